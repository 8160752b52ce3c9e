"""Bounds on what clients can make the router hold, and message expiry, black box.

One router with short limits: 3 testaments per session, persistent MQTT sessions and
durable AMQP links live at most 2 s after their connection, an AMQP sender link has a
window of 10 unsettled deliveries. Where time itself is the condition under test (a
message expiry), the test waits for the clock, not for a guess of how long work takes.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
from autobahn.wamp.exception import ApplicationError
from proton import Delivery, Terminus

from tests.amqp_clients import (Receive, Send, amqp_listeners, body_bytes, connect,
                                expect_body, message, received, send)
from tests.clients import Sessions, next_item, raw_connect, run
from tests.harness import OPEN_ROLE, RouterProcess
from tests.mqtt_clients import V5, V311, ClientPool, mqtt_realm, publish_properties, unique
from tests.retention_helpers import EVENT, call, joined, subscribe

MAX_EXPIRY = 2
WINDOW = 10


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = mqtt_realm("realm1", wamp={"max_testaments": 3, "ack_timeout": 0.3,
                                       "max_redeliveries": 1000},
                       mqtt={"max_session_expiry": MAX_EXPIRY},
                       amqp={"max_link_expiry": MAX_EXPIRY, "inbound_window": WINDOW})
    # anonymous may also list retained events, to see that expired ones are gone
    realm["roles"]["anonymous"] = OPEN_ROLE + [
        {"uri": "wamp.retained.", "match": "prefix", "allow": ["call"]}]
    process = RouterProcess(tmp_path_factory.mktemp("bounds"), [realm],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture
def mqtt(router):
    pool = ClientPool(router)
    yield pool
    pool.close()


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
