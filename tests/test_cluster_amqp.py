"""AMQP durable receiver links that follow their client among three nodes on one redis-server.

A durable link detaches on node A, AMQP and MQTT clients publish on node B, and the same
container attaches the same link on node C: A (which keeps the detached link subscribed)
queued for it in Redis until C claimed it. Attaching it on B while it is attached on A
takes it over: A closes its link with ``amqp:link:stolen``.
"""

from __future__ import annotations

import shutil
import time

import pytest
from proton import Delivery, Endpoint
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from tests.amqp_clients import (Receive, Send, amqp_listeners, body_bytes, connect, message,
                                received, send, settle)
from tests.harness import RedisServer, RouterProcess, redis_cluster
from tests.mqtt_clients import MqttClient, mqtt_realm, unique

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

LINK_STOLEN = "amqp:link:stolen"
PROBE = b"probe"
TAKEOVER_TIMEOUT = 2


def start_node(base, redis: RedisServer, name: str) -> RouterProcess:
    return RouterProcess(base / name, [mqtt_realm()],
                         listeners=amqp_listeners("realm1", mqtt=True, wamp=False),
                         extra_config={"engine": {"type": "redis", "url": redis.url,
                                                  "node": name},
                                       "cluster": {"session_takeover_timeout":
                                                   TAKEOVER_TIMEOUT}}).start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("amqp-cluster"), start_node) as running:
        yield running


def durable(node: RouterProcess, container: str, link: str, address: str
            ) -> tuple[BlockingConnection, BlockingReceiver]:
    connection = connect(node, container_id=container)
    return connection, connection.create_receiver(address, credit=5000, name=link,
                                                  options=Receive(1, durable=True))


def until_probe(probes: MqttClient, address: str, receiver: BlockingReceiver) -> None:
    """Publish QoS 0 probes with ``probes`` until one reaches ``receiver``: its node's
    interest reached the publisher's. Nothing but probes may arrive first."""
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "no probe arrived"
        probes.publish(address, PROBE)
        try:
            msg, delivery = received(receiver, timeout=0.05)
        except Exception:  # proton's Timeout: send another
            continue
        settle(receiver, delivery)
        assert body_bytes(msg) == PROBE
        return


def stolen(connection: BlockingConnection, receiver: BlockingReceiver) -> bool:
    """Wait for the router to close ``receiver``'s link; whether its error is
    ``amqp:link:stolen``."""
    link = receiver.link
    try:
        connection.wait(lambda: link.state & Endpoint.REMOTE_CLOSED, msg="waiting for the close")
    except LinkDetached:  # how the blocking client reports it
        pass
    return link.remote_condition is not None and link.remote_condition.name == LINK_STOLEN


def round_trip(connection: BlockingConnection) -> None:
    """Attach a link and wait for the answer: the router has read everything sent before
    on ``connection`` (the outcomes of its deliveries)."""
    connection.create_sender("amqpdur/sync", name=unique("sync"), options=Send(1)).close()


def collect(receiver: BlockingReceiver, count: int) -> list[tuple[bytes, int]]:
    """The next ``count`` messages other than probes, (body, delivery count), accepted."""
    got = []
    while len(got) < count:
        msg, delivery = received(receiver)
        settle(receiver, delivery)
        if body_bytes(msg) != PROBE:
            got.append((body_bytes(msg), msg.delivery_count))
    return got


@pytest.mark.parametrize("leaving", ["detach", "close"])
def test_durable_link_resumes_on_another_node(cluster, leaving):
    """Everything published on B while the link was away comes on C, each once and in
    order; the message in flight on A when it left comes first, counted."""
    _, nodes = cluster
    address = f"amqpdur/{unique('t')}"
    container, link = unique("container"), unique("link")
    publisher = connect(nodes["b"])
    amqp = publisher.create_sender(address, options=Send(1))
    mqtt = MqttClient(nodes["b"])
    mqtt.connect()

    first, receiver = durable(nodes["a"], container, link, address)
    until_probe(mqtt, address, receiver)
    send(amqp, message(b"in flight", qos=1))
    while True:
        msg, _unsettled = received(receiver)  # seen, never accepted
        if body_bytes(msg) != PROBE:
            break
    assert (body_bytes(msg), msg.delivery_count) == (b"in flight", 0)
    if leaving == "detach":  # the terminus stays (the router sees it before the close)
        receiver.link.detach()
    first.close()

    expected = [(b"in flight", 1)]
    for i in range(50):
        send(amqp, message(f"amqp-{i}".encode(), qos=1))
        mqtt.publish(address, f"mqtt-{i}".encode(), 1)
        expected += [(f"amqp-{i}".encode(), 0), (f"mqtt-{i}".encode(), 0)]

    again, receiver = durable(nodes["c"], container, link, address)
    assert collect(receiver, len(expected)) == expected
    # the link lives on C now: a probe from B reaches it there, behind no duplicate
    until_probe(mqtt, address, receiver)
    send(amqp, message(b"last", qos=1))
    assert collect(receiver, 1) == [(b"last", 0)]
    for connection in (again, publisher):
        connection.close()
    mqtt.close()


