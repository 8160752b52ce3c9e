"""Three router nodes on one real redis-server: one realm across all of them.

A node learns the other nodes' subscriptions (interest) through Redis a moment after they
are made; :func:`reaches` waits for that by publishing probes until one arrives, then the
check itself runs. "Nothing arrived" is proven by a later event that the same path orders
behind anything that could have arrived.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import shutil
import signal
import socket
import time

import pytest
from autobahn.wamp.types import PublishOptions

from router.engines.records import decode_retained, unpack_topic
from router.engines.redis.realm import INTEREST_CHANNEL, unpack_patterns
from router.engines.redis.resp import INCOMPLETE, BlockingRedis, command, parse
from router.engines.records import topic_key
from spark_analytics.reader import read_events
from spark_analytics.session import Sizing, start_session
from spark_analytics.storage import HadoopFiles, to_url
from tests.amqp_clients import Receive, amqp_listeners
from tests.amqp_clients import connect as amqp_connect
from tests.amqp_clients import received as amqp_received
from tests.clients import connect, next_item, raw_connect, run
from tests.harness import (OPEN_ROLE, RedisServer, RouterProcess, SubscribeHold, realm_file,
                           redis_cluster)
from tests.mqtt_clients import MqttClient, probe_until_received
from tests.test_backpressure import rss_mb

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

PROBE = "probe"
_names = itertools.count(1)


class ChannelWatch:
    """PSUBSCRIBE to every node's channel: which nodes were sent publications."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), 5)
        self.buffer = bytearray()
        self.socket.sendall(command("PSUBSCRIBE", "wr:node:*"))
        assert self.next()[0] == b"psubscribe"

    def next(self) -> list:
        while True:
            parsed = parse(self.buffer, 0) if self.buffer else INCOMPLETE
            if parsed is not INCOMPLETE:
                reply, position = parsed  # type: ignore[misc]
                del self.buffer[:position]
                return reply
            self.buffer += self.socket.recv(65536)

    def channels_until_ping(self) -> list[bytes]:
        """Channels of everything published so far (Redis answers PING behind them)."""
        self.socket.sendall(command("PING"))
        channels = []
        while True:
            reply = self.next()
            if reply[0] == b"pong":
                return channels
            channels.append(reply[2])

    def close(self) -> None:
        self.socket.close()


HISTORY_LIMIT = 3
REALM = realm_file(
    "realm1", roles={"anonymous": OPEN_ROLE + [
        {"uri": "wamp.retained.", "match": "prefix", "allow": ["call"]}]},
    history=[{"uri": "hist.", "match": "prefix", "limit": HISTORY_LIMIT}])
"""Every node: anonymous may do anything and list retained events; topics under ``hist.``
keep their last three events."""


def start_node(base, redis: RedisServer | SubscribeHold, name: str, launch_only: bool = False,
               **cluster) -> RouterProcess:
    """A node on ``redis`` (or a relay to it), ready unless ``launch_only``; ``cluster``: keys
    of the config's ``cluster`` block."""
    listeners = amqp_listeners() + [{"type": "rawsocket", "host": "127.0.0.1", "port": 0}]
    node = RouterProcess(base / name, [REALM], listeners=listeners,
                         extra_config={"engine": {"type": "redis", "url": redis.url,
                                                  "node": name},
                                       "cluster": cluster})
    return node.launch() if launch_only else node.start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("cluster"), start_node) as running:
        yield running


def topic(prefix: str = "cl") -> str:
    return f"{prefix}.t{next(_names)}"


async def reaches(publisher, probe_topic: str, received: asyncio.Queue) -> None:
    """Publish probes on ``probe_topic`` until the subscriber behind ``received`` gets one:
    its node's interest has then reached the publisher's node."""
    # a node started under load may take long to hear the others' interest
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        publisher.publish(probe_topic, PROBE)
        try:
            await next_item(received, 0.05)
            break
        except asyncio.TimeoutError:
            continue
    else:
        raise AssertionError(f"the interest in {probe_topic} never reached the publisher")


