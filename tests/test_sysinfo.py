"""``$SYS`` topics for MQTT clients and ``wamp.router.stats`` / ``wamp.router.on_stats`` for
WAMP clients, black box: real router, paho and autobahn clients."""

from __future__ import annotations

import pytest

from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import RouterProcess
from tests.mqtt_clients import (SECRETS, V5, V311, VERSION_IDS, VERSIONS, MqttClient, listeners,
                                mqtt_realm, unique)

RETAINED_COUNT = "$SYS/broker/retained messages/count"
UPTIME = "$SYS/broker/uptime"


STATS_READER = {"uri": "wamp.router.", "match": "prefix", "allow": ["call", "subscribe"]}
"""What a role needs to read the figures (realms/realm1.json gives it to anonymous)."""


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = mqtt_realm("realm1")
    realm["roles"]["anonymous"] = realm["roles"]["anonymous"] + [STATS_READER]
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


def test_loose_realm_sys_filter_gets_figures_and_client_topics(tmp_path):
    """Where '$SYS' is a valid level (a loose realm) clients may publish under it: a '$SYS/#'
    subscription gets those and the router's figures on the same subscription."""
    realm = mqtt_realm("loose", uri_check="loose")
    realm["roles"]["anonymous"] = realm["roles"]["anonymous"] + [STATS_READER]
    process = RouterProcess(tmp_path, [realm], listeners=listeners("loose", wamp=False),
                            extra_config={"sys_interval": 0.2}).start()
    watcher, publisher = MqttClient(process), MqttClient(process)
    try:
        watcher.connect()
        publisher.connect()
        assert watcher.subscribe(("$SYS/#", 0)) == [0]
        assert until(watcher, UPTIME).retain
        publisher.publish(f"$SYS/{unique('c')}", b"from a client", 0)
        assert until(watcher, "", lambda m: m.payload == b"from a client") is not None
    finally:
        watcher.close()
        publisher.close()
        process.stop()
