"""docs/cluster.sh as the README runs it: every port from the environment, a metrics listener
per node that ``status`` reads, and "redis on ..." only once every node is ready."""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

NODES = 2
PORTS_PER_NODE = 5  # websocket, rawsocket, mqtt, amqp, metrics


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base() -> int:
    """A BASE_PORT whose every node port is free now (below Linux's ephemeral range, so the
    kernel does not hand one out to a client meanwhile)."""
    for _ in range(100):
        base = random.randrange(10000, 30000, 10)
        ports = [base + 10 * node + n for node in range(1, NODES + 1)
                 for n in range(PORTS_PER_NODE)]
        if all(bindable(port) for port in ports):
            return base
    raise RuntimeError("no free block of ports")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Script:
    """docs/cluster.sh running in a process group of its own, its output read line by line."""

    def __init__(self, workdir: Path) -> None:
        self.base, self.redis_port = free_base(), free_port()
        env = dict(os.environ, BASE_PORT=str(self.base), REDIS_PORT=str(self.redis_port),
                   CLUSTER_DIR=str(workdir), PYTHON=sys.executable, READY_TIMEOUT="120")
        self.proc = subprocess.Popen(["bash", "docs/cluster.sh", str(NODES)], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, start: str, timeout: float = 150.0) -> list[str]:
        """Every line up to the first that starts with ``start``, that one included."""
        seen = []
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, f"cluster.sh ended before {start!r}: {seen}"
            seen.append(line)
            if line.startswith(start):
                return seen

    def stop(self) -> None:
        """SIGTERM to the script (its trap ends redis and the nodes), SIGKILL to its process
        group if that did not end it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def script(tmp_path):
    running = Script(tmp_path / "cluster")
    yield running
    running.stop()


def test_cluster_script_ports_metrics_and_ready_order(script):
    lines = script.until("redis on")
    assert lines[-1].startswith(f"redis on 127.0.0.1:{script.redis_port}, {NODES} node(s) ready")
    # said only now: every node already takes connections on the ports the base gave it
    for node in range(1, NODES + 1):
        port = script.base + 10 * node
        (line,) = [line for line in lines if line.startswith(f"node{node}: ")]
        assert f"ws://127.0.0.1:{port}/ws" in line
        assert f"mqtt://127.0.0.1:{port + 2}" in line
        assert f"http://127.0.0.1:{port + 4}/metrics" in line
        assert all(listening(port + n) for n in range(PORTS_PER_NODE)), node
    metrics = f"http://127.0.0.1:{script.base + 20 + 4}/metrics"
    status = subprocess.run([sys.executable, "-m", "router", "status", "--url", metrics],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert f"router at {metrics}" in status.stdout
    assert "realm realm1:" in status.stdout
    script.stop()
    assert script.proc.returncode is not None
    assert not listening(script.redis_port)
    assert not any(listening(script.base + 10 * node) for node in range(1, NODES + 1))
