"""The MQTT frontend, black box: a real router process, real sockets, real MQTT clients.

paho-mqtt speaks MQTT 3.1.1 and 5.0 over TCP and WebSocket; mosquitto_pub/_sub are a
second, independent client; a raw-socket client (router.mqtt.codec, client side) sends
exactly the bytes a case needs. WAMP clients check the bridge between the protocols.

Nothing here sleeps for correctness: waits are on queues and events with timeouts, and
"X did not arrive" is shown by a later sentinel on a topic the same client is
subscribed to arriving as the very next message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest
from autobahn.wamp.types import PublishOptions
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from router.mqtt.codec import MqttCodec
from router.mqtt.packets import (Connack, Connect, Disconnect, Pingreq, Pingresp, Puback,
                                 Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe,
                                 SubscriptionOptions, Will)
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import RouterProcess, kept_by_fixture
from tests.mqtt_clients import (COMBINATION_IDS, COMBINATIONS, SECRETS, V5, V311,
                                VERSION_IDS, VERSIONS, ClientPool, MosquittoSub, RawMqtt,
                                RawWebSocketMqtt, listeners, mosquitto, mqtt_realm, options,
                                publish_properties, raw_connect, raw_packet, raw_string, unique)
from tests.retention_helpers import joined
from tests.retention_helpers import publish as wamp_publish
from tests.retention_helpers import retained_after_subscribe

MAX_PACKET = 16 * 1024
SENTINEL = b"sentinel"

AUX_REALMS = {
    "closed": lambda: mqtt_realm("closed", anonymous=False),
    "loose": lambda: mqtt_realm("loose", uri_check="loose"),
    "qmax": lambda: mqtt_realm("qmax", mqtt={"qos_policy": "maximum"}),
    "qexact": lambda: mqtt_realm("qexact", mqtt={"qos_policy": "exact"}),
    "qcap": lambda: mqtt_realm("qcap", mqtt={"max_qos": 1}),
    "binmap": lambda: mqtt_realm("binmap", mqtt={"payload_mapping": "binary"}),
}

version_param = pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
combination_param = pytest.mark.parametrize("version,transport", COMBINATIONS,
                                            ids=COMBINATION_IDS)
needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
    reason="mosquitto-clients is not installed (apt-get install -y mosquitto-clients)")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """realm1: strict URIs, open to anonymous, 'alice' and 'limited' with passwords."""
    realm = mqtt_realm("realm1", mqtt={"max_packet_size": MAX_PACKET})
    process = RouterProcess(tmp_path_factory.mktemp("mqtt"), [realm],
                            listeners=listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def aux(tmp_path_factory):
    """Routers for other realm settings (one realm each), started on first use."""
    started: dict[str, RouterProcess] = {}

    def get(name: str) -> RouterProcess:
        if name not in started:
            started[name] = kept_by_fixture(RouterProcess(
                tmp_path_factory.mktemp(name), [AUX_REALMS[name]()],
                listeners=listeners(name))).start()
        return started[name]

    yield get
    for process in started.values():
        process.stop()


@pytest.fixture
def raw(router):
    opened: list[RawMqtt] = []

    def open_(target=None, listener: str = "mqtt") -> RawMqtt:
        client = RawMqtt(target or router, listener)
        opened.append(client)
        return client

    yield open_
    for client in opened:
        client.close()


def failure(version: int) -> int:
    """SUBACK 'not authorized': 0x80 is MQTT 3.1.1's only failure code."""
    return 0x80 if version == V311 else 0x87


def decode_server_bytes(data: bytes, version: int) -> list:
    """Packets in bytes a server sent to a client of ``version``."""
    codec = MqttCodec(client_side=True)
    codec.encode(Connect(protocol_version=version))
    codec.receive_data(data)
    packets = []
    while (packet := codec.next_packet()) is not None:
        packets.append(packet)
    return packets


# --- CONNECT / CONNACK ---------------------------------------------------------------------


@combination_param
def test_connect_succeeds_anonymously_and_with_password(clients, version, transport):
    anonymous = clients.new(version, transport)
    connack = anonymous.connect()
    assert (connack.reason_code, connack.session_present) == (0, False)
    if version == V5:
        assert connack.properties.MaximumPacketSize == MAX_PACKET
    alice = clients.new(version, transport, username="alice", password=SECRETS["alice"])
    assert alice.connect().reason_code == 0
    topic = f"conn/{unique('ok')}"
    assert alice.subscribe((topic, 1)) == [1]
    anonymous.publish(topic, b"hi", 1)
    assert alice.expect(topic, b"hi").qos == 1


@combination_param
def test_wrong_password_is_refused(clients, version, transport):
    for username, password in (("alice", "wrong"), ("nobody", "alice-secret"), ("alice", "")):
        client = clients.new(version, transport, username=username, password=password)
        assert client.connect().reason_code == 0x86  # paho maps 3.1.1's code 4 to 0x86
        client.wait_disconnected()


def test_wrong_password_wire_code_mqtt311(router, raw):
    client = raw()
    client.send(Connect(client_id="x", username="alice", password=b"wrong"))
    assert client.wait_closed() == b"\x20\x02\x00\x04"


@needs_mosquitto
@version_param
def test_mosquitto_pub_with_wrong_password_is_refused(router, version):
    result = mosquitto("mosquitto_pub", router, "-t", "conn/x", "-m", "x", "-u", "alice",
                       "-P", "wrong", version=version)
    assert result.returncode == (4 if version == V311 else 0x86), result
    assert "bad user name or password" in result.stderr.lower()


@version_param
def test_no_username_on_realm_without_anonymous_role(aux, raw, version):
    closed = aux("closed")
    pool = ClientPool(closed)
    try:
        client = pool.new(version)
        assert client.connect().reason_code == 0x87
        client.wait_disconnected()
        assert pool(version, username="alice", password=SECRETS["alice"]).client.is_connected()
    finally:
        pool.close()
    if version == V311:
        client = raw(closed)
        client.send_bytes(raw_connect(client_id="x"))
        assert client.wait_closed() == b"\x20\x02\x00\x05"


