"""The benchmarks' lean clients speak correct WAMP: what they measure is delivered for real."""

from __future__ import annotations

import pytest

from tests.clients import COMBINATIONS, raw_connect, run

SUBSCRIBE, SUBSCRIBED, PUBLISH, PUBLISHED, EVENT = 32, 33, 16, 17, 36


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_lean_clients_publish_in_batches_and_receive_every_event(router, transport,
                                                                 serializer):
    big = "x" * 70_000  # a 64-bit WebSocket length both ways

    async def scenario():
        subscriber = await raw_connect(router, transport, serializer, lean=True)
        publisher = await raw_connect(router, transport, serializer, lean=True)
        assert (await subscriber.hello())[0] == 2 and (await publisher.hello())[0] == 2
        subscriber.send([SUBSCRIBE, 1, {}, "com.bench.lean"])
        assert (await subscriber.recv())[0] == SUBSCRIBED
        publisher.send_many([[PUBLISH, n, {}, "com.bench.lean", [n, b"\x00\xff"]]
                             for n in range(1, 50)])
        publisher.send([PUBLISH, 50, {"acknowledge": True}, "com.bench.lean", [50, big]])
        assert (await publisher.recv())[0] == PUBLISHED
        events = [await subscriber.recv() for _ in range(50)]
        assert [event[0] for event in events] == [EVENT] * 50
        assert [event[4][0] for event in events] == list(range(1, 51))
        assert events[0][4][1] == b"\x00\xff" and events[-1][4][1] == big
        subscriber.close()
        publisher.close()

    run(scenario())


def test_lean_websocket_client_checks_the_handshake(router):
    host, port, _ = router.address("websocket")

    class WrongPath:
        @staticmethod
        def address(transport):
            return host, port, "/nowhere"

    async def scenario():
        with pytest.raises(ConnectionError, match="handshake refused"):
            await raw_connect(WrongPath, "websocket", "json", lean=True)

    run(scenario())
