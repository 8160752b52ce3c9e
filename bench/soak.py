"""Soak: healthy and misbehaving clients of every protocol against one router, at once.

Measures what the hardening promises are about: the router's memory while stopped readers,
an offline session, idle connections and a login flood are around and after they leave; the
delivered rates of healthy receivers against a baseline without the misbehaving clients; and
the latency of a modest publisher->subscriber pair, overall and during the login flood. It
prints PASS/FAIL per goal and always exits 0: it measures, it does not assert.

    .venv/bin/python bench/soak.py                       # 5 s warm-up, 15 s baseline, 60 s soak
    .venv/bin/python bench/soak.py --duration 300 --idle 4000
    .venv/bin/python bench/soak.py --router-config-extra '{"login_backoff": {"max_delay": 2}}'

See bench/README.md for what runs when and how each figure is taken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import os
import queue
import re
import resource
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections import Counter, defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proton import Timeout as AmqpTimeout  # noqa: E402

from bench.fanout import PUBLISH_BATCH, current_rss, latency_report, proc_stats  # noqa: E402
from router.core.credentials import hash_secret  # noqa: E402
from router.mqtt.packets import Subscribe, SubscriptionOptions  # noqa: E402
from tests.amqp_clients import Receive, body_bytes  # noqa: E402
from tests.amqp_clients import connect as amqp_connect  # noqa: E402
from tests.clients import RawClient, raw_connect  # noqa: E402
from tests.harness import OPEN_ROLE, RouterProcess, realm_file  # noqa: E402
from tests.mqtt_clients import V311, MqttClient, RawMqtt  # noqa: E402

REALM = "realm1"
USER, SECRET = "alice", "alice-secret"
LOAD_URI, LOAD_TOPIC = "soak.load", "soak/load"  # the same topic for WAMP and MQTT
PAIR_URI = "soak.pair"
OFFLINE_CLIENT_ID = "soak-offline"

SOURCES = ("wamp", "mqtt")  # the two load publishers; a payload's first byte names its source
MARKS = (b"W", b"M")
MQTT_MARK = MARKS[1][0]
SEQUENCE = struct.Struct("!Q")  # after the mark: the publisher's sequence number
HEALTHY = ("wamp", "mqtt-qos0", "mqtt-qos1", "amqp")

WINDOW = 500  # messages a healthy receiver may be behind a publisher before it waits
STALE = 2.0  # seconds without progress after which a receiver no longer holds publishers back
PACE = 0.002  # seconds a held-back publisher waits before looking again
MAX_UNACKED_BATCHES = 10  # WAMP publisher: acknowledged batches in flight
MAX_UNACKED_QOS1 = 200  # MQTT publisher: QoS 1 messages in flight (paho's own window is 100)
AMQP_CREDIT = 500  # healthy AMQP receiver's prefetch
AMQP_STOPPED_CREDIT = 100_000  # a stopped AMQP reader grants much, then reads nothing
STOPPED_RCVBUF = 4096  # bytes: stopped readers' socket receive buffers
NICE = 5  # load generators yield the CPU to the router and the latency pair
TIMEOUT = 10.0
FLOOD_CONCURRENCY = 64  # login attempts open at once (refusals may be held back 8 s)
FLOOD_TIMEOUT = 20.0
SETUP_LIMIT = 120.0  # seconds the misbehaving clients may take to connect
SETUP_BATCH = 20  # idle WAMP sessions opened at once
WAMP_ROLES = {"publisher": {}, "subscriber": {}}

GOAL_RSS_PEAK_MB = 250
GOAL_RSS_RETURN_MB = 30
GOAL_KEPT = 0.80
GOAL_FLOOD_P99_MS = 50
GOAL_FLOOD_MAX_MS = 500

LISTENERS = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
             {"type": "rawsocket", "host": "127.0.0.1", "port": 0},
             {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": REALM},
             {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": REALM}]

IDLE_SHARES = {"tcp-websocket": 0.125, "tcp-rawsocket": 0.125, "tcp-mqtt": 0.125,
               "tcp-amqp": 0.125, "wamp-rawsocket": 0.15, "wamp-websocket": 0.10,
               "mqtt": 0.20, "amqp": 0.05}
"""Idle connections: half only TCP-connected (never handshaking), half idle sessions."""

INCIDENT_LINE = re.compile(r"router\.incidents: realm (\S+), (\w+): (\w+)(?: x(\d+))?")
LOGIN_LINE = re.compile(r"router\.auth: (\w+) login failed")
LOG_LINE = re.compile(r"^\S+ \S+ (\w+) ([\w.]+): (.*)$")
DISCONNECT_WORDS = re.compile(r"\b(clos(e|ed|ing)|disconnect\w*|dropping connection|timed out|"
                              r"expired)\b", re.I)


# --- shared between processes ----------------------------------------------------------


class Addresses:
    """The router's listeners, picklable for the client processes (``address()`` as
    RouterProcess has it, so the tests' clients accept it)."""

    def __init__(self, router: RouterProcess) -> None:
        self._by_type = {kind: router.address(kind) for kind in router.urls}

    def address(self, transport: str) -> tuple[str, int, str]:
        return self._by_type[transport]


class Counters:
    """Shared counters: per healthy receiver and source, messages delivered, the first
    sequence number seen and the highest (+1); per publisher, messages sent."""

    def __init__(self, ctx) -> None:
        self.delivered = ctx.RawArray("q", len(HEALTHY) * len(SOURCES))
        self.first = ctx.RawArray("q", len(HEALTHY) * len(SOURCES))
        self.progress = ctx.RawArray("q", len(HEALTHY) * len(SOURCES))
        self.published = ctx.RawArray("q", len(SOURCES))

    def record(self, receiver: int, payload: bytes) -> None:
        slot = receiver * len(SOURCES) + (payload[0] == MQTT_MARK)
        number = SEQUENCE.unpack_from(payload, 1)[0]
        delivered = self.delivered[slot]
        if not delivered:
            self.first[slot] = number
        self.delivered[slot] = delivered + 1
        if number >= self.progress[slot]:
            self.progress[slot] = number + 1

    def delivered_by(self, receiver: int) -> int:
        """Messages of both sources delivered to one healthy receiver."""
        base = receiver * len(SOURCES)
        return sum(self.delivered[base:base + len(SOURCES)])

    def lost_by(self, receiver: int) -> int:
        """Messages published since the first one a receiver got (of each source) that it
        did not get: what was published before it could receive is not lost."""
        base = receiver * len(SOURCES)
        return sum(published - self.first[slot] - self.delivered[slot]
                   if self.delivered[slot] else published
                   for slot, published in enumerate(self.published, base))


