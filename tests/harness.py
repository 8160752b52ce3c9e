"""Start the real router as a subprocess on ephemeral ports and talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent

SCHEMES = {"ws": "websocket", "wss": "websocket", "rawsocket": "rawsocket",
           "rawsocket+tls": "rawsocket", "mqtt": "mqtt", "mqtts": "mqtt",
           "mqtt+ws": "mqtt-websocket", "mqtt+wss": "mqtt-websocket", "amqp": "amqp",
           "amqps": "amqp", "http": "metrics", "https": "metrics"}
"""URL scheme in the router's ``ready:`` line -> listener type."""

OPEN_ROLE = [
    {"uri": "", "match": "prefix", "allow": ["publish", "subscribe", "call", "register"]},
    {"uri": "wamp.session.", "match": "prefix", "allow": ["subscribe", "call"]},
    {"uri": "wamp.subscription.", "match": "prefix", "allow": ["subscribe", "call"]},
]


_created: list[weakref.ref] = []
"""Every RouterProcess and RedisServer made, in order (see :func:`stops_what_it_creates`)."""


def end(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if ``proc`` is still running after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kept_by_fixture(process: "RouterProcess") -> "RouterProcess":
    """Exempt ``process`` from :func:`stops_what_it_creates`: a module fixture that starts a
    router on first use (from a test body) stops it in its own finalizer, after every test
    that shares it."""
    _created[:] = [ref for ref in _created if ref() is not process]
    return process


@contextlib.contextmanager
def stops_what_it_creates() -> Iterator[None]:
    """Every RouterProcess and RedisServer made inside whose process still runs on the way
    out is ended, whatever happened (a failed assertion, a pytest-timeout): a test body that
    starts a node and times out before it stops it leaves nothing running."""
    mark = len(_created)
    try:
        yield
    finally:
        made, _created[mark:] = _created[mark:], []
        for ref in made:
            owner = ref()
            if owner is not None and owner.proc is not None:
                end(owner.proc)


def realm_file(name: str, roles: dict | None = None, anonymous_role: str | None = "anonymous",
               **extra) -> dict:
    """A realm definition; by default anonymous sessions may do anything outside wamp.*."""
    realm = {"name": name, "anonymous_role": anonymous_role,
             "roles": roles if roles is not None else {"anonymous": OPEN_ROLE}}
    realm.update(extra)
    return realm


class RouterProcess:
    """The router under test, started with ``python -m router run`` like a user would."""

    def __init__(self, workdir: Path, realms: list[dict], listeners: list[dict] | None = None,
                 extra_config: dict | None = None, run_args: list[str] | None = None) -> None:
        self.workdir = workdir
        self.run_args = run_args or []
        """More arguments of ``python -m router run`` (e.g. ``--log-format json``)."""
        self.realms = realms
        self.listeners = listeners or [
            {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
            {"type": "rawsocket", "host": "127.0.0.1", "port": 0},
        ]
        self.extra_config = extra_config or {}
        self.proc: subprocess.Popen | None = None
        self.log_lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.urls: dict[str, str] = {}
        self.write_config()
        _created.append(weakref.ref(self))

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.json"

    def write_config(self) -> None:
        realms_dir = self.workdir / "realms"
        realms_dir.mkdir(parents=True, exist_ok=True)
        for realm in self.realms:
            (realms_dir / f"{realm['name']}.json").write_text(json.dumps(realm, indent=2))
        config = {"data_dir": "data", "realms_dir": "realms",
                  "realms": [realm["name"] for realm in self.realms],
                  "listeners": self.listeners, "shutdown_timeout": 2,
                  # tests that log in wrongly on purpose should not wait for the back-off;
                  # the back-off's own tests (tests/test_auth.py) set it as in production
                  "login_backoff": {"after_failures": 1000}}
        config.update(self.extra_config)
        self.config_path.write_text(json.dumps(config, indent=2))

    def start(self, timeout: float = 20.0) -> "RouterProcess":
        """Launch the router and wait for its ``ready:`` line."""
        self.launch()
        try:
            self.take_urls(self.wait_for_log(r"ready: ", timeout))
        except AssertionError:
            end(self.proc)  # not ready in time: not left running either
            raise
        return self

    def launch(self) -> "RouterProcess":
        """Start the process without waiting for it (then :meth:`take_urls`)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router", "run", "--config", str(self.config_path),
             *self.run_args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self._lines), daemon=True).start()
        return self

    def take_urls(self, line: str) -> None:
        """The listeners' URLs, from the router's ``ready:`` line."""
        self.urls = {}
        self.schemes = {}
        for url in line.split("ready: ", 1)[1].split():
            scheme = url.split("://", 1)[0]
            # an http listener's URL ends with "/", a metrics listener's with its path
            kind = "http" if scheme.startswith("http") and url.endswith("/") else SCHEMES[scheme]
            self.urls[kind] = url
            self.schemes[kind] = scheme

    def _pump(self, proc: subprocess.Popen, lines: "queue.Queue[str | None]") -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            self.log_lines.append(line.rstrip("\n"))
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> str:
        """Block until a log line matches ``pattern`` (or fail with the log so far)."""
        regex = re.compile(pattern)
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no log line matching {pattern!r} within {timeout}s; "
                                     f"log:\n" + "\n".join(self.log_lines[-40:])) from None
            if line is None:
                raise AssertionError(f"router exited before logging {pattern!r}; log:\n"
                                     + "\n".join(self.log_lines[-40:]))
            if regex.search(line):
                return line

    def logged(self, pattern: str, timeout: float = 10.0) -> str:
        """A log line matching ``pattern``, written already (even before ``ready:``) or
        within ``timeout``."""
        regex = re.compile(pattern)
        for line in list(self.log_lines):
            if regex.search(line):
                return line
        return self.wait_for_log(pattern, timeout)

    def address(self, transport: str) -> tuple[str, int, str]:
        """(host, port, path) of a listener."""
        url = self.urls[transport]
        rest = url.split("://", 1)[1]
        hostport, _, path = rest.partition("/")
        host, port = hostport.rsplit(":", 1)
        return host, int(port), "/" + path

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, like a service manager; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("router did not stop within the timeout after SIGTERM")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def free_port() -> int:
    """A TCP port nothing listens on now (for servers that cannot report an ephemeral one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """A throw-away redis-server on a free port, nothing saved (never a system one)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _created.append(weakref.ref(self))
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if "Ready to accept connections" in line:
                break
        else:
            raise AssertionError("redis-server did not start")
        # keep reading its log so that a full pipe never stalls it
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        end(self.proc)


class SubscribeHold:
    """A TCP relay to a redis-server that holds back every SUBSCRIBE until :meth:`release`:
    a node behind it gets its Redis connections, but its subscriber link stays unfinished
    (as on a Redis slow to answer one of them)."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.released = threading.Event()
        self._sockets: list[socket.socket] = []
        self._subscribers: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.redis_port))
            self._sockets += (client, upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, holding: bool) -> None:
        try:
            while data := source.recv(65536):
                if holding and b"SUBSCRIBE" in data:
                    self._subscribers.append(source)
                    self.released.wait()
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # the other side or close() ended it
            pass

    def release(self) -> None:
        """Let the held SUBSCRIBEs (and every later one) through."""
        self.released.set()

    def hold(self) -> None:
        """Hold the SUBSCRIBEs that come from now on."""
        self.released.clear()

    def cut_subscribers(self) -> None:
        """Close the client side of every connection that subscribed (the node's subscriber
        link is lost; it connects again)."""
        for sock in self._subscribers:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._subscribers.clear()

    def close(self) -> None:
        self.release()
        self.listener.close()
        for sock in self._sockets:
            sock.close()


@contextlib.contextmanager
def redis_cluster(base: Path, start_node: Callable[..., "RouterProcess"],
                  names: tuple[str, ...] = ("a", "b", "c")
                  ) -> Iterator[tuple[RedisServer, dict[str, "RouterProcess"]]]:
    """A redis-server and one node per name (``start_node(base, redis, name)``), all
    stopped on the way out."""
    redis = RedisServer(base)
    nodes: dict[str, RouterProcess] = {}
    try:
        for name in names:
            nodes[name] = start_node(base, redis, name)
        yield redis, nodes
    finally:
        with contextlib.ExitStack() as stopping:  # each is stopped, even if one fails to
            stopping.callback(redis.stop)
            for node in nodes.values():
                stopping.callback(node.stop)
