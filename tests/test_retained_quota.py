"""Retained quotas per principal (issue 24, item 8), black box: one client flooding retained
publishes must not evict another principal's retained topics; the router's ``$SYS`` topics
count against no bound; every eviction is counted and logged; owners survive a restart."""

from __future__ import annotations

import time

import pytest

from tests.clients import run
from tests.harness import RedisServer, RouterProcess, redis_cluster
from tests.metrics_scrape import scrape, value
from tests.mqtt_clients import SECRETS, MqttClient, listeners, mqtt_realm, unique
from tests.retention_helpers import ERROR, joined

SENTINEL = b"sentinel"
QUOTA_EXCEEDED = 0x97


def quota_router(workdir, retention: dict, **extra_config) -> RouterProcess:
    """A router whose realm1 (anonymous open, principal alice) has ``retention`` limits,
    with MQTT, WAMP and metrics listeners."""
    realm = mqtt_realm("realm1", retention=retention)
    return RouterProcess(workdir, [realm], listeners=listeners("realm1") + [
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
        assert retained_under(router, "big") == set()
        samples = scrape(router)
        assert value(samples, "router_incidents_total", realm="realm1", protocol="mqtt",
                     reason="retained_refused") == 1
        assert value(samples, "router_incidents_total", realm="realm1", protocol="wamp",
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


def test_quota_holds_across_redis_nodes(tmp_path):
    realm = mqtt_realm("realm1", retention={"max_topics_per_principal": 3})

    def start_node(base, redis: RedisServer, name: str) -> RouterProcess:
        return RouterProcess(base / name, [realm], listeners=listeners("realm1", wamp=False),
                             extra_config={"engine": {"type": "redis", "url": redis.url,
                                                      "node": name}}).start()

    with redis_cluster(tmp_path, start_node, ("a", "b")) as (_, nodes):
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
