"""MQTT persistent sessions over router restarts (SIGTERM and kill -9), session and
message expiry, and QoS 2 exactly-once when the router dies in the middle of a flow.

The router is restarted on the same data folder; clients reconnect to its new ports.
Persistent sessions here belong to the user 'alice': anonymous persistent sessions
are a known router bug (see test_anonymous_persistent_session_is_resumed).
"""

from __future__ import annotations

import time

import pytest

from router.mqtt.packets import (Disconnect, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback,
                                 Subscribe, SubscriptionOptions)
from tests.clients import run
from tests.harness import RouterProcess
from tests.mqtt_clients import (SECRETS, V5, V311, VERSION_IDS, VERSIONS, ClientPool,
                                RawMqtt, listeners, mqtt_realm, publish_properties, unique)
from tests.retention_helpers import joined
from tests.retention_helpers import publish as wamp_publish

SENTINEL = b"sentinel"
ALICE = {"username": "alice", "password": SECRETS["alice"]}

version_param = pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("mqtt-persistence"), [mqtt_realm("realm1")],
                            listeners=listeners("realm1")).start()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.stop()


@pytest.fixture
def clients(router):
    """paho clients, plus ``clients.raw()`` for raw-socket ones; all closed at the end."""
    if router.proc.poll() is not None:  # a previous test left it down
        router.start()
    pool = ClientPool(router)
    opened: list[RawMqtt] = []

    def raw() -> RawMqtt:
        opened.append(RawMqtt(router))  # the router's current address, after restarts
        return opened[-1]

    pool.raw = raw
    yield pool
    pool.close()
    for client in opened:
        client.close()


def persistent(version: int, expiry: int = 300, **extra) -> dict:
    """A persistent session: clean session 0 (3.1.1) / clean start 0 + an expiry (5)."""
    return dict(ALICE, clean=False, session_expiry=expiry if version == V5 else None, **extra)


def raw_persistent(version: int) -> dict:
    return {"clean": False, "username": "alice", "password": SECRETS["alice"].encode(),
            "properties": {"session_expiry_interval": 300} if version == V5 else {}}


def restart(router: RouterProcess, how: str) -> None:
    if how == "stop":
        assert router.stop() == 0
        router.start()
    elif how == "kill9":
        router.kill9()
        router.start()


@pytest.mark.parametrize("how", ["running", "stop", "kill9"])
@version_param
def test_messages_published_while_offline_are_delivered_at_reconnect(clients, router, version,
                                                                     how):
    client_id = unique("offline")
    topic = f"offline/{unique('t')}"
    subscriber = clients.new(version, client_id=client_id, **persistent(version))
    assert subscriber.connect().session_present is False
    assert subscriber.subscribe((f"{topic}/q1", 1), (f"{topic}/q2", 2)) == [1, 2]
    subscriber.disconnect()
    publisher = clients(V5 if version == V311 else V311)
    for sub_qos, pub_qos, payload in ((1, 1, b"m1"), (2, 2, b"m2"), (1, 2, b"m3"),
                                      (2, 1, b"m4")):
        assert publisher.publish(f"{topic}/q{sub_qos}", payload, pub_qos) == 0
    publisher.disconnect()
    restart(router, how)
    again = clients.new(version, client_id=client_id, **persistent(version))
    connack = again.connect()
    assert (connack.reason_code, connack.session_present) == (0, True)
    received = sorted((m.topic, m.payload, m.qos) for m in (again.next_message()
                                                             for _ in range(4)))
    assert received == sorted([(f"{topic}/q1", b"m1", 1), (f"{topic}/q2", b"m2", 2),
                               (f"{topic}/q1", b"m3", 1), (f"{topic}/q2", b"m4", 1)])
    # the subscriptions are still there, and nothing is delivered twice
    clients(V5).publish(f"{topic}/q2", SENTINEL, 2)
    again.expect(f"{topic}/q2", SENTINEL)


@version_param
def test_anonymous_persistent_session_is_resumed(clients, version):
    client_id = unique("anon")
    topic = f"offline/{unique('anon')}"
    options = {"clean": False, "session_expiry": 300 if version == V5 else None}
    subscriber = clients(version, client_id=client_id, **options)
    assert subscriber.subscribe((topic, 1)) == [1]
    subscriber.disconnect()
    clients(V5).publish(topic, b"while away", 1)
    again = clients.new(version, client_id=client_id, **options)
    assert again.connect().session_present is True
    again.expect(topic, b"while away", timeout=3)