def test_attach_on_another_node_takes_the_link_over(cluster):
    """Attaching on B closes A's link (``amqp:link:stolen``); the message A had in flight
    comes on B, counted; then the same happens from B to C, and on C itself."""
    _, nodes = cluster
    address = f"amqpdur/{unique('take')}"
    container, link = unique("container"), unique("link")
    publisher = connect(nodes["c"])
    amqp = publisher.create_sender(address, options=Send(1))
    probes = MqttClient(nodes["c"])
    probes.connect()
    first, old = durable(nodes["a"], container, link, address)
    until_probe(probes, address, old)
    send(amqp, message(b"in flight", qos=1))
    assert body_bytes(received(old)[0]) == b"in flight"

    second, new = durable(nodes["b"], container, link, address)
    assert stolen(first, old)
    assert collect(new, 1) == [(b"in flight", 1)]
    round_trip(second)  # accepted on B before C takes the link

    third, newest = durable(nodes["c"], container, link, address)
    assert stolen(second, new)
    send(amqp, message(b"on c", qos=1))
    assert collect(newest, 1) == [(b"on c", 0)]
    round_trip(third)

    fourth, last = durable(nodes["c"], container, link, address)  # one node: the same
    assert stolen(third, newest)
    send(amqp, message(b"again on c", qos=1))
    assert collect(last, 1) == [(b"again on c", 0)]
    for connection in (first, second, third, fourth, publisher):
        connection.close()
    probes.close()


def test_accepted_waits_for_redis_to_store_the_queued_message(tmp_path):
    """With Redis gone, a message a detached durable link must keep is released (not
    stored), while one nobody keeps is still accepted."""
    redis = RedisServer(tmp_path)
    node = start_node(tmp_path, redis, "alone")
    try:
        address, elsewhere = f"amqpdur/{unique('kept')}", f"amqpdur/{unique('free')}"
        subscriber, _ = durable(node, unique("container"), unique("link"), address)
        subscriber.close()  # detached: the node queues for it in Redis
        publisher = connect(node)
        assert send(publisher.create_sender(address, options=Send(1)),
                    message(b"stored", qos=1)).remote_state == Delivery.ACCEPTED
        redis.stop()
        node.wait_for_log("will retry in", timeout=10)  # the node lost Redis
        kept = publisher.create_sender(address, name=unique("s"), options=Send(1))
        free = publisher.create_sender(elsewhere, name=unique("s"), options=Send(1))
        assert send(free, message(b"nobody keeps it", qos=1)).remote_state == Delivery.ACCEPTED
        assert send(kept, message(b"not stored", qos=1)).remote_state == Delivery.RELEASED
        publisher.close()
    finally:
        node.stop()
        redis.stop()


def test_restarted_node_keeps_its_detached_durable_links(cluster, tmp_path):
    """A node stopped and started again (same name) loads the durable links it had from
    Redis, subscribed: what is published on another node meanwhile is queued for them and
    comes, with what was queued before, where the link attaches next."""
    redis, nodes = cluster
    node = start_node(tmp_path, redis, "e")
    address = f"amqpdur/{unique('restart')}"
    container, link = unique("container"), unique("link")
    mqtt = MqttClient(nodes["b"])
    mqtt.connect()
    first, receiver = durable(node, container, link, address)
    until_probe(mqtt, address, receiver)
    first.close()
    mqtt.publish(address, b"before", 1)
    node.stop()
    node = start_node(tmp_path, redis, "e")
    try:
        assert any("restored 1 durable AMQP subscription" in line for line in node.log_lines)
        probe = connect(node)  # until b has heard of e's interest again
        until_probe(mqtt, address, probe.create_receiver(address, credit=100,
                                                         options=Receive(1)))
        probe.close()
        mqtt.publish(address, b"after", 1)
        again, receiver = durable(nodes["c"], container, link, address)
        assert collect(receiver, 2) == [(b"before", 0), (b"after", 0)]
        again.close()
    finally:
        node.stop()
        mqtt.close()


def test_durable_link_of_another_principal_is_refused_on_another_node(cluster):
    """alice's durable link attached on A: 'limited' attaching it (same container id and
    link name) on C is refused with amqp:unauthorized-access by the claim itself; alice's
    link on A keeps receiving."""
    _, nodes = cluster
    address = f"com.amqpdur.{unique('t')}"
    container, link = unique("container"), unique("link")
    alice = connect(nodes["a"], "alice", container_id=container)
    receiver = alice.create_receiver(address, credit=10, name=link,
                                     options=Receive(1, durable=True))
    mqtt = MqttClient(nodes["b"])
    mqtt.connect()
    until_probe(mqtt, address.replace(".", "/"), receiver)
    other = connect(nodes["c"], "limited", container_id=container)
    with pytest.raises(LinkDetached) as refused:
        other.create_receiver(address, credit=10, name=link, options=Receive(1, durable=True))
    assert "amqp:unauthorized-access" in str(refused.value)
    mqtt.publish(address.replace(".", "/"), b"still hers", 1)
    msg, delivery = received(receiver)
    settle(receiver, delivery)
    assert body_bytes(msg) == b"still hers"
    mqtt.close()
    for connection in (other, alice):
        connection.close()


def test_a_refused_durable_attach_leaves_the_link_name_free(cluster):
    """'limited' may not subscribe outside com.: its durable attach is refused and holds
    nothing, so alice attaches that container id and link name afterwards."""
    _, nodes = cluster
    container, link = unique("container"), unique("link")
    limited = connect(nodes["a"], "limited", container_id=container)
    with pytest.raises(LinkDetached) as refused:
        limited.create_receiver(f"org.{unique('t')}", credit=10, name=link,
                                options=Receive(1, durable=True))
    assert "amqp:unauthorized-access" in str(refused.value)
    alice = connect(nodes["c"], "alice", container_id=container)
    alice.create_receiver(f"com.{unique('t')}", credit=10, name=link,
                          options=Receive(1, durable=True))
    for connection in (limited, alice):
        connection.close()
