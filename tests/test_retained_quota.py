"""Retained quotas per principal (issue 24, item 8), black box: one client flooding retained
publishes must not evict another principal's retained topics; the router's ``$SYS`` topics
count against no bound; every eviction is counted and logged; owners survive a restart."""

from __future__ import annotations

import time

import msgpack
import pytest
from proton import Delivery

from router.core.model import Eligibility, Publication, SessionInfo
from router.core.retention import (QUOTA, REALM_LIMIT, Owner, RetainedStore, RetainRefused,
                                   RetentionPolicy, owner_of)
from router.core.topic import from_uri
from router.engines.records import decode_retained, encode_retained
from tests.amqp_clients import Send, message, send
from tests.amqp_clients import connect as amqp_connect
from tests.clients import run
from tests.harness import RedisServer, RouterProcess, redis_cluster
from tests.metrics_scrape import scrape, value
from tests.mqtt_clients import SECRETS, MqttClient, listeners, mqtt_realm, unique
from tests.retention_helpers import ERROR, joined

SENTINEL = b"sentinel"
QUOTA_EXCEEDED = 0x97


# the pure store -------------------------------------------------------------------------

ALICE = SessionInfo(1, "realm1", "alice", "user", "ticket")
BOB = SessionInfo(2, "realm1", "bob", "user", "ticket")
_ids = iter(range(1, 1_000_000))


def store_with(clock=time.time, **policy) -> tuple[RetainedStore, list[tuple[str, str, str]]]:
    """A store with ``policy`` and the list its evictions go to: (topic, owner, reason)."""
    store = RetainedStore(RetentionPolicy(**policy), encode_retained, clock)
    evicted: list[tuple[str, str, str]] = []
    store.evicted = lambda topic, owner, reason, cause: evicted.append(
        (".".join(topic), str(owner), reason))
    return store, evicted


def retain(store: RetainedStore, publisher: SessionInfo | None, topic: str,
           payload: str = "x", **extra) -> None:
    store.retain(Publication(next(_ids), from_uri(topic), [payload], None, publisher,
                             retain=True, **extra))


def kept(store: RetainedStore) -> set[str]:
    return {".".join(topic) for topic, _ in store.topics(("t",), "prefix")}


def test_overwriting_a_topic_moves_it_to_the_new_publishers_quota():
    store, evicted = store_with(max_topics_per_principal=2)
    retain(store, ALICE, "t.a1")
    retain(store, ALICE, "t.a2")
    retain(store, BOB, "t.a1")  # bob's now: alice holds one topic
    retain(store, ALICE, "t.a3")
    assert evicted == []
    retain(store, ALICE, "t.a4")
    assert evicted == [("t.a2", "alice", QUOTA)]
    assert kept(store) == {"t.a1", "t.a3", "t.a4"}


def test_a_restricted_entry_that_expires_gives_the_topic_back_to_its_general_owner():
    now = [time.time()]
    store, evicted = store_with(lambda: now[0], max_topics_per_principal=1)
    retain(store, ALICE, "t.shared")
    retain(store, BOB, "t.shared", eligibility=Eligibility(eligible_authid=frozenset({"x"})),
           retain_ttl=60)  # newest entry: bob's topic now
    retain(store, ALICE, "t.alice")
    assert evicted == []
    now[0] += 61
    assert store.expire() == 1  # bob's entry: alice's general event is left, hers again
    retain(store, ALICE, "t.alice2")  # quotas are enforced when their owner retains
    assert evicted == [("t.alice", "alice", QUOTA), ("t.shared", "alice", QUOTA)]
    assert kept(store) == {"t.alice2"}


