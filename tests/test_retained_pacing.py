"""Retained events for a new subscription, paced by the receiver (issue 24, item 9).

A subscription over many more retained topics than the connection's outbound bound
(``max_buffered_messages``, lowered here to BOUND so a few thousand topics show what
100,000 do with the default; ``bench/retained_prefix.py`` measures the 100,000) gets every
one of them, over WAMP (autobahn on RawSocket), MQTT (paho on ``#``, QoS 0 and QoS 1
through a small receive window and session queue) and AMQP (proton), with nothing counted
as dropped; a live event published meanwhile comes after them; a subscriber that stops
reading is disconnected at the slow-consumer timeout while the others are served.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from bench.retained_prefix import retain_topics
from router.core.trie import TopicTrie
from router.mqtt.packets import (Disconnect, Puback, Publish, Suback, Subscribe, Unsuback,
                                 Unsubscribe)
from router.mqtt.packets import SubscriptionOptions as MqttOptions
from tests.amqp_clients import Receive, annotation
from tests.amqp_clients import connect as amqp_connect
from tests.clients import connect, raw_connect, run
from tests.harness import RouterProcess
from tests.metrics_scrape import scrape
from tests.mqtt_clients import V5, MqttClient, RawMqtt, mqtt_realm, unique
from tests.retention_helpers import EVENT, SUBSCRIBED, joined, publish

BOUND = 100
TOPICS = 3000
"""30 times the bound: the unpaced loop delivered about 64 KiB of events plus BOUND."""
FLOW = {"max_buffered_messages": BOUND, "slow_consumer_timeout": 3}
STALLING, BIG = 2000, "x" * 4096
"""8 MB of retained events: more than the kernel's socket buffers take (tcp_wmem's 4 MiB
on the router's side, what a paused reader's buffer keeps), so a subscriber that does not
read is sure to leave its backlog pending."""
QUEUE = 20
"""MQTT session and AMQP link queues far smaller than the backlog: it must not go through them."""


@pytest.fixture
def router(tmp_path):
    listeners = [dict(type="rawsocket", host="127.0.0.1", port=0, **FLOW),
                 dict(type="mqtt", host="127.0.0.1", port=0, realm="realm1", **FLOW),
                 dict(type="amqp", host="127.0.0.1", port=0, realm="realm1", **FLOW),
                 {"type": "metrics", "host": "127.0.0.1", "port": 0}]
    realm = mqtt_realm("realm1", mqtt={"max_queued": QUEUE}, amqp={"max_queued": QUEUE})
    process = RouterProcess(tmp_path, [realm], listeners=listeners,
                            extra_config={"eventlog": {"enabled": False},
                                          "shutdown_timeout": 0.2}).start()
    yield process
    process.stop()


def retained(router, count: int = TOPICS, qos: int = 0, value: str = "21.5C") -> str:
    """Retain ``count`` events ``[n, value]`` under a fresh prefix (``<prefix>.sensor<n>``);
    the last publish is acknowledged once the router holds them all."""
    prefix = unique("paced")
    run(retain_topics(router, count, prefix, serializer="msgpack", qos=qos, value=value),
        timeout=120)
    return prefix


def dropped(router, reason: str | None = None) -> float:
    """The messages the router counted as not delivered (for ``reason``, or any)."""
    return sum(value for (name, labels), value in scrape(router).items()
               if name == "router_messages_dropped_total"
               and (reason is None or ("reason", reason) in labels))


async def reader_behind(router, prefix: str):
    """(a raw subscriber that asked for the retained events under ``prefix`` and has not
    read them, so its backlog is pending, a raw publisher)."""
    subscriber = await joined(router, "rawsocket", "msgpack")
    subscriber.send([32, 1, {"match": "prefix", "get_retained": True}, prefix + "."])
    subscriber.transport.pause_reading()
    return subscriber, await joined(router, "rawsocket", "msgpack")


def test_autobahn_prefix_subscription_gets_every_retained_event(router):
    prefix = retained(router)

    async def scenario():
        client = await connect(router, "rawsocket", "msgpack")
        events = await client.events(prefix + ".", match="prefix", get_retained=True)
        topics = set()
        for _ in range(TOPICS):
            args, _, details = await asyncio.wait_for(events.get(), 30)
            assert details.retained is True
            topics.add(details.topic)
        await client.close()
        return topics

    assert run(scenario(), timeout=120) == {f"{prefix}.sensor{n}" for n in range(TOPICS)}
    assert dropped(router) == 0


@pytest.mark.parametrize("qos", [0, 1])
def test_paho_hash_gets_every_retained_message(router, qos):
    """QoS 1 goes through a receive window of 10 and a persistent session whose queue
    holds QUEUE: sent as PUBACKs free the window, never piled into the queue."""
    prefix = retained(router, qos=qos)
    client = MqttClient(router, V5, clean=False, session_expiry=60,
                        connect_properties={"ReceiveMaximum": 10})
    try:
        client.connect()
        assert client.subscribe(("#", SubscribeOptions(qos=qos))) == [qos]
        topics = set()
        for _ in range(TOPICS):
            message = client.next_message(timeout=30)
            assert message.retain and message.qos == qos
            topics.add(message.topic)
    finally:
        client.close()
    assert topics == {f"{prefix}/sensor{n}" for n in range(TOPICS)}
    assert dropped(router) == 0


def test_amqp_receiver_gets_every_retained_message(router):
    prefix = retained(router)
    connection = amqp_connect(router)
    try:
        receiver = connection.create_receiver(f"prefix:{prefix}.", credit=200,
                                              options=Receive(0, retained=True))
        bodies = set()
        for _ in range(TOPICS):
            msg = receiver.receive(timeout=30)
            assert annotation(msg, "x-opt-retain") is True
            bodies.add(msg.address)
    finally:
        connection.close()
    assert len(bodies) == TOPICS
    assert dropped(router) == 0


@pytest.mark.parametrize("superseding", [False, True], ids=["new-topic", "superseding"])
def test_a_live_event_waits_behind_the_retained_backlog(router, superseding):
    """The subscriber reads nothing until the live event is published (acknowledged), so
    the backlog is still pending then; it must come after every retained event. A live
    retained event on a topic the backlog has not reached yet replaces that topic's
    retained one: it arrives once, live, last."""
    prefix = retained(router, STALLING, value=BIG)
    topic = f"{prefix}.sensor{STALLING - 1}" if superseding else f"{prefix}.live"

    async def scenario():
        subscriber, publisher = await reader_behind(router, prefix)
        await publish(publisher, topic, ["live"], retain=superseding)
        subscriber.transport.resume_reading()
        assert (await subscriber.recv())[0] == SUBSCRIBED
        expected = STALLING if superseding else STALLING + 1
        messages = [await subscriber.recv(timeout=30) for _ in range(expected)]
        await publish(publisher, f"{prefix}.end", ["sentinel"])
        messages.append(await subscriber.recv(timeout=30))
        publisher.close()
        subscriber.close()
        return messages

    *retained_events, live, sentinel = run(scenario(), timeout=120)
    assert all(m[0] == EVENT and m[3].get("retained") is True for m in retained_events)
    assert len({m[3]["topic"] for m in retained_events}) == len(retained_events)
    assert topic not in {m[3]["topic"] for m in retained_events}
    assert live[0] == EVENT and live[4] == ["live"] and "retained" not in live[3]
    assert sentinel[4] == ["sentinel"]
    assert dropped(router) == 0


def test_live_events_past_the_bound_behind_a_backlog_are_dropped_and_counted(router):
    """BOUND live events wait behind a pending backlog, in order; the rest are counted."""
    prefix = retained(router, STALLING, value=BIG)

    async def scenario():
        subscriber, publisher = await reader_behind(router, prefix)
        publisher.send_many([[16, n + 1, {}, f"{prefix}.live", [n]] for n in range(BOUND + 50)])
        await publish(publisher, f"{prefix}.live", ["last"])  # after all of them
        subscriber.transport.resume_reading()
        assert (await subscriber.recv())[0] == SUBSCRIBED
        messages = [await subscriber.recv(timeout=30) for _ in range(STALLING + BOUND)]
        publisher.close()
        subscriber.close()
        return messages

    messages = run(scenario(), timeout=120)
    assert all(m[3].get("retained") is True for m in messages[:STALLING])
    assert [m[4] for m in messages[STALLING:]] == [[n] for n in range(BOUND)]
    assert dropped(router, "queue_full") == 51
    assert dropped(router) == 51


def test_overlapping_mqtt_subscriptions_get_one_copy_each_around_a_backlog(router):
    """One MQTT 5 session on ``p/live`` (identifier 2), then ``p/#`` (identifier 1) with a
    pending backlog: a live message on ``p/live`` reaches the first at once and the second
    after its retained messages, each copy with its own identifier, no third copy."""
    prefix = retained(router, STALLING, value=BIG)
    subscriber = RawMqtt(router)
    publisher = MqttClient(router, V5)
    try:
        subscriber.connect_ok(V5, unique("overlap"))
        subscriber.send(Subscribe(1, [(f"{prefix}/live", MqttOptions())],
                                  {"subscription_identifier": [2]}))
        assert isinstance(subscriber.recv(), Suback)
        subscriber.send(Subscribe(2, [(f"{prefix}/#", MqttOptions())],
                                  {"subscription_identifier": [1]}))
        publisher.connect()  # the subscriber reads nothing meanwhile: its backlog waits
        assert publisher.publish(f"{prefix}/live", b"live", qos=1) == 0
        assert publisher.publish(f"{prefix}/end", b"sentinel", qos=1) == 0
        packets = []
        while not packets or getattr(packets[-1], "payload", None) != b"sentinel":
            packets.append(subscriber.recv(timeout=30))
    finally:
        publisher.close()
        subscriber.close()
    publishes = [p for p in packets if isinstance(p, Publish)]
    live = [(n, p.properties.get("subscription_identifier")) for n, p in enumerate(publishes)
            if p.payload == b"live"]
    assert sum(1 for p in publishes if p.retain) == STALLING
    last_retained = max(n for n, p in enumerate(publishes) if p.retain)
    assert [ids for _, ids in live] == [[2], [1]]
    assert live[1][0] > last_retained


def test_a_subscriber_that_stops_reading_is_disconnected_not_dropped_from(router):
    prefix = retained(router, STALLING, value=BIG)

    async def scenario():
        stalled = await raw_connect(router, "rawsocket", "msgpack")
        stalled.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the router's buffer is what fills
        welcome = await stalled.hello()
        stalled.send([32, 1, {"match": "prefix", "get_retained": True}, prefix + "."])
        stalled.transport.pause_reading()
        # another client is served meanwhile, in full
        healthy = await connect(router, "rawsocket", "msgpack")
        events = await healthy.events(prefix + ".", match="prefix", get_retained=True)
        for _ in range(STALLING):
            await asyncio.wait_for(events.get(), 30)
        await healthy.close()
        await asyncio.to_thread(router.wait_for_log, rf"realm1, wamp: disconnected: session "
                                rf"{welcome[1]}: slow consumer", 20)
        stalled.transport.resume_reading()
        await asyncio.wait_for(stalled.closed, 20)

    run(scenario(), timeout=120)
    assert dropped(router) == 0


def test_a_trie_walk_survives_changes_between_its_steps():
    """A backlog walks the retained store over many reactor turns while topics come and go."""
    trie: TopicTrie[int] = TopicTrie()
    for n in range(100):
        trie.set(("a", f"t{n}"), n)
    walk = trie.under_prefix(("a", "t"))
    first = [next(walk) for _ in range(10)]
    trie.set(("a", "new"), -1)  # a sibling added at the level being walked
    for key, _ in first:
        trie.pop(key)
    trie.pop(("a", "t99"))
    rest = list(walk)
    assert {key for key, _ in first}.isdisjoint(key for key, _ in rest)
    assert ("a", "t99") not in {key for key, _ in rest}
    assert len(rest) == 89
    hash_walk = trie.matching_filter(("#",))
    next(hash_walk)
    trie.set(("b",), 0)
    list(hash_walk)


def test_what_waited_behind_the_backlog_is_kept_by_a_persistent_session(router):
    """A live QoS 1 message held behind the backlog when the connection ends is queued in
    the persistent session (and sent on the next connection), not lost with the backlog."""
    prefix = retained(router, 100, qos=1)
    client_id = unique("held")
    session = {"session_expiry_interval": 60}
    first, second = RawMqtt(router), RawMqtt(router)
    publisher = MqttClient(router, V5)
    try:
        first.connect_ok(V5, client_id, clean=False, properties=dict(session, receive_maximum=1))
        first.send(Subscribe(1, [(f"{prefix}/#", MqttOptions(qos=1))]))
        assert isinstance(first.recv(), Suback)
        in_flight = first.recv()  # never acknowledged: the window of one stays full
        assert isinstance(in_flight, Publish) and in_flight.retain
        publisher.connect()
        assert publisher.publish(f"{prefix}/live", b"live", qos=1) == 0
        first.send(Disconnect())
        first.wait_closed()
        assert second.connect_ok(V5, client_id, clean=False, properties=session).session_present
        again = second.recv()
        assert (again.topic, again.dup) == (in_flight.topic, True)
        live = second.recv()
        assert (live.topic, live.payload, live.retain) == (f"{prefix}/live", b"live", False)
    finally:
        publisher.close()
        first.close()
        second.close()


def test_what_waited_behind_the_backlog_is_sent_when_the_client_unsubscribes(router):
    """A live QoS 1 message held behind the backlog when its subscription is removed is
    still sent (MQTT 3.10.4 allows it), not counted as delivered and silently left out."""
    prefix = retained(router, 100, qos=1)
    client = RawMqtt(router)
    publisher = MqttClient(router, V5)
    try:
        client.connect_ok(V5, unique("unsub"), properties={"receive_maximum": 1})
        client.send(Subscribe(1, [(f"{prefix}/#", MqttOptions(qos=1))]))
        assert isinstance(client.recv(), Suback)
        in_flight = client.recv()  # not acknowledged yet: the backlog waits behind it
        assert isinstance(in_flight, Publish) and in_flight.retain
        publisher.connect()
        assert publisher.publish(f"{prefix}/live", b"live", qos=1) == 0
        client.send(Unsubscribe(2, [f"{prefix}/#"]))
        client.send(Puback(in_flight.packet_id))
        seen: list = []
        while not any(isinstance(p, Publish) and p.payload == b"live" for p in seen):
            packet = client.recv()
            seen.append(packet)
            if isinstance(packet, Publish) and packet.qos:
                client.send(Puback(packet.packet_id))
        assert any(isinstance(p, Unsuback) for p in seen) or isinstance(client.recv(), Unsuback)
        live = next(p for p in seen if isinstance(p, Publish) and p.payload == b"live")
        assert (live.topic, live.retain) == (f"{prefix}/live", False)
    finally:
        publisher.close()
        client.close()
