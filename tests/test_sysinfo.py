"""``$SYS`` topics for MQTT clients and ``wamp.router.stats`` / ``wamp.router.on_stats`` for
WAMP clients, black box: real router, paho and autobahn clients."""

from __future__ import annotations

import pytest

from router.core.credentials import hash_secret
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import RouterProcess
from tests.mqtt_clients import (SECRETS, V5, V311, VERSION_IDS, VERSIONS, MqttClient, listeners,
                                mqtt_realm, unique)

RETAINED_COUNT = "$SYS/broker/retained messages/count"
UPTIME = "$SYS/broker/uptime"
SYS_FIGURES = 14
"""How many $SYS/broker/ topics the router publishes."""


STATS_READER = {"uri": "wamp.router.", "match": "prefix", "allow": ["call", "subscribe"]}
"""What a role needs to read the WAMP figures (realms/realm1.json gives it to anonymous)."""
SYS_READER = {"uri": "$SYS", "match": "prefix", "allow": ["subscribe"]}
"""A rule on the levels ``$SYS``...: what a role needs to read the ``$SYS`` topics (the
catch-all prefix rule of mqtt_realm's open roles covers them too)."""
SYS_SECRET = "sys-secret"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = mqtt_realm("realm1")
    realm["roles"]["anonymous"] = realm["roles"]["anonymous"] + [STATS_READER]
    realm["roles"]["sys"] = [SYS_READER]
    realm["principals"]["sys"] = {"role": "sys", "ticket": hash_secret(SYS_SECRET, 1000)}
    process = RouterProcess(tmp_path_factory.mktemp("sys"), [realm],
                            listeners=listeners("realm1"),
                            extra_config={"sys_interval": 0.2}).start()
    yield process
    process.stop()


def until(client: MqttClient, topic: str, accept=lambda message: True):
    """The next message on ``topic`` ("": any) that ``accept`` takes (others skipped)."""
    while True:
        message = client.next_message()
        if topic in ("", message.topic) and accept(message):
            return message


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_sys_retained_on_subscribe_then_live_changes(router, version):
    watcher = MqttClient(router, version=version)
    publisher = MqttClient(router)
    try:
        watcher.connect()
        publisher.connect()
        watcher.subscribe(("$SYS/#", 0))
        first = until(watcher, RETAINED_COUNT)
        assert first.retain
        if int(first.payload) < SYS_FIGURES:  # the router's first interval: the $SYS
            # figures are retained messages themselves, counted from the next one on
            first = until(watcher, RETAINED_COUNT, lambda m: int(m.payload) >= SYS_FIGURES)
        count = int(first.payload)
        publisher.publish(f"com/sys/{unique('r')}", b"kept", qos=1, retain=True)
        changed = until(watcher, RETAINED_COUNT, lambda m: int(m.payload) != count)
        assert int(changed.payload) == count + 1
        assert not changed.retain  # a live update on an existing subscription (MQTT-3.3.1-9)
        uptime = until(watcher, UPTIME)
        assert uptime.payload.decode().endswith(" seconds")
    finally:
        watcher.close()
        publisher.close()


def test_sys_counts_received_messages(router):
    watcher = MqttClient(router)
    publisher = MqttClient(router)
    topic = "$SYS/broker/messages/received"
    try:
        watcher.connect()
        publisher.connect()
        watcher.subscribe((topic, 0))
        before = int(until(watcher, topic).payload)
        for n in range(5):
            publisher.publish(f"com/sys/{unique('m')}", b"x", qos=1)
        # other tests' traffic may add to it, never take away
        assert int(until(watcher, topic, lambda m: int(m.payload) >= before + 5).payload) \
            >= before + 5
    finally:
        watcher.close()
        publisher.close()


@pytest.mark.parametrize("version,refused", [(V5, 0x87), (V311, 0x80)],
                         ids=["v5", "v311"])
def test_sys_refused_to_a_role_that_may_not_read_stats(router, version, refused):
    client = MqttClient(router, version=version, username="limited",
                        password=SECRETS["limited"])
    try:
        client.connect()
        assert client.subscribe(("$SYS/#", 0), ("com/x", 0)) == [refused, 0]
    finally:
        client.close()


def test_wildcard_filters_do_not_match_sys(router):
    everything = MqttClient(router)
    watcher = MqttClient(router)
    try:
        everything.connect()
        watcher.connect()
        everything.subscribe(("#", 0), ("+/broker/uptime", 0))
        watcher.subscribe((UPTIME, 0))
        until(watcher, UPTIME, lambda m: not m.retain)  # an interval's publication happened
        everything.publish(f"com/sys/{unique('s')}", b"sentinel", qos=1)
        seen = [message.topic for message in everything.collect_until(b"sentinel")]
        assert not [topic for topic in seen if topic.startswith("$")]
    finally:
        everything.close()
        watcher.close()


def test_wamp_stats_procedure_and_meta_topic(router):
    async def scenario():
        session = await wamp_connect(router)
        stats = await session.call("wamp.router.stats")
        events = await session.events("wamp.router.on_stats")
        published = (await next_item(events))[0][0]
        await session.close()
        return stats, published

    stats, published = run(scenario())
    assert stats["clients/connected"] >= 1
    assert set(stats) == set(published)
    assert {"messages/received", "messages/sent", "retained messages/count", "uptime",
            "subscriptions/count", "bytes/received", "bytes/sent"} <= set(stats)


def test_a_rule_on_sys_levels_grants_reading_only_them(router):
    client = MqttClient(router, username="sys", password=SYS_SECRET)
    try:
        client.connect()
        assert client.subscribe((UPTIME, 0), ("com/x", 0)) == [0, 0x87]
        assert until(client, UPTIME).retain
    finally:
        client.close()


def test_clients_cannot_publish_on_sys(router):
    watcher, publisher = MqttClient(router), MqttClient(router)
    try:
        watcher.connect()
        publisher.connect()
        watcher.subscribe(("$SYS/broker/fake", 0), ("com/sys/sentinel", 0))
        publisher.publish("$SYS/broker/fake", b"forged", qos=1)
        publisher.publish("com/sys/sentinel", b"sentinel", qos=1)
        assert until(watcher, "").payload == b"sentinel"
    finally:
        watcher.close()
        publisher.close()


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_a_persistent_session_keeps_its_sys_subscription(router, version):
    client_id = unique("sys")
    expiry = 300 if version == V5 else None
    first = MqttClient(router, version=version, client_id=client_id, clean=False,
                       session_expiry=expiry)
    try:
        first.connect()
        first.subscribe((UPTIME, 1))
        until(first, UPTIME)
    finally:
        first.close()
    again = MqttClient(router, version=version, client_id=client_id, clean=False,
                       session_expiry=expiry)
    try:
        assert again.connect().session_present
        assert until(again, UPTIME, lambda m: not m.retain).payload.endswith(b" seconds")
    finally:
        again.close()
