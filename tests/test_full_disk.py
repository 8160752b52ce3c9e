"""Truthful acknowledgements when the disk is full.

The store is capped with ``store.max_bytes``: at the cap SQLite fails every write that
needs a new page with "database or disk is full", exactly as on a full disk. An
acknowledgement that needs a write is then an error (WAMP, MQTT 5, AMQP) or, where the
protocol has no negative acknowledgement (MQTT 3.1.1), the connection closes; and
nothing is kept in memory as retained that a restart would not bring back.
"""

from __future__ import annotations

import pytest

from router.mqtt.packets import Puback, Publish, ReasonCode
from tests.clients import Sessions, raw_connect, run
from tests.harness import RouterProcess
from tests.mqtt_clients import V5, V311, ClientPool, RawMqtt, listeners, mqtt_realm, unique

PUBLISH, PUBLISHED, ERROR, SUBSCRIBE, SUBSCRIBED, EVENT = 16, 17, 8, 32, 33, 36
FULL = {"store": {"max_bytes": 40 * 4096}}
ROOMY = {"store": {"max_bytes": 64 * 1024 * 1024}}


def start(workdir, store: dict) -> RouterProcess:
    return RouterProcess(workdir, [mqtt_realm("realm1")], listeners=listeners("realm1"),
                         extra_config=store).start()


async def retain(client, request: int, topic: str, payload: str) -> list:
    client.send([PUBLISH, request, {"retain": True, "acknowledge": True}, topic, [payload]])
    return await client.recv()


async def retained_value(router, topic: str) -> list | None:
    """What a new get_retained subscriber of ``topic`` receives (None: nothing retained)."""
    client = await raw_connect(router, "websocket", "json")
    try:
        assert (await client.hello())[0] == 2
        client.send([SUBSCRIBE, 1, {"get_retained": True}, topic])
        assert (await client.recv())[0] == SUBSCRIBED
        client.send([PUBLISH, 2, {"acknowledge": True}, "com.full.sentinel", []])
        reply = await client.recv()  # retained events come before the PUBLISHED
        return reply[4] if reply[0] == EVENT else None
    finally:
        client.close()


def test_a_retained_event_that_was_not_stored_is_not_kept(tmp_path):
    router = start(tmp_path, FULL)
    kept = "com.full.kept"

    async def fill() -> None:
        async with Sessions(router) as sessions:
            client = await raw_connect(router, "websocket", "json")
            sessions.raw.append(client)
            assert (await client.hello())[0] == 2
            assert (await retain(client, 1, kept, "v1"))[0] == PUBLISHED
            for request in range(2, 500):
                reply = await retain(client, request, f"com.full.t{request}", "x" * 2000)
                if reply[0] == ERROR:
                    assert reply[4] == "wamp.error.unavailable", reply
                    failed = f"com.full.t{request}"
                    break
                assert reply[0] == PUBLISHED
            else:
                pytest.fail("the store never filled up")
            reply = await retain(client, 999, kept, "v2" + "y" * 8000)
            assert reply[0] == ERROR and reply[4] == "wamp.error.unavailable", reply
            assert await retained_value(router, failed) is None
            assert await retained_value(router, kept) == ["v1"]
            assert await retained_value(router, "com.full.t2") == ["x" * 2000]

    try:
        run(fill())
        router.wait_for_log(r"store: store_failed: router.sqlite3: .*full")
    finally:
        router.kill9()
    router = start(tmp_path, ROOMY)

    async def after_restart() -> None:
        assert await retained_value(router, kept) == ["v1"]
        assert await retained_value(router, "com.full.t2") == ["x" * 2000]

    try:
        run(after_restart())
    finally:
        router.stop()


def publish_until_full(router, topic: str, version: int) -> list[bytes]:
    """QoS 1 publishes until one is refused (MQTT 5) or the connection closes (3.1.1);
    returns the payloads that were acknowledged."""
    publisher = RawMqtt(router)
    publisher.connect_ok(version, client_id=unique("pub"))
    acknowledged = []
    for packet_id in range(1, 1000):
        payload = f"m{packet_id:04d}".encode() + b"z" * 1000
        publisher.send(Publish(topic, payload, 1, False, False, packet_id))
        if version == V311:
            try:
                ack = publisher.recv()
            except ConnectionError:
                break  # no negative PUBACK in 3.1.1: the router closed the connection
        else:
            ack = publisher.recv()
            if ack.reason_code == ReasonCode.UNSPECIFIED_ERROR:
                break
        assert isinstance(ack, Puback) and ack.packet_id == packet_id, ack
        acknowledged.append(payload)
    else:
        pytest.fail("the store never filled up")
    publisher.close()
    assert acknowledged
    return acknowledged


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_qos1_is_acknowledged_only_when_stored_and_acknowledged_means_delivered(
        tmp_path, version):
    router = start(tmp_path, FULL)
    topic = f"com/full/{unique('q')}"
    subscriber_id = unique("offline")
    pool = ClientPool(router)
    persistent = {"client_id": subscriber_id, "clean": False,
                  "session_expiry": 3600 if version == V5 else None}
    subscriber = pool(version, **persistent)
    subscriber.subscribe((topic, 1))
    subscriber.disconnect()  # offline: every QoS 1 message is queued on disk for it
    pool.close()

    try:
        acknowledged = publish_until_full(router, topic, version)
    finally:
        router.kill9()

    router = start(tmp_path, ROOMY)
    pool = ClientPool(router)
    try:
        subscriber = pool(version, **persistent)
        received = set()
        while len(received) < len(acknowledged):
            received.add(subscriber.next_message().payload)
        assert received == set(acknowledged)
    finally:
        pool.close()
        router.stop()
