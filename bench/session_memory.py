"""Memory per idle subscribed session: N clients that connect, subscribe and stay idle.

For MQTT (ours and Mosquitto, which it starts on a free port) and WAMP over RawSocket and
over WebSocket (ours), N sessions each subscribe to a topic of their own and wait; the
table gives the broker's RSS before, with the N sessions, and a few seconds after they all
closed, and the KB per session from the growth. The clients are raw sockets in this one
process (a few hundred bytes each here), so N in the tens of thousands needs no client
processes; the soft limit of open files is raised to the hard one (the broker inherits
it), and N is capped just under it, which is said in the table.

    .venv/bin/python bench/session_memory.py                    # N = 4,000 and 20,000
    .venv/bin/python bench/session_memory.py --sessions 4000 --only mqtt
    .venv/bin/python bench/session_memory.py --sessions 4000 --only ours --tracemalloc [FRAMES]

``--tracemalloc`` (ours only) traces the router's allocations (bench/memtrace is put first
on its PYTHONPATH) and, after each row, prints what the N sessions added: bytes per
session by allocating line, and live objects per session by type. Tracing costs memory
of its own, so the RSS columns of a traced run are not the figure to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import ExternalBroker, free_port, loadavg  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

SETTLE_S = 3.0
"""Seconds a broker is left alone before its RSS is read (and after the sessions close:
ours gives freed memory back to the system at most every few seconds)."""
SPARE_FILES = 200
"""Descriptors kept free besides the sessions' sockets (listeners, the database, logs)."""


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def mqtt_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def mqtt_packet(kind: int, body: bytes) -> bytes:
    """Fixed header (type and flags byte, remaining length) + body."""
    length, encoded = len(body), bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([kind]) + bytes(encoded) + body


def mqtt_hello(index: int, port: int) -> tuple[list[bytes], list[int]]:
    """MQTT 3.1.1 CONNECT (clean session, keep alive 600 s) and SUBSCRIBE QoS 1, sent
    together; CONNACK (4 bytes) and SUBACK (5 bytes) come back."""
    connect = mqtt_packet(0x10, mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 600)
                          + mqtt_string(f"mem-{index}"))
    subscribe = mqtt_packet(0x82, struct.pack("!H", 1) + mqtt_string(f"bench/mem/{index}")
                            + bytes([1]))
    return [connect + subscribe], [4 + 5]


WEBSOCKET_FRAMES = -2
"""A step's expected answer: one more WebSocket frame (-1: one more RawSocket frame; a
count >= 0: that many bytes)."""


def rawsocket_frame(message: list) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack("!I", len(data)) + data  # type 0 (a WAMP message) in the top byte


def wamp_hello(index: int, port: int) -> tuple[list[bytes], list[int]]:
    """RawSocket handshake (JSON) with HELLO, then SUBSCRIBE once WELCOME is in; each step
    waits for a count of frames (the handshake's answer is 4 bytes)."""
    handshake = bytes([0x7F, 0xF1, 0, 0])
    hello = rawsocket_frame([1, "realm1", {"roles": {"subscriber": {}}}])
    subscribe = rawsocket_frame([32, 1, {}, f"bench.mem.t{index}"])
    return [handshake + hello, subscribe], [-1, -1]


WEBSOCKET_PATH = "/ws"


def websocket_frame(message: list) -> bytes:
    """One masked text frame (a client's frames are masked)."""
    data = json.dumps(message).encode()
    mask = os.urandom(4)
    head = (bytes([0x81, 0x80 | len(data)]) if len(data) < 126
            else bytes([0x81, 0x80 | 126]) + struct.pack("!H", len(data)))
    return head + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(data))


def websocket_hello(index: int, port: int) -> tuple[list[bytes], list[int]]:
    """WebSocket opening handshake (subprotocol wamp.2.json) with HELLO, then SUBSCRIBE once
    WELCOME is in; each step waits for one more frame after the HTTP answer."""
    upgrade = (f"GET {WEBSOCKET_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Protocol: wamp.2.json\r\n\r\n").encode()
    hello = websocket_frame([1, "realm1", {"roles": {"subscriber": {}}}])
    subscribe = websocket_frame([32, 1, {}, f"bench.mem.t{index}"])
    return [upgrade + hello, subscribe], [WEBSOCKET_FRAMES, WEBSOCKET_FRAMES]


