"""Retained messages as each receiver must get them, now that a retained backlog encodes
its plain QoS 0 PUBLISHes straight from the stored publication and writes a batch at once
(issue 28): per receiver the protocol version, the granted QoS, the retain flag, the MQTT 5
properties (user properties, content type, the message expiry interval that remains),
subscription identifiers and topic aliases, with real paho clients."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness import RouterProcess
from tests.mqtt_clients import V5, V311, mqtt_realm, publish_properties, unique

SENTINEL = b"sentinel"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("frames"), [mqtt_realm("realm1")],
                            listeners=[{"type": "mqtt", "host": "127.0.0.1", "port": 0,
                                        "realm": "realm1"}],
                            extra_config={"eventlog": {"enabled": False}}).start()
    yield process
    process.stop()


LONG = b"L" * 300
"""Over 127 bytes: a two-byte remaining length."""


def retain_mixed(publisher, root: str) -> dict[str, tuple[bytes, int]]:
    """Retain one message of each kind under ``root``; topic -> (payload, published QoS)."""
    kinds = {
        f"{root}/plain": (b"21.5C", 0, None),
        f"{root}/qos1": (b"one", 1, None),
        f"{root}/long": (LONG, 0, None),
        f"{root}/caf\u00e9": (b"utf-8 topic", 0, None),
        f"{root}/props": (b"{}", 0, publish_properties(
            UserProperty=[("unit", "C"), ("unit", "again")], ContentType="application/json")),
        f"{root}/expiring": (b"soon", 0, publish_properties(MessageExpiryInterval=100)),
    }
    for topic, (payload, qos, properties) in kinds.items():
        publisher.publish(topic, payload, qos, retain=True, properties=properties)
    publisher.publish(unique("barrier"), b"", 1)  # its PUBACK: the QoS 0 ones are in place
    return {topic: (payload, qos) for topic, (payload, qos, _) in kinds.items()}


def until_sentinel(client) -> dict:
    """The messages the client's subscription brought, by topic, up to the live sentinel
    published after them."""
    return {m.topic: m for m in client.collect_until(SENTINEL)}


def test_receivers_of_each_version_and_qos_get_their_own_frames(clients):
    root = unique("frames")
    publisher = clients(V5)
    published = retain_mixed(publisher, root)
    old, new = clients(V311), clients(V5)
    waited = time.time()
    old.subscribe((f"{root}/#", 0))
    new.subscribe((f"{root}/#", 1))
    publisher.publish(f"{root}/zz", SENTINEL, 1)
    got = {}
    for client, granted in ((old, 0), (new, 1)):
        got[granted] = until_sentinel(client)
        assert set(got[granted]) == set(published), client.version
        for topic, (payload, qos) in published.items():
            message = got[granted][topic]
            assert message.payload == payload and message.retain, topic
            assert message.qos == min(qos, granted), (topic, client.version)
    # MQTT 5 forwards the publisher's properties (3.1.1 has none to carry)
    props = got[1][f"{root}/props"].properties
    assert props.UserProperty == [("unit", "C"), ("unit", "again")]
    assert props.ContentType == "application/json"
    plain = got[1][f"{root}/plain"].properties
    assert not hasattr(plain, "UserProperty") and not hasattr(plain, "MessageExpiryInterval")
    # the interval that remains: what the publisher gave less the time it was kept
    remaining = got[1][f"{root}/expiring"].properties.MessageExpiryInterval
    assert 100 - (time.time() - waited) - 1 <= remaining <= 100


def test_subscription_identifier_and_topic_alias_on_retained(clients):
    root = unique("ids")
    publisher = clients(V5)
    published = retain_mixed(publisher, root)
    identified = clients(V5)
    aliased = clients(V5, connect_properties={"TopicAliasMaximum": 2})
    with_id = Properties(PacketTypes.SUBSCRIBE)
    with_id.SubscriptionIdentifier = 7
    identified.subscribe((f"{root}/#", 0), properties=with_id)
    aliased.subscribe((f"{root}/#", 0))
    publisher.publish(f"{root}/zz", SENTINEL, 1)
    got = until_sentinel(identified)
    assert set(got) == set(published)
    assert all(m.properties.SubscriptionIdentifier == [7] for m in got.values())
    got = until_sentinel(aliased)  # paho resolves the aliases to the topic names
    assert {t: m.payload for t, m in got.items()} == {t: p for t, (p, _) in published.items()}


def test_an_expired_retained_message_is_not_sent(clients):
    root = unique("expired")
    publisher = clients(V5)
    publisher.publish(f"{root}/gone", b"x", 0, retain=True,
                      properties=publish_properties(MessageExpiryInterval=1))
    publisher.publish(f"{root}/kept", b"y", 1, retain=True)
    time.sleep(2.2)  # the expiry itself is what is tested: the interval must pass
    subscriber = clients(V311)
    subscriber.subscribe((f"{root}/#", 0))
    publisher.publish(f"{root}/zz", SENTINEL, 1)
    assert {t: m.payload for t, m in until_sentinel(subscriber).items()} == {
        f"{root}/kept": b"y"}