async def next_event(received: asyncio.Queue) -> tuple:
    """The next event that is not a probe (from a WAMP or an MQTT publisher)."""
    while True:
        item = await next_item(received)
        if item[0] not in ([PROBE], [PROBE.encode()]):
            return item


def test_every_match_kind_reaches_subscribers_on_other_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        publisher = await connect(nodes["a"])
        subscriber = await connect(nodes["b"], "rawsocket", "msgpack")
        base = topic()
        exact = await subscriber.events(f"{base}.x.z")
        prefix = await subscriber.events(f"{base}.p", match="prefix")
        wildcard = await subscriber.events(f"{base}..y", match="wildcard")
        await reaches(publisher, f"{base}.x.z", exact)
        await reaches(publisher, f"{base}.pq", prefix)
        await reaches(publisher, f"{base}.w.y", wildcard)
        publisher.publish(f"{base}.x.z", 1, key="v")
        publisher.publish(f"{base}.pz.z", 2)
        publisher.publish(f"{base}.q.y", 3)
        args, kwargs, _ = await next_event(exact)
        assert (args, kwargs) == ([1], {"key": "v"})
        args, _, details = await next_event(prefix)
        assert args == [2] and details.topic == f"{base}.pz.z"
        args, _, details = await next_event(wildcard)
        assert args == [3] and details.topic == f"{base}.q.y"
        for session in (publisher, subscriber):
            await session.close()

    run(scenario())


def test_eligibility_and_publisher_exclusion_hold_across_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        publisher = await connect(nodes["a"])
        kept = await connect(nodes["b"])
        excluded = await connect(nodes["b"])
        name = topic()
        own = await publisher.events(name)
        kept_events = await kept.events(name)
        excluded_events = await excluded.events(name)
        await reaches(publisher, name, kept_events)
        await next_item(excluded_events)  # the probe: b's interest is known to a
        await publisher.publish(name, "secret", options=PublishOptions(
            exclude=[excluded._session_id], acknowledge=True))
        await publisher.publish(name, "all", options=PublishOptions(acknowledge=True))
        assert (await next_event(kept_events))[0] == ["secret"]
        assert (await next_event(kept_events))[0] == ["all"]
        assert (await next_event(excluded_events))[0] == ["all"]  # "secret" never came
        # the publisher's own session is excluded on its node; only probes reached it
        while not own.empty():
            assert own.get_nowait()[0] == [PROBE]
        for session in (publisher, kept, excluded):
            await session.close()

    run(scenario())


def test_mqtt_wamp_and_amqp_clients_on_different_nodes(cluster):
    _, nodes = cluster
    name = topic("mq")
    mqtt_topic = name.replace(".", "/")
    mqtt_subscriber = MqttClient(nodes["c"])
    mqtt_subscriber.connect()
    connection = amqp_connect(nodes["c"])
    receiver = connection.create_receiver(mqtt_topic, credit=1000, options=Receive(qos=0))
    mqtt_subscriber.subscribe((mqtt_topic, 0))
    mqtt_publisher = MqttClient(nodes["a"])
    mqtt_publisher.connect()
    payload = b"\x00\xff"

    async def scenario():
        subscriber = await connect(nodes["b"], "rawsocket", "msgpack")
        events = await subscriber.events(name)
        publisher = await connect(nodes["a"])
        await reaches(publisher, name, events)
        await asyncio.to_thread(probe_until_received, mqtt_publisher, mqtt_subscriber,
                                mqtt_topic)
        await asyncio.to_thread(mqtt_publisher.publish, mqtt_topic, payload, 1)
        assert (await next_event(events))[0] == [payload]  # docs/mqtt-and-amqp.md's payload table
        await subscriber.close()
        await publisher.close()

    run(scenario())
    probes = (PROBE.encode(), b'"probe"')  # from the MQTT and from the WAMP publisher
    assert all(m.payload in probes for m in mqtt_subscriber.collect_until(payload))
    while True:  # the AMQP receiver got the probes too, then the message
        msg, delivery = amqp_received(receiver)
        delivery.settle()
        if msg.body == payload:
            break
        assert msg.body in probes + (PROBE,), msg  # the WAMP probe arrives as a string
    for client in (mqtt_subscriber, mqtt_publisher):
        client.close()
    connection.close()


