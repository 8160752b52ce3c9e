"""The router's own sends (``router/flow.py``'s ``TurnWriter``), black box over real sockets.

What a reactor turn writes to a WAMP connection goes out at the end of the turn in one
``send`` by the router, not through the reactor's write watch. These tests hold it to what
``transport.write`` gave: every byte in order when the client reads late (the kernel takes
part, Twisted's buffer the rest), and the listener's byte counter true. A client that does
not read at all is bounded and disconnected as before: tests/test_backpressure.py.
"""

from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from tests.clients import msgpack_frame, run
from tests.harness import RouterProcess, realm_file
from tests.metrics_scrape import delta, scrape
from tests.retention_helpers import EVENT, PUBLISHED, joined, subscribe

BURST = 10_000
"""1 KB events: 10 MB, more than the socket buffers take (Linux: at most 4 MB sent, and the
receive buffer of a client that has not read stays small), so Twisted's buffer holds the rest."""
ROOMY = {"max_buffered_bytes": 64 * 2**20, "max_buffered_messages": 100_000,
         "max_message_size": 2**24}
"""An outbound bound the burst stays under (the bound itself: tests/test_backpressure.py)."""


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    listeners = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws", **ROOMY},
                 {"type": "rawsocket", "host": "127.0.0.1", "port": 0, **ROOMY},
                 {"type": "metrics", "host": "127.0.0.1", "port": 0}]
    process = RouterProcess(tmp_path_factory.mktemp("turn-writes"), [realm_file("realm1")],
                            listeners=listeners,
                            extra_config={"eventlog": {"enabled": False}}).start()
    yield process
    process.stop()


async def paused_reader_and_publisher(router, transport: str, topic: str):
    """A subscriber on ``transport`` to ``topic`` that does not read (asyncio's
    ``pause_reading``), and a RawSocket publisher."""
    reader = await joined(router, transport, "msgpack")
    await subscribe(reader, topic)
    reader.transport.pause_reading()
    return reader, await joined(router, "rawsocket", "msgpack")


@pytest.mark.parametrize("transport", ["rawsocket", "websocket"])
def test_a_burst_read_late_arrives_whole_and_in_order(router, transport):
    """The subscriber does not read while the burst is written: the router's sends fill its
    socket buffers, the rest waits in Twisted's buffer; once it reads, every event arrives
    once, in publish order."""
    async def scenario():
        topic = f"turn.burst.{transport}"
        reader, publisher = await paused_reader_and_publisher(router, transport, topic)
        payload = "x" * 1024
        for start in range(0, BURST, 100):
            publisher.send_many([[16, publisher.next_request(), {}, topic, [n, payload]]
                                 for n in range(start, start + 100)])
        last = publisher.next_request()
        publisher.send([16, last, {"acknowledge": True}, topic, [BURST, payload]])
        reply = await publisher.recv()
        assert reply[:2] == [PUBLISHED, last], reply  # every event was written to the reader
        reader.transport.resume_reading()
        numbers = []
        while len(numbers) < BURST + 1:
            message = await reader.recv(timeout=20)
            assert message[0] == EVENT, message
            numbers.append(message[4][0])
        assert numbers == list(range(BURST + 1))
        publisher.close()
        reader.close()

    run(scenario(), timeout=90)


@pytest.mark.parametrize("transport", ["rawsocket", "websocket"])
def test_one_write_larger_than_the_socket_buffers_is_sent_whole(router, transport):
    """A single 12 MB event, the turn's only write to the reader: the kernel takes a part of
    it, the reactor must send the rest once the reader reads (nothing else is written)."""
    async def scenario():
        topic = f"turn.big.{transport}"
        reader, publisher = await paused_reader_and_publisher(router, transport, topic)
        request = publisher.next_request()
        publisher.send([16, request, {"acknowledge": True}, topic, ["y" * (12 * 2**20)]])
        reply = await publisher.recv(timeout=20)
        assert reply[:2] == [PUBLISHED, request], reply
        reader.transport.resume_reading()
        message = await reader.recv(timeout=20)
        assert message[0] == EVENT and len(message[4][0]) == 12 * 2**20
        publisher.close()
        reader.close()

    run(scenario(), timeout=60)


def test_the_sent_bytes_counter_counts_what_the_client_received(router):
    """One RawSocket client publishes to itself: the listener's ``router_sent_bytes_total``
    moved by exactly the bytes the client read (handshake, WELCOME, SUBSCRIBED, events)."""
    before = scrape(router)
    host, port, _ = router.address("rawsocket")
    received = bytearray()
    with socket.create_connection((host, port), timeout=20) as sock:
        def read_message() -> list:
            while True:
                if len(received) - offset[0] >= 4:
                    length, = struct.unpack_from("!I", received, offset[0])
                    end = offset[0] + 4 + length
                    if len(received) >= end:
                        message = msgpack.unpackb(bytes(received[offset[0] + 4:end]))
                        offset[0] = end
                        return message
                chunk = sock.recv(65536)
                assert chunk, "closed by the router"
                received.extend(chunk)

        sock.sendall(bytes([0x7F, 0xF2, 0, 0]))
        while len(received) < 4:
            received.extend(sock.recv(4 - len(received)))
        offset = [4]
        sock.sendall(msgpack_frame([1, "realm1", {"roles": {"publisher": {}, "subscriber": {}}}]))
        assert read_message()[0] == 2  # WELCOME
        sock.sendall(msgpack_frame([32, 1, {}, "turn.count"]))
        assert read_message()[0] == 33  # SUBSCRIBED
        sock.sendall(b"".join(msgpack_frame([16, 2 + n, {"exclude_me": False}, "turn.count", [n]])
                              for n in range(200)))
        assert [read_message()[4][0] for _ in range(200)] == list(range(200))
        after = scrape(router)
    assert delta(before, after, "router_sent_bytes_total", protocol="wamp") == len(received)
