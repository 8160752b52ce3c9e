"""The full MQTT topic space on the shipped realm, across protocols and restarts.

The router runs ``realms/realm1.json`` exactly as shipped. MQTT 3.1.1 and 5.0 clients
(paho) use topics WAMP cannot name (upper case, empty levels, a leading '/', spaces,
'.' inside a level, non-ASCII, '$' first levels) with MQTT's own semantics, live and
retained, and after a restart; WAMP subscribers get the topics that are URIs of the
realm and nothing else; AMQP receivers on MQTT-style addresses get them all.

"Nothing else arrived" is shown by a sentinel, published last, arriving next.
"""

from __future__ import annotations

import json
import sqlite3
import time

import msgpack
import pytest
from proton import LinkException
from autobahn.wamp.types import PublishOptions

from tests.amqp_clients import Receive, body_bytes, connect, message, received, send, settle
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.test_eventlog import read_records
from tests.harness import ROOT, RouterProcess
from tests.mqtt_clients import V5, V311, ClientPool
from tests.test_mqtt_matching import reference

SHIPPED_REALM = json.loads((ROOT / "realms" / "realm1.json").read_text())
TOPICS = ["TopicA", "TopicA/B", "/TopicA", "p//x", "home/Living Room", "a.b/c", "ünïcödé/x",
          "$foo/bar"]
FILTERS = ["#", "+", "+/+", "/#", "+//x", "$foo/#", "+/bar", "TopicA", "home/+", "a.b/#",
           "p//x"]
SENTINEL = b"sentinel"
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])


def sentinel_topic(topic_filter: str) -> str:
    """A topic the filter matches that no test publishes anything else on."""
    levels = topic_filter.split("/")
    return "/".join("end" if level in ("+", "#") else level for level in levels)


def expected(topic_filter: str) -> set[str]:
    return {topic for topic in TOPICS if reference(topic_filter, topic)}