def test_a_date_from_a_cbor_publisher_reaches_other_nodes_as_text(cluster):
    """The rule of docs/mqtt-and-amqp.md for values JSON has no type for holds across nodes
    too."""
    _, nodes = cluster
    name = topic("date")
    mqtt_subscriber = MqttClient(nodes["b"])
    mqtt_subscriber.connect()
    mqtt_subscriber.subscribe((name.replace(".", "/"), 0))
    moment = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)

    async def scenario():
        subscriber = await connect(nodes["b"], "rawsocket", "json")
        events = await subscriber.events(name)
        publisher = await connect(nodes["a"], "rawsocket", "cbor")
        await reaches(publisher, name, events)
        await publisher.publish(name, moment, options=PublishOptions(acknowledge=True))
        assert (await next_event(events))[0] == ["2024-05-01T12:30:00+00:00"]
        await subscriber.close()
        await publisher.close()

    run(scenario())
    received = mqtt_subscriber.collect_until(b'"2024-05-01T12:30:00+00:00"')
    assert all(message.payload == b'"probe"' for message in received)
    mqtt_subscriber.close()


def test_retained_set_on_one_node_is_read_on_others_also_after_kill_9(cluster, tmp_path):
    redis, nodes = cluster
    setter = start_node(tmp_path, redis, "setter")
    name = topic()

    async def set_and_read():
        watcher = await connect(nodes["b"])
        live = await watcher.events(name)
        publisher = await connect(setter)
        await reaches(publisher, name, live)
        await publisher.publish(name, "kept", options=PublishOptions(retain=True,
                                                                    acknowledge=True))
        assert (await next_event(live))[0] == ["kept"]
        # b applied the retained change before the event (same connection, in order)
        late = await connect(nodes["b"])
        retained = await late.events(name, get_retained=True)
        assert (await next_item(retained))[0] == ["kept"]
        for session in (watcher, publisher, late):
            await session.close()

    run(set_and_read())
    setter.kill9()
    fresh = start_node(tmp_path, redis, "fresh")  # loads every retained event from Redis

    async def read_after_kill():
        for node in (nodes["c"], fresh):
            reader = await connect(node)
            retained = await reader.events(name, get_retained=True)
            assert (await next_item(retained))[0] == ["kept"]
            await reader.close()

    run(read_after_kill())
    fresh.stop()


def test_a_node_without_matching_subscribers_is_sent_nothing(cluster):
    redis, nodes = cluster
    watch = ChannelWatch(redis.port)
    name = topic()

    async def scenario():
        publisher = await connect(nodes["a"])
        subscriber = await connect(nodes["b"])
        events = await subscriber.events(name)
        await reaches(publisher, name, events)
        watch.channels_until_ping()  # forget the probes
        await publisher.publish(name, "only b", options=PublishOptions(acknowledge=True))
        assert (await next_event(events))[0] == ["only b"]
        assert watch.channels_until_ping() == [b"wr:node:b"]
        for session in (publisher, subscriber):
            await session.close()

    run(scenario())
    watch.close()


