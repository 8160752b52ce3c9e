"""Node failure on a cluster of router nodes on one real redis-server.

A node is killed with kill -9: another node finds its alive key gone (within
``node_timeout`` + ``heartbeat_interval``), publishes the wills and testaments it left,
removes its sessions and registrations, and adopts its MQTT persistent sessions and AMQP
durable links, which then queue what is published and move to any node their client
reconnects to.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections import Counter

import msgpack
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from proton import Terminus

from router.amqp.persistence import link_id
from router.engines.redis.failure import NODE_DOWN_CHANNEL, REAP
from router.engines.redis.realm import unpack_patterns
from router.engines.redis.resp import BlockingRedis
from tests import amqp_clients
from tests.amqp_clients import Receive, Send, message, send
from tests.clients import connect, next_item, run
from tests.harness import RedisServer, RouterProcess, SubscribeHold, redis_cluster
from tests.mqtt_clients import V5, V311, MqttClient, mqtt_realm, unique
from tests.test_cluster_amqp import collect, durable, until_probe
from tests.test_cluster_sessions import (PROBE, count_until_probe, killed_with_a_queue,
                                         left_offline, persistent, wait_queued)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

HEARTBEAT = 0.2
NODE_TIMEOUT = 2.0
"""Not shorter: on a loaded 2-core machine a node can stall for a second, and would be
found dead although it runs."""
MARGIN = 4.0
"""Beyond the detection bound: a loaded 2-core machine delays processes and Redis."""
TAKEOVER_TIMEOUT = 30
"""Long: a reconnect that waited for it would fail the test's own deadline."""
N = 200


def start_node(base, redis: RedisServer | SubscribeHold, name: str, **cluster) -> RouterProcess:
    listeners = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                 {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                 {"type": "rawsocket", "host": "127.0.0.1", "port": 0}]
    limits = {"heartbeat_interval": HEARTBEAT, "node_timeout": NODE_TIMEOUT,
              "session_takeover_timeout": TAKEOVER_TIMEOUT, **cluster}
    return RouterProcess(base / name, [mqtt_realm()], listeners=listeners,
                         extra_config={"engine": {"type": "redis", "url": redis.url,
                                                  "node": name},
                                       "cluster": limits}).start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("failure"), start_node, ("b", "c")) as running:
        yield running


def connected(node: RouterProcess, **options) -> MqttClient:
    client = MqttClient(node, **options)
    client.connect()
    return client


def reaped_log(nodes: dict[str, RouterProcess], dead: str, timeout: float) -> str:
    """The line of the survivor that reaped node ``dead`` saying what it left."""
    deadline = time.monotonic() + timeout
    needle = f"node {dead} left "
    while time.monotonic() < deadline:
        for node in nodes.values():
            for line in node.log_lines:
                if needle in line:
                    return line
        time.sleep(0.02)  # polling the logs, not waiting in place of a check
    raise AssertionError(f"node {dead} was not reaped within {timeout} s")


def wait_will(redis: RedisServer, node: str, client_id: str, kept: bool) -> None:
    """Until Redis holds (or no longer holds) node ``node``'s copy of the client's will."""
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    deadline = time.monotonic() + 10
    try:
        while store.call("HEXISTS", f"wr:mqtt-will:realm1:{node}", client_id) != kept:
            assert time.monotonic() < deadline, f"the will of {client_id}: never {kept}"
            time.sleep(0.02)  # polling Redis, not waiting in place of a check
    finally:
        store.close()


def receive(client: MqttClient, wanted: set[bytes]) -> set[bytes]:
    """Read ``client``'s messages until every payload of ``wanted`` came."""
    seen = set()
    while not wanted <= seen:
        seen.add(client.next_message(timeout=NODE_TIMEOUT + HEARTBEAT + MARGIN).payload)
    return seen