@dataclass(frozen=True)
class Settings:
    size: int
    rate: float
    pair_rate: float
    idle: dict[str, int]
    flood_rate: float


class Pacer:
    """Holds a publisher back while a healthy receiver is more than WINDOW of its messages
    behind (or the publisher is ahead of --rate): full rate, without queues piling up in the
    router for receivers that do read. Progress is the highest sequence number seen, so
    dropped messages do not hold anyone back; a receiver that has not moved for STALE
    seconds (gone, or dropped what was in flight) holds nobody back until it moves again."""

    def __init__(self, counters: Counters, source: int, rate: float) -> None:
        self.progress = counters.progress
        self.slots = [receiver * len(SOURCES) + source for receiver in range(len(HEALTHY))]
        self.started = time.monotonic()
        self.seen = {slot: (-1, self.started) for slot in self.slots}
        self.rate = rate

    def ready(self, sent: int) -> bool:
        now = time.monotonic()
        if self.rate and sent >= self.rate * (now - self.started):
            return False
        for slot in self.slots:
            value = self.progress[slot]
            last, since = self.seen[slot]
            if value != last:
                self.seen[slot] = (value, now)
            elif now - since > STALE:
                continue
            if sent - value > WINDOW:
                return False
        return True


def running(stop, deadline: float) -> bool:
    return not stop.is_set() and time.monotonic() < deadline


def wait_stopped(stop, deadline: float, gone: Callable[[], bool] = lambda: False) -> None:
    """Block until told to stop, the deadline or ``gone()`` (the router closed on us)."""
    while running(stop, deadline) and not gone():
        stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))


async def close_when_stopped(client: RawClient, stop, deadline: float) -> None:
    while running(stop, deadline):
        await asyncio.sleep(0.2)
    client.close()


def payload(source: int, number: int, padding: bytes) -> bytes:
    return MARKS[source] + SEQUENCE.pack(number) + padding


def child(name: str, target: Callable, *args) -> None:
    """A client process: nice'd unless it is the latency pair; a failure ends it with one
    line instead of a traceback (the main process notices and reports the exit)."""
    if name != "pair":
        os.nice(NICE)
    try:
        target(*args)
    except Exception as exc:  # noqa: BLE001 - report any failure of a load generator
        print(f"soak: {name} stopped: {exc!r}", file=sys.stderr, flush=True)
        sys.exit(1)


async def joined(addresses: Addresses, transport: str = "rawsocket",
                 serializer: str = "msgpack") -> RawClient:
    """A lean WAMP session in the realm."""
    client = await raw_connect(addresses, transport, serializer, lean=True)
    welcome = await client.hello(REALM, {"roles": WAMP_ROLES})
    if welcome[0] != 2:
        raise ConnectionError(f"not welcomed: {welcome}")
    return client


async def subscribe(client: RawClient, uri: str) -> None:
    client.send([32, client.next_request(), {}, uri])
    reply = await client.recv()
    if reply[0] != 33:
        raise ConnectionError(f"subscribe {uri} refused: {reply}")


# --- publishers and healthy receivers ----------------------------------------------------


def wamp_publisher(addresses: Addresses, counters: Counters, settings: Settings, ready, stop,
                   deadline: float) -> None:
    """RawSocket+MsgPack, batches of PUBLISH_BATCH, the last of each acknowledged."""
    async def run() -> None:
        client = await joined(addresses)
        ready.put("wamp publisher")
        pacer = Pacer(counters, 0, settings.rate)
        padding = b"w" * (settings.size - 1 - SEQUENCE.size)
        sent = unacknowledged = 0
        while running(stop, deadline):
            if not pacer.ready(sent):
                await asyncio.sleep(PACE)
                continue
            batch = [[16, sent + n + 1, {}, LOAD_URI, [payload(0, sent + n, padding)]]
                     for n in range(PUBLISH_BATCH)]
            batch[-1][2] = {"acknowledge": True}
            client.send_many(batch)
            sent += PUBLISH_BATCH
            counters.published[0] = sent
            unacknowledged += 1
            while unacknowledged > MAX_UNACKED_BATCHES:
                if (await client.recv(timeout=TIMEOUT))[0] in (8, 17):  # ERROR or PUBLISHED
                    unacknowledged -= 1
            await asyncio.sleep(0)
        client.close()

    asyncio.run(run())


def mqtt_publisher(addresses: Addresses, counters: Counters, settings: Settings, ready, stop,
                   deadline: float) -> None:
    """paho, QoS 0 and QoS 1 alternately; at most MAX_UNACKED_QOS1 unacknowledged."""
    mqtt = MqttClient(addresses, version=V311, client_id="soak-publisher")
    paho = mqtt.client
    paho.max_inflight_messages_set(100)
    paho.max_queued_messages_set(0)
    paho.on_publish = None  # the tests' client would keep every acknowledgement
    mqtt.connect()
    ready.put("mqtt publisher")
    pacer = Pacer(counters, 1, settings.rate)
    padding = b"m" * (settings.size - 1 - SEQUENCE.size)
    unacknowledged: deque = deque()
    sent = 0
    while running(stop, deadline):
        if not pacer.ready(sent):
            time.sleep(PACE)
            continue
        for number in range(sent, sent + PUBLISH_BATCH):
            info = paho.publish(LOAD_TOPIC, payload(1, number, padding), qos=number & 1)
            if number & 1:
                unacknowledged.append(info)
        sent += PUBLISH_BATCH
        counters.published[1] = sent
        while len(unacknowledged) > MAX_UNACKED_QOS1 and running(stop, deadline):
            unacknowledged[0].wait_for_publish(0.5)
            if unacknowledged[0].is_published():
                unacknowledged.popleft()
    if unacknowledged:  # written in order: once the last is acknowledged, all are sent
        unacknowledged[-1].wait_for_publish(TIMEOUT)
    mqtt.close()