def test_interest_announced_while_a_node_was_not_listening_reaches_it(tmp_path):
    """A node that did not listen to the interest channel when another node announced a
    subscription (its start-up, a lost subscriber connection) reads the interest hash again
    once subscribed, so it sends that node its publications: without it, they would be
    acknowledged to the publisher and go nowhere, for good (a bridge's queue on another
    node lost them: tests/test_bridges.py::test_on_redis_the_queue_moves_with_the_bridge)."""
    with redis_cluster(tmp_path, start_node, names=("a", "b")) as (redis, nodes):
        admin = BlockingRedis("127.0.0.1", redis.port, 0)

        async def scenario():
            publisher = await connect(nodes["b"])
            subscriber = await connect(nodes["a"])
            for _ in range(5):  # until a announced while b was not listening
                # every node's subscriber connection: back after Twisted's reconnect delay
                admin.call("CLIENT", "KILL", "TYPE", "pubsub")
                name = topic()
                events = await subscriber.events(name)
                deadline = time.monotonic() + 10
                while not any(".".join(pattern) == name for pattern, _ in unpack_patterns(
                        admin.call("HGET", "wr:interest:realm1", "a"))):
                    assert time.monotonic() < deadline, "a never announced its subscription"
                    await asyncio.sleep(0.02)
                if admin.call("PUBSUB", "NUMSUB", INTEREST_CHANNEL)[1] == 0:
                    break
            else:
                raise AssertionError("a node listened again before the other announced")
            await reaches(publisher, name, events)
            for session in (publisher, subscriber):
                await session.close()

        run(scenario())
        admin.close()


def test_a_node_lets_clients_in_only_once_its_redis_channels_are_subscribed(cluster, tmp_path):
    """A node whose Redis subscription is slow to come up (held by a relay) says neither
    ``ready:`` nor opens its listeners until it is in place: a subscriber let in before
    would announce its interest, other nodes would send it their events on a channel
    nobody listens to yet, and a QoS 0 event would be lost without a trace."""
    redis, nodes = cluster
    relay = SubscribeHold(redis.port)
    late = start_node(tmp_path, relay, "late", launch_only=True)
    name = topic()
    try:
        line = late.wait_for_log(r"ready: |still connecting to Redis", timeout=60)
        assert "ready: " not in line, "clients let in before the node's channels were subscribed"
        relay.release()
        late.take_urls(late.wait_for_log(r"ready: ", timeout=60))

        async def scenario():
            publisher = await connect(nodes["a"])
            subscriber = await connect(late)
            events = await subscriber.events(name)
            await reaches(publisher, name, events)
            await publisher.publish(name, "after the probes",
                                    options=PublishOptions(acknowledge=True))
            assert (await next_event(events))[0] == ["after the probes"]
            for session in (publisher, subscriber):
                await session.close()

        run(scenario())
    finally:
        relay.close()
        late.stop()


def test_retained_changes_made_while_a_node_was_not_listening_reach_it(cluster, tmp_path):
    """One topic is set again and another cleared on node a while node "deaf" is cut from
    its Redis subscription (a relay holds its SUBSCRIBE): their announcements never reach
    it. Once it listens again it compares every topic's state in Redis with its copy and
    reads the changed ones, so it does not answer subscribers from the stale copy for good."""
    redis, nodes = cluster
    relay = SubscribeHold(redis.port)
    relay.release()
    deaf = start_node(tmp_path, relay, "deaf")
    changed, cleared = topic("ret"), topic("ret")
    retain = PublishOptions(retain=True, acknowledge=True)

    async def first_retained(node, name: str) -> list | None:
        """The retained event a subscriber to ``name`` gets at once (None: none, shown by a
        later event on the topic)."""
        reader, prober = await connect(node), await connect(node)
        events = await reader.events(name, get_retained=True)
        await prober.publish(name, PROBE, options=PublishOptions(acknowledge=True))
        args = (await next_item(events))[0]
        for session in (reader, prober):
            await session.close()
        return None if args == [PROBE] else args

    async def until_retained(node, name: str, expected: list | None) -> None:
        deadline = time.monotonic() + 30
        while (found := await first_retained(node, name)) != expected:
            assert time.monotonic() < deadline, f"{name} on {node}: {found}, not {expected}"

    async def scenario():
        setter = await connect(nodes["a"])
        for name in (changed, cleared):
            await setter.publish(name, "before", options=retain)
            await until_retained(deaf, name, ["before"])  # from the channel
        relay.hold()
        relay.cut_subscribers()
        await setter.publish(changed, "after", options=retain)
        await setter.publish(cleared, options=retain)  # no args: clears
        relay.release()
        await until_retained(deaf, changed, ["after"])
        await until_retained(deaf, cleared, None)
        await setter.close()

    try:
        run(scenario())
    finally:
        relay.close()
        deaf.stop()