def test_will_testament_sessions_and_registrations_of_a_killed_node(cluster, tmp_path):
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a1")
    base = unique("fail")
    watcher = connected(nodes["b"])
    assert watcher.subscribe((f"{base}/#", 1)) == [1]
    probers = [connected(dying), connected(nodes["c"])]
    for prober in probers:  # both nodes know the interest
        count_until_probe(prober, watcher, f"{base}/probe", Counter())
    probers[0].close()  # before the sessions are counted: a1 writes it before the others
    connected(dying, version=V311, will={"topic": f"{base}/will", "payload": b"gone",
                                         "qos": 1})

    async def before_kill():
        testator = await connect(dying, "rawsocket")
        await testator.call("wamp.session.add_testament", f"{base}.testament", ["bye"], {})
        await testator.register(lambda: "here", f"{base}.proc")
        caller = await connect(nodes["b"], "rawsocket")
        deadline = time.monotonic() + 10
        while testator._session_id not in await caller.call("wamp.session.list"):
            assert time.monotonic() < deadline, "the testator never showed on node b"
        while True:  # until b knows the registration
            try:
                assert await caller.call(f"{base}.proc") == "here"
                break
            except Exception:
                assert time.monotonic() < deadline, "the registration never reached b"
        leaves = await caller.events("wamp.session.on_leave")
        return caller, leaves, testator._session_id, await caller.call("wamp.session.count")

    async def after_kill(caller, leaves, testator_id, before):
        assert await caller.call("wamp.session.count") == before - 2
        left = set()
        while testator_id not in left:
            args, _, _ = await next_item(leaves)
            left.add(args[0])
        with pytest.raises(Exception) as failed:
            await caller.call(f"{base}.proc")
        assert failed.value.error == "wamp.error.no_such_procedure"
        await caller.close()

    async def scenario():
        caller, leaves, testator_id, before = await before_kill()
        killed = time.monotonic()
        dying.kill9()
        await asyncio.to_thread(receive, watcher, {b"gone", b'"bye"'})
        assert time.monotonic() - killed < NODE_TIMEOUT + HEARTBEAT + MARGIN
        await after_kill(caller, leaves, testator_id, before)

    run(scenario())
    assert "1 testament(s), 1 will(s)" in reaped_log(nodes, "a1", 1)
    for client in (watcher, probers[1]):
        client.close()


def test_offline_session_of_a_killed_node_queues_and_resumes_on_another_node(cluster,
                                                                             tmp_path):
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a2")
    topic = unique("adopt") + "/t"
    client_id = unique("orphan")
    publisher = connected(nodes["b"])
    early = 20
    killed_with_a_queue(dying, publisher, redis, V311, client_id, topic, 2,
                        [f"early-{i}".encode() for i in range(early)])
    assert "adopted" in reaped_log(nodes, "a2", NODE_TIMEOUT + HEARTBEAT + MARGIN)
    # the adopting node queues from now on: a QoS 1 probe lands in Redis once its
    # interest reached b
    wait_queued(redis, client_id, early + 1, lambda: publisher.publish(topic, PROBE, 1))

    for i in range(N):
        publisher.publish(topic, f"q1-{i}".encode(), 1)
        publisher.publish(topic, f"q2-{i}".encode(), 2)
    started = time.monotonic()
    resumed = MqttClient(nodes["c"], V311, client_id=client_id, clean=False)
    assert resumed.connect().session_present
    assert time.monotonic() - started < TAKEOVER_TIMEOUT / 3
    expected = ({f"early-{i}".encode() for i in range(early)}
                | {f"q{qos}-{i}".encode() for qos in (1, 2) for i in range(N)})
    received: Counter[bytes] = Counter()
    while not expected <= received.keys():
        message = resumed.next_message()
        if message.qos:
            received[message.payload] += 1
    count_until_probe(publisher, resumed, topic, received)
    assert received.keys() - {PROBE} == expected
    assert all(received[f"q2-{i}".encode()] == 1 for i in range(N))
    for client in (resumed, publisher):
        client.close()


def cut_off_later(base, redis: RedisServer, dying_name: str, **cluster):
    """Node a10 behind a :class:`SubscribeHold` relay (released) and node ``dying_name``,
    whose MQTT subscriber's topic a10 knows: ``(relay, a10, the other node, topic,
    subscriber, a publisher on a10)``."""
    relay = SubscribeHold(redis.port)
    relay.release()
    # a10 looks for dead nodes rarely, so that b or c reaps the other (a reaper learns it
    # at once)
    missing = start_node(base, relay, "a10", heartbeat_interval=10, node_timeout=30, **cluster)
    dying = start_node(base, redis, dying_name)
    topic = unique("gone")
    subscriber = connected(dying)
    assert subscriber.subscribe((topic, 1)) == [1]
    publisher = connected(missing)
    count_until_probe(publisher, subscriber, topic, Counter())  # a10 knows its interest
    return relay, missing, dying, topic, subscriber, publisher