def wamp_receiver(addresses: Addresses, index: int, counters: Counters, ready, stop,
                  deadline: float) -> None:
    async def run() -> None:
        client = await joined(addresses)
        await subscribe(client, LOAD_URI)
        ready.put(HEALTHY[index])
        closing = asyncio.create_task(close_when_stopped(client, stop, deadline))
        with contextlib.suppress(ConnectionError, TimeoutError):
            while True:
                message = await client.recv(timeout=deadline - time.monotonic())
                if message[0] == 36:
                    counters.record(index, message[4][0])
        closing.cancel()
        if running(stop, deadline):
            raise ConnectionError("closed by the router")

    asyncio.run(run())


def mqtt_receiver(addresses: Addresses, index: int, qos: int, counters: Counters, ready, stop,
                  deadline: float) -> None:
    mqtt = MqttClient(addresses, version=V311, client_id=f"soak-healthy-qos{qos}")
    mqtt.client.on_message = lambda _client, _userdata, message: counters.record(
        index, message.payload)
    mqtt.connect()
    mqtt.subscribe((LOAD_TOPIC, qos))
    ready.put(HEALTHY[index])
    wait_stopped(stop, deadline, mqtt.disconnected.is_set)
    if mqtt.disconnected.is_set():
        raise ConnectionError(f"closed by the router (reason {mqtt.disconnect_reason})")
    mqtt.close()


def amqp_receiver(addresses: Addresses, index: int, counters: Counters, ready, stop,
                  deadline: float) -> None:
    """QoS 1 (unsettled, accepted one by one)."""
    connection = amqp_connect(addresses)
    receiver = connection.create_receiver(LOAD_URI, credit=AMQP_CREDIT, options=Receive(qos=1))
    ready.put(HEALTHY[index])
    while running(stop, deadline):
        try:
            message = receiver.receive(timeout=0.5)
        except AmqpTimeout:
            continue
        counters.record(index, body_bytes(message))
        if receiver.fetcher.unsettled:  # QoS 0 messages arrive settled
            receiver.accept()
    connection.close()


def latency_pair(addresses: Addresses, rate: float, results, ready, stop,
                 deadline: float) -> None:
    """A WAMP publisher and subscriber at ``rate`` events/s on their own topic; reports
    (events sent, [(send time, latency)]) with monotonic times shared with the main process."""
    async def run() -> None:
        subscriber = await joined(addresses)
        await subscribe(subscriber, PAIR_URI)
        publisher = await joined(addresses)
        samples: list[tuple[float, float]] = []

        async def receive() -> None:
            with contextlib.suppress(ConnectionError, TimeoutError):
                while True:
                    message = await subscriber.recv(timeout=deadline - time.monotonic())
                    if message[0] == 36:
                        sent_at = message[4][0]
                        samples.append((sent_at, time.monotonic() - sent_at))

        receiving = asyncio.create_task(receive())
        ready.put("pair")
        started, sent = time.monotonic(), 0
        while running(stop, deadline):
            publisher.send([16, sent + 1, {}, PAIR_URI, [time.monotonic()]])
            sent += 1
            await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
        last_call = time.monotonic() + 2.0  # the last events still on their way
        while len(samples) < sent and time.monotonic() < last_call:
            await asyncio.sleep(0.05)
        receiving.cancel()
        results.put((sent, samples))
        publisher.close()
        subscriber.close()

    asyncio.run(run())


# --- misbehaving clients -----------------------------------------------------------------


@dataclass
class Held:
    """One connection a misbehaving client holds: its socket, to see whether the router
    closed it, and how to drop it."""

    sock: Any
    drop: Callable[[], None]

    def closed_by_router(self) -> bool:
        try:
            return self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 1
        except OSError:  # the client already saw the close and let go of the socket
            return True


def shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def open_sockets() -> dict[str, int]:
    """This process's sockets: kernel name ("socket:[inode]") -> descriptor."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # e.g. the descriptor listdir itself used
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:"):
                found[link] = int(fd)
    return found


def held_sockets_to(port: int, known: set[str]) -> dict[str, Held]:
    """This process's TCP connections to ``port`` other than ``known`` ones, by kernel
    name, each held through a duplicate of its socket (proton hides its own); dropping a
    duplicate shuts the connection down."""
    found = {}
    for link, fd in open_sockets().items():
        if link in known:
            continue
        sock = socket.socket(fileno=os.dup(fd))
        with contextlib.suppress(OSError):
            if sock.family == socket.AF_INET and sock.getpeername()[1] == port:
                found[link] = Held(sock, functools.partial(shut, sock))
                continue
        sock.close()
    return found


def idle_plan(total: int) -> dict[str, int]:
    """How many idle connections of each kind make up ``total``."""
    plan = {kind: int(total * share) for kind, share in IDLE_SHARES.items()}
    plan["mqtt"] += total - sum(plan.values())
    return plan


def wrong_password(addresses: Addresses, attempt: int) -> str:
    """One MQTT CONNECT with a wrong password, on a new connection (blocking)."""
    client = RawMqtt(addresses)
    try:
        connack = client.connect(client_id=f"soak-flood-{attempt}", username=USER,
                                 password=b"wrong-password")
        return "refused" if connack.reason_code else "accepted"
    finally:
        client.close()


async def wrong_ticket(addresses: Addresses) -> str:
    """One WAMP HELLO with ticket authentication and a wrong ticket, on a new connection."""
    client = await raw_connect(addresses, "rawsocket", "msgpack", lean=True)
    try:
        reply = await client.hello(REALM, {"roles": WAMP_ROLES, "authmethods": ["ticket"],
                                           "authid": USER})
        if reply[0] == 4:
            client.send([5, "wrong-ticket", {}])
            reply = await client.recv(timeout=FLOOD_TIMEOUT)
        return "refused" if reply[0] == 3 else "accepted"
    finally:
        client.close()


@dataclass
class Abusers:
    """Every misbehaving client, in one process: they connect on the main process's "go",
    the login flood runs in its window, and all leave at the leave time (or at a "leave"
    command). Reports ("ready" | "left" | "flood", ...) go back on ``reports``."""

    addresses: Addresses
    settings: Settings
    control: Any
    reports: Any
    stop: Any
    deadline: float
    leaving: bool = False
    stopped: dict[str, Held] = field(default_factory=dict)
    idle: dict[str, list[Held]] = field(default_factory=lambda: defaultdict(list))
    keep: list[Any] = field(default_factory=list)  # proton connections, dropped by socket
    flood: Counter[str] = field(default_factory=Counter)
    flood_window: tuple[float, float] | None = None
    setup_deadline: float = 0.0  # connecting stops here, with what is connected by then

    def __post_init__(self) -> None:
        self.setup_deadline = time.monotonic() + SETUP_LIMIT

    def poll_control(self) -> None:
        with contextlib.suppress(queue.Empty):
            if self.control.get_nowait() == "leave":
                self.leaving = True

    async def sleep_until(self, moment: float) -> None:
        """Until ``moment``, a "leave" command or the end of the run."""
        while time.monotonic() < moment and not self.leaving and running(self.stop,
                                                                          self.deadline):
            self.poll_control()
            await asyncio.sleep(min(0.1, max(0.0, moment - time.monotonic())))

    async def run(self, duration: float) -> None:
        """Connect (each step timed), then the soak's ``duration`` from when all are
        connected: the flood from 1/4 for 1/4 of it, everyone leaves at 2/3."""
        steps: dict[str, float] = {}
        for step, connect in (("proton+paho", self.connect_with_select_based_clients),
                              ("stopped wamp", self.connect_stopped_wamp),
                              ("stopped mqtt", self.connect_stopped_mqtt),
                              ("idle tcp", self.connect_idle_tcp),
                              ("idle sessions", self.connect_idle_sessions)):
            started = time.monotonic()
            if asyncio.iscoroutine(done := connect()):
                await done
            steps[step] = time.monotonic() - started
        ready = time.monotonic()
        self.reports.put(("ready", steps, len(self.stopped),
                          {kind: len(held) for kind, held in self.idle.items()}))
        flood = asyncio.create_task(self.run_flood(ready + duration / 4, ready + duration / 2))
        await self.sleep_until(ready + round(duration * 2 / 3))
        self.reports.put(("left", time.monotonic(), self.leave()))
        await asyncio.sleep(0)  # the aborted WAMP transports close their sockets
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(flood, FLOOD_TIMEOUT + 5)
        self.reports.put(("flood", dict(self.flood), self.flood_window))

    def connect_with_select_based_clients(self) -> None:
        """proton and paho wait with select(), which only takes descriptors below 1024:
        their connections come before the thousands of idle ones. Each proton Container
        loads the system's CA bundle (50-200 ms of CPU); these connections are plain TCP."""
        os.environ.update(SSL_CERT_FILE=os.devnull, SSL_CERT_DIR=os.devnull)
        amqp_port = self.addresses.address("amqp")[1]
        connection = amqp_connect(self.addresses)
        connection.create_receiver(LOAD_URI, credit=AMQP_STOPPED_CREDIT, options=Receive(qos=0))
        connection.container.process()  # flush the credit; from now on nothing is read
        (link, held), = held_sockets_to(amqp_port, set()).items()
        held.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STOPPED_RCVBUF)
        self.stopped["amqp"] = held
        self.keep = self.in_parallel(self.settings.idle["amqp"],
                                     lambda _: amqp_connect(self.addresses))
        self.keep.append(connection)
        self.idle["amqp"] = list(held_sockets_to(amqp_port, {link}).values())
        offline = MqttClient(self.addresses, version=V311, client_id=OFFLINE_CLIENT_ID,
                             clean=False)
        offline.connect()
        offline.subscribe((LOAD_TOPIC, 1))
        offline.disconnect()

    async def connect_stopped_wamp(self) -> None:
        for transport, serializer in (("rawsocket", "msgpack"), ("websocket", "json")):
            client = await joined(self.addresses, transport, serializer)
            await subscribe(client, LOAD_URI)
            client.transport.pause_reading()
            sock = client.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STOPPED_RCVBUF)
            self.stopped[f"wamp-{transport}"] = Held(sock, client.transport.abort)

    def connect_stopped_mqtt(self) -> None:
        for qos in (0, 1):
            client = RawMqtt(self.addresses)
            client.connect_ok(client_id=f"soak-stopped-qos{qos}")
            client.send(Subscribe(1, [(LOAD_TOPIC, SubscriptionOptions(qos))]))
            client.recv()  # SUBACK; nothing is read after it
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STOPPED_RCVBUF)
            self.stopped[f"mqtt-qos{qos}"] = Held(client.sock, client.close)

    def connect_idle_tcp(self) -> None:
        """Connections that never handshake, one listener after the other in turn (a burst
        at one listener overflows its accept queue, and a dropped SYN costs a second)."""
        kinds = [f"tcp-{listener}" for listener in ("websocket", "rawsocket", "mqtt", "amqp")]
        for round_ in range(max(self.settings.idle[kind] for kind in kinds)):
            for kind in kinds:
                if round_ < self.settings.idle[kind] and \
                        time.monotonic() < self.setup_deadline:
                    host, port, _ = self.addresses.address(kind[4:])
                    sock = socket.create_connection((host, port), timeout=TIMEOUT)
                    self.idle[kind].append(Held(sock, functools.partial(shut, sock)))

    async def connect_idle_sessions(self) -> None:
        """WAMP and MQTT sessions SETUP_BATCH at a time; all silent then."""
        plan = self.settings.idle
        for kind, serializer in (("wamp-rawsocket", "msgpack"), ("wamp-websocket", "json")):
            for first in range(0, plan[kind], SETUP_BATCH):
                if time.monotonic() > self.setup_deadline:
                    break
                clients = await asyncio.gather(*(
                    joined(self.addresses, kind.split("-")[1], serializer)
                    for _ in range(first, min(first + SETUP_BATCH, plan[kind]))))
                self.idle[kind] += [Held(c.transport.get_extra_info("socket"),
                                         c.transport.abort) for c in clients]

        def idle_mqtt(number: int) -> Held:
            client = RawMqtt(self.addresses)
            client.connect_ok(client_id=f"soak-idle-{number}", keep_alive=0)
            return Held(client.sock, client.close)

        self.idle["mqtt"] = self.in_parallel(plan["mqtt"], idle_mqtt)

    def in_parallel(self, count: int, connect: Callable[[int], Any]) -> list:
        """``connect(0..count-1)``, SETUP_BATCH at a time (each waits for the router's
        answers), none after the setup deadline."""
        def bounded(number: int) -> Any:
            return connect(number) if time.monotonic() < self.setup_deadline else None

        with ThreadPoolExecutor(SETUP_BATCH) as pool:
            return [result for result in pool.map(bounded, range(count)) if result is not None]

    def leave(self) -> dict:
        """Drop every connection; what the router had closed before, per kind."""
        closed = {name: held.closed_by_router() for name, held in self.stopped.items()}
        idle_closed = {kind: sum(held.closed_by_router() for held in helds)
                       for kind, helds in self.idle.items()}
        for held in [*self.stopped.values(), *(h for helds in self.idle.values() for h in helds)]:
            held.drop()
        discard = RawMqtt(self.addresses)  # a clean session replaces the offline one
        discard.connect_ok(client_id=OFFLINE_CLIENT_ID, clean=True)
        discard.close()
        return {"stopped": closed, "idle": idle_closed}

    async def run_flood(self, start: float, end: float) -> None:
        """Wrong WAMP tickets and MQTT passwords alternately, each on a new connection,
        ``flood_rate`` per second from ``start`` to ``end``."""
        rate = self.settings.flood_rate
        if rate <= 0:
            return
        await self.sleep_until(start)
        executor = ThreadPoolExecutor(FLOOD_CONCURRENCY)
        pending: set[asyncio.Future] = set()
        began, attempts = time.monotonic(), 0
        while (attempts < rate * (end - start) and time.monotonic() < end and not self.leaving
               and running(self.stop, self.deadline)):
            if len(pending) >= FLOOD_CONCURRENCY:
                self.flood["skipped (too many open)"] += 1
            else:
                task = asyncio.ensure_future(self.attempt(attempts, executor))
                pending.add(task)
                task.add_done_callback(pending.discard)
            attempts += 1
            await asyncio.sleep(max(0.0, began + attempts / rate - time.monotonic()))
        self.flood_window = (began, time.monotonic())
        if pending:
            await asyncio.wait(pending, timeout=FLOOD_TIMEOUT)
        executor.shutdown(wait=False, cancel_futures=True)

    async def attempt(self, number: int, executor: ThreadPoolExecutor) -> None:
        kind = "wamp" if number % 2 == 0 else "mqtt"
        try:
            if kind == "wamp":
                outcome = await asyncio.wait_for(wrong_ticket(self.addresses), FLOOD_TIMEOUT)
            else:
                outcome = await asyncio.get_running_loop().run_in_executor(
                    executor, wrong_password, self.addresses, number)
        except (OSError, AssertionError, asyncio.TimeoutError) as exc:
            outcome = f"error {type(exc).__name__}"
        self.flood[f"{kind} {outcome}"] += 1