@version_param
def test_session_still_connected_at_a_crash_is_restored(clients, router, version):
    client_id = unique("crash")
    topic = f"crash/{unique('t')}"
    subscriber = clients(version, client_id=client_id, **persistent(version))
    assert subscriber.subscribe((topic, 1)) == [1]
    # a PUBACK is sent once the store has everything written before it: the session too
    assert subscriber.publish(f"{topic}/barrier", b"", 1) == 0
    router.kill9()
    subscriber.wait_disconnected()
    router.start()
    clients(V311).publish(topic, b"after the crash", 1)
    again = clients.new(version, client_id=client_id, **persistent(version))
    assert again.connect().session_present is True
    again.expect(topic, b"after the crash")


@version_param
def test_clean_session_discards_the_old_session(clients, version):
    client_id = unique("clean")
    topic = f"clean/{unique('t')}"
    subscriber = clients(version, client_id=client_id, **persistent(version))
    assert subscriber.subscribe((f"{topic}/old", 1)) == [1]
    subscriber.disconnect()
    fresh = clients.new(version, client_id=client_id, **dict(persistent(version), clean=True))
    assert fresh.connect().session_present is False
    assert fresh.subscribe((f"{topic}/new", 1)) == [1]
    publisher = clients(V5)
    publisher.publish(f"{topic}/old", b"old subscription", 1)
    publisher.publish(f"{topic}/new", SENTINEL, 1)
    fresh.expect(f"{topic}/new", SENTINEL)


@pytest.mark.parametrize("resend", [False, True], ids=["plain", "dup-resent"])
@version_param
def test_qos2_publish_is_delivered_once_when_the_router_dies_before_pubrel(clients, router,
                                                                          version, resend):
    topic = f"exactly/{unique('t')}"
    subscriber_id = unique("q2sub")
    subscriber = clients(V311, client_id=subscriber_id, **persistent(V311))
    assert subscriber.subscribe((topic, 2)) == [2]
    subscriber.disconnect()
    publisher_id = unique("q2pub")
    publisher = clients.raw()
    publisher.connect_ok(version, publisher_id, **raw_persistent(version))
    publisher.send(Publish(topic, b"once", 2, packet_id=7))
    assert publisher.recv() == Pubrec(7)
    router.kill9()  # between PUBREC and PUBCOMP
    router.start()
    publisher = clients.raw()
    connack = publisher.connect(version, publisher_id, **raw_persistent(version))
    assert (connack.reason_code, connack.session_present) == (0, True)
    if resend:  # the publisher never saw the PUBREC: it sends the PUBLISH again
        publisher.send(Publish(topic, b"once", 2, dup=True, packet_id=7))
        assert publisher.recv() == Pubrec(7)
    publisher.send(Pubrel(7))
    assert publisher.recv() == Pubcomp(7)
    publisher.send(Publish(topic, SENTINEL, 2, packet_id=8))
    assert publisher.recv() == Pubrec(8)
    publisher.send(Pubrel(8))
    assert publisher.recv() == Pubcomp(8)
    again = clients.new(V311, client_id=subscriber_id, **persistent(V311))
    assert again.connect().session_present is True
    again.expect(topic, b"once")
    again.expect(topic, SENTINEL)


@version_param
def test_outbound_qos2_flow_resumes_after_restarts(clients, router, version):
    topic = f"resume/{unique('t')}"
    client_id = unique("q2recv")
    receiver = clients.raw()
    receiver.connect_ok(version, client_id, **raw_persistent(version))
    receiver.send(Subscribe(1, [(topic, SubscriptionOptions(2))]))
    assert receiver.recv() == Suback(1, [2])
    publisher = clients(V5)
    assert publisher.publish(topic, b"x", 2) == 0
    first = receiver.recv()
    assert (first.topic, first.payload, first.qos, first.dup) == (topic, b"x", 2, False)
    packet_id = first.packet_id
    receiver.drop()  # no PUBREC: the PUBLISH is unacknowledged
    restart(router, "stop")
    receiver = clients.raw()
    assert receiver.connect(version, client_id, **raw_persistent(version)).session_present
    assert receiver.recv() == Publish(topic, b"x", 2, False, True, packet_id)
    receiver.send(Pubrec(packet_id))
    assert receiver.recv() == Pubrel(packet_id)
    receiver.drop()  # no PUBCOMP: the PUBREL is unacknowledged
    restart(router, "stop")
    receiver = clients.raw()
    assert receiver.connect(version, client_id, **raw_persistent(version)).session_present
    assert receiver.recv() == Pubrel(packet_id)  # the PUBREL again, never the PUBLISH
    receiver.send(Pubcomp(packet_id))
    clients(V311).publish(topic, SENTINEL, 1)
    sentinel = receiver.recv()
    assert (sentinel.payload, sentinel.qos) == (SENTINEL, 1)
    receiver.send(Puback(sentinel.packet_id))