def test_a_node_that_missed_a_reaping_forgets_the_dead_nodes_interest(cluster, tmp_path):
    """Node a10 is cut from its Redis subscription while a11, which had a subscriber, is killed
    and reaped: a10 misses the announcement. When a10 listens again it reads every node's
    interest from Redis, where the reaping removed a11's: a10 must forget a11's too. Otherwise it
    forwards each QoS 1 publication matching them to a node nobody runs, and every such
    acknowledgement fails, for good."""
    redis, nodes = cluster
    relay, missing, dying, topic, subscriber, publisher = cut_off_later(tmp_path, redis, "a11")
    try:
        relay.hold()
        relay.cut_subscribers()  # a10 subscribes again, held until the reaping is over
        dying.kill9()
        reaped_log(nodes, "a11", NODE_TIMEOUT + HEARTBEAT + MARGIN)
        relay.release()
        deadline = time.monotonic() + 30
        while publisher.publish(topic, b"to nobody", qos=1) != 0:  # refused while a10 forwards
            assert time.monotonic() < deadline, "a10 still forwards to the reaped node a11"
    finally:
        relay.close()
        subscriber.close()
        publisher.close()
        missing.stop()


async def forwarded_call(callee_node: RouterProcess, caller_node: RouterProcess,
                         procedure: str, answer: asyncio.Event | None = None):
    """A call from ``caller_node`` to a callee on ``callee_node``, invoked there and waiting
    for ``answer`` (for ever when None): ``(caller, callee, the call's future)``."""
    invoked = asyncio.Event()

    async def slow(wait: bool) -> str:
        if wait:
            invoked.set()
            await (answer.wait() if answer is not None
                   else asyncio.get_running_loop().create_future())
        return "here"

    callee = await connect(callee_node, "rawsocket")
    await callee.register(slow, procedure)
    caller = await connect(caller_node, "rawsocket")
    deadline = time.monotonic() + 10
    while True:  # until the caller's node knows the registration
        try:
            assert await caller.call(procedure, False) == "here"
            break
        except Exception:
            assert time.monotonic() < deadline, "the registration never reached the caller"
    call = asyncio.ensure_future(caller.call(procedure, True))
    await asyncio.wait_for(invoked.wait(), 10)
    return caller, callee, call


def test_a_node_that_missed_a_reaping_fails_what_waited_for_the_dead_node(cluster, tmp_path):
    """Node a12 is killed and reaped while a10's Redis subscription is down: a10 misses the
    announcement, with a call it forwarded to a12's callee unanswered and a QoS 1 publication
    it forwarded to a12 unconfirmed (a12's confirmation came while a10 did not listen). Once
    a10 listens again and reads that a12 was reaped, both fail at once, as when it hears a
    reaping: not after ``cluster.call_timeout`` (300 s) and ``cluster.confirm_timeout``
    (set to 120 s here)."""
    redis, nodes = cluster
    relay, missing, dying, topic, subscriber, publisher = cut_off_later(
        tmp_path, redis, "a12", confirm_timeout=120)
    procedure = unique("hang").replace("/", ".")

    async def scenario():
        caller, _, call = await forwarded_call(dying, missing, procedure)  # answered by nobody
        relay.hold()
        relay.cut_subscribers()  # a10 subscribes again, held until the reaping is over
        bound = NODE_TIMEOUT + HEARTBEAT + MARGIN
        published = asyncio.ensure_future(asyncio.to_thread(
            publisher.publish, topic, b"unconfirmed", 1, timeout=bound + 40))
        assert (await asyncio.to_thread(subscriber.next_message)).payload == b"unconfirmed"
        dying.kill9()
        await asyncio.to_thread(reaped_log, nodes, "a12", bound)
        assert not published.done() and not call.done()
        relay.release()
        done, _ = await asyncio.wait({call, published}, timeout=30,
                                     return_when=asyncio.ALL_COMPLETED)
        assert call in done, "a10's call forwarded to the dead a12 still waits"
        assert published in done, "a10's publication forwarded to the dead a12 still waits"
        assert published.result() == 0x80  # not known to be stored: a12 died
        assert call.exception().error == "wamp.error.canceled"
        assert "a12 died" in call.exception().args[0]
        await caller.close()

    try:
        run(scenario(), timeout=120)
    finally:
        relay.close()
        subscriber.close()
        publisher.close()
        missing.stop()