def abusers_main(addresses: Addresses, settings: Settings, control, reports, stop,
                 deadline: float) -> None:
    duration = control.get(timeout=max(0.1, deadline - time.monotonic()))
    abusers = Abusers(addresses, settings, control, reports, stop, deadline)
    asyncio.run(abusers.run(duration))
    wait_stopped(stop, deadline)


# --- the main process --------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # monotonic
    rss: int  # bytes
    cpu: float  # router CPU seconds so far
    delivered: list[int]  # per healthy receiver
    published: list[int]  # per publisher


def merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in, nested objects key by key."""
    result = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def raise_fd_limit(needed: int) -> int:
    """Raise this process's (and so the router's and clients') open-file limit towards
    ``needed``; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def mb(value: float) -> str:
    return f"{value / 2**20:.1f}"


def latency_figures(samples: list[tuple[float, float]], start: float, end: float) -> dict:
    """n, p50, p99 and max in ms of the pair's events sent within [start, end)."""
    values = [latency for sent, latency in samples if start <= sent < end]
    if not values:
        return {}
    return {"n": len(values), **latency_report(values), "max_ms": max(values) * 1000}


def format_latency(figures: dict) -> str:
    if not figures:
        return "no events"
    return (f"p50 {figures['p50_ms']:.1f} / p99 {figures['p99_ms']:.1f} / "
            f"max {figures['max_ms']:.1f} ({figures['n']} events)")


def shape(message: str) -> str:
    """A log message with its numbers and quoted names blanked, to count lines alike."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message))


def read_router_log(lines: list[str]) -> dict:
    """Incidents by (protocol, reason), failed logins by protocol, lines about closed
    connections and other warnings and errors counted by shape, up to the router's shutdown."""
    incidents: Counter[str] = Counter()
    logins: Counter[str] = Counter()
    disconnections: Counter[str] = Counter()
    others: Counter[str] = Counter()
    for line in lines:
        if "shutting down:" in line:
            break
        if match := INCIDENT_LINE.search(line):
            incidents[f"{match[2]} {match[3]}"] += int(match[4] or 1)
        elif match := LOGIN_LINE.search(line):
            logins[match[1]] += 1
        elif (match := LOG_LINE.match(line)) and not match[3].startswith(("ready:", "realm ")):
            key = f"{match[1]} {match[2]}: {shape(match[3])}"
            if DISCONNECT_WORDS.search(match[3]):
                disconnections[key] += 1
            elif match[1] != "INFO":
                others[key] += 1
    return {"incidents": incidents, "logins": logins, "disconnections": disconnections,
            "others": others}


