"""Back-pressure, black box: clients that stop reading, publishers faster than the disk.

A "stalled" client completes its handshake and subscribes, then stops reading its
socket (asyncio ``pause_reading`` or a blocking socket nobody reads, with a small
receive buffer). The publisher writes 1 KB events in batches and, before each batch,
waits until a healthy subscriber on the same topic has caught up to within a window:
the healthy one keeps up, so it must get every event, while the stalled one must cost
the router a bounded amount of memory, be dropped from (counted), and be disconnected
after ``slow_consumer_timeout``. Memory is the router's VmRSS; the bounds leave room
for Python's allocator, which does not always return freed memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import pytest
from router.mqtt.packets import Subscribe, SubscriptionOptions
from tests.amqp_clients import Receive
from tests.amqp_clients import connect as amqp_connect
from tests.clients import raw_connect, run
from tests.harness import RouterProcess, realm_file
from tests.lean_websocket import masked_frame
from tests.mqtt_clients import V5, RawMqtt, unique
from tests.retention_helpers import EVENT, joined, publish, subscribe

FLOW = {"max_buffered_bytes": 256 * 1024, "max_buffered_messages": 1000,
        "slow_consumer_timeout": 1}
PAYLOAD = "x" * 1024
EVENTS = 20_000
BATCH = 100
WINDOW = 1000
SMALL_RCVBUF = 4096
QUICK_STOP = {"shutdown_timeout": 0.2}
"""Clients still connected at the end need not be waited for."""
GROWTH_MB = 15
"""Allowed VmRSS growth while 20 MB of events pass a stalled client. Measured: under
1 MB with the bound (the MQTT QoS 1 queue adds up to its 6,000 messages), about 39 MB
for 40 MB of events without it (test_the_bound_is_what_keeps_memory_flat)."""


@pytest.fixture
def router(tmp_path):
    listeners = [dict(type="rawsocket", host="127.0.0.1", port=0, **FLOW),
                 dict(type="websocket", host="127.0.0.1", port=0, path="/ws", **FLOW),
                 dict(type="mqtt", host="127.0.0.1", port=0, realm="realm1", **FLOW),
                 dict(type="amqp", host="127.0.0.1", port=0, realm="realm1", **FLOW)]
    realm = realm_file("realm1", mqtt={"max_queued": 6000}, wamp={"max_unacked": 20})
    process = RouterProcess(tmp_path, [realm], listeners=listeners,
                            extra_config={"eventlog": {"enabled": False}, **QUICK_STOP}).start()
    yield process
    process.stop()


def rss_mb(router) -> float:
    with open(f"/proc/{router.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def stall(sock: socket.socket) -> None:
    """Make the client's receive buffer small, so the router's buffer is what fills."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)


async def publish_paced(topic: str, router, healthy, count: int = EVENTS, **options) -> int:
    """Publish ``count`` events (arguments: their number and 1 KB), never more than WINDOW
    ahead of ``healthy``; returns how many ``healthy`` received (all of them, or it raises
    on a 10 s silence)."""
    publisher = await joined(router, "rawsocket", "msgpack")
    received = sent = 0
    while sent < count:
        batch = min(BATCH, count - sent)
        publisher.send_many([[16, publisher.next_request(), options, topic, [n, PAYLOAD]]
                             for n in range(sent, sent + batch)])
        sent += batch
        while received < sent - WINDOW or (sent == count and received < count):
            message = await healthy.recv()
            assert message[0] == EVENT, message
            received += 1
    publisher.close()
    return received


async def healthy_subscriber(router, topic: str):
    healthy = await joined(router, "rawsocket", "msgpack")
    await subscribe(healthy, topic)
    return healthy


@pytest.mark.parametrize("transport", ["rawsocket", "websocket"])
def test_a_stalled_wamp_subscriber_is_bounded_dropped_and_disconnected(router, transport):
    async def scenario():
        topic = f"bp.wamp.{transport}"
        healthy = await healthy_subscriber(router, topic)
        stalled = await joined(router, transport, "json")
        await subscribe(stalled, topic)
        stall(stalled.transport.get_extra_info("socket"))
        stalled.transport.pause_reading()
        start = rss_mb(router)
        assert await publish_paced(topic, router, healthy) == EVENTS
        grown = rss_mb(router) - start
        router.wait_for_log(rf"realm1, wamp: slow_consumer.*session {stalled.session_id}")
        router.wait_for_log(rf"realm1, wamp: disconnected: session {stalled.session_id}: "
                            "slow consumer", timeout=10)
        stalled.transport.resume_reading()
        await asyncio.wait_for(stalled.closed, 10)
        assert grown < GROWTH_MB, f"the router grew {grown:.0f} MB"
        # the stalled client is gone: the healthy one is still served at once
        assert await publish_paced(topic, router, healthy, count=10) == 10
        assert rss_mb(router) - start < GROWTH_MB

    run(scenario(), timeout=120)


