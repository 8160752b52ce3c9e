"""MQTT 5 features on the realm exactly as shipped, with two independent clients.

``realms/realm1.json`` runs unchanged (default ``mqtt`` settings): paho and the
mosquitto command-line clients use shared subscriptions, overlapping subscriptions
with identifiers, topic aliases both ways, the server keep alive and retained
messages on wildcards over topics WAMP could not name. test_topics.py covers the
topic space itself; this file covers the MQTT 5 features over it.
"""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness import RouterProcess
from tests.mqtt_clients import V5, V311, MosquittoSub, mosquitto, options, unique
from tests.test_mqtt5_completeness import identifier, identifiers
from tests.test_topics import SHIPPED_REALM

LISTENERS = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
SHIPPED_MAX_KEEPALIVE = 65535
SHIPPED_ALIAS_MAXIMUM = 16


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("shipped"), [SHIPPED_REALM],
                            listeners=LISTENERS).start()
    yield process
    process.stop()


def test_overlapping_subscriptions_arrive_once_with_every_identifier(clients):
    base = unique("Home")
    client = clients(V5)
    assert client.subscribe((f"{base}/#", options(1)), properties=identifier(1)) == [1]
    assert client.subscribe((f"{base}/+/Temp", options(0)), properties=identifier(2)) == [0]
    clients(V5).publish(f"{base}/Living Room/Temp", b"21.5", 1)
    clients(V5).publish(f"{base}/end", b"end", 0)
    message = client.next_message()
    assert (message.topic, message.payload, message.qos, identifiers(message)) == \
        (f"{base}/Living Room/Temp", b"21.5", 1, [1, 2])
    assert client.next_message().payload == b"end"  # and no second copy before it


def test_a_shared_group_of_paho_and_mosquitto_members_gets_each_message_once(router, clients):
    base = unique("Fleet")
    members = [clients(V5), clients(V311)]
    for member in members:
        assert member.subscribe((f"$share/workers/{base}/#", 1)) == [1]
    independent = MosquittoSub(router, "-t", f"$share/workers/{base}/#", "-q", "1",
                               version=V5)
    try:
        independent.wait_for(lambda line: "SUBACK" in line)
        publisher = clients(V5)
        for number in range(30):
            publisher.publish(f"{base}/Truck {number % 3}", f"m{number}".encode(), 1)
        got = []
        for member in members:
            while True:
                try:
                    got.append(member.next_message(timeout=1.0).payload.decode())
                except AssertionError:
                    break
        remaining = 30 - len(got)
        for _ in range(remaining):
            got.append(independent.wait_for(lambda line: line.startswith("m")))
        assert sorted(got) == sorted(f"m{number}" for number in range(30))
        assert all(count > 0 for count in (len(got) - remaining, remaining)), got
    finally:
        independent.close()


def test_topic_aliases_both_ways_with_the_shipped_maximum(clients):
    topic = f"{unique('Plant')}/Line 1/Speed"
    client = clients(V5, connect_properties={"TopicAliasMaximum": 4})
    assert client.subscribe((topic, options(0))) == [0]
    named = Properties(PacketTypes.PUBLISH)
    named.TopicAlias = 3
    client.client.publish(topic, b"first", 0, properties=named)
    aliased = Properties(PacketTypes.PUBLISH)
    aliased.TopicAlias = 3
    client.client.publish("", b"second", 0, properties=aliased)
    first, second = client.next_message(), client.next_message()
    # inbound: the router resolved the client's alias 3; outbound: it sent its own alias,
    # the topic with the first message only (paho does not resolve received aliases)
    assert (first.topic, first.payload, first.properties.TopicAlias) == (topic, b"first", 1)
    assert (second.topic, second.payload, second.properties.TopicAlias) == ("", b"second", 1)


def test_shipped_limits_are_announced_in_connack(clients):
    connack = clients.new(V5, keepalive=0).connect()
    properties = connack.properties
    assert properties.ServerKeepAlive == SHIPPED_MAX_KEEPALIVE
    assert properties.TopicAliasMaximum == SHIPPED_ALIAS_MAXIMUM
    assert properties.SharedSubscriptionAvailable == 1
    # absent means available (MQTT 5.0, 3.2.2.3.12)
    assert getattr(properties, "SubscriptionIdentifierAvailable", 1) == 1


def test_mosquitto_gets_retained_messages_on_wildcards_over_empty_levels(router):
    base = unique("Grid")
    for topic in (f"{base}//North", f"{base}/Sub Station/North"):
        result = mosquitto("mosquitto_pub", router, "-t", topic, "-m", topic, "-r", "-q", "1")
        assert result.returncode == 0, result.stderr
    result = mosquitto("mosquitto_sub", router, "-t", f"{base}/+/North", "-C", "2", "-v",
                       "-W", "10")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"{topic} {topic}" for topic in (f"{base}//North", f"{base}/Sub Station/North"))