@version_param
def test_unacknowledged_qos1_is_resent_with_dup_at_reconnect(clients, version):
    topic = f"redeliver/{unique('t')}"
    client_id = unique("q1recv")
    receiver = clients.raw()
    receiver.connect_ok(version, client_id, **raw_persistent(version))
    receiver.send(Subscribe(1, [(topic, SubscriptionOptions(1))]))
    assert receiver.recv() == Suback(1, [1])
    clients(V5).publish(topic, b"unacked", 1)
    first = receiver.recv()
    assert (first.payload, first.dup) == (b"unacked", False)
    receiver.drop()
    receiver = clients.raw()
    assert receiver.connect(version, client_id, **raw_persistent(version)).session_present
    assert receiver.recv() == Publish(topic, b"unacked", 1, False, True, first.packet_id)
    receiver.send(Puback(first.packet_id))
    receiver.drop()
    receiver = clients.raw()
    assert receiver.connect(version, client_id, **raw_persistent(version)).session_present
    clients(V311).publish(topic, SENTINEL, 1)
    assert receiver.recv().payload == SENTINEL  # acknowledged: not sent a third time


def test_mqtt5_disconnect_can_end_the_session(clients):
    client_id = unique("dxexp")
    topic = f"dxexp/{unique('t')}"
    client = clients.raw()
    client.connect_ok(V5, client_id, **raw_persistent(V5))
    client.send(Subscribe(1, [(topic, SubscriptionOptions(1))]))
    assert client.recv() == Suback(1, [1])
    client.send(Disconnect(0, {"session_expiry_interval": 0}))
    client.wait_closed()
    again = clients.new(V5, client_id=client_id, **persistent(V5))
    assert again.connect().session_present is False


@pytest.mark.parametrize("how", ["running", "stopped"])
def test_mqtt5_session_expiry_interval(clients, router, how):
    client_id = unique("expiry")
    topic = f"expiry/{unique('t')}"
    subscriber = clients(V5, client_id=client_id, **persistent(V5, expiry=1))
    assert subscriber.subscribe((f"{topic}/old", 1)) == [1]
    subscriber.disconnect()
    if how == "stopped":
        assert router.stop() == 0
    time.sleep(1.5)  # the session expiry interval is the feature under test
    if how == "stopped":
        router.start()
    again = clients.new(V5, client_id=client_id, **persistent(V5, expiry=60))
    assert again.connect().session_present is False
    assert again.subscribe((f"{topic}/new", 1)) == [1]
    publisher = clients(V311)
    publisher.publish(f"{topic}/old", b"to the expired session", 1)
    publisher.publish(f"{topic}/new", SENTINEL, 1)
    again.expect(f"{topic}/new", SENTINEL)


def test_mqtt5_message_expiry(clients):
    client_id = unique("msgexp")
    topic = f"msgexp/{unique('t')}"
    subscriber = clients(V5, client_id=client_id, **persistent(V5))
    assert subscriber.subscribe((f"{topic}/queued", 1)) == [1]
    subscriber.disconnect()
    publisher = clients(V5)
    for payload, expiry in ((b"short", 1), (b"long", 60), (b"plain", None)):
        properties = publish_properties(MessageExpiryInterval=expiry) if expiry else None
        publisher.publish(f"{topic}/queued", payload, 1, properties=properties)
        publisher.publish(f"{topic}/retained/{payload.decode()}", payload, 1, retain=True,
                          properties=properties)
    time.sleep(1.5)  # message expiry is the feature under test
    again = clients.new(V5, client_id=client_id, **persistent(V5))
    assert again.connect().session_present is True
    long_ = again.expect(f"{topic}/queued", b"long")
    assert 50 <= long_.properties.MessageExpiryInterval < 60  # minus the time it waited
    plain = again.expect(f"{topic}/queued", b"plain")
    assert not hasattr(plain.properties, "MessageExpiryInterval")
    publisher.publish(f"{topic}/queued", SENTINEL, 1)
    again.expect(f"{topic}/queued", SENTINEL)
    # retained messages expire too
    late = clients(V5)
    assert late.subscribe((f"{topic}/retained/+", 1)) == [1]
    publisher.publish(f"{topic}/retained/sentinel", SENTINEL, 1)
    retained = late.collect_until(SENTINEL)
    assert sorted(m.payload for m in retained) == [b"long", b"plain"]
    for message in retained:
        if message.payload == b"long":
            assert 50 <= message.properties.MessageExpiryInterval < 60