def test_a_node_redis_lost_unreaped_is_not_taken_for_dead(cluster, tmp_path):
    """Redis loses a running node's keys (a restart without persistence, a flush) while a10's
    subscription is down: when a10 catches up, that node is gone from the interest hash and
    has no alive key, like a reaped one, but no reaping marked it. a10 must not cancel the
    call it forwarded there: the callee still runs and answers it."""
    redis, nodes = cluster
    relay = SubscribeHold(redis.port)
    relay.release()
    missing = start_node(tmp_path, relay, "a10", heartbeat_interval=10, node_timeout=30)
    # no heartbeat of its own while the test runs: its alive key stays lost
    living = start_node(tmp_path, redis, "a13", heartbeat_interval=100, node_timeout=300)
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    procedure = unique("slow").replace("/", ".")

    async def scenario():
        answer = asyncio.Event()
        caller, callee, call = await forwarded_call(living, missing, procedure, answer)
        relay.hold()
        relay.cut_subscribers()
        # what Redis losing a13 leaves (out of the nodes set first: nobody reaps it)
        store.call("SREM", "wr:nodes", "a13")
        store.call("DEL", "wr:node-alive:a13")
        store.call("HDEL", "wr:interest:realm1", "a13")
        relay.release()
        await asyncio.to_thread(missing.logged, "node a13 is missing from Redis but was not "
                                "reaped", 30)
        assert not call.done(), "a10 gave up a call to a node that runs"
        answer.set()
        assert await asyncio.wait_for(call, 30) == "here"
        await caller.close()
        await callee.close()

    try:
        run(scenario(), timeout=120)
    finally:
        store.close()
        relay.close()
        missing.stop()
        living.stop()


def test_the_reaping_gives_the_reaper_the_dead_nodes_interest_in_redis(tmp_path):
    """The reaping script itself, on a real redis-server: the dead node's patterns move into
    the reaper's entry of the interest hash. A node reading the hash before the reaper
    announces its own (after the adoption; one that missed the reaping's announcement, or
    starts) then sends the reaper what the adopted sessions want; had the script only
    removed the dead node's entry, such a node would send them nothing meanwhile, and
    acknowledge it."""
    redis = RedisServer(tmp_path)
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    try:
        interest = "wr:interest:realm1"
        dead = {(("a", "b"), "exact"), (("c", ""), "wildcard"), (("é",), "prefix")}
        reaper = {(("a", "b"), "exact"), (("z",), "prefix")}
        store.call("HSET", interest, "x", msgpack.packb(sorted(dead), use_bin_type=True),
                   "r", msgpack.packb(sorted(reaper), use_bin_type=True))
        keys = ("wr:node-alive:x", "wr:testaments:realm1:x", "wr:mqtt-will:realm1:x",
                "wr:sessions:realm1", "wr:subscriptions:realm1", interest)
        assert store.call("EVAL", REAP, len(keys), *keys, "x", "r", "realm1",
                          NODE_DOWN_CHANNEL, "wr:node-reaped:x", 60_000) == [[], [], []]
        assert store.call("HKEYS", interest) == [b"r"]
        assert unpack_patterns(store.call("HGET", interest, "r")) == dead | reaper
        # the mark a node that missed the announcement reads to tell a reaping from a loss
        assert store.call("GET", "wr:node-reaped:x") == b"r"
    finally:
        store.close()
        redis.stop()


