"""Bounds on what clients can make the router hold, and message expiry, black box.

One router with short limits: 3 testaments per session, persistent MQTT sessions and
durable AMQP links live at most 2 s after their connection, an AMQP sender link has a
window of 10 unsettled deliveries, an AMQP receiver link queues at most 5 messages (and
its QoS policy is the realm's ``amqp.qos_policy``, ``maximum``). Where time itself is the condition under test (a
message expiry), the test waits for the clock, not for a guess of how long work takes.
"""

from __future__ import annotations

import re
import sqlite3
import time

import pytest
from autobahn.wamp.exception import ApplicationError
from proton import Delivery, Terminus

from tests.amqp_clients import (Receive, Send, amqp_listeners, body_bytes, connect,
                                expect_body, message, received, send, settle)
from tests.clients import Sessions, next_item, raw_connect, run
from tests.harness import OPEN_ROLE, RouterProcess
from tests.mqtt_clients import V5, V311, ClientPool, mqtt_realm, publish_properties, unique
from tests.retention_helpers import EVENT, call, joined, subscribe

MAX_EXPIRY = 2
WINDOW = 10
MAX_QUEUED = 5


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = mqtt_realm("realm1", wamp={"max_testaments": 3, "ack_timeout": 0.3,
                                       "max_redeliveries": 1000},
                       mqtt={"max_session_expiry": MAX_EXPIRY},
                       amqp={"max_link_expiry": MAX_EXPIRY, "inbound_window": WINDOW,
                             "max_queued": MAX_QUEUED, "qos_policy": "maximum"})
    # anonymous may also list retained events, to see that expired ones are gone
    realm["roles"]["anonymous"] = OPEN_ROLE + [
        {"uri": "wamp.retained.", "match": "prefix", "allow": ["call"]}]
    process = RouterProcess(tmp_path_factory.mktemp("bounds"), [realm],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


def wait_until(deadline: float) -> None:
    """Let the clock pass ``deadline``: the condition under test is the time itself."""
    while time.time() <= deadline:
        time.sleep(0.05)


# --- testaments ---------------------------------------------------------------------------


def test_testaments_per_session_are_limited_and_the_kept_ones_still_fire(router):
    async def scenario():
        async with Sessions(router) as open_session:
            watcher = await open_session()
            topic = f"com.bounds.{unique('testament')}"
            events = await watcher.events(topic)
            testator = await open_session()
            add = "wamp.session.add_testament"
            await testator.call(add, topic, ["one"], {})
            await testator.call(add, topic, ["two"], {}, scope="detached")
            await testator.call(add, topic, ["three"], {})
            with pytest.raises(ApplicationError) as refused:
                await testator.call(add, topic, ["four"], {}, scope="detached")
            assert refused.value.error == "wamp.error.limit_exceeded"
            assert "max_testaments" in refused.value.args[0]
            router.wait_for_log(r"realm realm1, wamp: refused: session \d+: testament limit 3")
            # room again after a flush: the bound is on what is held, not on calls made
            assert await testator.call("wamp.session.flush_testaments") == 2
            await testator.call(add, topic, ["five"], {})
            await testator.close()
            published = [(await next_item(events))[0][0] for _ in range(2)]
            assert published == ["two", "five"]  # detached first, then destroyed

    run(scenario())


# --- session and link expiry --------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5], ids=["mqtt311", "mqtt5-never"])
def test_persistent_mqtt_session_expires_at_the_realm_maximum(router, mqtt, version):
    client_id = unique("persistent")
    # 3.1.1: clean session 0 never expires by itself; 5: 0xFFFFFFFF means "never"
    settings = ({"clean": False} if version == V311
                else {"clean": True, "session_expiry": 0xFFFFFFFF})
    first = mqtt(version, client_id=client_id, **settings)
    first.subscribe((f"com/bounds/{client_id}", 1))
    first.disconnect()
    again = mqtt.new(version, client_id=client_id, clean=False, session_expiry=0xFFFFFFFF)
    connack = again.connect()
    assert connack.session_present, "the session must outlive its connection"
    if version == V5:  # the server's expiry differs from the request: CONNACK says so
        assert connack.properties.SessionExpiryInterval == MAX_EXPIRY
    again.disconnect()
    router.wait_for_log(rf"MQTT session {client_id} expired", timeout=MAX_EXPIRY + 5)
    late = mqtt.new(version, client_id=client_id, clean=False, session_expiry=0xFFFFFFFF)
    assert late.connect().session_present is False
    late.disconnect()


def test_mqtt5_session_expiry_within_the_maximum_is_not_echoed(router, mqtt):
    connack = mqtt.new(V5, session_expiry=1).connect()
    assert connack.reason_code == 0
    assert not hasattr(connack.properties, "SessionExpiryInterval")


def test_durable_amqp_link_expires_at_the_realm_maximum(router):
    address = f"com.bounds.{unique('durable')}"
    container, link_name = unique("container"), unique("never")

    def attach():
        connection = connect(router, container_id=container)
        receiver = connection.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        return connection, receiver

    subscriber, receiver = attach()
    source = receiver.link.remote_source
    assert source.timeout == MAX_EXPIRY  # "never" became the maximum, and the answer says so
    assert source.expiry_policy != Terminus.EXPIRE_NEVER
    subscriber.close()
    publisher = connect(router)
    sender = publisher.create_sender(address, options=Send(1))
    send(sender, message(b"queued while detached", qos=1))
    router.wait_for_log(rf"AMQP durable subscription {container}/{link_name} expired "
                        r"\(1 message", timeout=MAX_EXPIRY + 5)
    subscriber, receiver = attach()
    send(sender, message(b"sentinel", qos=1))
    expect_body(receiver, b"sentinel")  # the queue went with the link
    subscriber.close()
    publisher.close()



def test_sessions_and_links_restored_after_a_restart_get_the_lowered_maximum(tmp_path):
    realm = mqtt_realm("realm1", mqtt={"max_session_expiry": 3600},
                       amqp={"max_link_expiry": 3600})
    process = RouterProcess(tmp_path, [realm], listeners=amqp_listeners("realm1", wamp=False))
    process.start()
    client_id, container, link_name = unique("restored"), unique("container"), unique("link")
    address = f"com.bounds.{link_name}"
    pool = ClientPool(process)

    def attach():
        connection = connect(process, container_id=container)
        return connection, connection.create_receiver(address, credit=10, name=link_name,
                                                      options=Receive(1, durable=True))

    try:
        client = pool(V311, client_id=client_id, clean=False)
        client.subscribe((f"com/bounds/{client_id}", 1))
        client.disconnect()
        connection, _ = attach()
        connection.close()
        publisher = connect(process)
        send(publisher.create_sender(address, options=Send(1)), message(b"queued", qos=1))
        publisher.close()
        gone_by = time.time() + 1.2  # both were detached before this, by a margin
        assert process.stop() == 0
        realm["mqtt"]["max_session_expiry"] = realm["amqp"]["max_link_expiry"] = 1
        process.write_config()
        process.start()
        wait_until(gone_by)  # under the old maximum both would still live for an hour
        assert pool.new(V311, client_id=client_id, clean=False).connect().session_present is False
        connection, receiver = attach()
        publisher = connect(process)
        send(publisher.create_sender(address, options=Send(1)), message(b"sentinel", qos=1))
        expect_body(receiver, b"sentinel")  # the queued message went with the expired link
        connection.close()
        publisher.close()
    finally:
        pool.close()
        process.stop()

# --- AMQP inbound credit ------------------------------------------------------------------


def test_amqp_sender_never_has_more_than_the_window_unsettled(router):
    """With the disk held by another writer, the router cannot store (so cannot accept)
    retained QoS 1 messages: the sender gets no credit beyond the window and the rest
    waits on the client; once the disk is free, everything is accepted."""
    address = f"com.bounds.{unique('window')}"
    total = 3 * WINDOW
    connection = connect(router)
    # the router's events reach this receiver on the same connection, behind any credit
    # it gave the sender while handling the same deliveries
    receiver = connection.create_receiver(address, credit=total, options=Receive(0))
    sender = connection.create_sender(address, options=Send(1))
    link = sender.link
    blocker = sqlite3.connect(router.workdir / "data" / "router.sqlite3", timeout=10,
                              isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the router's writer now waits for the lock
    try:
        deliveries = [link.send(message(f"m{i}".encode(), qos=1, retain=True))
                      for i in range(total)]
        fetcher = receiver.fetcher
        connection.wait(lambda: len(fetcher.incoming) >= WINDOW, timeout=10,
                        msg="waiting for the first window to be routed")
        assert [body_bytes(msg) for msg, _ in fetcher.incoming] == \
            [f"m{i}".encode() for i in range(WINDOW)]
        # proton counts the credit the router gave minus the deliveries made: the window
        assert link.credit == WINDOW - total, "the router gave credit for unsettled deliveries"
        assert link.queued == total - WINDOW
        assert not any(d.remote_state for d in deliveries)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    outstanding = []

    def all_answered() -> bool:
        answered = sum(1 for d in deliveries if d.remote_state)
        outstanding.append(total - link.queued - answered)
        return answered == total

    connection.wait(all_answered, timeout=10, msg="waiting for every outcome")
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
    assert max(outstanding) <= WINDOW
    connection.close()


# --- message expiry -----------------------------------------------------------------------

SENTINEL = b'"sentinel"'


def short_lived(publisher, mqtt_topic: str, payload: bytes, retain: bool = False) -> float:
    """An MQTT 5 QoS 1 message that expires 1 s after the router got it; returns a time by
    which it has surely expired (the router got it before the PUBACK came back)."""
    assert publisher.publish(mqtt_topic, payload, qos=1, retain=retain,
                             properties=publish_properties(MessageExpiryInterval=1)) == 0
    return time.time() + 1


def amqp_before_sentinel(receiver) -> list[bytes]:
    bodies = []
    while True:
        msg, delivery = received(receiver)
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if body_bytes(msg) == SENTINEL:
            return bodies
        bodies.append(body_bytes(msg))


async def wamp_before_sentinel(client) -> list:
    args = []
    while True:
        event = await client.recv()
        assert event[0] == EVENT, event
        if event[4] == ["sentinel"]:
            return args
        args.append(event[4])


def test_expired_retained_message_reaches_no_protocol_and_is_removed(router, mqtt):
    name = unique("expiring")
    mqtt_topic, uri = f"com/bounds/{name}", f"com.bounds.{name}"
    publisher = mqtt(V5)

    async def retained_everywhere(mqtt_client, amqp_connection, wamp_client) -> list:
        """What each protocol gets as retained on (mqtt_topic, uri) before a live sentinel."""
        mqtt_client.subscribe((mqtt_topic, 1))
        amqp_receiver = amqp_connection.create_receiver(uri, credit=10,
                                                        options=Receive(1, retained=True))
        await subscribe(wamp_client, uri, get_retained=True)
        assert publisher.publish(mqtt_topic, SENTINEL, qos=1) == 0
        return [[m.payload for m in mqtt_client.collect_until(SENTINEL)],
                amqp_before_sentinel(amqp_receiver), await wamp_before_sentinel(wamp_client)]

    async def scenario():
        # everything is connected before the message exists: its second is for the checks
        clients = (mqtt(V5), connect(router), await joined(router, "websocket"))
        expires_by = short_lived(publisher, mqtt_topic, b'"short-lived"', retain=True)
        before = await retained_everywhere(*clients)
        assert time.time() < expires_by - 0.05, "too slow to check before the expiry"
        assert before == [[b'"short-lived"'], [b'"short-lived"'], [["short-lived"]]]
        wait_until(expires_by)
        wamp_client = await joined(router, "websocket")
        after = await retained_everywhere(mqtt(V5), connect(router), wamp_client)
        assert after == [[], [], []]
        listed = await call(wamp_client, "wamp.retained.list", kwargs={"prefix": uri})
        assert listed[3] == [[]], "the expired retained message is still stored"

    run(scenario())


def test_expired_message_queued_for_an_amqp_link_is_not_sent(router, mqtt):
    name = unique("queued")
    mqtt_topic, uri = f"com/bounds/{name}", f"com.bounds.{name}"
    connection = connect(router)
    receiver = connection.create_receiver(uri, credit=0, options=Receive(1))  # no credit yet
    publisher = mqtt(V5)
    expires_by = short_lived(publisher, mqtt_topic, b'"expiring"')
    assert publisher.publish(mqtt_topic, b'"kept"', qos=1) == 0
    wait_until(expires_by)
    receiver.flow(10)
    assert publisher.publish(mqtt_topic, SENTINEL, qos=1) == 0
    assert amqp_before_sentinel(receiver) == [b'"kept"']
    router.wait_for_log(r"realm realm1, amqp: expired: link com\.bounds\.queued_")
    connection.close()


def test_amqp_link_queue_stops_at_the_realm_maximum(router):
    """``amqp.max_queued``: a receiver link without credit keeps that many messages; the
    next ones are dropped and counted (``queue_full``), and the kept ones arrive in order."""
    address = f"com.bounds.{unique('full')}"
    connection = connect(router)
    receiver = connection.create_receiver(address, credit=0, options=Receive(1))
    publisher = connect(router)
    sender = publisher.create_sender(address, options=Send(1))
    bodies = [b'"m%d"' % index for index in range(MAX_QUEUED + 2)]
    for body in bodies:
        assert send(sender, message(body, qos=1)).remote_state == Delivery.ACCEPTED
    router.wait_for_log(rf"realm realm1, amqp: queue_full: {re.escape(address)}, QoS 1")
    receiver.flow(len(bodies) + 1)
    for body in bodies[:MAX_QUEUED]:
        expect_body(receiver, body)
    send(sender, message(SENTINEL, qos=1))  # the queue has room again: it goes through
    assert amqp_before_sentinel(receiver) == []  # and the dropped ones never came
    connection.close()
    publisher.close()


def test_amqp_receiver_gets_the_realm_qos_policy(router):
    """``amqp.qos_policy: maximum``: a QoS 1 link that names no policy gets a QoS 0 message
    as QoS 1 (unsettled); under the built-in default (``minimum``) it would come settled."""
    address = f"com.bounds.{unique('policy')}"
    connection = connect(router)
    receiver = connection.create_receiver(address, credit=10, options=Receive(1))
    publisher = connect(router)
    sender = publisher.create_sender(address, options=Send(1))
    send(sender, message(b'"zero"', qos=0))  # published as QoS 0 (x-opt-qos), answered
    msg, delivery = received(receiver)
    assert body_bytes(msg) == b'"zero"'
    assert not delivery.settled
    settle(receiver, delivery)
    connection.close()
    publisher.close()


def test_expired_message_is_not_delivered_again_to_a_wamp_subscriber(router, mqtt):
    name = unique("unacked")
    mqtt_topic, uri = f"com/bounds/{name}", f"com.bounds.{name}"

    async def scenario():
        subscriber = await raw_connect(router, "websocket")
        welcome = await subscriber.hello("realm1", {"roles": {"subscriber": {"features": {}}}})
        assert welcome[0] == 2
        await subscribe(subscriber, uri, _qos=1)
        publisher = mqtt(V5)
        short_lived(publisher, mqtt_topic, b'"expiring"')
        first = await subscriber.recv()
        assert first[4] == ["expiring"] and first[3].get("x_acknowledged_delivery") is True
        # never acknowledged: sent again every 0.3 s until it expires, then dropped, counted
        router.wait_for_log(r"realm realm1, wamp: expired: session \d+: " + uri.replace(".", r"\."))
        assert publisher.publish(mqtt_topic, SENTINEL, qos=0) == 0
        copies = await wamp_before_sentinel(subscriber)
        assert set(map(tuple, copies)) <= {("expiring",)}
        subscriber.close()

    run(scenario())