def test_every_nodes_event_log_is_read_by_the_report_as_one(cluster, tmp_path):
    """Two nodes log the same realm and day into their own ``node=`` folders; their trees
    copied into one (as a collector does) are read by the report's reader without change."""
    redis, _ = cluster
    loggers = {name: start_node(tmp_path, redis, name) for name in ("log1", "log2")}
    name = topic()

    async def publish_on_each():
        for node_name, node in loggers.items():
            publisher = await connect(node)
            await publisher.publish(name, node_name, options=PublishOptions(acknowledge=True))
            await publisher.close()

    run(publish_on_each())
    merged = tmp_path / "logs"
    for node_name, node in loggers.items():
        node.stop()  # closes the open parts, which Spark would skip while hidden
        shutil.copytree(node.workdir / "data" / "eventlog", merged, dirs_exist_ok=True)
    spark = start_session(Sizing(shuffle_partitions=1, quick_jit=True), driver_memory="1g")
    try:
        rows = read_events(spark, HadoopFiles(spark), to_url(merged)).where(f"kind = 'publish' AND topic = '{name}'")
        assert sorted((row["node"], row["realm"]) for row in rows.collect()) == [
            ("log1", "realm1"), ("log2", "realm1")]
    finally:
        spark.stop()


def test_event_history_is_one_log_for_every_node(cluster):
    """Events published on two nodes are read back on a third, in publication order,
    bounded by the rule's limit and filtered by the reader's eligibility."""
    _, nodes = cluster
    name = topic("hist")

    async def history(reader, subscription_id: int, until: list, **options) -> list:
        """``get_events`` once the last event published is in Redis (history writes are
        not waited for by the publisher's acknowledgement)."""
        deadline = time.monotonic() + 10
        while True:
            events = await reader.call("wamp.subscription.get_events", subscription_id,
                                       **options)
            if [e["args"] for e in events][-len(until):] == until or time.monotonic() > deadline:
                return events
            await asyncio.sleep(0.05)

    async def scenario():
        on_a = await connect(nodes["a"])
        on_c = await connect(nodes["c"], "rawsocket", "msgpack")
        reader = await connect(nodes["b"])
        subscription = await reader.subscribe(lambda *args, **kwargs: None, name)
        for n in range(4):
            await on_a.publish(name, f"a{n}", options=PublishOptions(acknowledge=True))
        await history(reader, subscription.id, [["a3"]])  # a's come before c's in Redis
        await on_c.publish(name, "not for anonymous", options=PublishOptions(
            acknowledge=True, eligible_authrole=["operator"]))
        await on_c.publish(name, "one session", options=PublishOptions(
            acknowledge=True, eligible=[reader._session_id]))  # names a session: not kept
        await on_c.publish(name, "c0", options=PublishOptions(acknowledge=True))
        events = await history(reader, subscription.id, [["c0"]])
        # the limit (3) counts every event kept: a3, the operators' event, c0
        assert [e["args"] for e in events] == [["a3"], ["c0"]]
        assert events[-1]["details"]["topic"] == name and events[-1]["timestamp"].endswith("Z")
        latest = await reader.call("wamp.subscription.get_events", subscription.id,
                                   limit=1, reverse=True)
        assert [e["args"] for e in latest] == [["c0"]]
        for session in (on_a, on_c, reader):
            await session.close()

    run(scenario())