LISTENERS = [
    {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
    {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
    {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
]


@pytest.fixture
def router(tmp_path):
    """A router of its own: tests here subscribe to '#' and retain on fixed topics."""
    process = RouterProcess(tmp_path, [SHIPPED_REALM], listeners=LISTENERS).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def shared_router(tmp_path_factory):
    """For tests that only attach and get refused."""
    process = RouterProcess(tmp_path_factory.mktemp("refusals"), [SHIPPED_REALM],
                            listeners=LISTENERS).start()
    yield process
    process.stop()


@pytest.fixture
def pool(router):
    clients = ClientPool(router)
    yield clients
    clients.close()


def subscribe_all(pool: ClientPool, version: int, **kwargs) -> dict:
    """One client per filter, so each one's messages are exactly that filter's."""
    clients = {}
    for topic_filter in FILTERS:
        client = pool(version, **kwargs)
        assert client.subscribe((topic_filter, 1)) == [1], topic_filter
        clients[topic_filter] = client
    return clients


def publish_sentinels(publisher) -> None:
    for topic_filter in FILTERS:
        publisher.publish(sentinel_topic(topic_filter), SENTINEL, 1)


def assert_each_got_exactly_its_topics(clients: dict, retained: bool = False) -> None:
    for topic_filter, client in clients.items():
        messages = client.collect_until(SENTINEL)
        got = [(m.topic, m.payload, bool(m.retain)) for m in messages]
        want = sorted((topic, topic.encode(), retained) for topic in expected(topic_filter))
        assert sorted(got) == want, f"filter {topic_filter!r}"


@VERSIONS
def test_mqtt_clients_use_every_valid_topic(pool, version):
    clients = subscribe_all(pool, version)
    publisher = pool(version)
    for topic in TOPICS:
        assert publisher.publish(topic, topic.encode(), 1) == 0, topic
    publish_sentinels(publisher)
    assert_each_got_exactly_its_topics(clients)
    assert expected("#") == set(TOPICS) - {"$foo/bar"}  # the reference agrees on '$'
    assert "$foo/bar" in expected("$foo/#") and "$foo/bar" not in expected("+/bar")


@VERSIONS
def test_retained_messages_on_wildcards_then_after_a_restart(router, pool, version):
    publisher = pool(version)
    for topic in TOPICS:
        assert publisher.publish(topic, topic.encode(), 1, retain=True) == 0, topic
    # a persistent session, offline while messages for it are queued and the router restarts
    offline = pool(version, clean=False, session_expiry=3600, client_id=f"keeper{version}")
    assert offline.subscribe(("#", 1), ("$foo/#", 1)) == [1, 1]
    assert sorted(offline.next_message().topic for _ in TOPICS) == sorted(TOPICS)
    offline.close()
    clients = subscribe_all(pool, version)
    publish_sentinels(publisher)
    assert_each_got_exactly_its_topics(clients, retained=True)
    for topic in TOPICS:
        publisher.publish(topic, b"queued " + topic.encode(), 1)
    pool.close()

    assert router.stop() == 0
    router.start()
    back = pool.new(version, clean=False, session_expiry=3600, client_id=f"keeper{version}")
    assert back.connect().session_present
    queued = []
    while len(queued) < len(TOPICS):  # the sentinels published while it was away come first
        msg = back.next_message()
        if msg.payload != SENTINEL:
            queued.append((msg.topic, msg.payload))
    assert sorted(queued) == sorted((topic, b"queued " + topic.encode()) for topic in TOPICS)
    # the retained store came back keyed by the same levels (the queued publishes were not
    # retained, so each topic still holds its first payload)
    clients = subscribe_all(pool, version)
    publish_sentinels(pool(version))
    assert_each_got_exactly_its_topics(clients, retained=True)


def test_wamp_subscribers_get_only_topics_that_are_uris_of_the_realm(router, pool):
    async def scenario():
        everything = await wamp_connect(router)
        events = await everything.events("", match="prefix")
        exact = await everything.events("TopicA.B")
        mqtt = pool(V5)
        assert mqtt.subscribe(("TopicA/B", 1), ("$foo/bar", 1)) == [1, 1]
        publisher = pool(V5)
        for topic in TOPICS:
            assert publisher.publish(topic, json.dumps(topic).encode(), 1) == 0
        publisher.publish("end", b'"end"', 1)
        got = []
        while True:
            args, _, details = await next_item(events)
            if args == ["end"]:
                break
            got.append((details.topic, args))
        assert got == [("TopicA", ["TopicA"]), ("TopicA.B", ["TopicA/B"]),
                       ("ünïcödé.x", ["ünïcödé/x"]), ("$foo.bar", ["$foo/bar"])]
        args, _, _ = await next_item(exact)
        assert args == ["TopicA/B"]
        router.wait_for_log(r"realm1, wamp: unrepresentable")
        # and back: a WAMP publication reaches MQTT on the same levels
        await everything.publish("TopicA.B", "from wamp",
                                 options=PublishOptions(acknowledge=True))
        assert [mqtt.next_message().payload for _ in range(3)] == [
            b'"TopicA/B"', b'"$foo/bar"', b'"from wamp"']
        await everything.close()

    run(scenario())


def test_amqp_reaches_every_mqtt_topic(router, pool):
    """An address with '/' or 'mqtt:' is an MQTT topic or filter; 'to' is written in the
    form the receiver subscribed with."""
    connection = connect(router)
    try:
        expected_to = {
            "+/+": ["TopicA/B", "/TopicA", "home/Living Room", "a.b/c", "ünïcödé/x"],
            "/#": ["/TopicA"],
            "mqtt:TopicA": ["mqtt:TopicA"],
            "home/Living Room": ["home/Living Room"],
            "mqtt:$foo/#": ["$foo/bar"],
            "TopicA.B": ["TopicA.B"],
        }
        receivers = {address: connection.create_receiver(address, credit=50,
                                                         options=Receive(1))
                     for address in expected_to}
        mqtt = pool(V5)
        assert mqtt.subscribe(("home/Living Room", 1)) == [1]
        publisher = pool(V311)
        for topic in TOPICS:
            publisher.publish(topic, topic.encode(), 1)
        send(connection.create_sender("topic://home/Living Room"), message(b"from amqp"))
        for address, addresses in expected_to.items():
            if "home/Living Room" in addresses:
                addresses = addresses + ["home/Living Room"]  # the AMQP publication, last
            receiver = receivers[address]
            got = []
            for _ in addresses:
                msg, delivery = received(receiver)
                settle(receiver, delivery)
                got.append((msg.address, body_bytes(msg)))
            assert [to for to, _ in got] == addresses, address
            assert [body for _, body in got[:len(expected_to[address])]] == \
                [_topic_of(to).encode() for to in expected_to[address]], address
        assert mqtt.next_message().payload == b"home/Living Room"
        assert mqtt.next_message().payload == b"from amqp"
    finally:
        connection.close()


def _topic_of(address: str) -> str:
    """The MQTT topic an outgoing 'to' names."""
    if address.startswith("mqtt:"):
        return address[len("mqtt:"):]
    return address if "/" in address else address.replace(".", "/")


@pytest.mark.parametrize("address", ["a/+b", "#/a", "a/#/b", "mqtt:", "mqtt:a+"])
def test_amqp_refuses_invalid_mqtt_filters(shared_router, address):
    connection = connect(shared_router)
    try:
        with pytest.raises(LinkException) as refused:
            connection.create_receiver(address, options=Receive(1))
        assert "invalid-field" in str(refused.value)
    finally:
        connection.close()


@pytest.mark.parametrize("address", ["a/+", "mqtt:#", "$SYS/x"])
def test_amqp_cannot_publish_to_filters_or_sys(shared_router, address):
    connection = connect(shared_router)
    try:
        with pytest.raises(LinkException):
            connection.create_sender(address)
    finally:
        connection.close()


def test_shipped_realm_defaults():
    """The shipped realm is loose: WAMP clients see MQTT topics with upper case and other
    non-[a-z0-9_] levels too (strict would hide most real MQTT topic names from them)."""
    assert SHIPPED_REALM["uri_check"] == "loose"


def test_a_database_from_before_level_topics_is_read_by_levels(tmp_path):
    """Retained rows keyed by dotted URIs, with the URI inside each entry (the format
    before topics were levels), come back on the same topics after an upgrade."""
    data = tmp_path / "data"
    data.mkdir()
    old = sqlite3.connect(data / "router.sqlite3")
    old.execute("CREATE TABLE retained (realm TEXT NOT NULL, topic TEXT NOT NULL, "
                "entries BLOB NOT NULL, PRIMARY KEY (realm, topic)) WITHOUT ROWID")
    for publication_id, uri in enumerate(("old.a", "old.b.c", "Old.Upper"), start=1):
        entry = msgpack.packb({
            "id": publication_id, "topic": uri, "args": [uri], "kwargs": None,
            "publisher": [1, "x", "anonymous"], "disclose": False, "eligibility": None,
            "exclude_me": True, "ts": time.time(), "expires": None, "qos": 1,
            "payload": uri.encode(), "properties": None, "message_expires": None,
        }, use_bin_type=True)
        old.execute("INSERT INTO retained VALUES ('realm1', ?, ?)",
                    (uri, msgpack.packb([entry], use_bin_type=True)))
    old.commit()
    old.close()
    process = RouterProcess(tmp_path, [SHIPPED_REALM], listeners=[
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]).start()
    pool = ClientPool(process)
    try:
        client = pool(V5)
        assert client.subscribe(("old/#", 1), ("Old/+", 1)) == [1, 1]
        got = sorted((m.topic, m.payload, m.retain) for m in
                     (client.next_message() for _ in range(3)))
        assert got == [("Old/Upper", b"Old.Upper", True), ("old/a", b"old.a", True),
                       ("old/b/c", b"old.b.c", True)]
        assert client.publish("old/a", b"", 1, retain=True) == 0  # clears the rekeyed row
    finally:
        pool.close()
        process.stop()
    rows = sqlite3.connect(data / "router.sqlite3").execute(
        "SELECT topic FROM retained ORDER BY topic").fetchall()
    assert rows == [('["Old","Upper"]',), ('["old","b","c"]',)]


def test_event_log_names_every_topic_unambiguously(router, pool):
    """WAMP topics keep their URI in `topic`; the others get their MQTT form and `levels`."""
    client = pool(V5)
    assert client.subscribe(("+/#", 1)) == [1]
    for topic in ("TopicA/B", "/TopicA", "a.b/c"):
        assert client.publish(topic, b"x", 1, retain=True) == 0
    client.next_message()
    pool.close()
    assert router.stop() == 0  # a clean stop writes what is buffered
    records = read_records(router.workdir / "data" / "eventlog", "realm1")
    published = {(r["topic"], tuple(r["levels"]) if "levels" in r else None)
                 for r in records if r["kind"] in ("publish", "retained_set")}
    assert published == {("TopicA.B", None), ("/TopicA", ("", "TopicA")),
                         ("a.b/c", ("a.b", "c"))}
    subscribed, = [r for r in records if r["kind"] == "subscribe"]
    # a filter is a pattern, never a topic: the report must not count it as one
    assert (subscribed["pattern"], subscribed["match"], "topic" in subscribed) == \
        ("+/#", "mqtt", False)
    router.start()  # for the fixture's stop