def test_durable_amqp_link_of_a_killed_node_queues_and_resumes_on_another_node(cluster,
                                                                              tmp_path):
    """A durable receiver detaches on a6 with one message queued; a6 is killed: its reaper
    adopts the link and queues what AMQP and MQTT clients publish on b meanwhile; the link
    attached on c gets the earlier message and the 100 later ones, each once, in order."""
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a6")
    address = f"amqpdur/{unique('adopt')}"
    container, link = unique("container"), unique("link")
    owned = link_id(container, link)
    mqtt = connected(nodes["b"])
    publisher = amqp_clients.connect(nodes["b"])
    sender = publisher.create_sender(address, options=Send(1))
    first, receiver = durable(dying, container, link, address)
    until_probe(mqtt, address, receiver)
    receiver.link.detach()
    first.close()
    send(sender, message(b"early", qos=1))
    wait_queued(redis, owned, 1, protocol="amqp")  # a6 queued it for the detached link
    dying.kill9()
    assert "1 AMQP durable link(s) adopted" in reaped_log(nodes, "a6",
                                                          NODE_TIMEOUT + HEARTBEAT + MARGIN)
    # the adopting node queues from now on: a QoS 1 probe lands in Redis once its
    # interest reached b
    wait_queued(redis, owned, 2, lambda: mqtt.publish(address, PROBE, 1), "amqp")

    expected = [(b"early", 0)]
    for i in range(50):
        send(sender, message(f"amqp-{i}".encode(), qos=1))
        mqtt.publish(address, f"mqtt-{i}".encode(), 1)
        expected += [(f"amqp-{i}".encode(), 0), (f"mqtt-{i}".encode(), 0)]
    started = time.monotonic()
    again, receiver = durable(nodes["c"], container, link, address)
    assert time.monotonic() - started < TAKEOVER_TIMEOUT / 3
    assert collect(receiver, len(expected)) == expected
    # the link lives on c now: a probe from b reaches it there, behind no duplicate
    until_probe(mqtt, address, receiver)
    for connection in (again, publisher):
        connection.close()
    mqtt.close()


def test_expired_durable_amqp_link_of_a_killed_node_is_dropped(cluster, tmp_path):
    """A durable receiver with a 1 s expiry detaches on a7, which is killed at once: its
    reaper finds the link expired (no node queued for it meanwhile) and drops it from
    Redis, so attaching it again on c starts afresh, without a takeover wait."""
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a7")
    address = f"amqpdur/{unique('expired')}"
    container, link = unique("container"), unique("link")
    owned = link_id(container, link)
    first = amqp_clients.connect(dying, container_id=container)
    receiver = first.create_receiver(address, credit=10, name=link, options=Receive(
        1, durable=True, expiry=Terminus.EXPIRE_WITH_LINK, timeout=1))
    receiver.link.detach()
    first.close()
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    try:
        deadline = time.monotonic() + 10
        while True:  # until a7 stored the detach, then kill it before the link expires
            expiry = store.call("HGET", "wr:amqp-expiry:realm1", owned)
            if expiry is not None and msgpack.unpackb(expiry)[1] is not None:
                break
            assert time.monotonic() < deadline, "a7 never stored the detach"
            time.sleep(0.02)  # polling Redis, not waiting in place of a check
        dying.kill9()
        assert "1 AMQP durable link(s) adopted" in reaped_log(
            nodes, "a7", NODE_TIMEOUT + HEARTBEAT + MARGIN)
        deadline = time.monotonic() + 10
        while (store.call("HEXISTS", "wr:amqp-link:realm1", owned)
               or store.call("HEXISTS", "wr:amqp-owner:realm1", owned)):
            assert time.monotonic() < deadline, "the expired link stayed in Redis"
            time.sleep(0.02)  # polling Redis, not waiting in place of a check
    finally:
        store.close()
    mqtt = connected(nodes["b"])
    started = time.monotonic()
    again, receiver = durable(nodes["c"], container, link, address)
    assert time.monotonic() - started < TAKEOVER_TIMEOUT / 3
    until_probe(mqtt, address, receiver)  # nothing but probes: no queue came back
    again.close()
    mqtt.close()


def test_a_normal_disconnect_leaves_no_will_and_a_restarted_node_is_not_reaped(cluster,
                                                                               tmp_path):
    redis, nodes = cluster
    base = unique("calm")
    watcher = connected(nodes["b"])
    assert watcher.subscribe((f"{base}/#", 1)) == [1]
    dying = start_node(tmp_path, redis, "a3")
    publisher = connected(dying)
    count_until_probe(publisher, watcher, f"{base}/probe", Counter())
    polite = connected(dying, version=V5, will={"topic": f"{base}/will", "payload": b"no",
                                                "qos": 1})
    wait_will(redis, "a3", polite.client_id, True)
    polite.disconnect()  # a normal DISCONNECT: the will is discarded
    wait_will(redis, "a3", polite.client_id, False)
    dying.kill9()
    assert "0 will(s)" in reaped_log(nodes, "a3", NODE_TIMEOUT + HEARTBEAT + MARGIN)
    seen: Counter[bytes] = Counter()
    for node in nodes.values():  # behind anything the reaper published
        prober = connected(node)
        count_until_probe(prober, watcher, f"{base}/probe", seen)
        prober.close()
    assert b"no" not in seen

    # killed and restarted before its alive key runs out: it is not reaped, and publishes
    # what its previous run left itself
    slow = {"node_timeout": 30}
    restarted = start_node(tmp_path, redis, "a4", **slow)
    count_until_probe(connected(restarted), watcher, f"{base}/probe", Counter())

    async def testament():
        testator = await connect(restarted, "rawsocket")
        await testator.call("wamp.session.add_testament", f"{base}.left", ["again"], {})

    run(testament())
    restarted.kill9()
    restarted = start_node(tmp_path, redis, "a4", **slow)
    restarted.logged(r"node a4 left 1 testament\(s\)")  # before its listeners open
    assert b'"again"' in receive(watcher, {b'"again"'})
    store = BlockingRedis("127.0.0.1", redis.port, 0)
    try:
        assert store.call("SISMEMBER", "wr:nodes", "a4") == 1
        assert store.call("EXISTS", "wr:node-reaper:a4") == 0
    finally:
        store.close()
    assert not any("node a4 is dead" in line
                   for node in nodes.values() for line in node.log_lines)
    restarted.stop()
    watcher.close()


