"""The AMQP 1.0 frontend, black box: a real router process, real sockets, the
python-qpid-proton client (and a raw socket for byte-level cases).

What a client sees of QoS on the wire: a QoS 0 delivery arrives pre-settled, a
QoS >= 1 delivery unsettled (and is sent again until accepted); the publisher's
QoS rides in the ``x-opt-qos`` annotation. Nothing sleeps for correctness: "X did
not arrive" is shown by a later sentinel arriving as the very next message, or by
a round trip that the router answers only after it would have sent X.
"""

from __future__ import annotations

import json

import pytest
from proton import ConnectionException, Delivery, Endpoint, LinkException, Message, symbol

from router.amqp.connection import terminus_capabilities
from router.settings import AmqpSettings
from tests.amqp_clients import (TIMEOUT, EngineClient, Receive, Send, amqp_listeners, annotation,
                                body_bytes, connect, expect_body, message, raw_socket, received,
                                send, settle)
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.mqtt_clients import mqtt_realm, unique
from tests.harness import RouterProcess
from tests.mqtt_clients import ClientPool, V5

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """realm1: anonymous allowed; 'alice' (everything) and 'limited' (com.* only)."""
    process = RouterProcess(tmp_path_factory.mktemp("amqp"), [mqtt_realm("realm1")],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def closed_router(tmp_path_factory):
    """A realm without an anonymous role."""
    process = RouterProcess(tmp_path_factory.mktemp("amqp-closed"),
                            [mqtt_realm("closed", anonymous=False)],
                            listeners=amqp_listeners("closed", mqtt=False, wamp=False)).start()
    yield process
    process.stop()


@pytest.fixture
def amqp(router):
    opened = []

    def open_(target=None, **kwargs):
        connection = connect(target or router, **kwargs)
        opened.append(connection)
        return connection

    yield open_
    for connection in opened:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - cleanup must go on
            pass


def topic(prefix: str = "com.amqp") -> str:
    return f"{prefix}.{unique('t')}"


# --- QoS ---------------------------------------------------------------------------------

# (link QoS, policy) -> the published QoS levels that arrive pre-settled (QoS 0)
PRESETTLED = {
    (0, "exact"): {0, 1, 2}, (0, "minimum"): {0, 1, 2}, (0, "maximum"): {0, 1, 2},
    (1, "exact"): {0}, (1, "minimum"): {0}, (1, "maximum"): set(),
    (2, "exact"): {0}, (2, "minimum"): {0}, (2, "maximum"): set(),
}


@pytest.mark.parametrize("policy", ["exact", "minimum", "maximum"])
@pytest.mark.parametrize("link_qos", [0, 1, 2])
def test_receiver_link_modes_and_qos_policy(amqp, link_qos, policy):
    address = topic()
    connection = amqp()
    receiver = connection.create_receiver(address, credit=10,
                                          options=Receive(link_qos, policy))
    assert receiver.link.remote_properties == {symbol("qos-policy"): policy}
    sender = connection.create_sender(address, options=Send(2))
    for published in (0, 1, 2):
        send(sender, message(f"q{published}", qos=published))
    for published in (0, 1, 2):
        msg, delivery = received(receiver)
        assert body_bytes(msg) == f"q{published}".encode()
        assert annotation(msg, "x-opt-qos") == published
        assert delivery.settled == (published in PRESETTLED[(link_qos, policy)])
        if not delivery.settled:
            settle(receiver, delivery)


def test_policy_is_offered_only_when_asked(amqp):
    connection = amqp()
    receiver = connection.create_receiver(topic(), options=Receive(1))
    assert not receiver.link.remote_properties


def test_unknown_policy_is_refused(amqp):
    with pytest.raises(LinkException):
        amqp().create_receiver(topic(), options=Receive(1, "sometimes"))


@pytest.mark.parametrize("link_qos,annotated,expected", [
    (0, None, 0), (1, None, 1), (2, None, 2),   # the link's modes
    (2, 0, 0), (2, 1, 1), (1, 0, 0),            # the annotation wins ...
    (1, 2, 1), (0, 2, 0),                       # ... capped at what the link carries
])
def test_publisher_qos_from_link_modes_and_annotation(amqp, link_qos, annotated, expected):
    address = topic()
    connection = amqp()
    receiver = connection.create_receiver(address, credit=10, options=Receive(2, "exact"))
    sender = connection.create_sender(address, options=Send(link_qos))
    delivery = send(sender, message(b"x", qos=annotated))
    if link_qos:
        assert delivery.remote_state == Delivery.ACCEPTED
    msg, incoming = received(receiver)
    assert annotation(msg, "x-opt-qos") == expected
    assert incoming.settled == (expected == 0)
    if not incoming.settled:
        settle(receiver, incoming)


def test_released_and_modified_deliveries_come_again_counted(amqp):
    address = topic()
    connection = amqp()
    receiver = connection.create_receiver(address, credit=10, options=Receive(1))
    sender = connection.create_sender(address, options=Send(1))
    send(sender, message(b"again", qos=1))
    msg, delivery = received(receiver)
    assert msg.delivery_count == 0
    settle(receiver, delivery, Delivery.RELEASED)
    msg, delivery = received(receiver)
    assert (body_bytes(msg), msg.delivery_count) == (b"again", 1)
    settle(receiver, delivery, Delivery.MODIFIED)
    msg, delivery = received(receiver)
    assert msg.delivery_count == 2
    settle(receiver, delivery, Delivery.REJECTED)  # dropped for good
    send(sender, message(b"next", qos=1))
    expect_body(receiver, b"next")


def test_credit_is_respected(amqp):
    address = topic()
    connection = amqp()
    receiver = connection.create_receiver(address, credit=None, options=Receive(1))
    receiver.link.flow(1)
    sender = connection.create_sender(address, options=Send(1))
    for index in range(3):
        send(sender, message(f"m{index}", qos=1))  # accepted: the router has dispatched it
    send(sender, message(b"round trip", qos=1))
    assert receiver.fetcher.has_message == 1
    assert receiver.link.credit == 0
    expect_body(receiver, b"m0")
    receiver.link.flow(2)
    bodies = []
    for _ in range(2):
        msg, delivery = received(receiver)
        bodies.append(body_bytes(msg))
        settle(receiver, delivery)
    assert bodies == [b"m1", b"m2"]


# --- addresses ----------------------------------------------------------------------------

def test_address_rules(amqp):
    base = topic()
    connection = amqp()
    exact = connection.create_receiver(f"topic://{base}.a", credit=10, options=Receive(0))
    prefix = connection.create_receiver(f"prefix:{base}.", credit=10, options=Receive(0))
    wildcard = connection.create_receiver(f"wildcard:{base}..c", credit=10,
                                          options=Receive(0))
    for leaf in ("a", "b.c"):
        send(connection.create_sender(f"{base}.{leaf}", options=Send(1)), message(leaf))
    assert body_bytes(received(exact)[0]) == b"a"
    assert [body_bytes(received(prefix)[0]) for _ in range(2)] == [b"a", b"b.c"]
    assert body_bytes(received(wildcard)[0]) == b"b.c"


@pytest.mark.parametrize("address", ["Com.Upper", "a..b", "prefix:a..", "wildcard:a.#"])
def test_invalid_addresses_are_refused(amqp, address):
    with pytest.raises(LinkException) as refused:
        amqp().create_receiver(address, options=Receive(1))
    assert "invalid-field" in str(refused.value) or "does not match" in str(refused.value)


def test_cannot_publish_to_a_pattern(amqp):
    with pytest.raises(LinkException):
        amqp().create_sender("prefix:com.")


# --- retained -----------------------------------------------------------------------------

def test_retained_set_delivered_and_cleared(amqp):
    address = topic()
    connection = amqp()
    sender = connection.create_sender(address, options=Send(1))
    send(sender, message(b"last value", qos=1, retain=True))
    send(sender, message(b"not retained", qos=1))

    asking = connection.create_receiver(address, credit=10, name=unique("asking"),
                                        options=Receive(1, retained=True))
    msg, delivery = received(asking)
    assert (body_bytes(msg), annotation(msg, "x-opt-retain")) == (b"last value", True)
    settle(asking, delivery)
    by_capability = connection.create_receiver(address, credit=10, name=unique("cap"),
                                               options=Receive(1, retained_capability=True))
    assert "retained" in terminus_capabilities(by_capability.link.remote_source)
    expect_body(by_capability, b"last value")

    not_asking = connection.create_receiver(address, credit=10, name=unique("plain"),
                                            options=Receive(1))
    send(sender, message(b"sentinel", qos=1))
    msg, delivery = received(not_asking)
    assert body_bytes(msg) == b"sentinel" and annotation(msg, "x-opt-retain") is None
    settle(not_asking, delivery)

    send(sender, message(b"", qos=1, retain=True))  # an empty body clears it
    fresh = connection.create_receiver(address, credit=10, name=unique("fresh"),
                                       options=Receive(1, retained=True))
    send(sender, message(b"after clear", qos=1))
    expect_body(fresh, b"after clear")


def test_amqp_value_null_with_retain_clears(amqp):
    address = topic()
    connection = amqp()
    sender = connection.create_sender(address, options=Send(1))
    send(sender, message(b"kept", qos=1, retain=True))
    send(sender, message(None, qos=1, retain=True, value=True))
    fresh = connection.create_receiver(address, credit=10, options=Receive(1, retained=True))
    send(sender, message(b"sentinel", qos=1))
    expect_body(fresh, b"sentinel")


# --- authentication and permissions --------------------------------------------------------

def test_sasl_plain_accepted_and_permissions_checked(amqp):
    connection = amqp(user="limited")
    address = topic("com.limited")
    receiver = connection.create_receiver(address, credit=10, options=Receive(1))
    send(connection.create_sender(address, options=Send(1)), message(b"allowed", qos=1))
    expect_body(receiver, b"allowed")
    with pytest.raises(LinkException) as refused:
        connection.create_receiver(topic("org.denied"), options=Receive(1))
    assert "unauthorized-access" in str(refused.value) or "does not match" in str(refused.value)
    with pytest.raises(LinkException):
        connection.create_sender(topic("org.denied"), options=Send(1))


def test_denied_attach_has_unauthorized_access_condition(router):
    """Seen at the link level: the router detaches with amqp:unauthorized-access."""
    conditions = _refused_conditions(router, "limited", "org.nope")
    assert conditions == ["amqp:unauthorized-access"]


def test_message_to_anonymous_relay_is_rejected_where_denied(amqp):
    connection = amqp(user="limited")
    sender = connection.create_sender(None, options=Send(1))
    denied = Message(body=b"x", inferred=True, address=topic("org.relay"))
    delivery = send(sender, denied)
    assert delivery.remote_state == Delivery.REJECTED
    assert delivery.remote.condition.name == "amqp:unauthorized-access"


def test_message_to_anonymous_relay_without_an_address_is_rejected_saying_so(amqp):
    """A message on a link without a target needs its own ``to``; the refusal names that."""
    connection = amqp()
    sender = connection.create_sender(None, options=Send(1))
    delivery = send(sender, Message(body=b"x", inferred=True))
    assert delivery.remote_state == Delivery.REJECTED
    assert delivery.remote.condition.name == "amqp:invalid-field"
    assert "'to' address" in delivery.remote.condition.description


def test_sasl_plain_wrong_password_refused(amqp):
    with pytest.raises(ConnectionException):
        amqp(user="alice", password="wrong")


def test_anonymous_refused_without_anonymous_role(closed_router):
    with pytest.raises(ConnectionException):
        connect(closed_router)
    connection = connect(closed_router, user="alice")  # PLAIN still works
    connection.create_receiver(topic(), options=Receive(1))
    connection.close()


def test_skipping_sasl_refused_without_anonymous_role(closed_router):
    answer = raw_socket(closed_router, AMQP_HEADER)
    assert answer == SASL_HEADER  # "speak SASL", then closed


def test_skipping_sasl_accepted_as_anonymous(router):
    import socket
    host, port, _ = router.address("amqp")
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(AMQP_HEADER)
        data = b""
        while len(data) < 8:
            chunk = sock.recv(8 - len(data))
            assert chunk, "closed"
            data += chunk
        assert data == AMQP_HEADER


# --- bad input -------------------------------------------------------------------------------

def test_wrong_protocol_header_closes(router, amqp):
    assert raw_socket(router, b"GET / HTTP/1.1\r\n\r\n") == SASL_HEADER
    amqp().create_receiver(topic(), options=Receive(1))  # the router carries on


def test_garbage_frame_closes(router, amqp):
    answer = raw_socket(router, AMQP_HEADER + b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\xff" * 8)
    assert answer == AMQP_HEADER  # closed without a word: there is no frame to answer
    amqp().create_receiver(topic(), options=Receive(1))


def test_frame_out_of_place_closes_with_error(router, amqp):
    transfer_on_no_session = b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x14\x45"
    answer = raw_socket(router, AMQP_HEADER + transfer_on_no_session)
    assert answer.startswith(AMQP_HEADER) and b"amqp:not-allowed" in answer
    amqp().create_receiver(topic(), options=Receive(1))


def test_oversized_frame_closes_with_error(router, amqp):
    answer = raw_socket(router, AMQP_HEADER + (1 << 24).to_bytes(4, "big") + b"\x02\x00\x00\x00")
    assert answer.startswith(AMQP_HEADER) and b"amqp:connection:framing-error" in answer
    amqp().create_receiver(topic(), options=Receive(1))


# --- helpers ----------------------------------------------------------------------------------

def _refused_conditions(router, user: str, address: str) -> list[str]:
    """Attach a receiver with a MessagingHandler and report the remote link conditions."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    from tests.amqp_clients import SECRETS, url

    conditions: list[str] = []

    class Probe(MessagingHandler):
        def on_start(self, event):
            connection = event.container.connect(url(router), user=user,
                                                 password=SECRETS[user], allowed_mechs="PLAIN",
                                                 allow_insecure_mechs=True)
            event.container.create_receiver(connection, address)

        def on_link_error(self, event):
            conditions.append(str(event.link.remote_condition.name))
            event.connection.close()

        def on_link_opened(self, event):
            pass

    container = Container(Probe())
    container.timeout = 10
    container.run()
    return conditions


# --- durable subscriptions ----------------------------------------------------------------------

def test_durable_subscription_redelivered_after_router_restart(tmp_path):
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")],
                            listeners=amqp_listeners("realm1", mqtt=False, wamp=False)).start()
    address = topic("com.durable")
    container, link_name = unique("container"), unique("durable")
    try:
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        publisher = connect(process)
        sender = publisher.create_sender(address, options=Send(1))
        send(sender, message(b"first", qos=1))
        msg, _unsettled = received(receiver)  # seen, never accepted
        assert (body_bytes(msg), msg.delivery_count) == (b"first", 0)
        subscriber.close()
        send(sender, message(b"while away", qos=1))
        send(sender, message(b"qos0 is not kept", qos=0))
        publisher.close()

        bystander = connect(process)
        process.stop()
        with pytest.raises(ConnectionException) as closed:  # told why, not just dropped
            bystander.wait(lambda: False, timeout=TIMEOUT)
        assert "amqp:connection:forced" in str(closed.value)
        process.start()
        assert any("restored 1 durable AMQP subscription" in line
                   for line in process.log_lines)

        publisher = connect(process)
        send(publisher.create_sender(address, options=Send(1)),
             message(b"after restart", qos=1))
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        got = []
        for _ in range(3):
            msg, delivery = received(receiver)
            got.append((body_bytes(msg), msg.delivery_count))
            settle(receiver, delivery)
        assert got == [(b"first", 1), (b"while away", 0), (b"after restart", 0)]
        # accepted: gone for good (a closed link ends the durable subscription too)
        receiver.close()
        subscriber.close()
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        send(publisher.create_sender(address, name=unique("s"), options=Send(1)),
             message(b"sentinel", qos=1))
        expect_body(receiver, b"sentinel")
        subscriber.close()
        publisher.close()
    finally:
        process.stop()


# --- exactly once, counted redelivery, expiry, acknowledgements -----------------------------

def _router(tmp_path, **extra) -> RouterProcess:
    return RouterProcess(tmp_path, [mqtt_realm("realm1")],
                         listeners=amqp_listeners("realm1", mqtt=False, wamp=False),
                         extra_config=extra or None).start()


def _sync(connection) -> None:
    """A QoS 1 round trip: the router accepts it only once every write it queued
    before (on any link) is on disk."""
    send(connection.create_sender(topic("com.sync"), name=unique("sync"), options=Send(1)),
         message(b"sync", qos=1))


def _drop(connection) -> None:
    """Forget a connection to a router that was killed (no peer left to answer a close)."""
    connection.timeout = 0.01
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - the peer is gone
        pass


def test_qos2_resent_after_a_lost_disposition_is_published_once(tmp_path):
    process = _router(tmp_path)
    address = topic("com.exactly")
    container, link_name = unique("publisher"), unique("qos2")

    def attach_sender():
        publisher = connect(process, container_id=container)
        return publisher, publisher.create_sender(address, name=link_name,
                                                  options=Send(2, durable=True))

    try:
        watcher = connect(process)
        receiver = watcher.create_receiver(address, credit=10, options=Receive(0))
        publisher, sender = attach_sender()
        first = send(sender, message(b"once", qos=2), tag="t1", settle_after=False)
        assert first.remote_state == Delivery.ACCEPTED and not first.settled
        # the client never saw that disposition: it reconnects and resumes the delivery
        publisher.close()
        publisher, sender = attach_sender()
        assert send(sender, message(b"once", qos=2), tag="t1").remote_state \
            == Delivery.ACCEPTED
        send(sender, message(b"sentinel", qos=2), tag="t2")
        assert [body_bytes(received(receiver)[0]) for _ in range(2)] == [b"once", b"sentinel"]
        # settled by the client: forgotten, so the tag may carry a new message
        send(sender, message(b"tag reused", qos=2), tag="t1")
        assert body_bytes(received(receiver)[0]) == b"tag reused"

        # the same across a crash: accepted means the tag is on disk
        crash = send(sender, message(b"before crash", qos=2), tag="t3", settle_after=False)
        assert crash.remote_state == Delivery.ACCEPTED
        assert body_bytes(received(receiver)[0]) == b"before crash"
        process.kill9()
        for connection in (publisher, watcher):
            _drop(connection)
        process.start()
        watcher = connect(process)
        receiver = watcher.create_receiver(address, credit=10, options=Receive(0))
        publisher, sender = attach_sender()
        assert send(sender, message(b"before crash", qos=2), tag="t3").remote_state \
            == Delivery.ACCEPTED
        send(sender, message(b"sentinel 2", qos=2), tag="t4")
        assert body_bytes(received(receiver)[0]) == b"sentinel 2"
        publisher.close()
        watcher.close()
    finally:
        process.stop()


def test_qos2_tags_of_a_non_durable_sender_link_are_not_kept(router, amqp):
    """Without a durable target a reused tag on a new link is a new message."""
    address = topic("com.exactly")
    watcher = amqp()
    receiver = watcher.create_receiver(address, credit=10, options=Receive(0))
    container, link_name = unique("publisher"), unique("qos2")
    for body in (b"one", b"two"):
        publisher = amqp(container_id=container)
        sender = publisher.create_sender(address, name=link_name, options=Send(2))
        send(sender, message(body, qos=2), tag="same", settle_after=False)
        publisher.close()
    assert [body_bytes(received(receiver)[0]) for _ in range(2)] == [b"one", b"two"]


def test_delivery_count_of_an_in_flight_message_survives_kill9(tmp_path):
    process = _router(tmp_path)
    address = topic("com.durable")
    container, link_name = unique("container"), unique("durable")
    try:
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        publisher = connect(process)
        send(publisher.create_sender(address, options=Send(1)), message(b"in flight", qos=1))
        msg, _unsettled = received(receiver)
        assert (body_bytes(msg), msg.delivery_count) == (b"in flight", 0)
        _sync(publisher)
        process.kill9()
        for connection in (subscriber, publisher):
            _drop(connection)
        process.start()
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True))
        msg, delivery = received(receiver)
        assert body_bytes(msg) == b"in flight" and msg.delivery_count >= 1
        settle(receiver, delivery)
        subscriber.close()
    finally:
        process.stop()


def test_durable_subscription_expires_after_its_timeout(tmp_path):
    from proton import Terminus
    process = _router(tmp_path)
    address = topic("com.expiring")
    container, link_name = unique("container"), unique("expiring")

    def attach(timeout):
        connection = connect(process, container_id=container)
        receiver = connection.create_receiver(
            address, credit=10, name=link_name,
            options=Receive(1, durable=True, expiry=Terminus.EXPIRE_WITH_LINK, timeout=timeout))
        return connection, receiver

    try:
        publisher = connect(process)
        sender = publisher.create_sender(address, options=Send(1))
        # re-attached before the timeout: kept, with what was queued meanwhile
        subscriber, receiver = attach(30)
        subscriber.close()
        send(sender, message(b"kept", qos=1))
        subscriber, receiver = attach(1)
        expect_body(receiver, b"kept")
        # left alone past the timeout: dropped with its queue
        subscriber.close()
        send(sender, message(b"expired", qos=1))
        process.wait_for_log(r"AMQP durable subscription .* expired \(1 message")
        subscriber, receiver = attach(2)
        send(sender, message(b"sentinel", qos=1))
        expect_body(receiver, b"sentinel")

        # the timeout passes while the router is down: dropped at start-up
        subscriber.close()
        import time
        deadline = time.time() + 2  # the router noted the detach before close() returned
        send(sender, message(b"lost with it", qos=1))  # accepted: the detach time is on disk
        process.kill9()
        _drop(publisher)
        while time.time() <= deadline:  # the condition under test is the clock itself
            time.sleep(0.05)
        process.start()
        assert any("expired while the router was down" in line for line in process.log_lines)
        publisher = connect(process)
        subscriber, receiver = attach(2)
        send(publisher.create_sender(address, options=Send(1)), message(b"sentinel 2", qos=1))
        expect_body(receiver, b"sentinel 2")
        subscriber.close()
        publisher.close()
    finally:
        process.stop()


def test_expiry_policy_never_ignores_the_timeout(tmp_path):
    process = _router(tmp_path)
    address = topic("com.never")
    container, link_name = unique("container"), unique("never")
    try:
        subscriber = connect(process, container_id=container)
        subscriber.create_receiver(address, credit=10, name=link_name,
                                   options=Receive(1, durable=True, timeout=1))
        subscriber.close()
        publisher = connect(process)
        send(publisher.create_sender(address, options=Send(1)), message(b"kept", qos=1))
        process.stop()
        process.start()
        assert any("restored 1 durable AMQP subscription" in line
                   for line in process.log_lines[-20:])
        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(address, credit=10, name=link_name,
                                              options=Receive(1, durable=True, timeout=1))
        expect_body(receiver, b"kept")
        subscriber.close()
        _drop(publisher)
    finally:
        process.stop()


def test_accepted_deliveries_are_in_the_event_log(tmp_path):
    from tests.test_eventlog import read_records
    process = _router(tmp_path, eventlog={"flush_interval": 0.1})
    address = topic("com.acked")
    try:
        connection = connect(process)
        receiver = connection.create_receiver(address, credit=10, options=Receive(2))
        send(connection.create_sender(address, options=Send(1)), message(b"ack me", qos=1))
        msg, delivery = received(receiver)
        settle(receiver, delivery)
        connection.create_sender(address, name=unique("after"))  # a round trip after it
        connection.close()
    finally:
        assert process.stop() == 0
    acks = [record for record in read_records(tmp_path / "data" / "eventlog", "realm1")
            if record["kind"] == "ack" and record["topic"] == address]
    assert len(acks) == 1
    assert acks[0]["qos"] == 1 and acks[0]["latency_ms"] >= 0


# --- message size -------------------------------------------------------------------------------

MAX_MESSAGE = 1024 * 1024
"""The listener's max_message_size (its default)."""


def test_a_message_over_max_message_size_closes_its_link(router):
    # it was accepted whatever its size (the link's max-message-size was only announced),
    # and one over the session's 4 MiB window hung for ever
    client = EngineClient(router)
    try:
        big = client.sender(topic())
        assert big.remote_max_message_size == MAX_MESSAGE
        big.delivery(b"big")
        big.send(b"x" * (MAX_MESSAGE + 1))
        big.advance()
        client.run(lambda: big.remote_condition is not None, "the link's detach")
        assert big.remote_condition.name == "amqp:link:message-size-exceeded"
        small = client.sender(topic())  # the connection goes on
        delivery = small.delivery(b"small")
        small.send(Message(body=b"ok").encode())
        small.advance()
        client.run(lambda: delivery.remote_state == Delivery.ACCEPTED, "accepted")
    finally:
        client.close()


def test_messages_under_way_on_one_session_over_one_message_worth_close_the_connection(router):
    # each link may hold a message under way up to max_message_size; a session with
    # amqp.max_links (1,000) links held that much each (180 MB measured with 200 links)
    client = EngineClient(router)
    try:
        session = client.session()
        links = [client.sender(topic(), session) for _ in range(3)]
        for link in links:
            link.delivery(b"unfinished")
            link.send(b"x" * (MAX_MESSAGE // 2))  # no advance: more to come, never sent
        client.run(lambda: client.connection.remote_condition is not None or client.closed,
                   "the connection's close")
        condition = client.connection.remote_condition
        assert condition is not None and condition.name == "amqp:resource-limit-exceeded"
    finally:
        client.close()


def test_sessions_each_with_a_message_under_way_go_on(router, amqp):
    """A client writing big messages on several sessions at once (each session's window
    stops one part-way) is within its bound: each session may hold one message's worth."""
    client = EngineClient(router)
    try:
        address = topic()
        links = [client.sender(address) for _ in range(3)]
        receiver = amqp().create_receiver(address, credit=10, options=Receive(0))
        encoded = Message(body=b"x" * (MAX_MESSAGE // 2), inferred=True).encode()
        deliveries = []
        for link in links:
            deliveries.append(link.delivery(b"big"))
            link.send(encoded[:-10])  # each session's links hold half a message
        for link in links:
            link.send(encoded[-10:])
            link.advance()
        client.run(lambda: all(delivery.remote_state for delivery in deliveries),
                   "the messages' outcomes")
        assert client.connection.remote_condition is None and not client.closed
        assert [len(body_bytes(received(receiver)[0])) for _ in links] == [MAX_MESSAGE // 2] * 3
    finally:
        client.close()


def test_a_session_over_max_sessions_closes_the_connection(router):
    """The connection's channel-max is ``amqp.max_sessions - 1``: a client within it goes
    on; one that begins more (before it read the router's OPEN) is closed."""
    sessions = AmqpSettings().max_sessions
    within = EngineClient(router)
    over = EngineClient(router)
    try:
        opened = [within.session() for _ in range(sessions)]
        within.run(lambda: all(session.state & Endpoint.REMOTE_ACTIVE for session in opened),
                   "the sessions' BEGIN")
        assert within.transport.remote_channel_max == sessions - 1
        for _ in range(sessions + 1):  # all sent with the OPEN, on channels 0 .. sessions
            over.session()
        over.run(lambda: over.connection.remote_condition is not None or over.closed,
                 "the connection's close")
        within.run(lambda: True, "a turn")
        assert within.connection.remote_condition is None and not within.closed
    finally:
        within.close()
        over.close()


# --- three protocols ------------------------------------------------------------------------------

def test_one_publication_reaches_wamp_mqtt_and_amqp(router, amqp):
    base = topic("com.bridge")
    mqtt_pool = ClientPool(router)

    async def scenario():
        wamp = await wamp_connect(router, "websocket")
        try:
            wamp_events = await wamp.events(f"{base}.live")
            mqtt = mqtt_pool(V5)
            assert mqtt.subscribe((f"{base.replace('.', '/')}/live", 1)) == [1]
            connection = amqp()
            receiver = connection.create_receiver(f"{base}.live", credit=10,
                                                  options=Receive(1))
            # one AMQP publication (QoS 2 on the wire, amqp-value body) reaches all three
            sender = connection.create_sender(f"{base}.live", options=Send(2))
            assert send(sender, message({"n": 1}, qos=2, value=True)).remote_state \
                == Delivery.ACCEPTED
            args, kwargs, _details = await next_item(wamp_events)
            assert (args, kwargs) == ([], {"n": 1})
            got = mqtt.next_message()
            assert (json.loads(got.payload), got.qos) == ({"n": 1}, 1)  # min(2, granted 1)
            msg, delivery = received(receiver)
            assert msg.body == {"n": 1}  # the amqp-value map, as it was sent
            assert annotation(msg, "x-opt-qos") == 2 and not delivery.settled
            settle(receiver, delivery)

            # retained events set from each protocol, visible to the other two
            await wamp.publish(f"{base}.from_wamp", "w", options=_wamp_options(retain=True))
            mqtt.publish(f"{base.replace('.', '/')}/from_mqtt", b'"m"', qos=1, retain=True)
            send(sender_for(connection, f"{base}.from_amqp"),
                 message(b'"a"', qos=1, retain=True))
            await wamp.call("wamp.session.count")  # a round trip: the WAMP publish is done

            for origin in ("from_mqtt", "from_amqp"):
                queue = await wamp.events(f"{base}.{origin}", get_retained=True)
                args, _kwargs, _details = await next_item(queue)
                assert args == [origin[5]]
            watcher = mqtt_pool(V5)
            watcher.subscribe((f"{base.replace('.', '/')}/+", 0))
            seen = {watcher.next_message().topic.rsplit("/", 1)[1]: None for _ in range(3)}
            assert set(seen) == {"from_wamp", "from_mqtt", "from_amqp"}
            retained_rx = connection.create_receiver(f"wildcard:{base}.", credit=10,
                                                     name=unique("retained"),
                                                     options=Receive(0, retained=True))
            bodies = {}
            for _ in range(3):
                msg, _delivery = received(retained_rx)
                assert annotation(msg, "x-opt-retain") is True
                bodies[msg.address] = (msg.body if isinstance(msg.body, str)
                                       else bytes(msg.body))
            # a WAMP string arg is an amqp-value string; bytes stay a data section
            assert bodies == {f"{base}.from_wamp": "w", f"{base}.from_mqtt": b'"m"',
                              f"{base}.from_amqp": b'"a"'}
        finally:
            await wamp.close()
            mqtt_pool.close()

    run(scenario())


def _wamp_options(**options):
    from autobahn.wamp.types import PublishOptions
    return PublishOptions(acknowledge=True, **options)


def sender_for(connection, address: str):
    return connection.create_sender(address, name=unique("sender"), options=Send(1))