def joined_counts(counts: Counter, empty: str = "none") -> str:
    return " | ".join(f"{key} {n}" for key, n in counts.most_common()) or empty


class Soak:
    """Runs the phases, prints a line per second, and the summary with the goals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ctx = mp.get_context("spawn")
        self.stop = self.ctx.Event()
        self.stop_publishing = self.ctx.Event()
        self.ready = self.ctx.Queue()
        self.control = self.ctx.Queue()
        self.reports = self.ctx.Queue()
        self.pair_results = self.ctx.Queue()
        self.counters = Counters(self.ctx)
        self.processes: dict[str, Any] = {}
        self.samples: list[Sample] = []
        self.events: dict[str, Any] = {}
        self.exited: dict[str, float] = {}
        self.pair: tuple[int, list] = (0, [])
        self.warmup, self.baseline, self.duration = args.warmup, args.baseline, args.duration
        self.started = 0.0
        self.end = 0  # the last second
        self.kept: list[float] | None = None
        self.lost: list[int] = []  # per healthy receiver, once the publishers stopped

    def sample(self, pid: int) -> Sample:
        cpu, _ = proc_stats(pid)
        return Sample(time.monotonic(), current_rss(pid), cpu,
                      [self.counters.delivered_by(i) for i in range(len(HEALTHY))],
                      list(self.counters.published))

    def start_clients(self, addresses: Addresses, settings: Settings, deadline: float) -> None:
        counters, stop, ready = self.counters, self.stop, self.ready
        targets = {
            "wamp": (wamp_receiver, addresses, 0, counters, ready, stop, deadline),
            "mqtt-qos0": (mqtt_receiver, addresses, 1, 0, counters, ready, stop, deadline),
            "mqtt-qos1": (mqtt_receiver, addresses, 2, 1, counters, ready, stop, deadline),
            "amqp": (amqp_receiver, addresses, 3, counters, ready, stop, deadline),
            "pair": (latency_pair, addresses, settings.pair_rate, self.pair_results, ready,
                     stop, deadline),
        }
        for name, (target, *args) in targets.items():
            self.processes[name] = self.ctx.Process(target=child, args=(name, target, *args))
        self.processes["abusers"] = self.ctx.Process(target=child, args=(
            "abusers", abusers_main, addresses, settings, self.control, self.reports, stop,
            deadline))
        for name, target in (("wamp publisher", wamp_publisher),
                             ("mqtt publisher", mqtt_publisher)):
            self.processes[name] = self.ctx.Process(target=child, args=(
                name, target, addresses, counters, settings, ready, self.stop_publishing,
                deadline))
        for process in self.processes.values():
            process.start()
        for _ in range(len(targets) + 2):  # the abusers wait for "go" instead
            self.ready.get(timeout=60)

    def run(self, router: RouterProcess, settings: Settings) -> None:
        pid = router.proc.pid
        self.events["idle_rss"] = current_rss(pid)
        go = self.warmup + self.baseline
        self.end = go + SETUP_LIMIT + self.duration  # until the misbehaving clients connected
        deadline = time.monotonic() + self.end + 120  # every client gives up by then
        self.start_clients(Addresses(router), settings, deadline)
        print(f"clients ready; router pid {pid}, RSS {mb(self.events['idle_rss'])} MB before "
              "they connected", flush=True)
        self.started = time.monotonic()
        second = 0
        while second <= self.end:
            time.sleep(max(0.0, self.started + second - time.monotonic()))
            if router.proc.poll() is not None:
                print(f"[{second:4d}s] the router exited (code {router.proc.returncode})")
                break
            self.samples.append(self.sample(pid))
            if second == go:  # the soak phase: the misbehaving clients connect
                self.control.put(self.duration)
            if second:
                self.print_second(second)
                self.watch(second)
            second += 1

    def phase(self, second: int) -> str:
        if second <= self.warmup:
            return "warm-up"
        if second <= self.warmup + self.baseline:
            return "baseline"
        return "soak" if "ready" in self.events else "connect"

    def print_second(self, second: int) -> None:
        now, before = self.samples[-1], self.samples[-2]
        elapsed = max(1e-6, now.at - before.at)

        def per_second(names: tuple[str, ...], attribute: str) -> str:
            pairs = zip(names, getattr(now, attribute), getattr(before, attribute))
            return " ".join(f"{name} {(new - old) / elapsed:6.0f}" for name, new, old in pairs)

        print(f"[{second:4d}s] {self.phase(second):8s} rss {mb(now.rss):>7s} MB | published/s "
              f"{per_second(SOURCES, 'published')} | delivered/s "
              f"{per_second(HEALTHY, 'delivered')}", flush=True)

    def watch(self, second: int) -> None:
        """Reports of the misbehaving clients, the RSS safety limit, clients that exited."""
        with contextlib.suppress(queue.Empty):
            while True:
                report = self.reports.get_nowait()
                self.events[report[0]] = report[1:]
                if report[0] == "ready":
                    self.end = second + self.duration
                    steps = ", ".join(f"{step} {took:.1f}" for step, took in report[1].items())
                    print(f"[{second:4d}s] misbehaving clients connected in "
                          f"{sum(report[1].values()):.1f} s ({steps}): {report[2]} stopped "
                          f"readers, {sum(report[3].values())} idle connections, an offline "
                          f"MQTT session; {self.duration} s from now", flush=True)
                elif report[0] == "left":
                    print(f"[{second:4d}s] misbehaving clients left", flush=True)
        if (self.samples[-1].rss > self.args.rss_limit * 2**20 and "left" not in self.events
                and "early_leave" not in self.events):
            self.events["early_leave"] = second
            self.control.put("leave")
            print(f"[{second:4d}s] router RSS over --rss-limit: misbehaving clients told to "
                  "leave now", flush=True)
        for name, process in self.processes.items():
            if name not in self.exited and not process.is_alive():
                self.exited[name] = second
                print(f"[{second:4d}s] client process {name} exited (code {process.exitcode})",
                      flush=True)

    def finish(self) -> None:
        """Stop every client (bounded) and collect the pair's samples and the last reports;
        the publishers first, so that what is still in flight is not counted as lost."""
        self.stop_publishing.set()
        delivered, until = None, time.monotonic() + 5
        while time.monotonic() < until:
            previous, delivered = delivered, [self.counters.delivered_by(i)
                                              for i in range(len(HEALTHY))]
            if delivered == previous:
                break
            time.sleep(0.5)
        self.lost = [self.counters.lost_by(i) for i in range(len(HEALTHY))]
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            self.pair = self.pair_results.get(timeout=15)
        until = time.monotonic() + FLOOD_TIMEOUT + 10
        while "flood" not in self.events and self.processes.get("abusers") is not None \
                and time.monotonic() < until:
            with contextlib.suppress(queue.Empty):
                report = self.reports.get(timeout=1)
                self.events[report[0]] = report[1:]
            if not self.processes["abusers"].is_alive():
                break
        for process in self.processes.values():
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    # summary ------------------------------------------------------------------------

    def sample_at(self, second: int) -> Sample | None:
        return self.samples[second] if second < len(self.samples) else None

    def first_sample_after(self, moment: float) -> Sample | None:
        return next((s for s in self.samples if s.at >= moment), None)

    def summary(self, router: RouterProcess, peak_rss: int) -> None:
        base_start = self.sample_at(self.warmup)
        start = self.sample_at(self.warmup + self.baseline)
        end = self.samples[-1]
        connecting = sum(self.events.get("ready", ({},))[0].values())
        print(f"\n=== soak summary: {self.warmup} s warm-up, {self.baseline} s baseline, "
              f"{connecting:.0f} s connecting the misbehaving clients + {self.duration} s soak; "
              f"router pid {router.proc.pid} ===")
        left = self.events.get("left", (None, {}))
        before = after = None
        if left[0] is not None:
            before = next((s for s in reversed(self.samples) if s.at <= left[0]), None)
            after = self.first_sample_after(left[0] + 5) or end
        figures = [("idle", self.events["idle_rss"]), ("start", start and start.rss),
                   ("peak", peak_rss), ("before leave", before and before.rss),
                   ("after leave +5s", after and after.rss), ("end", end.rss)]
        print("router RSS MB: " + " | ".join(f"{name} {mb(value) if value else 'n/a'}"
                                           for name, value in figures))
        self.print_rates(base_start, start, end)
        self.print_log(router)
        self.print_abusers()
        flood = self.print_latency(base_start, start, end)
        self.print_goals(start, end, peak_rss, flood)

    def rates(self, first: Sample | None, last: Sample | None) -> list[float] | None:
        if first is None or last is None or last.at <= first.at:
            return None
        return [(last.delivered[i] - first.delivered[i]) / (last.at - first.at)
                for i in range(len(HEALTHY))]

    def print_rates(self, base_start, start, end) -> None:
        baseline, soak = self.rates(base_start, start), self.rates(start, end)
        if base_start and start and end.at > start.at:
            cpu = [(b.cpu - a.cpu) / (b.at - a.at) * 100
                   for a, b in ((base_start, start), (start, end))]
            print(f"router CPU: baseline {cpu[0]:.0f}% | soak {cpu[1]:.0f}%")
        if soak is None:
            print("healthy delivered/s: the soak phase did not run")
            return
        if baseline:
            self.kept = [s / b if b else 0.0 for s, b in zip(soak, baseline)]
            print("healthy delivered/s, baseline -> soak (kept): " + " | ".join(
                f"{HEALTHY[i]} {baseline[i]:.0f} -> {soak[i]:.0f} ({self.kept[i]:.0%})"
                for i in range(len(HEALTHY))))
        else:
            print("healthy delivered/s during the soak: " + " | ".join(
                f"{HEALTHY[i]} {soak[i]:.0f}" for i in range(len(HEALTHY))))
        print("healthy lost (published since its first message - delivered): " + " | ".join(
            f"{name} {lost}" for name, lost in zip(HEALTHY, self.lost)))
        gone = {name: s for name, s in self.exited.items() if s < len(self.samples) - 1}
        print("client processes that exited early: "
              + (" | ".join(f"{name} at {s} s" for name, s in gone.items()) or "none"))

    def print_log(self, router: RouterProcess) -> None:
        log = read_router_log(router.log_lines)
        print("router log, incidents by protocol and reason (counts held back in the last "
              "interval are not logged yet): " + joined_counts(log["incidents"]))
        print("router log, failed logins: " + joined_counts(log["logins"]))
        print(f"router log, disconnections: {sum(log['disconnections'].values())}")
        for line, n in log["disconnections"].most_common(8):
            print(f"    {n:7d}x {line[:150]}")
        print(f"router log, other warnings and errors: {sum(log['others'].values())}")
        for line, n in log["others"].most_common(8):
            print(f"    {n:7d}x {line[:150]}")

    def print_abusers(self) -> None:
        left = self.events.get("left")
        if left is None:
            print("misbehaving clients: did not leave (see the lines above)")
            return
        closed = left[1]
        print("stopped readers closed by the router before they left: " + " | ".join(
            f"{name} {'yes' if gone else 'no'}" for name, gone in closed["stopped"].items()))
        ready = self.events.get("ready", (0, 0, {}))[2]
        print("idle connections closed by the router before they left: " + " | ".join(
            f"{kind} {n}/{ready.get(kind, 0)}" for kind, n in closed["idle"].items()))
        flood = Counter(self.events.get("flood", ({}, None))[0])
        print(f"login flood: {sum(flood.values())} attempts: " + " | ".join(
            f"{key} {n}" for key, n in sorted(flood.items())))

    def print_latency(self, base_start, start, end) -> dict:
        sent, samples = self.pair
        print(f"latency pair: {sent} sent, {sent - len(samples)} lost")
        windows = [("baseline", base_start and base_start.at, start and start.at),
                   ("soak", start and start.at, end.at)]
        flood_window = self.events.get("flood", ({}, None))[1]
        if flood_window:
            windows.append(("login flood", *flood_window))
        results = {}
        for name, first, last in windows:
            results[name] = latency_figures(samples, first, last) if first else {}
            print(f"latency pair ms, {name}: {format_latency(results[name])}")
        return results.get("login flood", {})

    def print_goals(self, start: Sample | None, end: Sample, peak_rss: int, flood: dict) -> None:
        def goal(name: str, ok: bool | None, detail: str) -> None:
            verdict = "n/a " if ok is None else ("PASS" if ok else "FAIL")
            print(f"GOAL {name:44s} {verdict} ({detail})")

        goal(f"router RSS peak < {GOAL_RSS_PEAK_MB} MB", peak_rss < GOAL_RSS_PEAK_MB * 2**20,
             f"peak {mb(peak_rss)} MB")
        if start is None or "left" not in self.events:
            goal(f"RSS back within {GOAL_RSS_RETURN_MB} MB of start", None, "no leave")
        else:
            grown = end.rss - start.rss
            goal(f"RSS back within {GOAL_RSS_RETURN_MB} MB of start",
                 grown <= GOAL_RSS_RETURN_MB * 2**20,
                 f"start {mb(start.rss)} MB, end {mb(end.rss)} MB: {mb(grown)} MB more")
        if self.kept is None:
            goal(f"healthy receivers keep >= {GOAL_KEPT:.0%} of baseline", None, "no baseline")
        else:
            worst = min(range(len(HEALTHY)), key=self.kept.__getitem__)
            goal(f"healthy receivers keep >= {GOAL_KEPT:.0%} of baseline",
                 self.kept[worst] >= GOAL_KEPT, f"worst {HEALTHY[worst]} {self.kept[worst]:.0%}")
        if self.args.flood_rate <= 0:
            goal(f"pair p99 < {GOAL_FLOOD_P99_MS} ms during the login flood", None, "no flood")
            goal(f"pair max < {GOAL_FLOOD_MAX_MS} ms during the login flood", None, "no flood")
        elif not flood:
            goal(f"pair p99 < {GOAL_FLOOD_P99_MS} ms during the login flood", False, "no events")
            goal(f"pair max < {GOAL_FLOOD_MAX_MS} ms during the login flood", False, "no events")
        else:
            goal(f"pair p99 < {GOAL_FLOOD_P99_MS} ms during the login flood",
                 flood["p99_ms"] < GOAL_FLOOD_P99_MS, f"p99 {flood['p99_ms']:.1f} ms")
            goal(f"pair max < {GOAL_FLOOD_MAX_MS} ms during the login flood",
                 flood["max_ms"] < GOAL_FLOOD_MAX_MS, f"max {flood['max_ms']:.1f} ms")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=60, help="seconds of the soak phase")
    parser.add_argument("--warmup", type=int, default=5, help="seconds before measuring")
    parser.add_argument("--baseline", type=int,
                        help="seconds of the baseline phase, healthy clients only, before the "
                             "soak (default: a quarter of --duration; 0: none)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per load event")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="events/s per load publisher (0: as fast as the healthy receivers "
                             "take them)")
    parser.add_argument("--pair-rate", type=float, default=200.0,
                        help="events/s of the latency pair")
    parser.add_argument("--idle", type=int, default=2000, help="idle connections")
    parser.add_argument("--flood-rate", type=float, default=4.0,
                        help="failed logins/s during the flood (0: no flood)")
    parser.add_argument("--rss-limit", type=int, default=2048,
                        help="MB: above it the misbehaving clients leave early (machine safety)")
    for name, what in (("router-config-extra", "config.json keys"),
                       ("realm-extra", "realm file keys"),
                       ("listener-extra", "keys of every listener")):
        parser.add_argument(f"--{name}", type=json.loads, default={},
                            help=f"JSON object merged into the {what}")
    args = parser.parse_args(argv)
    for name in ("router_config_extra", "realm_extra", "listener_extra"):
        if not isinstance(getattr(args, name), dict):
            parser.error(f"--{name.replace('_', '-')} must be a JSON object")
    if args.baseline is None:
        args.baseline = max(1, round(args.duration / 4))
    if args.size < 1 + SEQUENCE.size:
        parser.error(f"--size must be at least {1 + SEQUENCE.size}")
    return args


def router_for(args: argparse.Namespace, workdir: Path) -> RouterProcess:
    """Production defaults (the failed-login back-off included, which the test harness
    relaxes), plus the --*-extra keys."""
    realm = realm_file(REALM, roles={"anonymous": OPEN_ROLE, "user": OPEN_ROLE},
                       principals={USER: {"role": "user", "ticket": hash_secret(SECRET)}})
    listeners = [merged(listener, args.listener_extra) for listener in LISTENERS]
    node = merged({"login_backoff": {}}, args.router_config_extra)
    return RouterProcess(workdir, [merged(realm, args.realm_extra)], listeners=listeners,
                         extra_config=node)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    limit = raise_fd_limit(args.idle + 1024)
    if limit < args.idle + 256:
        args.idle = max(0, limit - 256)
        print(f"open-file limit {limit}: idle connections reduced to {args.idle}")
    settings = Settings(args.size, args.rate, args.pair_rate, idle_plan(args.idle),
                        args.flood_rate)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    router = router_for(args, workdir).start()
    soak = Soak(args)
    peak_rss = 0
    try:
        soak.run(router, settings)
    finally:
        soak.finish()
        if router.proc.poll() is None:
            peak_rss = proc_stats(router.proc.pid)[1]
        with contextlib.suppress(AssertionError):  # killed after the timeout
            router.stop(timeout=20)
        shutil.rmtree(workdir, ignore_errors=True)
    soak.summary(router, peak_rss or max(s.rss for s in soak.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
