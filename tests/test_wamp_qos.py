"""WAMP acknowledged delivery: QoS >= 1 for WAMP subscribers via EVENT_RECEIVED."""

from __future__ import annotations

import json

import pytest

from tests.clients import connect, next_item, raw_connect, run
from tests.harness import RouterProcess, realm_file
from tests.retention_helpers import EVENT, joined, publish, subscribe


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = realm_file("realm1", wamp={"granted_qos": 1, "ack_timeout": 0.3,
                                       "max_redeliveries": 2})
    process = RouterProcess(tmp_path_factory.mktemp("wampqos"), [realm],
                            extra_config={"eventlog": {"flush_interval": 0.1}}).start()
    yield process
    process.stop()


def test_router_announces_acknowledged_event_delivery(router):
    async def scenario():
        client = await raw_connect(router)
        welcome = await client.hello()
        assert welcome[2]["roles"]["broker"]["features"]["x_acknowledged_event_delivery"] is True

    run(scenario())


def test_qos1_publication_reaches_granted_subscriber_with_ack_request(router):
    async def scenario():
        subscriber = await joined(router, "websocket", "json")
        await subscribe(subscriber, "com.qos.acked")
        publisher = await joined(router)
        qos1 = await publish(publisher, "com.qos.acked", ["important"], _qos=1)
        qos0 = await publish(publisher, "com.qos.acked", ["whatever"])
        first, second = await subscriber.recv(), await subscriber.recv()
        assert first[0] == EVENT and first[2] == qos1
        assert first[3].get("x_acknowledged_delivery") is True
        assert second[2] == qos0 and "x_acknowledged_delivery" not in second[3]
        subscriber.send([337, qos1])
        marker = await publish(publisher, "com.qos.acked", ["marker"])
        assert (await subscriber.recv())[2] == marker  # acknowledged: no redelivery first

    run(scenario())


def test_unacknowledged_event_is_delivered_again_then_given_up(router):
    async def scenario():
        subscriber = await joined(router)
        await subscribe(subscriber, "com.qos.redeliver")
        publisher = await joined(router)
        publication = await publish(publisher, "com.qos.redeliver", ["again"], _qos=2)
        deliveries = [await subscriber.recv(timeout=5) for _ in range(3)]
        assert [d[2] for d in deliveries] == [publication] * 3  # first + 2 redeliveries
        marker = await publish(publisher, "com.qos.redeliver", ["marker"], _qos=0)
        assert (await subscriber.recv(timeout=5))[2] == marker  # no fourth copy

    run(scenario())


def test_subscriber_may_ask_for_qos0_and_autobahn_acknowledges(tmp_path):
    router = RouterProcess(tmp_path, [realm_file("realm1", wamp={"granted_qos": 1})],
                           extra_config={"eventlog": {"flush_interval": 0.1}}).start()

    async def scenario():
        opted_out = await joined(router)
        await subscribe(opted_out, "com.qos.optout", _qos=0)
        acking = await connect(router, "rawsocket", "msgpack")
        events = await acking.events("com.qos.optout")
        publisher = await joined(router)
        publication = await publish(publisher, "com.qos.optout", ["x"], _qos=1)
        plain = await opted_out.recv()
        assert plain[2] == publication and "x_acknowledged_delivery" not in plain[3]
        args, _, details = await next_item(events)
        assert args == ["x"] and details.publication == publication
        await acking.close()

    try:
        run(scenario())
    finally:
        assert router.stop() == 0
    logs = router.workdir / "data" / "eventlog" / "realm=realm1"
    acks = [json.loads(line) for path in logs.rglob("*.jsonl")
            for line in path.read_text().splitlines() if '"kind":"ack"' in line]
    assert any(a["topic"] == "com.qos.optout" and a["latency_ms"] >= 0 for a in acks)
