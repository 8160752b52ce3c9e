"""MQTT 5 as a standard broker does it: one copy for overlapping subscriptions with every
subscription identifier, server keep alive, topic aliases both ways from config; and a
role added on the command line that then governs an MQTT client.

Black box: a real router process, paho-mqtt 3.1.1 / 5.0 clients, and a raw-socket client
where the exact packets matter. "Nothing else arrived" is shown by a sentinel that the
same client receives as the very next message.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from router.mqtt.packets import (Connack, Disconnect, Pubcomp, Publish, Pubrec, Pubrel,
                                 ReasonCode)
from tests.harness import ROOT, RouterProcess
from tests.mqtt_clients import (SECRETS, V5, V311, VERSION_IDS, VERSIONS, ClientPool, RawMqtt,
                                listeners, mqtt_realm, options, publish_properties, unique)

SENTINEL = b"sentinel"
ALIAS_MAXIMUM = 3
MAX_KEEPALIVE = 2
ALICE = {"username": "alice", "password": SECRETS["alice"]}

version_param = pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)


def started(tmp_path_factory, realm: dict):
    """A router for one realm with MQTT listeners only, stopped at the end (if still up)."""
    process = RouterProcess(tmp_path_factory.mktemp(realm["name"]), [realm],
                            listeners=listeners(realm["name"], wamp=False)).start()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    yield from started(tmp_path_factory,
                       mqtt_realm("realm1", mqtt={"topic_alias_maximum": ALIAS_MAXIMUM}))


@pytest.fixture
def clients(router):
    if router.proc.poll() is not None:  # a test that restarts it failed half-way
        router.start()
    pool = ClientPool(router)
    yield pool
    pool.close()


def identifier(value: int) -> Properties:
    properties = Properties(PacketTypes.SUBSCRIBE)
    properties.SubscriptionIdentifier = value
    return properties


def subscribe(client, topic_filter: str, qos: int, sub_id: int, **flags) -> None:
    """Subscribe with an identifier (MQTT 5) or plainly (3.1.1); the grant must be ``qos``."""
    if client.version == V5:
        granted = client.subscribe((topic_filter, options(qos, **flags)),
                                   properties=identifier(sub_id))
    else:
        granted = client.subscribe((topic_filter, qos))
    assert granted == [qos]


def identifiers(message) -> list[int]:
    return sorted(getattr(message.properties, "SubscriptionIdentifier", []) or [])


def seen(message) -> tuple:
    """What a user checks of a delivered message (identifiers only where MQTT 5 has them)."""
    return (message.topic, message.payload, message.qos, bool(message.retain),
            identifiers(message) if message.properties is not None else None)


# --- overlapping subscriptions ----------------------------------------------------------------


@version_param
def test_overlapping_subscriptions_deliver_one_copy_at_the_highest_qos(clients, version):
    base = unique("ov")
    receiver = clients(version)
    subscribe(receiver, f"{base}/+", 1, 1)
    subscribe(receiver, f"{base}/#", 2, 2)
    subscribe(receiver, f"{base}/x", 0, 3)
    publisher = clients(V5)
    publisher.publish(f"{base}/x", b"all three", qos=2)
    publisher.publish(f"{base}/y", b"plus and hash", qos=1)
    # matches '#' alone; at QoS 2 paho hands it over last (at PUBREL), after any copies
    publisher.publish(f"{base}/s/t", SENTINEL, qos=2)

    got = sorted(seen(m) for m in receiver.collect_until(SENTINEL))
    ids = version == V5
    assert got == [(f"{base}/x", b"all three", 2, False, [1, 2, 3] if ids else None),
                   (f"{base}/y", b"plus and hash", 1, False, [1, 2] if ids else None)]


def test_no_local_and_retain_as_published_apply_per_matching_subscription(clients):
    base = unique("nl")
    receiver = clients(V5)
    subscribe(receiver, f"{base}/+", 1, 1, no_local=True)
    subscribe(receiver, f"{base}/#", 0, 2, retain_as_published=True)
    receiver.publish(f"{base}/own", b"own", qos=1, retain=True)
    message = receiver.next_message()
    # its own message: only the subscription without no-local matches, at its QoS
    assert seen(message) == (f"{base}/own", b"own", 0, True, [2])

    clients(V5).publish(f"{base}/other", b"other", qos=1, retain=True)
    message = receiver.next_message()
    # one copy: the retain flag as published because one subscription asked for it
    assert seen(message) == (f"{base}/other", b"other", 1, True, [1, 2])


def test_retained_on_subscribe_go_to_the_new_subscription_only(clients):
    base = unique("rt")
    publisher = clients(V5)
    publisher.publish(f"{base}/x", b"kept", qos=1, retain=True)
    receiver = clients(V5)
    subscribe(receiver, f"{base}/x", 1, 1)
    assert seen(receiver.next_message()) == (f"{base}/x", b"kept", 1, True, [1])
    subscribe(receiver, f"{base}/+", 1, 2)
    assert seen(receiver.next_message()) == (f"{base}/x", b"kept", 1, True, [2])
    publisher.publish(f"{base}/x", b"live", qos=1)
    publisher.publish(f"{base}/s", SENTINEL, qos=1)
    assert [seen(m) for m in receiver.collect_until(SENTINEL)] == [
        (f"{base}/x", b"live", 1, False, [1, 2])]


@version_param
def test_queued_message_keeps_its_identifiers_over_a_restart(clients, router, version):
    base = unique("pq")
    client_id = unique("pq_client")
    session = dict(ALICE, client_id=client_id, clean=False,
                   session_expiry=300 if version == V5 else None)
    receiver = clients(version, **session)
    subscribe(receiver, f"{base}/+", 1, 1)
    subscribe(receiver, f"{base}/#", 1, 2)
    receiver.disconnect()
    publisher = clients(V5)
    publisher.publish(f"{base}/x", b"queued", qos=1)
    publisher.publish(f"{base}/s/t", SENTINEL, qos=1)
    publisher.disconnect()

    assert router.stop() == 0
    router.start()
    receiver = clients.new(version, **session)
    connack = receiver.connect()
    assert (connack.reason_code, connack.session_present) == (0, True)
    got = [seen(m) for m in receiver.collect_until(SENTINEL)]
    assert got == [(f"{base}/x", b"queued", 1, False, [1, 2] if version == V5 else None)]


# --- topic aliases ------------------------------------------------------------------------------


def test_outbound_topic_aliases_up_to_the_clients_and_the_servers_maximum(clients):
    base = unique("al")
    small = clients(V5, connect_properties={"TopicAliasMaximum": 2})
    large = clients(V5, connect_properties={"TopicAliasMaximum": 100})
    plain = clients(V5)
    for receiver in (small, large, plain):
        assert receiver.subscribe((f"{base}/#", options(1))) == [1]
    publisher = clients(V5)
    sent = [("a", 0), ("a", 1), ("b", 1), ("c", 0), ("c", 1), ("d", 0)]
    for level, qos in sent:
        publisher.publish(f"{base}/{level}", level.encode(), qos=qos)

    def wire(receiver) -> list[tuple]:
        """(topic name on the wire, alias or None, payload, QoS) as paho reports them."""
        messages = [receiver.next_message() for _ in sent]
        return [(m.topic, getattr(m.properties, "TopicAlias", None), m.payload, m.qos)
                for m in messages]

    # the name goes with the alias once, then the alias alone; new topics past the client's
    # maximum go by name
    assert wire(small) == [(f"{base}/a", 1, b"a", 0), ("", 1, b"a", 1), (f"{base}/b", 2, b"b", 1),
                           (f"{base}/c", None, b"c", 0), (f"{base}/c", None, b"c", 1),
                           (f"{base}/d", None, b"d", 0)]
    # the client allows 100: the router's own maximum (3) bounds it
    assert wire(large) == [(f"{base}/a", 1, b"a", 0), ("", 1, b"a", 1), (f"{base}/b", 2, b"b", 1),
                           (f"{base}/c", 3, b"c", 0), ("", 3, b"c", 1),
                           (f"{base}/d", None, b"d", 0)]
    assert wire(plain) == [(f"{base}/{level}", None, level.encode(), qos)
                           for level, qos in sent]

    # aliases belong to one connection: a new one starts with names again
    small.disconnect()
    again = clients(V5, connect_properties={"TopicAliasMaximum": 2})
    assert again.subscribe((f"{base}/#", options(1))) == [1]
    publisher.publish(f"{base}/a", b"again", qos=1)
    message = again.next_message()
    assert (message.topic, message.properties.TopicAlias) == (f"{base}/a", 1)


def test_inbound_topic_alias_maximum_comes_from_config(clients, router):
    base = unique("in")
    publisher = clients.new(V5)
    connack = publisher.connect()
    assert connack.properties.TopicAliasMaximum == ALIAS_MAXIMUM
    receiver = clients(V5)
    assert receiver.subscribe((f"{base}/#", options(1))) == [1]
    alias = Properties(PacketTypes.PUBLISH)
    alias.TopicAlias = ALIAS_MAXIMUM
    publisher.publish(f"{base}/x", b"named", qos=1, properties=alias)
    publisher.publish("", b"aliased", qos=1, properties=alias)
    assert [(m.topic, m.payload) for m in (receiver.next_message(), receiver.next_message())] \
        == [(f"{base}/x", b"named"), (f"{base}/x", b"aliased")]

    raw = RawMqtt(router)
    try:
        raw.connect_ok(V5, unique("raw"))
        raw.send(Publish(f"{base}/y", b"over", properties={"topic_alias": ALIAS_MAXIMUM + 1}))
        assert raw.recv() == Disconnect(ReasonCode.TOPIC_ALIAS_INVALID)
        raw.wait_closed()
    finally:
        raw.close()


# --- message expiry and receive maximum --------------------------------------------------------


def test_message_expiry_interval_is_the_received_one_minus_whole_seconds_waited(clients):
    base = unique("mx")
    receiver = clients(V5)
    assert receiver.subscribe((f"{base}/q0", 0), (f"{base}/q1", 1)) == [0, 1]
    publisher = clients(V5)
    for interval in (1, 3600):
        for qos in (0, 1):
            started = time.monotonic()
            publisher.publish(f"{base}/q{qos}", str(interval).encode(), qos=qos,
                              properties=publish_properties(MessageExpiryInterval=interval))
            message = receiver.next_message()
            waited = time.monotonic() - started
            assert (message.topic, message.payload) == (f"{base}/q{qos}", str(interval).encode())
            sent = message.properties.MessageExpiryInterval
            # delivered within a second it keeps its interval (was 0 for 1 and 3599 for 3600)
            assert interval - int(waited) <= sent <= interval, (interval, qos, sent, waited)


def test_qos2_flows_hold_the_receive_maximum_until_pubcomp(router):
    raw = RawMqtt(router)
    try:
        maximum = raw.connect_ok(V5, unique("rm")).properties["receive_maximum"]
        topic = unique("rm")
        for packet_id in range(1, maximum + 1):  # every flow left open after PUBREC
            raw.send(Publish(topic, b"x", qos=2, packet_id=packet_id))
            assert raw.recv() == Pubrec(packet_id)
        # completing one flow frees exactly one slot
        raw.send(Pubrel(1))
        assert raw.recv() == Pubcomp(1)
        raw.send(Publish(topic, b"x", qos=2, packet_id=maximum + 1))
        assert raw.recv() == Pubrec(maximum + 1)
        raw.send(Publish(topic, b"x", qos=2, packet_id=maximum + 2))
        assert raw.recv() == Disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
        raw.wait_closed()
    finally:
        raw.close()


# --- server keep alive ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keepalive_router(tmp_path_factory):
    yield from started(tmp_path_factory, mqtt_realm("ka", mqtt={"max_keepalive": MAX_KEEPALIVE}))


def test_server_keep_alive_is_announced_and_enforced(keepalive_router):
    pool = ClientPool(keepalive_router)
    silent = [RawMqtt(keepalive_router) for _ in range(2)]
    try:
        # paho asks for none, is told the maximum, and keeps to it by pinging
        paho_client = pool.new(V5, keepalive=0)
        assert paho_client.connect().properties.ServerKeepAlive == MAX_KEEPALIVE
        assert pool.new(V5, keepalive=60).connect().properties.ServerKeepAlive == MAX_KEEPALIVE
        within = pool.new(V5, keepalive=1).connect()
        assert (within.reason_code, hasattr(within.properties, "ServerKeepAlive")) == (0, False)
        connack = silent[0].connect(V5, unique("v5"), keep_alive=0)
        assert isinstance(connack, Connack)
        assert connack.properties["server_keep_alive"] == MAX_KEEPALIVE
        # MQTT 3.1.1 cannot be told: no keep alive is held to the maximum silently
        silent[1].connect_ok(V311, unique("v311"), keep_alive=0)
        started = time.monotonic()
        closing = [raw.wait_closed(timeout=10) for raw in silent]
        elapsed = time.monotonic() - started
        assert MAX_KEEPALIVE * 1.5 - 0.5 <= elapsed <= MAX_KEEPALIVE * 1.5 + 3, elapsed
        silent[0].codec.receive_data(closing[0])
        assert silent[0].codec.next_packet() == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
        # the paho client lived through the same silence on its pings
        assert not paho_client.disconnected.is_set()
        topic = unique("ka")
        assert paho_client.subscribe((topic, 1)) == [1]
        paho_client.publish(topic, b"alive", qos=1)
        paho_client.expect(topic, b"alive")
    finally:
        pool.close()
        for raw in silent:
            raw.close()


def test_mqtt311_keep_alive_over_the_maximum_is_refused(keepalive_router):
    raw = RawMqtt(keepalive_router)
    try:
        connack = raw.connect(V311, unique("long"), keep_alive=MAX_KEEPALIVE + 1)
        # return code 2 on the wire (identifier rejected), as Mosquitto answers it
        assert connack == Connack(False, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        raw.wait_closed()
    finally:
        raw.close()


# --- role on the command line ---------------------------------------------------------------------


def test_role_added_on_the_command_line_governs_mqtt_clients(tmp_path):
    realm = mqtt_realm("realm1", anonymous=False)
    process = RouterProcess(tmp_path, [realm], listeners=listeners("realm1", wamp=False))
    config = ["--config", str(process.config_path)]

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "router", *args, *config], cwd=ROOT,
                              input=stdin, capture_output=True, text=True, timeout=30)

    add = ["role", "add", "--realm", "realm1", "--role", "sensor", "--allow",
           "publish,subscribe", "--uri", "sensors.", "--match", "prefix"]
    result = cli(*add)
    assert result.returncode == 0, result.stderr
    again = cli(*add)
    assert again.returncode == 2 and "already" in again.stderr
    bad = cli("role", "add", "--realm", "realm1", "--role", "x", "--allow", "publish,fly",
              "--uri", "a", "--match", "exact")
    assert bad.returncode == 2 and "roles.x[0].allow[1]" in bad.stderr
    listed = cli("role", "list", "--realm", "realm1")
    assert "sensor" in listed.stdout and "'sensors.'" in listed.stdout
    result = cli("principal", "add", "--realm", "realm1", "--authid", "bob", "--role", "sensor",
                 "--method", "ticket", stdin="bob-secret\n")
    assert result.returncode == 0, result.stderr

    process.start()
    pool = ClientPool(process)
    try:
        bob = pool(V5, username="bob", password="bob-secret")
        topic = "sensors/" + unique("t")
        assert bob.subscribe((topic, 1)) == [1]
        assert bob.publish(topic, b"reading", qos=1) == 0
        bob.expect(topic, b"reading")
        assert bob.publish(unique("other") + "/t", b"x", qos=1) == ReasonCode.NOT_AUTHORIZED
        limited = pool(V5, username="limited", password=SECRETS["limited"])
        assert limited.publish(topic, b"x", qos=1) == ReasonCode.NOT_AUTHORIZED
    finally:
        pool.close()
        process.stop()