def websocket_frames_in(buffer: bytes) -> int:
    """Complete (unmasked, server) WebSocket frames in ``buffer`` after the HTTP answer."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return 0
    count, offset = 0, end + 4
    while len(buffer) >= offset + 2:
        length, offset = buffer[offset + 1] & 0x7F, offset + 2
        if length == 126:
            if len(buffer) < offset + 2:
                break
            length, offset = struct.unpack_from("!H", buffer, offset)[0], offset + 2
        elif length == 127:
            if len(buffer) < offset + 8:
                break
            length, offset = struct.unpack_from("!Q", buffer, offset)[0], offset + 8
        offset += length
        if offset > len(buffer):
            break
        count += 1
    return count


def frames_in(buffer: bytes, skip: int) -> int:
    """Complete RawSocket frames in ``buffer`` after its first ``skip`` bytes."""
    count, offset = 0, skip
    while len(buffer) >= offset + 4:
        offset += 4 + (struct.unpack_from("!I", buffer, offset)[0] & 0xFFFFFF)
        if offset > len(buffer):
            break
        count += 1
    return count


class Client:
    __slots__ = ("sock", "steps", "expects", "step", "buffer")

    def __init__(self, sock: socket.socket, steps: list[bytes], expects: list[int]) -> None:
        self.sock, self.steps, self.expects = sock, steps, expects
        self.step, self.buffer = 0, b""

    def step_done(self) -> bool:
        """Has the answer to the current step arrived? (MQTT: a byte count; WAMP: one more
        frame per step, after the handshake's 4 bytes)."""
        expected = self.expects[self.step]
        if expected == WEBSOCKET_FRAMES:
            return websocket_frames_in(self.buffer) >= self.step + 1
        if expected >= 0:
            return len(self.buffer) >= expected
        return len(self.buffer) >= 4 and frames_in(self.buffer, 4) >= self.step + 1


def open_sessions(port: int, count: int, hello, batch: int = 500,
                  timeout: float = 120.0) -> list[socket.socket]:
    """``count`` sessions, ``batch`` at a time being set up; their sockets."""
    done: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    deadline = time.monotonic() + timeout
    index = 0
    while len(done) < count:
        pending = []
        for _ in range(min(batch, count - index)):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = Client(sock, *hello(index, port))
            index += 1
            sock.sendall(client.steps[0])
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, client)
            pending.append(client)
        waiting = len(pending)
        while waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(done) + len(pending) - waiting} of {count} sessions "
                                   f"set up in {timeout:.0f} s")
            for key, _ in selector.select(1.0):
                client = key.data
                data = client.sock.recv(65536)
                if not data:
                    raise RuntimeError(f"the broker closed session {len(done)}'s connection")
                client.buffer += data
                while client.step_done():
                    client.step += 1
                    if client.step == len(client.steps):
                        selector.unregister(client.sock)
                        client.sock.setblocking(True)
                        done.append(client.sock)
                        waiting -= 1
                        break
                    client.sock.sendall(client.steps[client.step])
    selector.close()
    return done


TRACE_LINES = 30
"""Allocating lines printed per traced row (the largest growth first)."""
TRACE_TYPES = 25
"""Object types printed per traced row."""


class Tracer:
    """The router's tracemalloc snapshots, taken on SIGUSR2 (see bench/memtrace)."""

    def __init__(self, prefix: Path, frames: int = 1) -> None:
        self.prefix = prefix
        self.frames = frames
        self.taken = 0

    def env(self) -> dict[str, str]:
        path = str(Path(__file__).resolve().parent / "memtrace")
        old = os.environ.get("PYTHONPATH")
        return {"BENCH_TRACEMALLOC": str(self.prefix),
                "BENCH_TRACEMALLOC_FRAMES": str(self.frames),
                "PYTHONPATH": path + (os.pathsep + old if old else "")}

    def take(self, pid: int, timeout: float = 120.0) -> tuple:
        """Signal the router and wait for its snapshot and type census."""
        self.taken += 1
        name = f"{self.prefix}.{self.taken}"
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not os.path.exists(name + ".done"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no snapshot from the router in {timeout:.0f} s")
            time.sleep(0.1)
        import tracemalloc
        with open(name + ".json") as census:
            return tracemalloc.Snapshot.load(name + ".snapshot"), json.load(census)

    @staticmethod
    def where(frame) -> str:
        """``file:line``, the path from the package or the repository on."""
        name = frame.filename
        for marker in ("site-packages/", str(Path(__file__).resolve().parent.parent) + "/",
                       "lib/python3."):
            name = name.split(marker, 1)[-1]
        return f"{name}:{frame.lineno}"

    @staticmethod
    def report(first: tuple, second: tuple, count: int) -> None:
        """What ``count`` sessions added, per session: by allocating line and by type."""
        frames = max(len(stat.traceback) for stat in second[0].statistics("traceback")[:50])
        stats = second[0].compare_to(first[0], "traceback" if frames > 1 else "lineno")
        total = sum(stat.size_diff for stat in stats)
        print(f"\ntraced Python allocations: {total / count:,.0f} bytes per session "
              f"({total / 1024 / 1024:.1f} MB for {count:,})")
        print("| bytes/session | blocks/session | line |\n|---:|---:|---|")
        for stat in stats[:TRACE_LINES]:
            print(f"| {stat.size_diff / count:,.1f} | {stat.count_diff / count:.2f} "
                  f"| {' < '.join(Tracer.where(frame) for frame in stat.traceback)} |")
        rows = []
        for kind, (number, size) in second[1].items():
            was = first[1].get(kind, (0, 0))
            rows.append((size - was[1], number - was[0], kind))
        rows.sort(reverse=True)
        print("\n| shallow bytes/session | objects/session | type (collector-tracked) |"
              "\n|---:|---:|---|")
        for size, number, kind in rows[:TRACE_TYPES]:
            print(f"| {size / count:,.1f} | {number / count:.2f} | {kind} |")
        print(flush=True)


def measure(pid: int, port: int, count: int, hello, tracer: Tracer | None = None) -> dict:
    """RSS before, with ``count`` idle subscribed sessions, and after they closed."""
    time.sleep(SETTLE_S)
    before = rss_kb(pid)
    first = tracer.take(pid) if tracer else None
    started = time.monotonic()
    sockets = open_sessions(port, count, hello)
    setup_s = time.monotonic() - started
    time.sleep(SETTLE_S)
    loaded = rss_kb(pid)
    if tracer:
        Tracer.report(first, tracer.take(pid), count)
    for sock in sockets:
        sock.close()
    time.sleep(SETTLE_S * 2)
    after = rss_kb(pid)
    return {"sessions": count, "rss_before_mb": before / 1024, "rss_mb": loaded / 1024,
            "kb_per_session": (loaded - before) / count, "rss_after_close_mb": after / 1024,
            "setup_s": setup_s}


def our_router(workdir: Path, count: int, env: dict[str, str] | None = None) -> RouterProcess:
    cap = {"max_connections": count + 100, "max_connections_per_host": count + 100}
    listeners = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1", **cap},
                 {"type": "rawsocket", "host": "127.0.0.1", "port": 0, **cap},
                 {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": WEBSOCKET_PATH,
                  **cap}]
    router = RouterProcess(workdir, [realm_file("realm1")], listeners=listeners,
                           extra_config={"eventlog": {"enabled": False}})
    saved = dict(os.environ)
    os.environ.update(env or {})  # the harness passes this process's environment on
    try:
        return router.start(timeout=60)
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Mosquitto(ExternalBroker):
    name = "mosquitto"

    def __init__(self, executable: str, workdir: Path) -> None:
        port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "mosquitto.conf").write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "max_connections -1\n")
        super().__init__([executable, "-c", str(workdir / "mosquitto.conf")], workdir,
                         {"mqtt": (port, "/")})


