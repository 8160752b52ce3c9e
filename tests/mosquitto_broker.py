"""A throw-away Mosquitto broker (Debian's ``mosquitto``) on a free port, for bridge tests."""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
import weakref
from pathlib import Path

from tests import harness

MOSQUITTO = "/usr/sbin/mosquitto"


class MosquittoBroker:
    """Mosquitto 2 on 127.0.0.1, anonymous clients allowed, sessions saved to ``workdir`` on
    shutdown (so a restart on the same port keeps persistent sessions and their queues)."""

    def __init__(self, workdir: Path, port: int | None = None, extra: str = "") -> None:
        """``extra``: more lines of its configuration (its listener's options)."""
        self.workdir = workdir
        self.port = port or harness.free_port()
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {workdir}/\n"
            "max_queued_messages 10000\nlog_type all\n"
            # started as root, it would run as "mosquitto", who cannot save to workdir
            f"user {getpass.getuser()}\n{extra}")
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None
        harness._created.append(weakref.ref(self))  # ended after the test whatever happens

    def start(self, timeout: float = 20.0) -> "MosquittoBroker":
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:  # ready once it accepts connections: polled, with a deadline
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("mosquitto did not start:\n" + self.log.read_text())
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            harness.end(self.proc)

    def address(self, transport: str) -> tuple[str, int, str]:
        """As :meth:`tests.harness.RouterProcess.address`, for the paho helpers."""
        return "127.0.0.1", self.port, "/"