def test_a_reconnect_waiting_for_a_killed_node_resumes_when_it_is_found_dead(cluster,
                                                                            tmp_path):
    """The client reconnects before the death is found: its claim waits for the dead node
    to let go only until the death is found, not ``session_takeover_timeout``."""
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a5")
    topic = unique("soon") + "/t"
    client_id = unique("hasty")
    publisher = connected(nodes["b"])
    count = 5
    killed_with_a_queue(dying, publisher, redis, V5, client_id, topic, 1,
                        [f"m{i}".encode() for i in range(count)])
    started = time.monotonic()
    resumed = MqttClient(nodes["c"], V5, client_id=client_id, clean=False, session_expiry=300)
    assert resumed.connect(timeout=TAKEOVER_TIMEOUT).session_present
    assert time.monotonic() - started < NODE_TIMEOUT + HEARTBEAT + MARGIN
    assert receive(resumed, {f"m{i}".encode() for i in range(count)})
    for client in (resumed, publisher):
        client.close()


def test_will_of_a_client_back_on_another_node_before_its_node_is_found_dead(cluster,
                                                                             tmp_path):
    """Its connection was closed by the death: the will (no delay) is published, by the
    node that reaps the dead one, although the client is connected elsewhere by then."""
    redis, nodes = cluster
    dying = start_node(tmp_path, redis, "a9")
    base = unique("back")
    watcher = connected(nodes["b"])
    assert watcher.subscribe((f"{base}/#", 1)) == [1]
    prober = connected(dying)
    count_until_probe(prober, watcher, f"{base}/probe", Counter())
    client_id = unique("back")
    gone = connected(dying, client_id=client_id,
                     will={"topic": f"{base}/will", "payload": b"gone", "qos": 1})
    wait_will(redis, "a9", client_id, True)
    dying.kill9()
    back = MqttClient(nodes["c"], client_id=client_id)
    assert back.connect(timeout=TAKEOVER_TIMEOUT).reason_code == 0
    assert receive(watcher, {b"gone"})
    assert "1 will(s)" in reaped_log(nodes, "a9", 1)
    for client in (watcher, prober, gone, back):
        client.close()