@pytest.mark.parametrize("name,level,expected", [
    ("MQTT", 3, {b"\x20\x02\x00\x01"}),
    ("MQIsdp", 3, {b"\x20\x02\x00\x01"}),
    ("MQTT", 6, {b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00", b"\x20\x02\x00\x84"}),
], ids=["MQTT-3", "MQIsdp-3", "MQTT-6"])
def test_unsupported_protocol_version_is_refused(raw, name, level, expected):
    client = raw()
    client.send_bytes(raw_connect(name, level, client_id="x"))
    assert client.wait_closed() in expected


def test_empty_client_id_without_clean_session_is_rejected_mqtt311(raw):
    client = raw()
    client.send_bytes(raw_connect(flags=0x00, client_id=""))
    assert client.wait_closed() == b"\x20\x02\x00\x02"
    accepted = raw()
    assert accepted.connect(V311, client_id="", clean=True) == Connack(False, 0)


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_mqtt5_empty_client_id_is_assigned(clients, transport):
    first, second = clients.new(V5, transport, client_id=""), clients.new(V5, transport,
                                                                         client_id="")
    assigned = [client.connect().properties.AssignedClientIdentifier
                for client in (first, second)]
    assert all(assigned) and assigned[0] != assigned[1]
    topic = f"conn/{unique('assigned')}"
    assert first.subscribe((topic, 1)) == [1]
    second.publish(topic, b"x", 1)
    first.expect(topic, b"x")


def test_mqtt5_unsupported_authentication_method_is_refused(raw):
    client = raw()
    client.send(Connect(protocol_version=V5, client_id=unique("scram"),
                        properties={"authentication_method": "SCRAM-SHA-1",
                                    "authentication_data": b"client-first"}))
    data = client.wait_closed(timeout=3)
    if data:
        connack, = decode_server_bytes(data, V5)
        assert isinstance(connack, Connack) and connack.reason_code in (0x8C, 0x87)


@combination_param
def test_second_connection_with_same_client_id_takes_over(clients, version, transport):
    client_id = unique("takeover")
    first = clients(version, transport, client_id=client_id)
    second = clients(version, "tcp" if transport == "ws" else "ws", client_id=client_id)
    reason = first.wait_disconnected()
    if version == V5:
        # the router sends DISCONNECT 0x8E, then closes; paho's WebSocket wrapper now and then
        # reports the closed socket (0x80) before it has read that DISCONNECT
        assert reason == 0x8E or (transport == "ws" and reason == 0x80)
    topic = f"take/{unique('t')}"
    assert second.subscribe((topic, 1)) == [1]
    second.publish(topic, b"still here", 1)
    second.expect(topic, b"still here")


# --- keep-alive ----------------------------------------------------------------------------


@version_param
def test_silent_client_is_disconnected_after_keep_alive(clients, raw, version):
    will_topic = f"ka/{unique('will')}"
    observer = clients(V5)
    assert observer.subscribe((will_topic, 1)) == [1]
    silent = raw()
    silent.connect_ok(version, unique("silent"), keep_alive=1,
                      will=Will(will_topic, b"timed out", 1))
    started = time.monotonic()
    data = silent.wait_closed(timeout=5)
    elapsed = time.monotonic() - started
    assert elapsed >= 1.0, f"closed after {elapsed:.2f}s, before the keep-alive ran out"
    if version == V5 and data:
        assert decode_server_bytes(data, V5) == [Disconnect(0x8D)]
    observer.expect(will_topic, b"timed out")  # the will goes out on a keep-alive timeout


def test_a_client_that_talks_outlives_its_keep_alive_many_times(raw):
    # the keep-alives share one wheel (router.core.scheduler.Deadlines): a read moves the
    # deadline, and the wheel must file the connection again rather than close it
    client = raw()
    client.connect_ok(V311, unique("talker"), keep_alive=1)
    started = time.monotonic()
    while time.monotonic() - started < 5:  # over three times the 1.5 s the router allows
        time.sleep(0.5)  # the client's pace: a ping every half keep-alive
        client.send(Pingreq())
        assert client.recv() == Pingresp()


def test_pingreq_is_answered(raw):
    client = raw()
    client.connect_ok(V311, unique("ping"), keep_alive=1)
    client.send(Pingreq())
    assert client.recv() == Pingresp()


# --- QoS -----------------------------------------------------------------------------------


def qos_matrix(clients, subscriber_args, publisher_args, expected_qos, router=None,
               granted=(0, 1, 2)):
    """Subscribe at QoS 0/1/2 on three topics, publish at 0/1/2 on each; check each QoS."""
    root = unique("qos")
    subscriber = clients(*subscriber_args, router=router)
    publisher = clients(*publisher_args, router=router)
    topics = [f"{root}/sub{qos}" for qos in (0, 1, 2)]
    assert subscriber.subscribe(*[(topic, qos) for qos, topic in enumerate(topics)]) == \
        list(granted)
    for sub_qos, topic in enumerate(topics):
        for pub_qos in (0, 1, 2):
            assert publisher.publish(topic, f"{sub_qos}{pub_qos}".encode(), pub_qos) == 0
    # paho hands a QoS 2 message over at PUBREL: a QoS 2 sentinel comes after all of them
    publisher.publish(topics[2], SENTINEL, 2)
    received = subscriber.collect_until(SENTINEL)
    got = sorted((message.payload.decode(), message.qos) for message in received)
    want = sorted((f"{s}{p}", expected_qos(p, granted[s])) for s in (0, 1, 2) for p in (0, 1, 2))
    assert got == want
    assert all(message.retain is False and message.dup is False for message in received)


@combination_param
def test_delivered_qos_is_min_of_published_and_granted(clients, version, transport):
    other_version = V5 if version == V311 else V311
    other_transport = "ws" if transport == "tcp" else "tcp"
    qos_matrix(clients, (version, transport), (other_version, other_transport), min)


@pytest.mark.parametrize("realm,expected", [
    ("qmax", max),
    ("qexact", lambda published, granted: published),
], ids=["maximum", "exact"])
def test_realm_qos_policy(aux, clients, realm, expected):
    qos_matrix(clients, (V5, "tcp"), (V311, "ws"), expected, router=aux(realm))


def test_realm_max_qos_caps_the_granted_qos(aux, clients):
    qos_matrix(clients, (V311, "tcp"), (V5, "tcp"), min, router=aux("qcap"), granted=(0, 1, 1))


@version_param
def test_unsubscribe_stops_delivery(clients, version):
    root = unique("unsub")
    client = clients(version)
    publisher = clients(V5)
    assert client.subscribe((f"{root}/a", 1), (f"{root}/b", 1)) == [1, 1]
    codes = client.unsubscribe(f"{root}/a")
    if version == V5:
        assert codes == [0]
        assert client.unsubscribe(f"{root}/a") == [0x11]
    publisher.publish(f"{root}/a", b"gone", 1)
    publisher.publish(f"{root}/b", SENTINEL, 1)
    client.expect(f"{root}/b", SENTINEL)


@version_param
def test_subscribing_again_replaces_the_subscription(clients, version):
    topic = f"resub/{unique('r')}"
    subscriber = clients(version)
    assert subscriber.subscribe((topic, 0)) == [0]
    assert subscriber.subscribe((topic, 2)) == [2]
    publisher = clients(V5)
    publisher.publish(topic, b"once", 2)
    message = subscriber.expect(topic, b"once")
    assert message.qos == 2
    publisher.publish(topic, SENTINEL, 2)
    subscriber.expect(topic, SENTINEL)  # one subscription, one copy


@version_param
def test_inbound_qos2_is_delivered_exactly_once(clients, raw, version):
    topic = f"q2/{unique('in')}"
    subscriber = clients(V5)
    assert subscriber.subscribe((topic, 2)) == [2]
    publisher = raw()
    publisher.connect_ok(version, unique("q2pub"))
    publisher.send(Publish(topic, b"one", 2, packet_id=7))
    assert publisher.recv() == Pubrec(7)
    publisher.send(Publish(topic, b"one", 2, dup=True, packet_id=7))  # lost PUBREC: resent
    assert publisher.recv() == Pubrec(7)
    publisher.send(Pubrel(7))
    assert publisher.recv() == Pubcomp(7)
    # the packet id is free again: the same id now carries a new message
    publisher.send(Publish(topic, b"two", 2, packet_id=7))
    assert publisher.recv() == Pubrec(7)
    publisher.send(Pubrel(7))
    assert publisher.recv() == Pubcomp(7)
    if version == V5:
        publisher.send(Pubrel(99))  # nothing in flight with that id
        assert publisher.recv() == Pubcomp(99, 0x92)
    subscriber.expect(topic, b"one")
    subscriber.expect(topic, b"two")
    publisher.send(Publish(topic, SENTINEL, 2, packet_id=8))
    assert publisher.recv() == Pubrec(8)
    publisher.send(Pubrel(8))
    assert publisher.recv() == Pubcomp(8)
    subscriber.expect(topic, SENTINEL)


def test_qos2_messages_awaiting_pubrel_are_bounded(router, clients, raw):
    """An MQTT 3.1.1 client (no receive maximum to keep it in check) sends 20,000 QoS 2
    publishes and never a PUBREL: the router holds 1,000 (``mqtt.max_inbound_qos2``), closes
    the connection at the next and counts it; a client that releases its messages is never
    held to it."""
    topic = f"flow/{unique('q2')}"
    watcher = clients(V5)
    watcher.subscribe((topic, 2))
    flood = raw()
    flood.connect_ok(V311, unique("q2"))
    flood.send_bytes(b"".join(flood.codec.encode(Publish(topic, b"held", qos=2,
                                                         packet_id=packet_id))
                              for packet_id in range(1, 20_001)))
    acknowledged = []
    with pytest.raises(ConnectionError):
        while True:
            acknowledged.append(flood.recv(timeout=30))
    assert acknowledged == [Pubrec(packet_id) for packet_id in range(1, 1_001)]
    router.logged(r"more than 1000 QoS 2 messages awaiting PUBREL", timeout=30)
    for _ in range(1_000):  # each delivered once (PUBREC: routed), the 1,001st was not
        assert watcher.next_message(timeout=30).payload == b"held"

    polite = raw()
    polite.connect_ok(V311, unique("q2"))
    for packet_id in range(1, 1_501):  # released one by one: never more than one held
        polite.send(Publish(topic, b"released", qos=2, packet_id=packet_id))
        assert polite.recv() == Pubrec(packet_id)
        polite.send(Pubrel(packet_id))
        assert polite.recv() == Pubcomp(packet_id)
    for _ in range(1_500):
        assert watcher.next_message(timeout=30).payload == b"released"


def test_mqtt5_receive_maximum_limits_messages_in_flight(clients, raw):
    topic = f"flow/{unique('rm')}"
    receiver = raw()
    receiver.connect_ok(V5, unique("rm"), properties={"receive_maximum": 1})
    receiver.send(Subscribe(1, [(topic, SubscriptionOptions(1))]))
    assert receiver.recv() == Suback(1, [1])
    publisher = clients(V311)
    for payload in (b"m1", b"m2", b"m3"):
        publisher.publish(topic, payload, 1)
    publisher.publish(topic, SENTINEL, 0)  # QoS 0 is not counted against the window
    first = receiver.recv()
    assert (first.payload, first.qos) == (b"m1", 1)
    assert receiver.recv().payload == SENTINEL  # m2 and m3 wait for the PUBACK of m1
    for expected in (b"m2", b"m3"):
        receiver.send(Puback(first.packet_id))
        first = receiver.recv()
        assert first.payload == expected
    receiver.send(Puback(first.packet_id))


@version_param
def test_a_run_of_pubacks_in_one_read_frees_the_window_once_each(clients, raw, version):
    """PUBACKs read together are handled as one batch: each completes its own delivery
    (a repeated or unknown packet id none), then the queued messages fill the window."""
    topic = f"flow/{unique('run')}"
    receiver = raw()
    if version == V5:
        receiver.connect_ok(V5, unique("run"), properties={"receive_maximum": 2})
    else:  # 3.1.1: the router's own window of 100, filled first
        receiver.connect_ok(V311, unique("run"))
    receiver.send(Subscribe(1, [(topic, SubscriptionOptions(1))]))
    assert receiver.recv() == Suback(1, [1])
    window = 2 if version == V5 else 100
    publisher = clients(V311)
    for number in range(window + 4):
        publisher.publish(topic, b"m%d" % number, 1)
    received = [receiver.recv() for _ in range(window)]
    assert [m.payload for m in received] == [b"m%d" % n for n in range(window)]
    first, second = received[0].packet_id, received[1].packet_id
    # one write: PUBACK first, first again, an unknown id, second
    receiver.send_bytes(b"".join(receiver.codec.encode(Puback(packet_id))
                                 for packet_id in (first, first, 60000, second)))
    following = [receiver.recv(), receiver.recv()]
    assert [m.payload for m in following] == [b"m%d" % n for n in (window, window + 1)]
    receiver.send(Publish(topic, SENTINEL, 0))  # nothing more comes before the sentinel
    assert receiver.recv().payload == SENTINEL


def test_mqtt5_message_over_client_maximum_packet_size_is_discarded(clients, raw):
    topic = f"flow/{unique('mps')}"
    receiver = raw()
    receiver.connect_ok(V5, unique("mps"), properties={"receive_maximum": 1,
                                                      "maximum_packet_size": 256})
    receiver.send(Subscribe(1, [(topic, SubscriptionOptions(1))]))
    assert receiver.recv() == Suback(1, [1])
    publisher = clients(V311)
    publisher.publish(topic, b"z" * 1000, 1)
    publisher.publish(topic, b"small", 1)
    message = receiver.recv(timeout=3)
    assert message.payload == b"small"  # the big one is discarded as if it had been sent
    receiver.send(Puback(message.packet_id))


@version_param
def test_takeover_keeps_a_persistent_session(clients, version):
    client_id = unique("takepersist")
    # with a user name: anonymous sessions do not persist (see test_mqtt_persistence.py)
    persistent = {"clean": False, "session_expiry": 60 if version == V5 else None,
                  "username": "alice", "password": SECRETS["alice"]}
    first = clients(version, client_id=client_id, **persistent)
    topic = f"take/{unique('p')}"
    assert first.subscribe((topic, 1)) == [1]
    second = clients.new(version, client_id=client_id, **persistent)
    connack = second.connect()
    assert (connack.reason_code, connack.session_present) == (0, True)
    first.wait_disconnected()
    clients(V5).publish(topic, b"to the session", 1)
    second.expect(topic, b"to the session")
    second.disconnect()
    cleaner = clients(version, client_id=client_id, clean=True, username="alice",
                      password=SECRETS["alice"])  # ends the session
    cleaner.disconnect()


# --- topic filters -------------------------------------------------------------------------

TOPICS = ["", "a", "a/b", "a/b/c", "ab", "ab/c", "b/a", "x/a/b"]


@pytest.mark.parametrize("topic_filter,expected", [
    ("#", set(TOPICS)),
    ("a/#", {"a", "a/b", "a/b/c"}),
    ("a/+", {"a/b"}),
    ("+/a", {"b/a"}),
    ("+/+", {"a/b", "ab/c", "b/a"}),
    ("a/+/c", {"a/b/c"}),
    ("+/#", set(TOPICS) - {""}),
    ("a/b", {"a/b"}),
    ("+/a/+", {"x/a/b"}),
])
def test_wildcard_filters_have_mqtt_semantics(clients, topic_filter, expected):
    root = unique("wc")

    def full(relative: str) -> str:
        return f"{root}/{relative}" if relative else root

    subscriber = clients(V5)
    publisher = clients(V311, "ws")
    assert subscriber.subscribe((full(topic_filter), 0)) == [0]
    for relative in TOPICS:
        publisher.publish(full(relative), relative.encode() or b"root", 0)
    publisher.publish(full(sorted(expected)[0]), SENTINEL, 0)
    received = [message.topic for message in subscriber.collect_until(SENTINEL)]
    assert sorted(received) == sorted(full(relative) for relative in expected)


def test_dollar_topics_are_not_matched_by_leading_wildcards(aux):
    loose = aux("loose")
    pool = ClientPool(loose)
    try:
        name = unique("sys")
        hash_all, plus, plus_hash, system = (pool(V5) for _ in range(4))
        assert hash_all.subscribe(("#", 0)) == [0]
        assert plus.subscribe((f"+/{name}", 0)) == [0]
        assert plus_hash.subscribe(("+/#", 0)) == [0]
        assert system.subscribe(("$app/#", 0)) == [0]
        publisher = pool(V311)
        publisher.publish(f"$app/{name}", b"system", 0)
        publisher.publish(f"n/{name}", SENTINEL, 0)
        for client in (hash_all, plus, plus_hash):
            client.expect(f"n/{name}", SENTINEL)
        system.expect(f"$app/{name}", b"system")
        # retained: a new '#' subscriber does not get a retained '$' message either
        publisher.publish(f"$app/{name}/r", b"kept", 1, retain=True)
        late = pool(V5)
        assert late.subscribe(("#", 0)) == [0]
        publisher.publish(f"n/{name}/late", SENTINEL, 0)
        late.expect(f"n/{name}/late", SENTINEL)
        late_system = pool(V311)
        assert late_system.subscribe(("$app/+/r", 0)) == [0]
        message = late_system.next_message()
        assert (message.topic, message.payload, message.retain) == \
            (f"$app/{name}/r", b"kept", True)
        publisher.publish(f"$app/{name}/r", b"", 1, retain=True)
    finally:
        pool.close()


@version_param
def test_clients_may_not_publish_on_sys_topics(clients, version):
    """'$SYS' belongs to the broker (as on Mosquitto): a client's publish there is refused
    (MQTT 5: PUBACK 0x87) and reaches nobody."""
    name = unique("sys")
    watcher = clients(V5)
    assert watcher.subscribe((f"$SYS/{name}/#", 1), (f"$other/{name}", 1)) == [1, 1]
    client = clients(version)
    assert client.publish(f"$SYS/{name}/x", b"forged", 1) == (0 if version == V311 else 0x87)
    client.publish(f"$other/{name}", SENTINEL, 1)
    watcher.expect(f"$other/{name}", SENTINEL)


def test_loose_realm_keeps_topic_levels_distinct(aux):
    """A level with a '.' stays one level: 'x.y/#' is not 'x/y/#'."""
    pool = ClientPool(aux("loose"))
    try:
        name = unique("dots")
        everything, dotted, split = pool(V5), pool(V5), pool(V5)
        assert everything.subscribe((f"{name}/#", 0)) == [0]
        assert dotted.subscribe((f"{name}/x.y/#", 0)) == [0]
        assert split.subscribe((f"{name}/x/y/#", 0)) == [0]
        publisher = pool(V5)
        assert publisher.publish(f"{name}/x.y/z", b"dotted", 1) == 0
        assert publisher.publish(f"{name}/x/y/z", b"split", 1) == 0
        everything.expect(f"{name}/x.y/z", b"dotted")
        everything.expect(f"{name}/x/y/z", b"split")
        dotted.expect(f"{name}/x.y/z", b"dotted")
        split.expect(f"{name}/x/y/z", b"split")
        publisher.publish(f"{name}/x.y/end", SENTINEL, 1)
        assert dotted.next_message().payload == SENTINEL
        publisher.publish(f"{name}/x/y/end", SENTINEL, 1)
        assert split.next_message().payload == SENTINEL
    finally:
        pool.close()


@version_param
def test_topics_that_are_no_uri_work_on_the_strict_realm(clients, version):
    """Upper case, empty levels and '.' inside a level are plain MQTT topics, whatever the
    realm's uri_check (it applies to WAMP URIs only): accepted, routed, never mangled."""
    root = unique("map")
    client = clients(version)
    assert client.subscribe((f"{root}/A/#", 1), (f"{root}//b", 1), (f"{root}/+/b", 1)) == \
        [1, 1, 1]
    observer = clients(V5)
    assert observer.subscribe((f"{root}/#", 1)) == [1]
    for topic in (f"{root}/A/b", f"{root}//b", f"{root}/a/", f"{root}/a.b/c"):
        assert client.publish(topic, topic.encode(), 1) == 0
        observer.expect(topic, topic.encode())
    client.publish(f"{root}/z/b", SENTINEL, 1)
    received = {message.topic for message in client.collect_until(SENTINEL)}
    assert received == {f"{root}/A/b", f"{root}//b"}  # 'a/' and 'a.b/c' match none of its filters


# --- retained messages ---------------------------------------------------------------------


@combination_param
def test_retained_set_replace_and_clear(clients, version, transport):
    topic = f"ret/{unique('r')}"
    publisher = clients(version, transport)
    assert publisher.publish(topic, b"v1", 1, retain=True) == 0
    assert publisher.publish(topic, b"v2", 1, retain=True) == 0
    subscriber = clients(version, transport)
    assert subscriber.subscribe((topic, 1)) == [1]
    message = subscriber.next_message()
    assert (message.payload, message.retain, message.qos) == (b"v2", True, 1)
    publisher.publish(topic, b"live", 1, retain=True)
    live = subscriber.expect(topic, b"live")
    assert live.retain is False  # an established subscription: the flag is cleared
    # an empty retained payload clears the retained message and is delivered as is
    publisher.publish(topic, b"", 1, retain=True)
    cleared = subscriber.expect(topic, b"")
    assert cleared.retain is False
    late = clients(version, transport)
    assert late.subscribe((topic, 1)) == [1]
    publisher.publish(topic, SENTINEL, 1)
    late.expect(topic, SENTINEL)


def test_retained_messages_for_wildcard_subscription(clients):
    root = unique("retwc")
    publisher = clients(V311)
    for leaf in ("a", "b/c", "d"):
        publisher.publish(f"{root}/{leaf}", leaf.encode(), 1, retain=True)
    subscriber = clients(V5)
    assert subscriber.subscribe((f"{root}/+", 1)) == [1]
    publisher.publish(f"{root}/z", SENTINEL, 1)
    retained = subscriber.collect_until(SENTINEL)
    assert sorted((m.topic, m.payload, m.retain) for m in retained) == [
        (f"{root}/a", b"a", True), (f"{root}/d", b"d", True)]


def test_retain_handling_mqtt5(clients):
    topic = f"ret/{unique('rh')}"
    publisher = clients(V5)
    publisher.publish(topic, b"kept", 1, retain=True)
    every, first_only, never = clients(V5), clients(V5), clients(V5)
    for client, handling in ((every, 0), (first_only, 1), (never, 2)):
        assert client.subscribe((topic, options(1, retain_handling=handling))) == [1]
    for client in (every, first_only):
        message = client.next_message()
        assert (message.payload, message.retain) == (b"kept", True)
    # subscribing again to the same filter: only retain handling 0 sends it again
    for client, handling in ((every, 0), (first_only, 1), (never, 2)):
        assert client.subscribe((topic, options(1, retain_handling=handling))) == [1]
    message = every.next_message()
    assert (message.payload, message.retain) == (b"kept", True)
    publisher.publish(topic, SENTINEL, 1)
    for client in (every, first_only, never):
        client.expect(topic, SENTINEL)


def test_retain_as_published_mqtt5(clients):
    topic = f"ret/{unique('rap')}"
    as_published, plain = clients(V5), clients(V5)
    assert as_published.subscribe((topic, options(1, retain_as_published=True))) == [1]
    assert plain.subscribe((topic, options(1))) == [1]
    publisher = clients(V5)
    publisher.publish(topic, b"retained", 1, retain=True)
    publisher.publish(topic, b"normal", 1)
    assert [(m.payload, m.retain) for m in (as_published.next_message(),
                                            as_published.next_message())] == \
        [(b"retained", True), (b"normal", False)]
    assert [(m.payload, m.retain) for m in (plain.next_message(), plain.next_message())] == \
        [(b"retained", False), (b"normal", False)]
    publisher.publish(topic, b"", 1, retain=True)


def test_no_local_mqtt5(clients):
    topic = f"nl/{unique('nl')}"
    no_local, local = clients(V5), clients(V5)
    assert no_local.subscribe((topic, options(1, no_local=True))) == [1]
    assert local.subscribe((topic, options(1))) == [1]
    no_local.publish(topic, b"mine", 1)
    local.publish(topic, b"theirs", 1)
    no_local.expect(topic, b"theirs")
    local.expect(topic, b"mine")
    local.expect(topic, b"theirs")


# --- will ----------------------------------------------------------------------------------


@version_param
def test_will_is_published_on_abnormal_close(router, clients, raw, version):
    topic = f"will/{unique('w')}"

    async def scenario():
        wamp = await wamp_connect(router, "websocket", "json")
        events = await wamp.events(topic.replace("/", "."))
        observer = clients(V311, "ws")
        assert observer.subscribe((topic, 1)) == [1]
        client = raw()
        client.connect_ok(version, unique("willer"), will=Will(topic, b'["bye", 1]', 1))
        client.drop()
        message = await asyncio.to_thread(observer.next_message)
        assert (message.topic, message.payload, message.qos) == (topic, b'["bye", 1]', 1)
        args, kwargs, _ = await next_item(events)
        assert (args, kwargs) == (["bye", 1], {})
        await wamp.close()

    run(scenario())


@version_param
def test_no_will_after_clean_disconnect(clients, raw, version):
    topic = f"will/{unique('clean')}"
    observer = clients(V5)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(version, unique("polite"), will=Will(topic, b"should not", 1))
    client.send(Disconnect())
    client.wait_closed()
    paho_client = clients(version, will={"topic": topic, "payload": b"nor this", "qos": 1})
    paho_client.disconnect()
    clients(V311).publish(topic, SENTINEL, 1)
    observer.expect(topic, SENTINEL)


def test_will_on_mqtt5_disconnect_with_will_message(clients, raw):
    topic = f"will/{unique('rc4')}"
    observer = clients(V311)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(V5, unique("rc4"), will=Will(topic, b"asked for", 1))
    client.send(Disconnect(0x04))
    client.wait_closed()
    observer.expect(topic, b"asked for")


def test_disconnect_setting_an_expiry_on_a_session_without_one_is_a_protocol_error(clients,
                                                                                     raw):
    # MQTT-3.14.2-2: not a valid DISCONNECT, so the server answers 0x82 and the will stays
    # due; it was taken as a normal DISCONNECT: no will, the expiry silently ignored
    topic = f"will/{unique('expiry')}"
    observer = clients(V311)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(V5, unique("noexpiry"), will=Will(topic, b"still due", 1))
    client.send(Disconnect(properties={"session_expiry_interval": 60}))
    assert client.recv() == Disconnect(0x82)  # protocol error
    client.wait_closed()
    observer.expect(topic, b"still due")


def test_mqtt5_will_properties_pass_through(clients, raw):
    topic = f"will/{unique('props')}"
    observer = clients(V5)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(V5, unique("willprops"), will=Will(topic, b"w", 1, properties={
        "content_type": "text/plain", "user_property": [("why", "dropped")]}))
    client.drop()
    message = observer.expect(topic, b"w")
    assert message.properties.ContentType == "text/plain"
    assert message.properties.UserProperty == [("why", "dropped")]


def test_mqtt5_will_delay_interval(clients, raw):
    topic = f"will/{unique('delay')}"
    observer = clients(V311)
    assert observer.subscribe((topic, 1)) == [1]

    def connect_with_will(client_id: str, payload: bytes, delay: int, expiry: int) -> RawMqtt:
        client = raw()
        client.connect_ok(V5, client_id, clean=False, username="alice",
                          password=SECRETS["alice"].encode(),
                          properties={"session_expiry_interval": expiry},
                          will=Will(topic, payload, 1,
                                    properties={"will_delay_interval": delay}))
        return client

    # the session ends at once (expiry 0): the will does not wait for its delay
    connect_with_will(unique("ends"), b"session ended", 60, 0).drop()
    observer.expect(topic, b"session ended", timeout=3)
    # back within the delay: no will
    returning = unique("returns")
    connect_with_will(returning, b"came back", 1, 300).drop()
    connect_with_will(returning, b"never", 300, 300)
    # away longer than the delay: the will, after the delay
    connect_with_will(unique("away"), b"stayed away", 1, 300).drop()
    dropped = time.monotonic()
    observer.expect(topic, b"stayed away", timeout=5)
    assert time.monotonic() - dropped >= 0.9


@version_param
def test_will_retain_sets_the_retained_message(clients, raw, version):
    topic = f"will/{unique('ret')}"
    observer = clients(V5)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(version, unique("wr"), will=Will(topic, b"last words", 1, retain=True))
    client.drop()
    assert observer.expect(topic, b"last words").retain is False
    late = clients(V311)
    assert late.subscribe((topic, 1)) == [1]
    message = late.next_message()
    assert (message.payload, message.retain) == (b"last words", True)
    late.publish(topic, b"", 1, retain=True)


# --- MQTT <-> WAMP -------------------------------------------------------------------------

MQTT_TO_WAMP = [
    (b'[1, "x"]', [1, "x"], {}),
    (b'{"a": 1, "b": [true, null]}', [], {"a": 1, "b": [True, None]}),
    (b'"text"', ["text"], {}),
    (b"42", [42], {}),
    (b"\xff\x00not json", [b"\xff\x00not json"], {}),
    (b"not json either", [b"not json either"], {}),
    (b"", [], {}),
    # nested deeper than the decoder recurses: it stays bytes, like any payload not decoded
    (b"[" * 5000 + b"]" * 5000, [b"[" * 5000 + b"]" * 5000], {}),
]


@pytest.mark.parametrize("version,transport,serializer", [
    (V311, "tcp", "json"), (V311, "ws", "cbor"), (V5, "tcp", "msgpack"), (V5, "ws", "json")],
    ids=lambda value: VERSION_IDS.get(value, value))
def test_mqtt_publish_reaches_wamp_subscriber(router, clients, version, transport, serializer):
    name = unique("m2w")

    async def scenario():
        wamp = await wamp_connect(router, "rawsocket", serializer)
        events = await wamp.events(f"bridge.{name}")
        publisher = clients(version, transport)
        for payload, _, _ in MQTT_TO_WAMP:
            await asyncio.to_thread(publisher.publish, f"bridge/{name}", payload, 1)
        for _, args, kwargs in MQTT_TO_WAMP:
            got_args, got_kwargs, _ = await next_item(events)
            assert (got_args, got_kwargs) == (args, kwargs)
        await wamp.close()

    run(scenario())


WAMP_TO_MQTT = [
    ((["hello"], {}), lambda p: p == b'"hello"'),
    (([b"\x00\x01"], {}), lambda p: p == b"\x00\x01"),
    (([1, "x"], {}), lambda p: json.loads(p) == [1, "x"]),
    (([], {"a": 1}), lambda p: json.loads(p) == {"a": 1}),
    (([1], {"k": "v"}), lambda p: json.loads(p) == {"args": [1], "kwargs": {"k": "v"}}),
    (([], {}), lambda p: p == b""),
]


@combination_param
def test_wamp_publish_reaches_mqtt_subscriber(router, clients, version, transport):
    name = unique("w2m")
    subscriber = clients(version, transport)
    assert subscriber.subscribe((f"bridge/{name}", 1)) == [1]

    async def scenario():
        publisher = await wamp_connect(router, "websocket", "cbor")
        for (args, kwargs), _ in WAMP_TO_MQTT:
            await publisher.publish(f"bridge.{name}", *args,
                                    options=PublishOptions(acknowledge=True), **kwargs)
        await publisher.close()

    run(scenario())
    for (args, kwargs), check in WAMP_TO_MQTT:
        message = subscriber.next_message()
        assert message.topic == f"bridge/{name}"
        assert check(message.payload), (args, kwargs, message.payload)
        assert message.qos == 0


def test_binary_payload_mapping_realm(aux):
    binmap = aux("binmap")
    name = unique("bin")
    pool = ClientPool(binmap)

    async def scenario():
        wamp = await wamp_connect(binmap, "websocket", "json", realm="binmap")
        events = await wamp.events(f"bridge.{name}")
        subscriber = pool(V5)
        assert subscriber.subscribe((f"bridge/{name}", 0)) == [0]
        await asyncio.to_thread(pool(V311).publish, f"bridge/{name}", b"[1]", 1)
        assert (await next_item(events))[:2] == ([b"[1]"], {})
        await wamp.publish(f"bridge.{name}", "x", options=PublishOptions(acknowledge=True))
        assert (await asyncio.to_thread(subscriber.next_message)).payload == b"[1]"
        assert (await asyncio.to_thread(subscriber.next_message)).payload == b'"x"'
        await wamp.close()

    try:
        run(scenario())
    finally:
        pool.close()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_retained_across_protocols(router, clients, transport):
    name = unique("xret")

    async def scenario():
        # MQTT sets, WAMP get_retained reads
        mqtt = clients(V5, transport)
        await asyncio.to_thread(mqtt.publish, f"xret/{name}/m", b'{"t": 21}', 1, True)
        wamp = await wamp_connect(router, "websocket", "msgpack")
        events = await wamp.events(f"xret.{name}.m", get_retained=True)
        args, kwargs, details = await next_item(events)
        assert (args, kwargs, details.retained) == ([], {"t": 21}, True)
        # WAMP sets, a new MQTT subscriber reads
        raw_wamp = await joined(router)
        await wamp_publish(raw_wamp, f"xret.{name}.w", ["w"], retain=True)
        subscriber = clients(V311, transport)
        assert await asyncio.to_thread(subscriber.subscribe, (f"xret/{name}/w", 1)) == [1]
        message = await asyncio.to_thread(subscriber.next_message)
        assert (message.payload, message.retain) == (b'"w"', True)
        # an empty retained MQTT message clears what WAMP retained
        await asyncio.to_thread(mqtt.publish, f"xret/{name}/w", b"", 1, True)
        reader = await joined(router, "websocket", "cbor")
        assert await retained_after_subscribe(router, reader, f"xret.{name}.w",
                                              f"xret.{name}.w", get_retained=True) == []
        raw_wamp.close()
        reader.close()
        await wamp.close()

    run(scenario())


def test_wamp_qos_option_reaches_mqtt_subscriber(router, clients):
    name = unique("wqos")
    subscriber = clients(V5)
    assert subscriber.subscribe(*[(f"wqos/{name}/{qos}", qos) for qos in (0, 1, 2)]) == [0, 1, 2]

    async def scenario():
        publisher = await joined(router)
        for sub_qos in (0, 1, 2):
            for pub_qos in (0, 1, 2):
                options = {"_qos": pub_qos} if pub_qos else {}  # no option: QoS 0
                await wamp_publish(publisher, f"wqos.{name}.{sub_qos}",
                                   [f"{sub_qos}{pub_qos}"], **options)
        publisher.close()

    run(scenario())
    received = sorted((m.payload, m.qos) for m in (subscriber.next_message() for _ in range(9)))
    assert received == sorted((f'"{s}{p}"'.encode(), min(s, p)) for s in (0, 1, 2)
                              for p in (0, 1, 2))


# --- authorization -------------------------------------------------------------------------


@version_param
def test_subscribe_outside_the_role_is_refused(clients, version):
    name = unique("auth")
    limited = clients(version, username="limited", password=SECRETS["limited"])
    assert limited.subscribe((f"com/{name}/#", 1), (f"other/{name}/#", 1), ("#", 1),
                             (f"com/{name}", 1)) == \
        [1, failure(version), failure(version), 1]
    publisher = clients(V5)
    publisher.publish(f"other/{name}/x", b"forbidden", 1)
    publisher.publish(f"com/{name}/x", SENTINEL, 1)
    limited.expect(f"com/{name}/x", SENTINEL)


@version_param
def test_publish_outside_the_role_is_not_delivered(clients, version):
    name = unique("authpub")
    observer = clients(V5)
    assert observer.subscribe((f"other/{name}", 1), (f"com/{name}", 1)) == [1, 1]
    limited = clients(version, username="limited", password=SECRETS["limited"])
    assert limited.publish(f"other/{name}", b"forbidden", 1) == \
        (0 if version == V311 else 0x87)
    assert limited.publish(f"com/{name}", SENTINEL, 1) == 0
    observer.expect(f"com/{name}", SENTINEL)
    assert limited.client.is_connected()


def test_publish_into_the_wamp_namespace_is_refused(clients):
    client = clients(V5)
    assert client.publish("wamp/session/on_join", b"[]", 1) == 0x87
    assert client.publish("wamp", b"[]", 1) == 0x87


def test_will_outside_the_role_is_not_published(clients, raw):
    name = unique("authwill")
    observer = clients(V5)
    assert observer.subscribe((f"other/{name}", 1), (f"com/{name}", 1)) == [1, 1]
    client = raw()
    client.connect_ok(V311, unique("limitedwill"), username="limited",
                      password=SECRETS["limited"].encode(),
                      will=Will(f"other/{name}", b"forbidden will", 1))
    client.drop()
    allowed = raw()
    allowed.connect_ok(V5, unique("limitedwill"), username="limited",
                       password=SECRETS["limited"].encode(),
                       will=Will(f"com/{name}", SENTINEL, 1))
    allowed.drop()
    observer.expect(f"com/{name}", SENTINEL)


# --- malformed and forbidden input ---------------------------------------------------------


def publish_body(topic: bytes | str, payload: bytes, version: int) -> bytes:
    return raw_string(topic) + (b"\x00" if version == V5 else b"") + payload


BAD_INPUT = {
    "garbage": lambda v: b"\xde\xad\xbe\xef" * 4,
    "reserved-packet-type-0": lambda v: b"\x00\x00",
    "subscribe-flags-0000": lambda v: raw_packet(
        0x80, b"\x00\x01" + (b"\x00" if v == V5 else b"") + raw_string("a") + b"\x00"),
    "pingreq-flags-0001": lambda v: b"\xc1\x00",
    "publish-qos-3": lambda v: raw_packet(0x36, raw_string("a") + b"\x00\x01"),
    "length-shorter-than-fields": lambda v: raw_packet(0x30, b"\x00\x0aab"),
    "length-five-bytes": lambda v: b"\x30\xff\xff\xff\xff\x01",
    "length-not-minimal": lambda v: b"\xc0\x80\x00",
    "over-max-packet-size": lambda v: raw_packet(
        0x30, publish_body("big", b"x" * (MAX_PACKET + 1), v)),
    "topic-invalid-utf8": lambda v: raw_packet(0x30, publish_body(b"a/\xff\xfe", b"x", v)),
    "topic-with-nul": lambda v: raw_packet(0x30, publish_body(b"a/\x00", b"x", v)),
    "topic-wildcard-plus": lambda v: raw_packet(0x30, publish_body("a/+", b"x", v)),
    "topic-wildcard-hash": lambda v: raw_packet(0x30, publish_body("a/#", b"x", v)),
    "second-connect": lambda v: raw_connect(level=v, client_id="again",
                                            properties=b"\x00" if v == V5 else b""),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
@version_param
def test_bad_input_closes_the_connection(clients, raw, case, version):
    witness_topic = f"bad/{unique('witness')}"
    witness = clients(V5)  # connected before the incident
    assert witness.subscribe((witness_topic, 1)) == [1]
    client = raw()
    client.connect_ok(version, unique("bad"))
    try:
        client.send_bytes(BAD_INPUT[case](version))
    except OSError:
        pass  # the router may close while a large packet is still being sent
    data = client.wait_closed()
    for packet in decode_server_bytes(data, version) if data else []:
        assert isinstance(packet, Disconnect) and packet.reason_code >= 0x80, packet
    clients(V311).publish(witness_topic, b"still served", 1)
    witness.expect(witness_topic, b"still served")


def test_garbage_before_connect_closes_the_connection(raw):
    client = raw()
    client.send_bytes(b"GET / HTTP/1.1\r\n\r\n")
    client.wait_closed()


def test_publish_before_connect_closes_the_connection(raw):
    client = raw()
    client.send_bytes(raw_packet(0x30, raw_string("a") + b"x"))
    client.wait_closed()


def test_protocol_error_publishes_the_will(clients, raw):
    topic = f"bad/{unique('will')}"
    observer = clients(V5)
    assert observer.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(V311, unique("badwill"), will=Will(topic, b"broken", 1))
    client.send_bytes(b"\xc1\x00")
    client.wait_closed()
    observer.expect(topic, b"broken")


def test_packet_within_max_packet_size_is_accepted(clients, raw):
    topic = f"size/{unique('ok')}"
    subscriber = clients(V5)
    assert subscriber.subscribe((topic, 1)) == [1]
    client = raw()
    client.connect_ok(V311, unique("size"))
    payload = b"y" * (MAX_PACKET - 64)
    client.send(Publish(topic, payload, 1, packet_id=1))
    assert client.recv() == Puback(1)
    assert subscriber.next_message().payload == payload


# --- MQTT over WebSocket framing -------------------------------------------------------------


def test_websocket_packets_may_span_and_share_messages(router):
    topic = f"wsframe/{unique('t')}"
    client = RawWebSocketMqtt(router)
    try:
        assert client.status == 101
        connect = client.encode(Connect(protocol_version=V5, client_id=unique("wsraw")))
        client.send_message(connect[:3])  # one packet over three WebSocket messages
        client.send_message(connect[3:7])
        client.send_message(connect[7:])
        assert client.recv().reason_code == 0
        both = (client.encode(Subscribe(1, [(topic, SubscriptionOptions(1))]))
                + client.encode(Publish(topic, b"to myself", 1, packet_id=2)))
        client.send_message(both)  # two packets in one message
        assert client.recv() == Suback(1, [1])
        received = [client.recv(), client.recv()]
        assert Puback(2) in received
        delivered, = [packet for packet in received if isinstance(packet, Publish)]
        assert (delivered.topic, delivered.payload, delivered.qos) == (topic, b"to myself", 1)
    finally:
        client.close()


def test_websocket_text_message_closes_the_connection(router):
    client = RawWebSocketMqtt(router)
    try:
        client.send_message(client.encode(Connect(client_id=unique("wstext"))))
        assert client.recv().reason_code == 0
        client.send_message(b"\xc0\x00", opcode=0x1)  # PINGREQ, but as a text message
        with pytest.raises(ConnectionError):
            client.recv()
    finally:
        client.close()


@pytest.mark.parametrize("path,subprotocol,status", [
    ("/elsewhere", "mqtt", 404), (None, "wamp.2.json", 400), (None, None, 400)])
def test_websocket_handshake_needs_the_mqtt_path_and_subprotocol(router, path, subprotocol,
                                                                 status):
    client = RawWebSocketMqtt(router, path, subprotocol)
    try:
        assert client.status == status
    finally:
        client.close()


# --- MQTT 5 properties -----------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_mqtt5_message_properties_pass_through(clients, transport):
    topic = f"props/{unique('p')}"
    subscriber = clients(V5, transport)
    classic = clients(V311, transport)
    subscribe_properties = Properties(PacketTypes.SUBSCRIBE)
    subscribe_properties.SubscriptionIdentifier = 42
    assert subscriber.subscribe((topic, 1), properties=subscribe_properties) == [1]
    assert classic.subscribe((topic, 1)) == [1]
    user_properties = [("k", "v"), ("k", "w"), ("ünï", "cödé")]
    publisher = clients(V5)
    publisher.publish(topic, b'{"x": 1}', 1, properties=publish_properties(
        UserProperty=user_properties, ContentType="application/json",
        PayloadFormatIndicator=1, ResponseTopic=f"{topic}/reply", CorrelationData=b"\x01\x02"))
    message = subscriber.expect(topic, b'{"x": 1}')
    properties = message.properties
    assert properties.UserProperty == user_properties
    assert properties.ContentType == "application/json"
    assert properties.PayloadFormatIndicator == 1
    assert properties.ResponseTopic == f"{topic}/reply"
    assert properties.CorrelationData == b"\x01\x02"
    assert properties.SubscriptionIdentifier == [42]
    classic.expect(topic, b'{"x": 1}')


def test_mqtt5_topic_alias(clients):
    topic = f"alias/{unique('a')}"
    subscriber = clients(V311)
    assert subscriber.subscribe((topic, 1)) == [1]
    publisher = clients(V5)
    publisher.publish(topic, b"first", 1, properties=publish_properties(TopicAlias=3))
    publisher.publish("", b"second", 1, properties=publish_properties(TopicAlias=3))
    subscriber.expect(topic, b"first")
    subscriber.expect(topic, b"second")


# --- mosquitto clients ---------------------------------------------------------------------


@needs_mosquitto
@version_param
def test_mosquitto_sub_receives_from_paho(router, clients, version):
    topic = f"mosq/{unique('sub')}"
    subscriber = MosquittoSub(router, "-t", topic, "-q", "1", "-C", "1", "-v", version=version)
    try:
        subscriber.wait_for(lambda line: "received SUBACK" in line)
        clients(V5 if version == V311 else V311, "ws").publish(topic, b"from paho", 1)
        received = subscriber.wait_for(lambda line: "received PUBLISH" in line)
        assert "q1" in received and "r0" in received
        assert subscriber.wait_for(lambda line: line.startswith(topic)) == f"{topic} from paho"
        assert subscriber.proc.wait(10) == 0
    finally:
        subscriber.close()


@needs_mosquitto
@version_param
def test_mosquitto_pub_retained_reaches_paho(router, clients, version):
    topic = f"mosq/{unique('pub')}"
    result = mosquitto("mosquitto_pub", router, "-t", topic, "-m", "from mosquitto", "-r",
                       "-q", "2", "-u", "alice", "-P", SECRETS["alice"], version=version)
    assert result.returncode == 0, result
    subscriber = clients(V5 if version == V311 else V311)
    assert subscriber.subscribe((topic, 2)) == [2]
    message = subscriber.next_message()
    assert (message.topic, message.payload, message.retain, message.qos) == \
        (topic, b"from mosquitto", True, 2)
    result = mosquitto("mosquitto_pub", router, "-t", topic, "-n", "-r", "-q", "1",
                       version=version)
    assert result.returncode == 0, result
    assert subscriber.expect(topic, b"").retain is False