def raise_file_limit() -> int:
    """Soft limit of open files up to the hard one (inherited by the brokers started
    after); the most sessions one broker can then hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft - SPARE_FILES


def run(counts: list[int], only: list[str], trace: int = 0) -> list[tuple[str, dict]]:
    most = raise_file_limit()
    work = Path(tempfile.mkdtemp(prefix="bench-session-memory-"))
    rows = []
    mosquitto = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
    for wanted in counts:
        count = min(wanted, most)
        note = "" if count == wanted else f" (of {wanted:,}: open-file limit)"
        for name in ("ours mqtt", "mosquitto mqtt", "ours wamp rawsocket",
                     "ours wamp websocket"):
            if only and not any(word in name for word in only):
                continue
            tracer = None
            if name.startswith("mosquitto"):
                if not mosquitto or trace:
                    continue
                broker = Mosquitto(mosquitto, work / f"mosquitto-{count}")
                pid, port, stop = broker.pid, broker.ports["mqtt"][0], broker.stop
            else:
                workdir = work / f"ours-{name.split()[-1]}-{count}"
                tracer = (Tracer(work / f"trace-{name.split()[-1]}-{count}", trace)
                          if trace else None)
                router = our_router(workdir, count, tracer.env() if tracer else None)
                transport = name.split()[-1] if "wamp" in name else "mqtt"
                pid, port, stop = router.proc.pid, router.address(transport)[1], router.stop
            try:
                hello = (mqtt_hello if "mqtt" in name
                         else websocket_hello if "websocket" in name else wamp_hello)
                row = measure(pid, port, count, hello, tracer)
                row["load"] = loadavg()
                rows.append((name + note, row))
                print(format_row(name + note, row), flush=True)
            finally:
                stop()
    return rows


def format_row(name: str, row: dict) -> str:
    return (f"| {name} | {row['sessions']:,} | {row['rss_before_mb']:.1f} | {row['rss_mb']:.1f} "
            f"| {row['kb_per_session']:.2f} | {row['rss_after_close_mb']:.1f} "
            f"| {row['setup_s']:.1f} | {row['load']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="4000,20000", help="comma-separated counts")
    parser.add_argument("--only", default="", help='e.g. "mqtt" or "wamp"')
    parser.add_argument("--tracemalloc", type=int, nargs="?", const=1, default=0,
                        metavar="FRAMES",
                        help="ours only: trace the router's allocations, print per session "
                             "what each line (FRAMES > 1: each call chain of that depth) and "
                             "type added (RSS then includes tracing)")
    args = parser.parse_args()
    print("| broker | sessions | RSS before MB | RSS with sessions MB | KB per session "
          "| RSS after close MB | setup s | load 1/5/15 |")
    print("|---|---:|---:|---:|---:|---:|---:|---|", flush=True)
    run([int(n) for n in args.sessions.split(",")],
        [word for word in args.only.split(",") if word], args.tracemalloc)
    print(f"(pid {os.getpid()}; RSS from /proc/<pid>/status VmRSS, {SETTLE_S:g} s after the "
          f"sessions are set up and {2 * SETTLE_S:g} s after they close)")


if __name__ == "__main__":
    main()