def stored_ids(redis: RedisServer, name: str) -> list[int]:
    """Publication ids of the retained entries Redis holds for ``name``."""
    client = BlockingRedis("127.0.0.1", redis.port, 0)
    try:
        blob = client.call("HGET", "wr:retained:realm1", topic_key(tuple(name.split("."))))
    finally:
        client.close()
    return [decode_retained(data, "realm1").publication.publication_id
            for data in unpack_topic(blob)] if blob else []


def test_retained_changes_made_at_once_on_two_nodes_are_both_kept_everywhere(cluster):
    """Restricted retained events are added to a topic's entries, not put in place of them:
    published on two nodes at the same time, Redis and every node end up with all of them
    (a node that wrote what it had before the other's change would drop that change)."""
    redis, nodes = cluster
    name = topic()

    async def listed(session) -> list[int]:
        found = await session.call("wamp.retained.list", name)
        return [e["publication"] for e in found[0]["events"]] if found else []

    async def scenario():
        on_a = await connect(nodes["a"])
        on_b = await connect(nodes["b"])
        general = await on_a.publish(name, "general", options=PublishOptions(
            retain=True, acknowledge=True))
        restricted = PublishOptions(retain=True, acknowledge=True, exclude_authid=["nobody"])
        published = await asyncio.gather(*(
            session.publish(name, f"{session is on_a} {n}", options=restricted)
            for n in range(4) for session in (on_a, on_b)))
        expected = {general.id} | {publication.id for publication in published}
        readers = [await connect(node) for node in nodes.values()]
        deadline = time.monotonic() + 10
        while True:
            seen = [set(await listed(reader)) for reader in readers]
            if all(ids == expected for ids in seen) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert seen == [expected] * 3
        assert set(stored_ids(redis, name)) == expected
        for session in [on_a, on_b] + readers:
            await session.close()

    run(scenario())


def test_publishers_pause_while_redis_is_stopped_and_resume_after(tmp_path):
    """SIGSTOP of redis-server: the node stops reading from its publisher once half of
    cluster.max_pending_commands wait for Redis, instead of buffering what it cannot
    forward; after SIGCONT it reads again and forwarding resumes."""
    redis = RedisServer(tmp_path)
    sender = start_node(tmp_path, redis, "sender", max_pending_commands=200)
    receiver = start_node(tmp_path, redis, "receiver")
    name = topic()
    flood, size = 4000, 5000  # 20 MB offered while Redis is stopped

    async def scenario():
        subscriber = await connect(receiver, "rawsocket", "msgpack")
        events = await subscriber.events(name)
        probe = await connect(sender)
        await reaches(probe, name, events)
        publisher = await raw_connect(sender, "rawsocket", "msgpack")
        await publisher.hello()
        start = rss_mb(sender)
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            publisher.send_many([[16, publisher.next_request(), {}, name, [n, "x" * size]]
                                 for n in range(flood)])
            line = await asyncio.to_thread(sender.wait_for_log,
                                           r"engine: engine_behind: (\d+) commands")
            assert int(line.split("engine_behind: ")[1].split()[0]) <= 200
            await asyncio.to_thread(sender.wait_for_log,
                                    r"Redis behind: pausing reading from \d+ publishing")
            await asyncio.sleep(1)  # what the node would read meanwhile if it did not pause
            grown = rss_mb(sender) - start
            assert grown < 10, f"the node grew {grown:.0f} MB while Redis was stopped"
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        await asyncio.to_thread(sender.wait_for_log, r"Redis caught up: resuming reading")
        await probe.publish(name, "after", options=PublishOptions(acknowledge=True))
        while (await next_item(events, 30))[0] != ["after"]:
            pass
        for session in (subscriber, probe):
            await session.close()

    try:
        run(scenario(), timeout=90)
    finally:
        for node in (sender, receiver):
            node.stop()
        redis.stop()

