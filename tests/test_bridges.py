"""MQTT bridges (docs/bridges.md) against a real Mosquitto and against a second router.

The edge router runs a bridge to the remote broker; paho clients publish and subscribe on
both sides. "Exactly once" is observed with sentinels that travel the same path after the
messages under test: a duplicate would arrive before its sentinel (one connection, in order).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from router.config import ConfigError, load_config
from tests.auth_helpers import make_certs
from tests.harness import OPEN_ROLE, RedisServer, RouterProcess, free_port
from tests.mosquitto_broker import MosquittoBroker
from tests.mqtt_clients import (SECRETS, V5, V311, VERSION_IDS, VERSIONS, ClientPool,
                                listeners, mqtt_realm, probe_until_received, unique)

PROTOCOL = {V311: "3.1.1", V5: "5"}
STATE = "$SYS/broker/connection/{}/state"


def edge_realm() -> dict:
    """An open realm with a ``bridge`` role that may publish and subscribe anywhere."""
    realm = mqtt_realm("realm1")
    realm["roles"]["bridge"] = OPEN_ROLE + [
        {"uri": "$SYS", "match": "prefix", "allow": ["subscribe"]}]
    return realm


def bridge_block(name: str, port: int, topics: list[dict], version: int = V5,
                 **extra) -> dict:
    block = {"name": name, "realm": "realm1", "host": "127.0.0.1", "port": port,
             "role": "bridge", "protocol": PROTOCOL[version], "topics": topics,
             "keep_alive": 5, "reconnect_min": 0.2, "reconnect_max": 1.0}
    block.update(extra)
    return block


def start_edge(workdir, bridges: list[dict], **extra_config) -> RouterProcess:
    """The edge router with ``bridges``, started once every bridge is connected."""
    edge = RouterProcess(workdir, [edge_realm()],
                         listeners=listeners("realm1", wamp=False) + [
                             {"type": "metrics", "host": "127.0.0.1", "port": 0,
                              "path": "/metrics"}],
                         extra_config={"bridges": bridges, "sys_interval": 0.2,
                                       **extra_config}).start()
    for bridge in bridges:
        edge.wait_for_log(rf"bridge {bridge['name']}: connected to ", timeout=20)
    return edge


@pytest.fixture
def mosquitto(tmp_path):
    workdir = tmp_path / "mosquitto"
    workdir.mkdir()
    broker = MosquittoBroker(workdir).start()
    yield broker
    broker.stop()


@pytest.fixture
def pool():
    pool = ClientPool(None)
    yield pool
    pool.close()


# --- out, in, both ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_out_and_in_with_prefixes_and_each_qos(tmp_path, mosquitto, pool, version):
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", mosquitto.port, [
        {"topic": "out/#", "direction": "out", "local_prefix": "edge/",
         "remote_prefix": "cloud/", "qos": 2},
        {"topic": "in/#", "direction": "in", "local_prefix": "edge/",
         "remote_prefix": "cloud/", "qos": 2}], version)])
    try:
        remote_sub = pool(router=mosquitto)
        remote_sub.subscribe(("cloud/out/#", 2))
        local_sub = pool(router=edge)
        local_sub.subscribe(("edge/in/#", 2))
        local_pub, remote_pub = pool(router=edge), pool(router=mosquitto)
        for qos in (0, 1, 2):
            local_pub.publish(f"edge/out/q{qos}", f"up {qos}".encode(), qos)
            message = remote_sub.expect(f"cloud/out/q{qos}", f"up {qos}".encode())
            assert message.qos == qos
            remote_pub.publish(f"cloud/in/q{qos}", f"down {qos}".encode(), qos)
            message = local_sub.expect(f"edge/in/q{qos}", f"down {qos}".encode())
            assert message.qos == qos
        # outside the mappings: nothing crosses either way
        local_pub.publish("edge/elsewhere", b"stays", 1)
        remote_pub.publish("cloud/elsewhere", b"stays", 1)
        local_pub.publish("edge/out/end", b"end", 1)
        assert remote_sub.collect_until(b"end") == []
    finally:
        edge.stop()


def retained_on(client, topic: str) -> object:
    """The retained message a new subscription to ``topic`` gets, once the bridge has
    forwarded it (it does so asynchronously: subscribed again until it is there)."""
    for _ in range(100):
        client.subscribe((topic, 1))
        try:
            return client.next_message(timeout=0.5)
        except AssertionError:
            client.unsubscribe(topic)
    raise AssertionError(f"{topic} never retained on the other side")


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_retained_messages_cross_with_their_flag(tmp_path, mosquitto, pool, version):
    """Retained before the bridge connects (the remote sends it on SUBSCRIBE) and live; an
    MQTT 3.1.1 remote clears the flag of live messages (no retain-as-published there)."""
    pool(router=mosquitto).publish("cloud/r/before", b"kept before", 1, retain=True)
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", mosquitto.port, [
        {"topic": "r/#", "direction": "both", "local_prefix": "edge/",
         "remote_prefix": "cloud/"}], version)])
    try:
        pool(router=edge).publish("edge/r/up", b"kept up", 1, retain=True)
        pool(router=mosquitto).publish("cloud/r/down", b"kept down", 1, retain=True)
        expected = [(pool(router=mosquitto), "cloud/r/up", b"kept up"),
                    (pool(router=edge), "edge/r/before", b"kept before")]
        if version == V5:
            expected.append((pool(router=edge), "edge/r/down", b"kept down"))
        for client, topic, payload in expected:
            message = retained_on(client, topic)
            assert (message.topic, message.payload, message.retain) == (topic, payload, True)
    finally:
        edge.stop()


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_both_directions_never_loop(tmp_path, mosquitto, pool, version):
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", mosquitto.port, [
        {"topic": "sync/#", "direction": "both", "remote_prefix": "site1/", "qos": 1}],
        version)])
    try:
        remote_sub, local_sub = pool(router=mosquitto), pool(router=edge)
        remote_sub.subscribe(("site1/#", 1))
        local_sub.subscribe(("sync/#", 1))
        local_pub, remote_pub = pool(router=edge), pool(router=mosquitto)
        local_pub.publish("sync/a", b"a", 1)
        remote_sub.expect("site1/sync/a", b"a")
        local_sub.expect("sync/a", b"a")
        remote_pub.publish("site1/sync/b", b"b", 1)
        remote_sub.expect("site1/sync/b", b"b")
        local_sub.expect("sync/b", b"b")
        # an echo of b sent back out would reach the remote before this
        local_pub.publish("sync/end", b"end", 1)
        assert remote_sub.collect_until(b"end") == []
        # an echo of a or end brought back in would reach the edge before this
        remote_pub.publish("site1/sync/end2", b"end2", 1)
        assert [m.payload for m in local_sub.collect_until(b"end2")] == [b"end"]
        assert remote_sub.next_message().payload == b"end2"
    finally:
        edge.stop()


# --- the remote away -------------------------------------------------------------------------


def await_state(client, state: bytes) -> None:
    """Until the $SYS state the client subscribed to says ``state`` (it is published every
    ``sys_interval`` when it changed, so earlier values may come first)."""
    while client.next_message(timeout=30).payload != state:
        pass


OUTAGE = 10.0
"""Seconds the remote broker is down in the outage scenario (its length, not a wait)."""


def start_remote(kind: str, workdir):
    """The remote end: Mosquitto, or a router on a fixed port (both restartable on it)."""
    if kind == "mosquitto":
        workdir.mkdir()
        return MosquittoBroker(workdir).start()
    return RouterProcess(workdir, [mqtt_realm("realm1")], listeners=[
        {"type": "mqtt", "host": "127.0.0.1", "port": free_port(), "realm": "realm1"}]).start()


@pytest.mark.parametrize("kind", ["mosquitto", "router"])
def test_messages_wait_for_a_stopped_remote_and_arrive_once_in_order(tmp_path, pool, kind):
    remote = start_remote(kind, tmp_path / "remote")
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", remote.address("mqtt")[1], [
        {"topic": "m/#", "direction": "out", "remote_prefix": "cloud/", "qos": 1}])])
    try:
        state = pool(router=edge)
        state.subscribe((STATE.format("cloud"), 0))
        await_state(state, b"1")
        subscriber_id = unique("cloud_sub")  # its session and queue outlive the outage
        remote_sub = pool(router=remote, version=V311, client_id=subscriber_id, clean=False)
        remote_sub.subscribe(("cloud/m/#", 1))
        local_pub = pool(router=edge)
        local_pub.publish("m/before", b"before", 1)
        remote_sub.expect("cloud/m/before", b"before")
        remote_sub.close()

        remote.stop()
        await_state(state, b"0")
        payloads = []
        outage_ends = time.monotonic() + OUTAGE
        while time.monotonic() < outage_ends:  # acknowledged by the edge: in its queue
            payloads.append(f"{len(payloads)}".encode())
            assert local_pub.publish("m/outage", payloads[-1], 1) == 0
            time.sleep(0.2)  # the scenario's pace: messages spread over the outage
        remote.start()  # on the same port, with its persistent sessions

        await_state(state, b"1")
        remote_sub = pool(router=remote, version=V311, client_id=subscriber_id, clean=False)
        local_pub.publish("m/outage", b"sentinel", 1)
        received = remote_sub.collect_until(b"sentinel", timeout=30)
        assert [m.payload for m in received] == payloads  # each once, in order
        assert {m.topic for m in received} == {"cloud/m/outage"}
        assert any("bridge cloud: cannot reach" in line for line in edge.log_lines)
    finally:
        edge.stop()
        remote.stop()


def test_queued_messages_survive_a_restart_of_the_edge(tmp_path, pool):
    port = free_port()  # nothing listens yet: the bridge queues
    edge = RouterProcess(tmp_path / "edge", [edge_realm()], listeners=listeners("realm1", False),
                         extra_config={"bridges": [bridge_block("cloud", port, [
                             {"topic": "q/#", "direction": "out", "qos": 2}])]}).start()
    try:
        publisher = pool(router=edge)
        for n in range(5):
            publisher.publish("q/x", f"{n}".encode(), 2)
        publisher.close()
    finally:
        edge.stop()
    (tmp_path / "mosquitto").mkdir()
    broker = MosquittoBroker(tmp_path / "mosquitto", port).start()
    try:
        subscriber = pool(router=broker)
        subscriber.subscribe(("q/#", 2))
        edge.start()
        assert any("bridge cloud: 5 queued message(s) restored" in line
                   for line in edge.log_lines)  # logged before "ready"
        received = [subscriber.next_message(timeout=30) for _ in range(5)]
        assert [(m.payload, m.qos) for m in received] == [(f"{n}".encode(), 2) for n in range(5)]
        pool(router=edge).publish("q/x", b"sentinel", 2)
        assert subscriber.collect_until(b"sentinel") == []
    finally:
        edge.stop()
        broker.stop()


def scrape(edge: RouterProcess) -> str:
    with urllib.request.urlopen(edge.urls["metrics"], timeout=10) as response:
        return response.read().decode()


def test_the_queue_bound_drops_and_counts(tmp_path, pool):
    edge = RouterProcess(tmp_path / "edge", [edge_realm()],
                         listeners=listeners("realm1", False) + [
                             {"type": "metrics", "host": "127.0.0.1", "port": 0,
                              "path": "/metrics"}],
                         extra_config={"bridges": [bridge_block("cloud", free_port(), [
                             {"topic": "q/#", "direction": "out"}], max_queued=3)]}).start()
    try:
        publisher = pool(router=edge)
        for n in range(5):
            publisher.publish("q/x", f"{n}".encode(), 1)
        publisher.publish("q/x", b"qos 0", 0)
        metrics = scrape(edge)
        assert ('router_messages_dropped_total{protocol="bridge",realm="realm1",'
                'reason="queue_full"} 2.0') in metrics
        assert ('router_messages_dropped_total{protocol="bridge",realm="realm1",'
                'reason="bridge_offline"} 1.0') in metrics
        assert 'router_bridge_queued_messages{bridge="cloud",realm="realm1"} 3.0' in metrics
        assert 'router_bridge_connected{bridge="cloud",realm="realm1"} 0.0' in metrics
        status = subprocess.run([sys.executable, "-m", "router", "status", "--url",
                                 edge.urls["metrics"], "--interval", "0.2", "--config",
                                 "no-such-config.json"], capture_output=True, text=True,
                                timeout=30)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "  bridge cloud: not connected, 3 queued, 0 sent, 0 received" in \
            status.stdout.splitlines()
    finally:
        edge.stop()


# --- our own router at the other end ---------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)
def test_a_bridge_to_another_router(tmp_path, pool, version):
    cloud = RouterProcess(tmp_path / "cloud", [mqtt_realm("realm1")],
                          listeners=listeners("realm1", wamp=False)).start()
    try:
        _, port, _ = cloud.address("mqtt")
        edge = start_edge(tmp_path / "edge", [bridge_block("cloud", port, [
            {"topic": "t/#", "direction": "both", "remote_prefix": "site/", "qos": 2}],
            version, username="alice", password="alice-secret")])
        try:
            cloud_sub, edge_sub = pool(router=cloud), pool(router=edge)
            cloud_sub.subscribe(("site/#", 2))
            edge_sub.subscribe(("t/#", 2))
            edge_pub, cloud_pub = pool(router=edge), pool(router=cloud)
            for qos in (1, 2):
                edge_pub.publish("t/up", f"up {qos}".encode(), qos)
                assert cloud_sub.expect("site/t/up", f"up {qos}".encode()).qos == qos
                assert edge_sub.expect("t/up", f"up {qos}".encode()).qos == qos
                cloud_pub.publish("site/t/down", f"down {qos}".encode(), qos)
                assert cloud_sub.expect("site/t/down", f"down {qos}".encode()).qos == qos
                assert edge_sub.expect("t/down", f"down {qos}".encode()).qos == qos
            edge_pub.publish("t/end", b"end", 1)
            assert cloud_sub.collect_until(b"end") == []
            cloud_pub.publish("site/t/end2", b"end2", 1)
            assert [m.payload for m in edge_sub.collect_until(b"end2")] == [b"end"]
        finally:
            edge.stop()
    finally:
        cloud.stop()


def test_reconnects_back_off_exponentially_up_to_the_cap(tmp_path):
    edge = RouterProcess(tmp_path / "edge", [edge_realm()], listeners=listeners("realm1", False),
                         extra_config={"bridges": [bridge_block(
                             "cloud", free_port(), [{"topic": "t/#"}], reconnect_min=0.1,
                             reconnect_max=0.8)]}).start()
    try:
        delays = [float(re.search(r"again in ([\d.]+) s", edge.wait_for_log(
            r"bridge cloud: cannot reach .*again in", timeout=20)).group(1)) for _ in range(6)]
    finally:
        edge.stop()
    # 0.1 doubling (each shortened by up to 20 %, as logged to 0.1 s), then held at 0.8
    assert 0.0 <= delays[0] <= 0.1 and 0.1 <= delays[1] <= 0.2 and 0.3 <= delays[2] <= 0.4
    assert all(0.6 <= delay <= 0.8 for delay in delays[4:]), delays


def test_a_refused_login_is_retried_and_logged(tmp_path, pool):
    cloud = RouterProcess(tmp_path / "cloud", [mqtt_realm("realm1", anonymous=False)],
                          listeners=listeners("realm1", wamp=False)).start()
    try:
        _, port, _ = cloud.address("mqtt")
        edge = RouterProcess(tmp_path / "edge", [edge_realm()],
                             listeners=listeners("realm1", False),
                             extra_config={"bridges": [bridge_block(
                                 "cloud", port, [{"topic": "t/#"}], username="alice",
                                 password="wrong")]}).start()
        try:
            edge.wait_for_log(r"bridge cloud: 127.0.0.1:\d+ refused the connection: "
                              r"BAD_USER_NAME_OR_PASSWORD", timeout=20)
            edge.wait_for_log(r"bridge cloud: cannot reach .* again in", timeout=20)
            edge.wait_for_log(r"bridge cloud: 127.0.0.1:\d+ refused the connection",
                              timeout=20)
        finally:
            edge.stop()
    finally:
        cloud.stop()


def test_a_bridge_role_without_permission_forwards_nothing(tmp_path, mosquitto, pool):
    realm = edge_realm()
    realm["roles"]["bridge"] = [{"uri": "allowed", "match": "prefix",
                                 "allow": ["publish", "subscribe"]}]
    edge = RouterProcess(tmp_path / "edge", [realm], listeners=listeners("realm1", False),
                         extra_config={"bridges": [bridge_block("cloud", mosquitto.port, [
                             {"topic": "#", "direction": "in"},
                             {"topic": "secret/#", "remote_prefix": "out/"},
                             {"topic": "allowed/#", "remote_prefix": "out/"}])]}).start()
    try:
        edge.wait_for_log(r"bridge cloud: connected to ", timeout=20)
        assert any("bridge cloud: cannot forward secret/# out: role 'bridge' may not "
                   "subscribe" in line for line in edge.log_lines)  # at start, before ready
        remote_sub = pool(router=mosquitto)
        remote_sub.subscribe(("out/#", 1))
        local_pub = pool(router=edge)
        local_pub.publish("secret/y", b"stays here", 1)
        local_pub.publish("allowed/y", b"goes out", 1)
        remote_sub.expect("out/allowed/y", b"goes out")
        local_sub = pool(router=edge)
        local_sub.subscribe(("#", 1))
        remote_pub = pool(router=mosquitto)
        remote_pub.publish("secret/x", b"no", 1)
        edge.wait_for_log(r"bridge cloud: secret/x not published: role 'bridge' may not "
                          "publish", timeout=20)
        remote_pub.publish("allowed/x", b"yes", 1)
        local_sub.expect("allowed/x", b"yes")
    finally:
        edge.stop()


# --- the Redis engine ------------------------------------------------------------------------


def cluster_node(workdir, redis: RedisServer, name: str, port: int) -> RouterProcess:
    return RouterProcess(workdir / name, [edge_realm()], listeners=listeners("realm1", False),
                         extra_config={
                             "engine": {"type": "redis", "url": redis.url, "node": name},
                             "cluster": {"heartbeat_interval": 0.5, "node_timeout": 2},
                             "bridges": [bridge_block("cloud", port, [
                                 {"topic": "c/#", "direction": "both",
                                  "remote_prefix": "site/"}])]}).start()


@contextlib.contextmanager
def bridged_cluster(tmp_path, port: int, pool, timeout: float = 30.0):
    """Redis and nodes a and b, both configured with the bridge; yields (nodes, the node
    whose bridge connected, the other), once exactly one has (a bounded poll of two logs)
    and the other knows the interest of the first, its bridge's filters among it (so what
    is published on the other from then on goes to the bridge)."""
    redis = RedisServer(tmp_path)
    nodes: dict[str, RouterProcess] = {}
    try:
        for name in ("a", "b"):
            nodes[name] = cluster_node(tmp_path, redis, name, port)
        deadline = time.monotonic() + timeout
        while True:
            running = [name for name, node in nodes.items()
                       if any("bridge cloud: connected to" in line for line in node.log_lines)]
            if running or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(running) == 1, f"the bridge runs on {running}"
        holder, other = running[0], "b" if running[0] == "a" else "a"
        listener = pool(router=nodes[holder])  # announced with every pattern of its node
        listener.subscribe(("probe/interest", 0))
        probe_until_received(pool(router=nodes[other]), listener, "probe/interest")
        yield nodes, holder, other
    finally:
        for node in nodes.values():
            node.stop()
        redis.stop()


def test_on_redis_one_node_runs_a_bridge_and_another_takes_it_over(tmp_path, mosquitto, pool):
    with bridged_cluster(tmp_path, mosquitto.port, pool) as (nodes, holder, other):
        remote_sub = pool(router=mosquitto)
        remote_sub.subscribe(("site/#", 1))
        local_sub = pool(router=nodes[other])
        local_sub.subscribe(("c/#", 1))
        # through the cluster to the node that runs the bridge, and back
        pool(router=nodes[other]).publish("c/up", b"via the other node", 1)
        remote_sub.expect("site/c/up", b"via the other node")
        local_sub.expect("c/up", b"via the other node")
        pool(router=mosquitto).publish("site/c/down", b"to every node", 1)
        remote_sub.expect("site/c/down", b"to every node")
        local_sub.expect("c/down", b"to every node")
        assert not any("this node runs it" in line for line in nodes[other].log_lines)
        status = subprocess.run([sys.executable, "-m", "router", "status", "--config",
                                 str(nodes[other].config_path), "--interval", "0.2"],
                                capture_output=True, text=True, timeout=30)
        assert "  bridge cloud: runs on another node" in status.stdout.splitlines(), \
            status.stdout + status.stderr

        nodes[holder].kill9()
        nodes[other].wait_for_log(r"bridge cloud: connected to ", timeout=30)
        pool(router=nodes[other]).publish("c/after", b"after the takeover", 1)
        remote_sub.expect("site/c/after", b"after the takeover")


def test_on_redis_the_queue_moves_with_the_bridge(tmp_path, mosquitto, pool):
    """Queued while the remote is down by the node that runs the bridge, sent by the node
    that took it over after the first was killed: each once, in order."""
    with bridged_cluster(tmp_path, mosquitto.port, pool) as (nodes, holder, other):
        subscriber_id = unique("cloud_sub")
        remote_sub = pool(router=mosquitto, version=V311, client_id=subscriber_id, clean=False)
        remote_sub.subscribe(("site/#", 1))
        remote_sub.close()
        mosquitto.stop()
        nodes[holder].wait_for_log(r"bridge cloud: lost ", timeout=30)
        publisher = pool(router=nodes[other])
        payloads = [f"{n}".encode() for n in range(20)]
        for payload in payloads:  # acknowledged once the holder queued it in Redis
            assert publisher.publish("c/q", payload, 1) == 0
        nodes[holder].kill9()
        mosquitto.start()
        nodes[other].wait_for_log(r"bridge cloud: connected to ", timeout=30)
        remote_sub = pool(router=mosquitto, version=V311, client_id=subscriber_id, clean=False)
        publisher.publish("c/q", b"sentinel", 1)
        received = remote_sub.collect_until(b"sentinel", timeout=30)
        assert [m.payload for m in received] == payloads


# --- TLS and keep alive -----------------------------------------------------------------------


@pytest.fixture
def tls_cloud(tmp_path):
    """A router whose TLS MQTT listener takes clients with a certificate of its CA (CN edge1
    logs in as edge1), and a plain one for alice with her password."""
    certs = make_certs(tmp_path / "certs", client_cns=("edge1",))
    tls = {"cert": str(certs["cert"]), "key": str(certs["key"]), "ca": str(certs["ca"]),
           "client_certs": "required"}
    realm = mqtt_realm("realm1", anonymous=False)
    realm["principals"]["edge1"] = {"role": "user"}
    cloud = RouterProcess(tmp_path / "cloud", [realm], listeners=[
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1", "tls": tls},
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]).start()
    ready = next(line for line in cloud.log_lines if "ready: " in line)
    yield cloud, certs, int(re.search(r"mqtts://127\.0\.0\.1:(\d+)", ready).group(1))
    cloud.stop()


def test_a_bridge_over_tls_with_a_client_certificate(tmp_path, tls_cloud, pool):
    cloud, certs, tls_port = tls_cloud
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", tls_port, [
        {"topic": "t/#", "direction": "out", "remote_prefix": "edge1/"}], host="localhost",
        tls={"ca": str(certs["ca"]), "cert": str(certs["edge1.cert"]),
             "key": str(certs["edge1.key"])})])
    try:
        cloud_sub = pool(router=cloud, username="alice", password=SECRETS["alice"])
        cloud_sub.subscribe(("edge1/#", 1))
        pool(router=edge).publish("t/x", b"over tls", 1)
        assert cloud_sub.expect("edge1/t/x", b"over tls").qos == 1
    finally:
        edge.stop()


@pytest.mark.parametrize("problem, tls", [
    ("another CA", lambda certs, other: {"ca": str(other["ca"]), "cert": str(certs["edge1.cert"]),
                                          "key": str(certs["edge1.key"])}),
    ("no client certificate", lambda certs, other: {"ca": str(certs["ca"])}),
])
def test_a_bridge_refused_by_tls_never_connects(tmp_path, tls_cloud, problem, tls):
    cloud, certs, tls_port = tls_cloud
    other = make_certs(tmp_path / "other")
    edge = RouterProcess(tmp_path / "edge", [edge_realm()], listeners=listeners("realm1", False),
                         extra_config={"bridges": [bridge_block(
                             "cloud", tls_port, [{"topic": "t/#"}], host="localhost",
                             tls=tls(certs, other))]}).start()
    try:
        edge.wait_for_log(r"bridge cloud: cannot reach localhost:\d+: .*again in", timeout=20)
        edge.wait_for_log(r"bridge cloud: cannot reach localhost:\d+: .*again in", timeout=20)
        assert not any("connected to" in line for line in edge.log_lines)
    finally:
        edge.stop()


def test_a_remote_that_stops_answering_is_left_by_the_keep_alive(tmp_path, mosquitto, pool):
    """Mosquitto frozen (SIGSTOP): its socket stays open, only the unanswered PINGREQ tells;
    once it runs again the bridge reconnects."""
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", mosquitto.port, [
        {"topic": "t/#"}], keep_alive=1)])
    try:
        state = pool(router=edge)
        state.subscribe((STATE.format("cloud"), 0))
        await_state(state, b"1")
        mosquitto.proc.send_signal(signal.SIGSTOP)
        try:
            edge.wait_for_log(r"bridge cloud: lost 127\.0\.0\.1:\d+: no PINGRESP within the "
                              "keep alive", timeout=30)
            await_state(state, b"0")
        finally:
            mosquitto.proc.send_signal(signal.SIGCONT)
        await_state(state, b"1")
    finally:
        edge.stop()


def test_a_remote_with_lower_limits_gets_what_it_takes(tmp_path, pool):
    """A Mosquitto that takes QoS 1 at most and keeps no retained messages (it closes a
    client that sends more): the bridge sends QoS 2 at 1 and clears the retain flag."""
    (tmp_path / "mosquitto").mkdir()
    broker = MosquittoBroker(tmp_path / "mosquitto",
                             extra="max_qos 1\nretain_available false\n").start()
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", broker.port, [
        {"topic": "l/#", "direction": "both", "remote_prefix": "lim/", "qos": 2}])])
    try:
        remote_sub = pool(router=broker)
        remote_sub.subscribe(("lim/#", 1))
        pool(router=edge).publish("l/x", b"high", 2, retain=True)
        message = remote_sub.expect("lim/l/x", b"high")
        assert (message.qos, message.retain) == (1, False)
        assert not any("bridge cloud: lost" in line for line in edge.log_lines)
    finally:
        edge.stop()
        broker.stop()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_in_flight_when_the_link_broke_is_finished(tmp_path, mosquitto, pool, qos):
    """Sent to a frozen Mosquitto, never acknowledged; the keep alive drops the connection;
    the reconnected bridge finds its session there and finishes the flow (PUBLISH with DUP
    and the same packet id): at QoS 2 the subscriber gets it once; at QoS 1 at least once
    (Mosquitto may have read the first copy before it saw the connection go)."""
    edge = start_edge(tmp_path / "edge", [bridge_block("cloud", mosquitto.port, [
        {"topic": "f/#", "qos": 2}], keep_alive=1)])
    try:
        remote_sub = pool(router=mosquitto)
        remote_sub.subscribe(("f/#", 2))
        local_pub = pool(router=edge)
        mosquitto.proc.send_signal(signal.SIGSTOP)
        try:
            local_pub.publish("f/x", b"in flight", qos)  # the edge has it: PUBACK/PUBCOMP
            edge.wait_for_log(r"bridge cloud: lost .*no PINGRESP", timeout=30)
        finally:
            mosquitto.proc.send_signal(signal.SIGCONT)
        edge.wait_for_log(r"bridge cloud: connected to .*session present: True", timeout=30)
        local_pub.publish("f/x", b"sentinel", qos)
        assert remote_sub.expect("f/x", b"in flight").qos == qos
        again = remote_sub.collect_until(b"sentinel", timeout=30)
        assert [m.payload for m in again] == ([] if qos == 2 else [b"in flight"] * len(again))
        assert len(again) <= 1
    finally:
        edge.stop()


# --- configuration ---------------------------------------------------------------------------


def write_config(tmp_path, bridge: dict | list, **extra) -> str:
    (tmp_path / "realms").mkdir(exist_ok=True)
    (tmp_path / "realms" / "realm1.json").write_text(json.dumps(edge_realm()))
    (tmp_path / "ca.pem").write_text("not a certificate")
    config = {"realms": ["realm1"], "listeners": [{"type": "mqtt", "host": "127.0.0.1",
                                                   "port": 0, "realm": "realm1"}],
              "bridges": bridge if isinstance(bridge, list) else [bridge], **extra}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


GOOD = {"name": "cloud", "realm": "realm1", "host": "broker.example", "role": "bridge",
        "topics": [{"topic": "a/#"}]}


def test_a_minimal_bridge_gets_every_default(tmp_path):
    bridge, = load_config(write_config(tmp_path, GOOD)).bridges
    assert (bridge.port, bridge.protocol, bridge.mqtt_client_id, bridge.clean_session,
            bridge.keep_alive, bridge.max_queued, bridge.tls) == (
        1883, 5, "bridge-cloud", False, 60, 10_000, None)
    mapping, = bridge.topics
    assert (mapping.direction, mapping.qos, mapping.local_filter, mapping.remote_filter) == (
        "out", 1, "a/#", "a/#")


@pytest.mark.parametrize("change, key, problem", [
    ({"realm": "nope"}, "bridges[0].realm", "not one of the realms"),
    ({"role": "nope"}, "bridges[0].role", "has no role 'nope'"),
    ({"port": 0}, "bridges[0].port", "must be 1 to 65535"),
    ({"protocol": "3.1"}, "bridges[0].protocol", 'must be "3.1.1" or "5"'),
    ({"name": "a/b"}, "bridges[0].name", "must be 1 to 64 letters"),
    ({"topics": []}, "bridges[0].topics", "at least one topic mapping"),
    ({"topics": [{"topic": "a/#", "direction": "sideways"}]}, "bridges[0].topics[0].direction",
     "must be one of out, in, both"),
    ({"topics": [{"topic": "a/#", "qos": 3}]}, "bridges[0].topics[0].qos", "must be 0, 1 or 2"),
    ({"topics": [{"topic": "a", "local_prefix": "x/#/"}]}, "bridges[0].topics[0].local_prefix",
     "must not hold a wildcard"),
    ({"topics": [{"topic": "a/#/b"}]}, "bridges[0].topics[0].topic", "not a valid MQTT topic"),
    ({"topics": [{"topic": "$share/g/a"}]}, "bridges[0].topics[0].topic",
     "not a valid MQTT topic"),
    ({"topics": [{"topic": "a", "dirction": "in"}]}, "bridges[0].topics[0].dirction",
     "did you mean 'direction'"),
    ({"keep_alive": 70000}, "bridges[0].keep_alive", "must be 0 to 65535"),
    ({"reconnect_min": 5, "reconnect_max": 1}, "bridges[0].reconnect_max",
     "must be at least reconnect_min"),
    ({"max_queued": 0}, "bridges[0].max_queued", "must be positive"),
    ({"tls": {"ca": "missing.pem"}}, "bridges[0].tls.ca", "does not exist"),
    ({"tls": {"ca": "ca.pem"}}, "bridges[0].tls.ca", "cannot be used"),
    ({"tls": {"cert": "ca.pem"}}, "bridges[0].tls.key", "needs both 'cert' and 'key'"),
    ({"protocol": "3.1.1", "password": "x"}, "bridges[0].password", "needs a username"),
])
def test_a_bad_bridge_is_refused_naming_its_key(tmp_path, change, key, problem):
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, {**GOOD, **change}))
    assert refused.value.key == key and problem in refused.value.problem, str(refused.value)


def test_two_bridges_of_one_name_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"bridges\[1\]\.name: 'cloud' names two bridges"):
        load_config(write_config(tmp_path, [GOOD, GOOD]))