def test_byte_quota_evicts_the_owners_oldest_and_an_event_over_it_is_refused():
    store, evicted = store_with()
    retain(store, ALICE, "t.a0", "y" * 200)
    size = store.bytes  # one entry's encoding: the quota is three and a half of them
    store.policy = RetentionPolicy(max_bytes_per_principal=size * 7 // 2)
    for n in range(1, 6):
        retain(store, ALICE, f"t.a{n}", "y" * 200)
    assert evicted == [("t.a0", "alice", QUOTA), ("t.a1", "alice", QUOTA),
                       ("t.a2", "alice", QUOTA)]
    retain(store, BOB, "t.b0", "y" * 200)  # another owner's quota is its own
    assert len(evicted) == 3
    with pytest.raises(RetainRefused):
        retain(store, ALICE, "t.big", "z" * size * 4)
    assert kept(store) == {"t.a3", "t.a4", "t.a5", "t.b0"}


def test_at_the_realm_bound_the_largest_holder_loses_its_oldest_the_publisher_on_a_tie():
    store, evicted = store_with(max_topics=3)
    retain(store, ALICE, "t.a0")
    retain(store, BOB, "t.b0")
    retain(store, BOB, "t.b1")
    retain(store, ALICE, "t.a1")  # 2 against 2: the publisher's oldest goes
    retain(store, BOB, "t.b2")  # 3 against 1: bob's oldest goes
    assert evicted == [("t.a0", "alice", REALM_LIMIT), ("t.b0", "bob", REALM_LIMIT)]
    assert kept(store) == {"t.a1", "t.b1", "t.b2"}


def test_at_the_realm_byte_bound_the_owner_holding_the_most_bytes_loses_its_oldest():
    carol = SessionInfo(3, "realm1", "carol", "user", "ticket")
    store, evicted = store_with()
    retain(store, ALICE, "t.probe", "y" * 400)
    big = store.bytes  # an entry's encoding, with a 400-byte payload and a 1-byte one
    retain(store, ALICE, "t.probe", "y")
    small = store.bytes
    store.clear(("t", "probe"))
    assert small < big // 2
    retain(store, ALICE, "t.a0", "y" * 400)
    retain(store, ALICE, "t.a1", "y" * 400)
    retain(store, BOB, "t.b0", "y" * 400)
    retain(store, BOB, "t.b1", "y" * 400)
    retain(store, BOB, "t.b2", "y" * 400)  # bob holds the most bytes
    retain(store, BOB, "t.b1", "y")
    retain(store, BOB, "t.b2", "y")  # ... no more: alice does
    retain(store, carol, "t.c0", "y" * 400)
    store.policy = RetentionPolicy(max_bytes=store.bytes + small // 2)
    retain(store, carol, "t.c1", "y")  # over the bound
    assert evicted == [("t.a0", "alice", REALM_LIMIT)]
    retain(store, BOB, "t.b2", "y" * 400)  # bob holds the most again
    retain(store, carol, "t.c2", "y")
    assert evicted[1:] == [("t.b0", "bob", REALM_LIMIT)]
    assert kept(store) == {"t.a1", "t.b1", "t.b2", "t.c0", "t.c1", "t.c2"}


def test_the_routers_own_topics_count_against_no_bound():
    store, evicted = store_with(max_topics=2, max_topics_per_principal=2)
    for n in range(5):
        retain(store, None, f"t.sys{n}")
    retain(store, ALICE, "t.a0")
    retain(store, ALICE, "t.a1")
    assert evicted == []
    assert len(kept(store)) == 7


def test_the_owner_is_stored_with_the_entry_and_old_entries_are_charged_to_their_authid():
    anonymous = SessionInfo(3, "realm1", "mqtt-assigned-7", "anonymous", "anonymous")
    publication = Publication(9, ("t", "x"), [1], None, anonymous, retain=True)
    blob = encode_retained(publication, None, owner_of(anonymous))
    assert decode_retained(blob, "realm1").owner == Owner("anonymous", "anonymous")
    old = {"id": 9, "topic": ["t", "x"], "args": [1], "kwargs": None,
           "publisher": [3, "mqtt-assigned-7", "anonymous"], "disclose": False,
           "eligibility": None, "exclude_me": False, "ts": publication.timestamp,
           "expires": None}  # as stored before owners were (and entries were positional)
    decoded = decode_retained(msgpack.packb(old, use_bin_type=True), "realm1")
    assert decoded.owner == Owner("authid", "mqtt-assigned-7")
    assert (decoded.publication.topic, decoded.publication.args) == (("t", "x"), [1])


# the router over real sockets ------------------------------------------------------------


def quota_router(workdir, retention: dict, **extra_config) -> RouterProcess:
    """A router whose realm1 (anonymous open, principal alice) has ``retention`` limits,
    with MQTT, WAMP and metrics listeners."""
    realm = mqtt_realm("realm1", retention=retention)
    return RouterProcess(workdir, [realm], listeners=listeners("realm1") + [
        {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
        {"type": "metrics", "host": "127.0.0.1", "port": 0}],
        extra_config=extra_config).start()


def client(router, **login) -> MqttClient:
    connected = MqttClient(router, **login)
    assert connected.connect().reason_code == 0
    return connected


def retain_all(publisher: MqttClient, topics: list[str]) -> None:
    """Retained QoS 1 publishes, each acknowledged with success (the event is retained)."""
    for topic in topics:
        assert publisher.publish(topic, topic.encode(), qos=1, retain=True) == 0, topic


def retained_under(router, prefix: str) -> set[str]:
    """The topics under ``prefix`` that have a retained message, as a new subscriber sees
    them: everything before a live sentinel published after SUBACK."""
    reader = client(router)
    try:
        assert reader.subscribe((f"{prefix}/#", 0)) == [0]
        marker = client(router)
        try:
            marker.publish(f"{prefix}/{unique('sentinel')}", SENTINEL, qos=1)
        finally:
            marker.close()
        received = reader.collect_until(SENTINEL)
        assert all(message.retain for message in received)
        return {message.topic for message in received}
    finally:
        reader.close()


def test_anonymous_flood_evicts_only_the_anonymous_clients_own_topics(tmp_path):
    router = quota_router(tmp_path, {"max_topics_per_principal": 5, "max_topics": 12})
    clients = []
    try:
        alice = client(router, username="alice", password=SECRETS["alice"])
        clients.append(alice)
        kept = [f"q/alice/{n}" for n in range(3)]
        retain_all(alice, kept)
        flooder = client(router)
        clients.append(flooder)
        flood = [f"q/anon/{n}" for n in range(20)]
        retain_all(flooder, flood)
        # another anonymous connection is the same owner: no fresh quota by reconnecting
        other = client(router)
        clients.append(other)
        retain_all(other, ["q/anon2/x"])
        assert retained_under(router, "q") == set(kept) | set(flood[16:]) | {"q/anon2/x"}
        router.wait_for_log(r"retained_quota: topic q\.anon\.0 evicted: its owner "
                            r"\(anonymous clients")
        samples = scrape(router)
        assert value(samples, "router_incidents_total", realm="realm1", protocol="mqtt",
                     reason="retained_quota") == 16
        assert value(samples, "router_retained_evictions_total", realm="realm1") == 16
    finally:
        for each in clients:
            each.close()
        router.stop()


def test_at_the_realm_bound_the_principal_holding_the_most_loses_its_oldest(tmp_path):
    router = quota_router(tmp_path, {"max_topics": 8})
    clients = []
    try:
        alice = client(router, username="alice", password=SECRETS["alice"])
        clients.append(alice)
        kept = [f"r/alice/{n}" for n in range(3)]
        retain_all(alice, kept)
        flooder = client(router)
        clients.append(flooder)
        flood = [f"r/anon/{n}" for n in range(20)]
        retain_all(flooder, flood)
        assert retained_under(router, "r") == set(kept) | set(flood[15:])
        router.wait_for_log(r"retained_realm_limit: topic r\.anon\.0 evicted: .* its owner "
                            r"\(anonymous clients")
        samples = scrape(router)
        assert value(samples, "router_incidents_total", realm="realm1", protocol="mqtt",
                     reason="retained_realm_limit") == 15
    finally:
        for each in clients:
            each.close()
        router.stop()


def test_router_sys_topics_count_against_no_bound(tmp_path):
    router = quota_router(tmp_path, {"max_topics": 4},
                          sys_interval=0.2)
    clients = []
    try:
        watcher = client(router)
        clients.append(watcher)
        assert watcher.subscribe(("$SYS/broker/uptime", 0)) == [0]
        watcher.next_message()  # the $SYS figures are retained from here on
        alice = client(router, username="alice", password=SECRETS["alice"])
        clients.append(alice)
        kept = [f"s/alice/{n}" for n in range(4)]
        retain_all(alice, kept)
        for _ in range(3):  # three more intervals: uptime changed, retained again each time
            assert watcher.next_message().topic == "$SYS/broker/uptime"
        assert retained_under(router, "s") == set(kept)
        version = client(router)
        clients.append(version)
        assert version.subscribe(("$SYS/broker/version", 0)) == [0]
        assert version.next_message().retain
    finally:
        for each in clients:
            each.close()
        router.stop()


def test_a_retained_event_over_the_byte_quota_is_refused_whole(tmp_path):
    router = quota_router(tmp_path, {"max_bytes_per_principal": 2000})
    clients = []
    try:
        subscriber = client(router)
        clients.append(subscriber)
        assert subscriber.subscribe(("big/#", 0)) == [0]
        publisher = client(router)
        clients.append(publisher)
        assert publisher.publish("big/one", b"x" * 5000, qos=1, retain=True) == QUOTA_EXCEEDED
        assert publisher.publish("big/one", b"live", qos=1) == 0
        assert subscriber.next_message().payload == b"live"  # the refused one never came

        async def wamp():
            session = await joined(router)
            request = session.next_request()
            session.send([16, request, {"acknowledge": True, "retain": True}, "big.two",
                          ["y" * 5000]])
            reply = await session.recv()
            assert reply[:3] == [ERROR, 16, request], reply
            assert reply[4] == "wamp.error.limit_exceeded"

        run(wamp())
        connection = amqp_connect(router)
        try:
            sender = connection.create_sender("big.three", options=Send(1))
            delivery = send(sender, message(b"z" * 5000, retain=True))
            assert delivery.remote_state == Delivery.REJECTED
            assert delivery.remote.condition.name == "amqp:resource-limit-exceeded"
        finally:
            connection.close()
        assert retained_under(router, "big") == set()
        samples = scrape(router)
        assert value(samples, "router_incidents_total", realm="realm1", protocol="mqtt",
                     reason="retained_refused") == 1
        for protocol in ("wamp", "amqp"):
            assert value(samples, "router_incidents_total", realm="realm1", protocol=protocol,
                         reason="retained_refused") == 1
    finally:
        for each in clients:
            each.close()
        router.stop()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_owners_survive_a_restart(tmp_path, how):
    router = quota_router(tmp_path, {"max_topics_per_principal": 3})
    clients = []
    try:
        alice = client(router, username="alice", password=SECRETS["alice"])
        clients.append(alice)
        retain_all(alice, ["o/alice/0"])
        anonymous = client(router)
        clients.append(anonymous)
        before = [f"o/anon/{n}" for n in range(3)]
        retain_all(anonymous, before)
        for each in clients:
            each.close()
        clients.clear()
        if how == "kill9":
            router.kill9()
        else:
            assert router.stop() == 0
        router.start()
        # a different anonymous connection after the restart: still the same owner, whose
        # quota the restored topics fill, so its oldest goes
        later = client(router)
        clients.append(later)
        retain_all(later, ["o/anon/3"])
        assert retained_under(router, "o") == {"o/alice/0", "o/anon/1", "o/anon/2",
                                               "o/anon/3"}
        alice = client(router, username="alice", password=SECRETS["alice"])
        clients.append(alice)
        retain_all(alice, ["o/alice/1", "o/alice/2", "o/alice/3"])
        assert retained_under(router, "o/alice") == {"o/alice/1", "o/alice/2", "o/alice/3"}
    finally:
        for each in clients:
            each.close()
        router.stop()


def eventually_retained(router, prefix: str, expected: set[str], timeout: float = 20.0) -> None:
    """Wait until a new subscriber on ``router`` sees exactly ``expected`` retained under
    ``prefix`` (another node's change reaches this node through Redis a moment later)."""
    deadline = time.monotonic() + timeout
    while (seen := retained_under(router, prefix)) != expected:
        assert time.monotonic() < deadline, f"retained under {prefix}: {seen}, not {expected}"


def listening(sender: RouterProcess, receiver: RouterProcess, timeout: float = 20.0) -> None:
    """Wait until ``receiver`` hears of retained changes made on ``sender``: a node is ready
    before its Redis subscription is, and what is announced before that does not reach it.
    The probes are alice's: they count against nobody else's quota."""
    prober = client(sender, username="alice", password=SECRETS["alice"])
    deadline = time.monotonic() + timeout
    try:
        while True:
            retain_all(prober, ["probe/alice"])
            if retained_under(receiver, "probe") == {"probe/alice"}:
                return
            assert time.monotonic() < deadline, "node never heard of the other's changes"
    finally:
        prober.close()


def test_quota_holds_across_redis_nodes(tmp_path):
    realm = mqtt_realm("realm1", retention={"max_topics_per_principal": 3})

    def start_node(base, redis: RedisServer, name: str) -> RouterProcess:
        return RouterProcess(base / name, [realm], listeners=listeners("realm1", wamp=False),
                             extra_config={"engine": {"type": "redis", "url": redis.url,
                                                      "node": name}}).start()

    with redis_cluster(tmp_path, start_node, ("a", "b")) as (_, nodes):
        listening(nodes["a"], nodes["b"])
        on_a = client(nodes["a"])
        try:
            retain_all(on_a, [f"c/anon/{n}" for n in range(3)])
        finally:
            on_a.close()
        eventually_retained(nodes["b"], "c", {f"c/anon/{n}" for n in range(3)})
        on_b = client(nodes["b"])  # another anonymous client, on the other node
        try:  # node b charges the anonymous clients for what node a stored: their oldest goes
            retain_all(on_b, ["c/anon/3"])
        finally:
            on_b.close()
        expected = {f"c/anon/{n}" for n in range(1, 4)}
        assert retained_under(nodes["b"], "c") == expected
        eventually_retained(nodes["a"], "c", expected)