@pytest.mark.parametrize("path,protocol,hello", [
    ("/ws", "wamp.2.json", json.dumps([1, "realm1", {"roles": {"subscriber": {}}}]).encode()),
    ("/mqtt", "mqtt", None)])
def test_a_client_that_pings_and_never_reads_is_bounded_and_disconnected(tmp_path, path,
                                                                         protocol, hello):
    # every WebSocket ping was answered, and a client that did not read piled the pongs up
    # in the router without bound (940,000 pings in 30 s: +145 MB), never disconnected
    listeners = [dict(type="websocket", host="127.0.0.1", port=0, path="/ws", **FLOW),
                 dict(type="mqtt-websocket", host="127.0.0.1", port=0, path="/mqtt",
                      realm="realm1", **FLOW)]
    router = RouterProcess(tmp_path, [realm_file("realm1")], listeners=listeners,
                           extra_config=QUICK_STOP).start()
    try:
        host, port, _ = router.address("websocket" if path == "/ws" else "mqtt-websocket")
        sock = socket.socket()
        stall(sock)
        sock.connect((host, port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n"
                     "\r\n".encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 101")
        if hello is not None:
            sock.sendall(masked_frame(0x1, hello))
        pings = masked_frame(0x9, b"p" * 125) * 1000
        start = rss_mb(router)
        sock.settimeout(30)
        with pytest.raises(OSError):  # reset or broken pipe, once the router closes it
            for _ in range(1000):  # a million pings at most (127 MB of pongs)
                sock.sendall(pings)
        assert rss_mb(router) - start < GROWTH_MB
        router.wait_for_log("stayed over its outbound bound for 1s: disconnecting")
    finally:
        router.stop()


def test_the_bound_is_what_keeps_memory_flat(tmp_path):
    """The same stalled reader without a practical bound: memory grows with what was
    published (this is what the bound of the other tests prevents)."""
    unbounded = dict(FLOW, max_buffered_bytes=2 ** 30, max_buffered_messages=10 ** 9)
    router = RouterProcess(tmp_path, [realm_file("realm1")],
                           listeners=[dict(type="rawsocket", host="127.0.0.1", port=0,
                                           **unbounded)],
                           extra_config={"eventlog": {"enabled": False}, **QUICK_STOP}).start()

    async def scenario():
        healthy = await healthy_subscriber(router, "bp.flat")
        stalled = await joined(router, "rawsocket", "json")
        await subscribe(stalled, "bp.flat")
        stall(stalled.transport.get_extra_info("socket"))
        stalled.transport.pause_reading()
        start = rss_mb(router)
        assert await publish_paced("bp.flat", router, healthy, count=2 * EVENTS) == 2 * EVENTS
        assert rss_mb(router) - start > 2 * GROWTH_MB

    try:
        run(scenario(), timeout=120)
    finally:
        router.stop()


def test_a_stalled_mqtt_qos0_subscriber_is_dropped_from_and_disconnected(router):
    async def scenario():
        healthy = await healthy_subscriber(router, "bp.mqtt.qos0")
        stalled = RawMqtt(router)
        stalled.connect_ok(V5, unique("stalled"))
        await stalled_mqtt_is_cut_off(router, healthy, stalled, 0, "slow_consumer")

    run(scenario(), timeout=120)


async def stalled_mqtt_is_cut_off(router, healthy, stalled: RawMqtt, qos: int,
                                  incident: str) -> None:
    """``stalled`` subscribes at ``qos`` and stops reading while EVENTS are published: the
    router counts ``incident``, cuts it off, and grows less than GROWTH_MB meanwhile."""
    topic = f"bp.mqtt.qos{qos}"
    stalled.send(Subscribe(1, [(topic.replace(".", "/"), SubscriptionOptions(qos))]))
    assert stalled.recv().packet_id == 1
    stall(stalled.sock)
    start = rss_mb(router)
    assert await publish_paced(topic, router, healthy, **({"_qos": qos} if qos else {})) \
        == EVENTS
    grown = rss_mb(router) - start
    router.wait_for_log(rf"realm1, mqtt: {incident}")
    router.wait_for_log(r"realm1, mqtt: disconnected: client stalled_\S+: slow consumer")
    stalled.wait_closed(timeout=10)
    assert grown < GROWTH_MB, f"the router grew {grown:.0f} MB"


def test_a_stalled_mqtt_qos1_subscriber_keeps_its_bounded_queue_then_is_disconnected(router):
    """QoS 1 is never dropped for a paused transport, only held: the session's queue
    (max_queued 6,000, more than the kernel's socket buffers take) is the bound, and
    a queue full while the transport is paused is the slow consumer's sign."""

    async def scenario():
        healthy = await healthy_subscriber(router, "bp.mqtt.qos1")
        stalled = RawMqtt(router)
        stalled.connect_ok(V5, unique("stalled"))
        await stalled_mqtt_is_cut_off(router, healthy, stalled, 1, "queue_full")

    run(scenario(), timeout=120)


def test_mqtt_qos1_held_while_the_client_stalls_is_all_delivered_when_it_reads_again(router):
    """6 MB of QoS 1 to a client that does not read, more than the kernel's socket
    buffers take (4 MB send buffer at most here): what the paused connection cannot take
    waits in the session queue, and reading again (without acknowledging: only the
    drained transport can trigger the rest) delivers all of it, in order (under
    max_queued, so nothing is dropped, and never over the bound, so nobody is cut off).
    The receive buffer keeps its default size: a shrunken TCP window would not open
    again for the catch-up."""
    count = 5800

    async def scenario():
        healthy = await healthy_subscriber(router, "bp.mqtt.resume")
        stalled = RawMqtt(router)
        stalled.connect_ok(V5, unique("stalled"))
        stalled.send(Subscribe(1, [("bp/mqtt/resume", SubscriptionOptions(1))]))
        assert stalled.recv().packet_id == 1
        assert await publish_paced("bp.mqtt.resume", router, healthy, count, _qos=1) == count
        packets = [stalled.recv() for _ in range(count)]  # no PUBACK: only the drain pumps
        assert [json.loads(packet.payload)[0] for packet in packets] == list(range(count))

    run(scenario(), timeout=120)


def test_a_stalled_amqp_receiver_is_dropped_from_and_disconnected(router):
    connection = amqp_connect(router)
    # a large credit lets the router send; not calling receive() leaves the socket unread
    connection.create_receiver("bp.amqp", credit=100_000, options=Receive(0))

    async def scenario():
        healthy = await healthy_subscriber(router, "bp.amqp")
        start = rss_mb(router)
        assert await publish_paced("bp.amqp", router, healthy) == EVENTS
        grown = rss_mb(router) - start
        router.wait_for_log(r"realm1, amqp: slow_consumer")
        router.wait_for_log(r"realm1, amqp: disconnected: \S+: slow consumer")
        assert grown < GROWTH_MB, f"the router grew {grown:.0f} MB"

    try:
        run(scenario(), timeout=120)
    finally:
        connection.timeout = 1  # the router has dropped it: do not wait for its close
        with contextlib.suppress(Exception):
            connection.close()


def test_wamp_acknowledged_delivery_is_bounded_by_max_unacked(router):
    async def scenario():
        subscriber = await joined(router)
        await subscribe(subscriber, "bp.acked", _qos=1)
        publisher = await joined(router)
        publications = [await publish(publisher, "bp.acked", ["n"], _qos=1) for _ in range(25)]
        events = [await subscriber.recv() for _ in range(20)]  # max_unacked is 20
        assert [event[2] for event in events] == publications[:20]
        router.wait_for_log(rf"realm1, wamp: unacknowledged: session {subscriber.session_id}")
        subscriber.send([337, publications[0]])  # one answered: room for one more
        # and handled before the next publish (a later message on the same connection is
        # answered after it; the publisher's connection is another, unordered with it)
        await subscribe(subscriber, "bp.acked.barrier")
        later = await publish(publisher, "bp.acked", ["n"], _qos=1)
        assert (await subscriber.recv())[2] == later

    run(scenario())


def test_publishers_are_paused_while_the_store_is_behind_and_nothing_is_lost(tmp_path):
    router = RouterProcess(tmp_path, [realm_file("realm1")],
                           listeners=[{"type": "rawsocket", "host": "127.0.0.1", "port": 0}],
                           extra_config={"store": {"max_queued_writes": 10},
                                         "eventlog": {"enabled": False}, **QUICK_STOP}).start()

    async def scenario():
        publisher = await raw_connect(router, "rawsocket", "msgpack")
        await publisher.hello()
        requests = [publisher.next_request() for _ in range(2000)]
        publisher.send_many([[16, request, {"acknowledge": True, "retain": True},
                              f"bp.store.t{request % 500}", [request]] for request in requests])
        acknowledged = {(await publisher.recv())[1] for _ in requests}
        assert acknowledged == set(requests)
        router.wait_for_log(r"store writer behind: pausing reading from 1 publishing")
        router.wait_for_log(r"store writer caught up: resuming reading from 1 publishing")

    async def stored():
        reader = await joined(router)
        await subscribe(reader, "bp.store.t7", get_retained=True)
        return (await reader.recv())[4]

    try:
        run(scenario())
        router.stop()
        router.start()  # what was acknowledged is on disk: the last value of each topic
        assert run(stored()) == [1507]  # the last of requests 7, 507, 1007, 1507 (t7)
    finally:
        router.stop()
