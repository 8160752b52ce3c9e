"""MQTT persistent sessions that follow their client among three nodes on one redis-server.

A subscriber leaves its session on node A, messages are published on node B, and it
resumes on node C: the session lives in Redis, and node A (which keeps the offline session
subscribed) queues for it there until C takes it over.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections import Counter

import pytest

from router.mqtt.packets import (Puback, Pubcomp, Publish, Pubrec, Pubrel, Subscribe,
                                 SubscriptionOptions)
from router.engines.redis.resp import BlockingRedis
from tests.harness import RedisServer, RouterProcess
from tests.mqtt_clients import SECRETS, V5, V311, MqttClient, RawMqtt, mqtt_realm, unique

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

N = 1000
"""QoS 1 and QoS 2 messages each published while the subscriber is offline (issue 16's
numbers: about 2.7 s per protocol version here, against 0.45 s with 200)."""
SESSION_TAKEN_OVER = 0x8E
NOT_AUTHORIZED = 0x87
PROBE = b"probe"


def count_until_probe(publisher: MqttClient, subscriber: MqttClient, topic: str,
                      received: Counter) -> None:
    """Publish QoS 0 probes until one reaches ``subscriber`` (its node's interest reached
    the publisher's, and everything queued before it has arrived), counting the QoS >= 1
    messages that come first in ``received``."""
    # a node started under load may take long to hear the others' interest
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, f"no probe on {topic} arrived"
        publisher.publish(topic, PROBE)
        try:
            while True:
                message = subscriber.next_message(timeout=0.05)
                if message.payload == PROBE:
                    return
                if message.qos:
                    received[message.payload] += 1
        except AssertionError:
            continue


TAKEOVER_TIMEOUT = 2
CONFIRM_TIMEOUT = 1


def start_node(base, redis: RedisServer, name: str) -> RouterProcess:
    listeners = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
    return RouterProcess(base / name, [mqtt_realm()], listeners=listeners,
                         extra_config={"engine": {"type": "redis", "url": redis.url,
                                                  "node": name},
                                       "cluster": {"session_takeover_timeout":
                                                   TAKEOVER_TIMEOUT,
                                                   "confirm_timeout": CONFIRM_TIMEOUT}}).start()


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, redis):
    base = tmp_path_factory.mktemp("sessions")
    started = {name: start_node(base, redis, name) for name in ("a", "b", "c")}
    yield started
    for node in started.values():
        node.stop()


def persistent(node: RouterProcess, version: int, client_id: str) -> MqttClient:
    """A persistent session: clean session 0 (3.1.1) or a session expiry (5)."""
    return MqttClient(node, version, client_id=client_id, clean=False,
                      session_expiry=300 if version == V5 else None)


def left_offline(node: RouterProcess, publisher: MqttClient, version: int, client_id: str,
                 topic: str, qos: int) -> None:
    """A persistent session on ``node`` subscribed to ``topic``, whose interest has reached
    ``publisher``'s node, and whose client then disconnected."""
    subscriber = persistent(node, version, client_id)
    assert not subscriber.connect().session_present
    assert subscriber.subscribe((topic, qos)) == [qos]
    count_until_probe(publisher, subscriber, topic, Counter())
    subscriber.disconnect()


def killed_with_a_queue(dying: RouterProcess, publisher: MqttClient, redis: RedisServer,
                        version: int, client_id: str, topic: str, qos: int,
                        payloads: list[bytes]) -> None:
    """A persistent session left offline on ``dying`` (subscribed to ``topic`` at ``qos``),
    ``payloads`` published to it at QoS 1 and written to Redis, then ``dying`` killed -9."""
    left_offline(dying, publisher, version, client_id, topic, qos)
    for payload in payloads:
        publisher.publish(topic, payload, 1)
    wait_queued(redis, client_id, len(payloads))
    dying.kill9()


def wait_queued(redis: RedisServer, client_id: str, count: int,
                publish=lambda: None, protocol: str = "mqtt") -> None:
    """Until Redis holds ``count`` queued messages for ``client_id`` (an AMQP link id with
    ``protocol`` "amqp"), calling ``publish`` between looks."""
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    deadline = time.monotonic() + 10
    try:
        while store.call("HLEN", f"wr:{protocol}-queue:realm1:{client_id}") < count:
            assert time.monotonic() < deadline, f"{count} messages never queued in Redis"
            publish()
            time.sleep(0.02)  # polling Redis, not waiting in place of a check
    finally:
        store.close()


def connected(node: RouterProcess) -> MqttClient:
    client = MqttClient(node)
    client.connect()
    return client


@pytest.mark.parametrize("version", [V311, V5], ids=["mqtt311", "mqtt5"])
def test_offline_session_resumes_on_another_node(nodes, version):
    topic = unique("sess") + "/t"
    client_id = unique("sub")
    publisher = connected(nodes["b"])
    left_offline(nodes["a"], publisher, version, client_id, topic, 2)

    for i in range(N):
        publisher.publish(topic, f"q1-{i}".encode(), 1)
        publisher.publish(topic, f"q2-{i}".encode(), 2)

    resumed = persistent(nodes["c"], version, client_id)
    assert resumed.connect().session_present
    received: Counter[bytes] = Counter()
    expected = {f"q{qos}-{i}".encode() for qos in (1, 2) for i in range(N)}
    while not expected <= received.keys():
        message = resumed.next_message()
        if message.qos:
            received[message.payload] += 1
    # the session now lives on C: a probe from B reaches it there, behind any duplicate
    count_until_probe(publisher, resumed, topic, received)
    assert received.keys() == expected
    assert all(received[f"q2-{i}".encode()] == 1 for i in range(N))
    for client in (resumed, publisher):
        client.close()


def test_in_flight_messages_resume_on_another_node(nodes):
    """A QoS 1 message sent but not acknowledged comes again with DUP; a QoS 2 message
    whose PUBREC was sent continues with PUBREL, and one not yet received is resent once."""
    topic = unique("flight") + "/t"
    client_id = unique("raw")
    raw = RawMqtt(nodes["a"])
    raw.connect_ok(client_id=client_id, clean=False)
    raw.send(Subscribe(1, [(topic, SubscriptionOptions(2))]))
    raw.recv()  # SUBACK
    publisher = connected(nodes["b"])
    deadline = time.monotonic() + 10
    while True:  # QoS 0 probes until B knows A's interest
        assert time.monotonic() < deadline, "A's interest never reached B"
        publisher.publish(topic, PROBE, 0)
        try:
            if raw.recv(timeout=0.05).payload == PROBE:
                break
        except AssertionError:
            continue
    publisher.publish(topic, b"one", 1)
    publisher.publish(topic, b"two", 2)
    publisher.publish(topic, b"three", 2)
    seen = {}
    while len(seen) < 3:
        packet = raw.recv()
        if isinstance(packet, Publish) and packet.payload != PROBE:
            seen[packet.payload] = packet
    raw.send(Pubrec(seen[b"two"].packet_id))
    assert isinstance(raw.recv(), Pubrel)
    raw.drop()  # "one" and "three" unacknowledged, "two" released but not completed

    again = RawMqtt(nodes["c"])
    connack = again.connect(client_id=client_id, clean=False)
    assert connack.session_present
    resent = [again.recv() for _ in range(3)]
    one = next(p for p in resent if isinstance(p, Publish) and p.payload == b"one")
    three = next(p for p in resent if isinstance(p, Publish) and p.payload == b"three")
    pubrel = next(p for p in resent if isinstance(p, Pubrel))
    assert one.dup and three.dup and pubrel.packet_id == seen[b"two"].packet_id
    assert not any(isinstance(p, Publish) and p.payload == b"two" for p in resent)
    again.send(Puback(one.packet_id))
    again.send(Pubcomp(pubrel.packet_id))
    again.send(Pubrec(three.packet_id))
    assert again.recv() == Pubrel(three.packet_id)
    again.send(Pubcomp(three.packet_id))
    again.close()
    # nothing is left: a third resume gets no message again
    last = RawMqtt(nodes["b"])
    assert last.connect(client_id=client_id, clean=False).session_present
    publisher.publish(topic, b"after", 1)
    packet = last.recv()
    assert isinstance(packet, Publish) and packet.payload == b"after" and not packet.dup
    for client in (last, publisher):
        client.close()


@pytest.mark.parametrize("version", [V311, V5], ids=["mqtt311", "mqtt5"])
def test_takeover_across_nodes(nodes, version):
    client_id = unique("take")
    first = persistent(nodes["a"], version, client_id)
    first.connect()
    second = persistent(nodes["c"], version, client_id)
    assert second.connect().session_present
    reason = first.wait_disconnected()
    if version == V5:
        assert reason == SESSION_TAKEN_OVER
    # the session is C's now: a third connection on B takes it from C
    third = persistent(nodes["b"], version, client_id)
    assert third.connect().session_present
    second.wait_disconnected()
    for client in (first, second, third):
        client.close()


@pytest.mark.parametrize("version", [V311, V5], ids=["mqtt311", "mqtt5"])
def test_client_id_of_another_principal_is_refused_on_every_node(nodes, version):
    """alice's client id, from 'limited' or an anonymous client on other nodes: refused
    (0x87 / 3.1.1 return code 5) by the claim itself, alice's connection on A and then
    her offline session and its queue untouched."""
    client_id, topic = unique("alice-id"), unique("mine") + "/t"
    alice_login = {"username": "alice", "password": SECRETS["alice"]}
    publisher = connected(nodes["b"])
    alice = MqttClient(nodes["a"], version, client_id=client_id, clean=False,
                       session_expiry=300 if version == V5 else None, **alice_login)
    assert alice.connect().reason_code == 0
    assert alice.subscribe((topic, 1)) == [1]
    count_until_probe(publisher, alice, topic, Counter())
    others = []
    for node, login in (("c", {"username": "limited", "password": SECRETS["limited"]}),
                        ("b", {})):
        other = MqttClient(nodes[node], version, client_id=client_id, clean=True, **login)
        others.append(other)
        assert other.connect().reason_code == NOT_AUTHORIZED
    assert not alice.disconnected.is_set()
    publisher.publish(topic, b"still hers", 1)
    alice.expect(topic, b"still hers")
    alice.disconnect()
    publisher.publish(topic, b"queued", 1)
    intruder = MqttClient(nodes["c"], version, client_id=client_id, clean=False,
                          session_expiry=300 if version == V5 else None)
    others.append(intruder)
    assert intruder.connect().reason_code == NOT_AUTHORIZED
    again = MqttClient(nodes["c"], version, client_id=client_id, clean=False,
                       session_expiry=300 if version == V5 else None, **alice_login)
    assert again.connect().session_present
    again.expect(topic, b"queued")
    for client in (publisher, alice, again, *others):
        client.close()


def test_session_stored_without_a_holder_stays_its_owners(nodes, redis):
    """A session written by a version that kept no holder (its entry deleted here): another
    principal's claim gets through Redis, but is refused once the session is read, and the
    session keeps its owner: alice resumes it, queue included, on a third node."""
    client_id, topic = unique("legacy"), unique("legacy") + "/t"
    alice_login = {"username": "alice", "password": SECRETS["alice"]}
    publisher = connected(nodes["b"])
    alice = MqttClient(nodes["a"], V5, client_id=client_id, clean=False, session_expiry=300,
                       **alice_login)
    assert alice.connect().reason_code == 0
    assert alice.subscribe((topic, 1)) == [1]
    count_until_probe(publisher, alice, topic, Counter())
    alice.disconnect()
    publisher.publish(topic, b"queued", 1)
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    try:
        assert store.call("HDEL", "wr:mqtt-holder:realm1", client_id) == 1
    finally:
        store.close()
    limited = MqttClient(nodes["c"], V5, client_id=client_id, clean=False, session_expiry=300,
                         username="limited", password=SECRETS["limited"])
    assert limited.connect().reason_code == NOT_AUTHORIZED
    again = MqttClient(nodes["b"], V5, client_id=client_id, clean=False, session_expiry=300,
                       **alice_login)
    assert again.connect().session_present
    received: Counter[bytes] = Counter()
    count_until_probe(publisher, again, topic, received)
    assert received[b"queued"] == 1
    for client in (publisher, alice, limited, again):
        client.close()


@pytest.mark.parametrize("version", [V311, V5], ids=["mqtt311", "mqtt5"])
def test_will_of_a_connection_taken_over_from_another_node_is_published(nodes, version):
    topic = unique("will") + "/t"
    client_id = unique("will-take")
    observer = connected(nodes["b"])
    assert observer.subscribe((topic, 1)) == [1]
    probes = connected(nodes["a"])
    count_until_probe(probes, observer, topic, Counter())  # A knows of the subscription
    old = MqttClient(nodes["a"], version, client_id=client_id,
                     will={"topic": topic, "payload": b"taken over", "qos": 1})
    assert old.connect().reason_code == 0
    new = MqttClient(nodes["c"], version, client_id=client_id)
    assert new.connect().reason_code == 0
    old.wait_disconnected()
    observer.expect(topic, b"taken over")
    for client in (observer, probes, old, new):
        client.close()


def test_clean_start_on_another_node_discards_the_session(nodes):
    """A clean start on C drops what A queued for the client, in Redis too."""
    topic = unique("clean") + "/t"
    client_id = unique("cs")
    publisher = connected(nodes["b"])
    left_offline(nodes["a"], publisher, V5, client_id, topic, 1)
    publisher.publish(topic, b"old", 1)

    fresh = MqttClient(nodes["c"], V5, client_id=client_id, clean=True, session_expiry=300)
    assert not fresh.connect().session_present
    fresh.disconnect()
    again = persistent(nodes["b"], V5, client_id)
    assert again.connect().session_present  # the clean session's own (expiry 300)
    assert again.subscribe((topic, 1)) == [1]
    received: Counter[bytes] = Counter()
    count_until_probe(publisher, again, topic, received)
    assert b"old" not in received
    for client in (again, publisher):
        client.close()


def test_session_of_a_killed_node_resumes_after_the_takeover_timeout(nodes, redis, tmp_path):
    """The owner node is gone (kill -9): the claim waits ``session_takeover_timeout``, then
    the session resumes from what the dead node had written to Redis."""
    dying = start_node(tmp_path, redis, "d")
    topic = unique("dead") + "/t"
    client_id = unique("orphan")
    publisher = connected(nodes["b"])
    count = 20
    killed_with_a_queue(dying, publisher, redis, V311, client_id, topic, 1,
                        [f"m{i}".encode() for i in range(count)])

    started = time.monotonic()
    resumed = persistent(nodes["c"], V311, client_id)
    assert resumed.connect(timeout=TAKEOVER_TIMEOUT + 10).session_present
    assert time.monotonic() - started >= TAKEOVER_TIMEOUT - 0.2
    nodes["c"].wait_for_log("node d did not release the session")
    received = {resumed.next_message().payload for _ in range(count)}
    assert received == {f"m{i}".encode() for i in range(count)}
    for client in (resumed, publisher):
        client.close()


def test_restarted_node_keeps_queueing_for_its_offline_sessions(nodes, redis, tmp_path):
    """A node stopped and started again (same name) loads the offline sessions it had
    from Redis, subscribed: publications on another node are queued for them meanwhile."""
    node = start_node(tmp_path, redis, "e")
    topic = unique("restart") + "/t"
    client_id = unique("kept")
    publisher = connected(nodes["b"])
    left_offline(node, publisher, V5, client_id, topic, 1)
    publisher.publish(topic, b"before", 1)
    wait_queued(redis, client_id, 1)
    node.stop()
    node = start_node(tmp_path, redis, "e")
    assert any("restored 1 persistent MQTT session" in line for line in node.log_lines)
    wait_queued(redis, client_id, 2, lambda: publisher.publish(topic, b"after", 1))
    resumed = persistent(node, V5, client_id)
    assert resumed.connect().session_present
    assert {resumed.next_message().payload for _ in range(2)} == {b"before", b"after"}
    for client in (resumed, publisher):
        client.close()
    node.stop()


def test_acknowledgement_waits_for_the_node_that_stores_the_message(nodes, redis, tmp_path):
    """A publication queued for a session on another node is acknowledged only once that
    node has stored it in Redis. While that node is stopped (SIGSTOP), an MQTT 3.1.1 QoS 2
    publisher is disconnected without PUBREC and an MQTT 5 QoS 1 one gets PUBACK 0x80, after
    ``cluster.confirm_timeout``; once it runs again, the 3.1.1 client's retransmission is
    routed (not taken for a duplicate) and each acknowledgement means "queued in Redis"."""
    stopped = start_node(tmp_path, redis, "s")
    try:
        topic = unique("confirm") + "/t"
        client_id, publisher_id = unique("held"), unique("p311")
        left_offline(stopped, connected(nodes["b"]), V311, client_id, topic, 2)
        v311, v5 = RawMqtt(nodes["b"]), RawMqtt(nodes["b"])
        v311.connect_ok(client_id=publisher_id, clean=False)
        v5.connect_ok(version=V5, client_id=unique("p5"))
        os.kill(stopped.proc.pid, signal.SIGSTOP)
        try:
            v311.send(Publish(topic, b"retried", 2, packet_id=7))
            v5.send(Publish(topic, b"refused", 1, packet_id=1))
            v311.codec.receive_data(v311.wait_closed(CONFIRM_TIMEOUT + 5))
            answers = list(iter(v311.codec.next_packet, None))
            assert not any(isinstance(packet, Pubrec) for packet in answers), answers
            puback = v5.recv(CONFIRM_TIMEOUT + 5)
            assert isinstance(puback, Puback) and puback.reason_code == 0x80
        finally:
            os.kill(stopped.proc.pid, signal.SIGCONT)
        again = RawMqtt(nodes["b"])
        assert again.connect(client_id=publisher_id, clean=False).session_present
        again.send(Publish(topic, b"retried", 2, dup=True, packet_id=7))
        assert again.recv() == Pubrec(7)
        v5.send(Publish(topic, b"kept", 1, packet_id=2))
        assert v5.recv() == Puback(2)
        store = BlockingRedis("127.0.0.1", redis.port, 0)
        try:  # acknowledged: already in the offline session's queue (the stalled node also
            # queued what it read once it ran again: a failed acknowledgement promises nothing)
            queued = b"".join(store.call("HVALS", f"wr:mqtt-queue:realm1:{client_id}"))
        finally:
            store.close()
        assert b"retried" in queued and b"kept" in queued
        again.send(Pubrel(7))
        assert again.recv() == Pubcomp(7)
        for client in (v311, v5, again):
            client.close()
    finally:
        stopped.stop()


def test_acknowledgements_fail_at_the_confirm_timeout_while_redis_is_stopped(tmp_path):
    """SIGSTOP of redis-server: the writes a PUBACK waits for (an offline session's queue, a
    retained message) are never answered; the PUBACK says 0x80 once
    ``cluster.confirm_timeout`` has run (checked once a second), while Redis is still
    stopped, not when it comes back."""
    redis = RedisServer(tmp_path)
    node = start_node(tmp_path, redis, "alone")
    publisher = RawMqtt(node)
    try:
        topic = unique("stopped") + "/t"
        subscriber = persistent(node, V5, unique("kept"))
        subscriber.connect()
        assert subscriber.subscribe((topic, 1)) == [1]
        subscriber.disconnect()  # offline: the node queues for it in Redis
        publisher.connect_ok(V5, unique("p"))
        publisher.send(Publish(topic, b"stored", 1, packet_id=1))
        assert publisher.recv() == Puback(1)
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            publisher.send(Publish(topic, b"queued", 1, packet_id=2))
            publisher.send(Publish(unique("kept") + "/r", b"retained", 1, True, packet_id=3))
            answers = [publisher.recv(CONFIRM_TIMEOUT + 10) for _ in range(2)]
            waited = time.monotonic() - started
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        assert answers == [Puback(2, 0x80), Puback(3, 0x80)]
        assert waited >= CONFIRM_TIMEOUT - 0.1, waited
    finally:
        publisher.close()
        node.stop()
        redis.stop()