class RetryingPublisher:
    """An MQTT 3.1.1 publisher as an application runs it: persistent session, automatic
    reconnect, every QoS >= 1 message kept by paho until acknowledged and sent again after
    a reconnect (the router closes a 3.1.1 connection whose message it could not store)."""

    def __init__(self, node: RouterProcess) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=unique("retrying"),
                                  protocol=paho.MQTTv311, clean_session=False)
        self.client.reconnect_delay_set(0.05, 0.5)
        self.client.max_queued_messages_set(0)
        self.acknowledged: set[int] = set()
        self.reconnects = 0
        self._done = threading.Condition()
        self.client.on_publish = self._on_publish
        self.client.on_connect = self._on_connect
        host, port, _ = node.address("mqtt")
        self.client.connect(host, port, 30)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.reconnects += 1

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._done:
            self.acknowledged.add(mid)
            self._done.notify_all()

    def publish_all(self, messages: list[tuple[str, bytes, int]]) -> list[int]:
        return [self.client.publish(topic, payload, qos).mid for topic, payload, qos in messages]

    def wait_acknowledged(self, mids: list[int], timeout: float) -> None:
        with self._done:
            assert self._done.wait_for(lambda: self.acknowledged >= set(mids), timeout), \
                f"{len(set(mids) - self.acknowledged)} messages never acknowledged"

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_node_killed_mid_stream_loses_nothing_acknowledged(cluster, tmp_path):
    """An MQTT 3.1.1 and an MQTT 5 persistent subscriber leave their sessions on node a3;
    1,000 QoS 1 and 1,000 QoS 2 messages are published on b, and a3 is killed with kill -9
    when about a third of them are queued. The publisher's client resends what was not
    acknowledged; both subscribers resume on c with every QoS 1 message at least once and
    every QoS 2 message exactly once."""
    redis, nodes = cluster
    count = 1000
    dying = start_node(tmp_path, redis, "a3")
    topic = unique("midstream") + "/t"
    prober = connected(nodes["b"])
    ids = {V311: unique("mid311"), V5: unique("mid5")}
    for version, client_id in ids.items():
        left_offline(dying, prober, version, client_id, topic, 2)
    publisher = RetryingPublisher(nodes["b"])
    messages = [(topic, f"q{qos}-{i}".encode(), qos) for i in range(count) for qos in (1, 2)]
    mids = publisher.publish_all(messages)
    wait_queued(redis, ids[V311], count * 2 // 3)
    dying.kill9()
    publisher.wait_acknowledged(mids, timeout=60)
    assert publisher.reconnects > 1, "the kill never cost an acknowledgement"
    expected = {payload for _, payload, _ in messages}
    for version, client_id in ids.items():
        resumed = persistent(nodes["c"], version, client_id)
        assert resumed.connect().session_present
        received: Counter[bytes] = Counter()
        while not expected <= received.keys():
            message = resumed.next_message(timeout=NODE_TIMEOUT + HEARTBEAT + MARGIN)
            if message.qos:
                received[message.payload] += 1
        count_until_probe(prober, resumed, topic, received)
        assert received.keys() - {PROBE} == expected
        twice = [payload for payload, seen in received.items()
                 if payload.startswith(b"q2-") and seen > 1]
        assert not twice, f"QoS 2 messages delivered more than once: {twice[:5]}"
        resumed.close()
    for client in (publisher, prober):
        client.close()


@pytest.mark.parametrize("publishing_node", ["b", "c"])
def test_nothing_acknowledged_misses_an_adopted_session(cluster, tmp_path, publishing_node):
    """An MQTT 5 publisher on b (or c) publishes without pause while the node that has an
    offline persistent session dies, is found dead and reaped: every message it got a
    successful PUBACK for, also those published while the reaper was still loading the
    session, is in that session when its client comes back. (Either node may reap; the
    other one then sends the reaper what the dead node had subscribed.)"""
    redis, nodes = cluster
    name = f"a8{publishing_node}"
    dying = start_node(tmp_path, redis, name)
    topic = unique("window") + "/t"
    client_id = unique("adopted")
    publisher = connected(nodes[publishing_node])
    left_offline(dying, publisher, V311, client_id, topic, 1)
    acknowledged, refused = [], 0
    number = 0

    def publish() -> None:
        nonlocal number, refused
        payload = f"m{number}".encode()
        number += 1
        if publisher.publish(topic, payload, 1) == 0:
            acknowledged.append(payload)
        else:
            refused += 1

    for _ in range(50):
        publish()
    dying.kill9()
    deadline = time.monotonic() + NODE_TIMEOUT + HEARTBEAT + MARGIN
    while not any(f"node {name} left " in line
                  for node in nodes.values() for line in node.log_lines):
        assert time.monotonic() < deadline, f"node {name} was not reaped"
        publish()
    for _ in range(300):  # on into the adoption and after it
        publish()
    resumed = MqttClient(nodes["c"], V311, client_id=client_id, clean=False)
    assert resumed.connect().session_present
    wanted, received = set(acknowledged), set()
    try:
        while not wanted <= received:
            received.add(resumed.next_message().payload)
    except AssertionError:  # nothing more came
        missing = sorted(wanted - received)
        raise AssertionError(f"{len(missing)} acknowledged messages lost, "
                             f"e.g. {missing[:5]}") from None
    assert refused  # the death did cost acknowledgements before it was found
    for client in (resumed, publisher):
        client.close()