@pytest.mark.parametrize("how", ["stop", "kill9"])
def test_retained_message_survives_a_restart(clients, router, how):
    topic = f"keep/{unique('t')}"
    publisher = clients(V311)
    assert publisher.publish(topic, b"\xff\x00 binary", 1, retain=True) == 0
    assert publisher.publish(f"{topic}/gone", b"x", 1, retain=True) == 0
    assert publisher.publish(f"{topic}/gone", b"", 1, retain=True) == 0  # cleared
    restart(router, how)
    subscriber = clients(V5)
    assert subscriber.subscribe((f"{topic}/#", 0)) == [0]
    message = subscriber.next_message()
    assert (message.topic, message.payload, message.retain) == (topic, b"\xff\x00 binary", True)
    clients(V311).publish(f"{topic}/later", SENTINEL, 0)
    subscriber.expect(f"{topic}/later", SENTINEL)


def test_retained_batch_acknowledged_then_kill9_loses_nothing(clients, router):
    """Three publishers with many QoS 1 retained messages in flight each: the writer commits
    a reactor turn's writes together, and every PUBACK still means committed, so a kill -9
    right after the last acknowledgement loses none of them."""
    root = f"keep/{unique('batch')}"
    pending = []
    for index in range(3):
        publisher = clients.new(V311)
        publisher.client.max_inflight_messages_set(50)
        assert publisher.connect().reason_code == 0
        pending += [publisher.client.publish(f"{root}/p{index}/t{n}", b"v%d" % n, 1, True)
                    for n in range(150)]
    for info in pending:
        info.wait_for_publish(30)
        assert info.is_published()
    router.kill9()
    router.start()
    subscriber = clients(V5)
    assert subscriber.subscribe((f"{root}/#", 0)) == [0]
    clients(V311).publish(f"{root}/zz", SENTINEL, 1)
    got = {m.topic: m.payload for m in subscriber.collect_until(SENTINEL)}
    assert got == {f"{root}/p{i}/t{n}": b"v%d" % n for i in range(3) for n in range(150)}


def test_retained_message_is_unchanged_by_a_restart(clients, router):
    topic = f"keep/{unique('exact')}"
    payload = b'[1,  "spaced json"]'  # an MQTT receiver gets the publisher's exact bytes
    properties = dict(ContentType="text/x-test", UserProperty=[("k", "v")],
                      MessageExpiryInterval=600)
    publisher = clients(V5)
    assert publisher.publish(topic, payload, 1, retain=True,
                             properties=publish_properties(**properties)) == 0
    restart(router, "stop")
    subscriber = clients(V5)
    assert subscriber.subscribe((topic, 2)) == [2]
    message = subscriber.next_message()
    assert (message.payload, message.qos, message.retain) == (payload, 1, True)
    assert message.properties.ContentType == "text/x-test"
    assert message.properties.UserProperty == [("k", "v")]
    assert 590 <= message.properties.MessageExpiryInterval <= 600


def test_wamp_qos1_publication_for_offline_session_survives_kill9(clients, router):
    client_id = unique("wampq")
    topic = f"wampq/{unique('t')}"
    subscriber = clients(V311, client_id=client_id, **persistent(V311))
    assert subscriber.subscribe((topic, 1)) == [1]
    subscriber.disconnect()

    async def publish() -> None:
        publisher = await joined(router)
        await wamp_publish(publisher, topic.replace("/", "."), ["from wamp"], _qos=1)
        publisher.close()

    run(publish())
    router.kill9()
    router.start()
    again = clients.new(V311, client_id=client_id, **persistent(V311))
    assert again.connect().session_present is True
    message = again.expect(topic, b'"from wamp"')
    assert message.qos == 1
