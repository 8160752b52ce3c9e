"""AMQP body and property fidelity, black box (python-qpid-proton, paho-mqtt, autobahn):
an AMQP receiver gets the body section kind, the value with its AMQP type, and the
bare message's properties exactly as the AMQP publisher sent them, live, retained
and across a restart; WAMP args/kwargs and MQTT payloads and MQTT 5 properties map
to native AMQP bodies and properties and back, as the payload table of docs/mqtt-and-amqp.md says.
"""

from __future__ import annotations

import time
import uuid

import pytest
from proton import (Delivery, Described, Message, char, decimal64, float32, int32, symbol,
                    timestamp, ubyte, ulong)

from tests.amqp_clients import (X_OPT_RETAIN, Receive, Send, amqp_listeners, annotation,
                                connect, materialized, received, send, settle)
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from router.admin_socket import ask
from tests.harness import RouterProcess
from tests.mqtt_clients import V5, ClientPool, mqtt_realm, publish_properties, unique

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# (id, body, inferred): inferred is a data section (bytes) or an amqp-sequence (list)
BODIES = [
    ("string", "hello", False),
    ("binary-value", b"\x00\xffbin", False),
    ("data", b"\x00\xffdata", True),
    ("int", int32(-7), False),
    ("long", 2 ** 40, False),
    ("ulong", ulong(2 ** 63), False),
    ("ubyte", ubyte(255), False),
    ("double", 1.25, False),
    ("float", float32(0.5), False),
    ("bool", True, False),
    ("list", [1, "two", b"3", None], False),
    ("map", {"a": 1, "nested": {"b": [True]}}, False),
    ("map-int-keys", {1: "one"}, False),
    ("symbol", symbol("sym"), False),
    ("char", char("x"), False),
    ("uuid", UUID, False),
    ("timestamp", timestamp(1_700_000_000_000), False),
    ("sequence", [1, "a"], True),
]


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("amqp-body"), [mqtt_realm("realm1")],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def amqp(router):
    connection = connect(router)
    yield connection
    connection.close()


def address() -> str:
    return f"com.body.{unique('t')}"


def full_message(body, inferred: bool, **annotations) -> Message:
    """A message with every bare-message property the router must keep."""
    msg = Message(body=body, inferred=inferred)
    msg.id = ulong(42)
    msg.correlation_id = UUID
    msg.reply_to = "com.body.replies"
    msg.content_type = "application/x-test"
    msg.content_encoding = "identity"
    msg.subject = "the subject"
    msg.user_id = b"anonymous"
    msg.group_id = "group"
    msg.properties = {"count": int32(3), "name": "n", "flag": False}
    if annotations:
        msg.annotations = {symbol(key): value for key, value in annotations.items()}
    return msg


def assert_same_message(got: Message, sent: Message, address_: str) -> None:
    """Body kind, value and type, and every property, as sent (``to`` is the topic)."""
    body = materialized(got.body)
    assert (body, type(body), got.inferred) == (sent.body, type(sent.body), sent.inferred)
    assert repr(body) == repr(sent.body)  # element types too (int32 vs long...)
    for name in ("id", "correlation_id", "reply_to", "content_type", "content_encoding",
                 "subject", "group_id"):
        assert getattr(got, name) == getattr(sent, name), name
    assert bytes(got.user_id) == bytes(sent.user_id)
    assert got.properties == sent.properties
    assert type(got.properties["count"]) is int32
    assert got.address == address_


@pytest.mark.parametrize("body,inferred", [case[1:] for case in BODIES],
                         ids=[case[0] for case in BODIES])
def test_every_body_kind_round_trips_live_and_retained(amqp, body, inferred):
    topic = address()
    live = amqp.create_receiver(topic, credit=10, name=unique("live"), options=Receive(1))
    sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
    sent = full_message(body, inferred, **{"x-opt-retain": True})
    assert send(sender, sent).remote_state == Delivery.ACCEPTED
    got, delivery = received(live)
    assert_same_message(got, sent, topic)
    settle(live, delivery)

    late = amqp.create_receiver(topic, credit=10, name=unique("late"),
                                options=Receive(1, retained=True))
    got, delivery = received(late)
    assert annotation(got, "x-opt-retain") is True
    assert_same_message(got, sent, topic)
    settle(late, delivery)


@pytest.mark.parametrize("body", [decimal64(5), Described(symbol("x:custom"), 1),
                                  [1, decimal64(5)]],
                         ids=["decimal", "described", "decimal-in-list"])
def test_unsupported_body_is_rejected_and_counted(router, amqp, body):
    topic = address()
    watcher = amqp.create_receiver(topic, credit=10, name=unique("w"), options=Receive(1))
    sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
    delivery = send(sender, Message(body=body))
    assert delivery.remote_state == Delivery.REJECTED
    assert delivery.remote.condition.name == "amqp:not-implemented"
    assert "not carried" in delivery.remote.condition.description
    send(sender, Message(body="sentinel"))
    got, accepted = received(watcher)
    assert got.body == "sentinel"  # the refused message reached nobody
    settle(watcher, accepted)
    if isinstance(body, Described):
        router.wait_for_log(r"realm1, amqp: unsupported")


def test_retained_and_queued_bodies_survive_a_restart(tmp_path):
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")],
                            listeners=amqp_listeners("realm1", mqtt=False, wamp=False)).start()
    topic = address()
    container, link = unique("c"), unique("durable")
    try:
        subscriber = connect(process, container_id=container)
        subscriber.create_receiver(topic, credit=0, name=link, options=Receive(1, durable=True))
        subscriber.close()  # a durable subscription that queues while away
        publisher = connect(process)
        sender = publisher.create_sender(topic, options=Send(1))
        retained = full_message({"k": [int32(1), b"\x01"]}, False, **{"x-opt-retain": True})
        queued = full_message([symbol("a"), "b"], True)
        for msg in (retained, queued):
            assert send(sender, msg).remote_state == Delivery.ACCEPTED
        publisher.close()
        process.stop()
        process.start()

        subscriber = connect(process, container_id=container)
        receiver = subscriber.create_receiver(topic, credit=10, name=link,
                                              options=Receive(1, durable=True))
        for sent in (retained, queued):
            got, delivery = received(receiver)
            assert_same_message(got, sent, topic)
            settle(receiver, delivery)
        late = subscriber.create_receiver(topic, credit=10, name=unique("late"),
                                          options=Receive(1, retained=True))
        got, delivery = received(late)
        assert_same_message(got, retained, topic)
        settle(late, delivery)
        subscriber.close()
    finally:
        process.stop()


# --- MQTT 5 <-> AMQP --------------------------------------------------------------------

def test_mqtt5_properties_and_payloads_reach_amqp(router, amqp):
    topic = address()
    pool = ClientPool(router)
    try:
        receiver = amqp.create_receiver(topic, credit=10, name=unique("r"), options=Receive(1))
        mqtt = pool(V5)
        mqtt_topic = topic.replace(".", "/")
        mqtt.publish(mqtt_topic, "grüße".encode(), qos=1, properties=publish_properties(
            PayloadFormatIndicator=1, ContentType="text/plain", CorrelationData=b"\x00c",
            ResponseTopic="replies/here", MessageExpiryInterval=3600,
            UserProperty=[("a", "1"), ("b", "two")]))
        got, delivery = received(receiver)
        settle(receiver, delivery)
        assert (got.body, got.inferred) == ("grüße", False)  # declared UTF-8: a string
        assert got.content_type == "text/plain"
        assert bytes(got.correlation_id) == b"\x00c"
        assert got.reply_to == "replies/here"
        assert got.properties == {"a": "1", "b": "two"}
        assert 3500 < got.ttl <= 3600
        assert 3500 < got.expiry_time - time.time() <= 3600

        mqtt.publish(mqtt_topic, b"\xff raw", qos=1)  # no format indicator: a data section
        got, delivery = received(receiver)
        settle(receiver, delivery)
        assert (bytes(got.body), got.inferred) == (b"\xff raw", True)
        # (proton reads an absent content-type as the symbol 'None')
        assert (got.content_type, got.properties, got.ttl) == ("None", None, 0)

        # 2**32 - 1 s, legal in MQTT 5, is more milliseconds than AMQP's 32-bit ttl holds:
        # the longest ttl (~49.7 days); it was lost (an encoding error), and the message
        # after it on the link too
        mqtt.publish(mqtt_topic, b"far", qos=1, properties=publish_properties(
            MessageExpiryInterval=0xFFFFFFFF))
        mqtt.publish(mqtt_topic, b"next", qos=1)
        for body, ttl in ((b"far", 0xFFFFFFFF / 1000), (b"next", 0)):
            got, delivery = received(receiver)
            settle(receiver, delivery)
            assert (bytes(got.body), got.ttl) == (body, ttl)
    finally:
        pool.close()


def amqp_to_mqtt5(router, amqp, msg: Message):
    """What an MQTT 5 subscriber gets of ``msg`` sent by an AMQP client."""
    topic = address()
    pool = ClientPool(router)
    try:
        mqtt = pool(V5)
        assert mqtt.subscribe((topic.replace(".", "/"), 1)) == [1]
        send(amqp.create_sender(topic, name=unique("s"), options=Send(1)), msg)
        return mqtt.next_message()
    finally:
        pool.close()


def test_an_amqp_message_without_content_type_reaches_mqtt5_without_one(router, amqp):
    # proton reads an absent content-type as the symbol 'None': every such message reached
    # MQTT 5 subscribers with ContentType "None"
    got = amqp_to_mqtt5(router, amqp, Message(body=b"plain", inferred=True))
    assert got.payload == b"plain"
    assert getattr(got.properties, "ContentType", None) is None


@pytest.mark.parametrize("expiry_time", [1e15, -1e15], ids=["year 31690708", "before 1970"])
def test_a_retained_amqp_message_with_any_expiry_time_leaves_the_retained_list_working(
        router, amqp, expiry_time):
    # an absolute-expiry-time may be any millisecond of +-292 million years; the retained
    # event kept it, and `router retained list` (wamp.retained.list) failed for the whole
    # realm: "year 31690708 is out of range"
    topic = address()
    sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
    msg = Message(body=b"kept", inferred=True)
    msg.expiry_time = expiry_time
    msg.annotations = {X_OPT_RETAIN: True}
    send(sender, msg)
    listed = ask(router.workdir / "data" / "admin.sock",
                 {"realm": "realm1", "call": "wamp.retained.list", "kwargs": {"prefix": topic}})
    assert [item["topic"] for item in listed] in ([topic], [])  # (an expired one may be gone)


def test_an_amqp_expiry_centuries_away_reaches_mqtt5_as_the_longest_interval(router, amqp):
    # an absolute-expiry-time ~317 years away is more seconds than MQTT 5's 32-bit message
    # expiry interval holds: it goes as the longest; it was lost (an encoding error) for
    # MQTT 5 subscribers
    msg = Message(body=b"far", inferred=True)
    msg.expiry_time = time.time() + 10 ** 10
    got = amqp_to_mqtt5(router, amqp, msg)
    assert (got.payload, got.properties.MessageExpiryInterval) == (b"far", 0xFFFFFFFF)


@pytest.mark.parametrize("body,inferred,payload", [
    ("héllo", False, "héllo".encode()),
    (b"\x00\x01", True, b"\x00\x01"),
    (b"bin", False, b"bin"),
    ({"n": 1}, False, b'{"n":1}'),
    ([1, "a"], False, b'[1,"a"]'),
    ([1, "a"], True, b'[1,"a"]'),
    (int32(5), False, b"5"),
    (symbol("s"), False, b'"s"'),
], ids=["string", "data", "binary-value", "map", "list", "sequence", "int", "symbol"])
def test_amqp_bodies_and_properties_reach_mqtt5(router, amqp, body, inferred, payload):
    topic = address()
    pool = ClientPool(router)
    try:
        mqtt = pool(V5)
        assert mqtt.subscribe((topic.replace(".", "/"), 1)) == [1]
        sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
        msg = Message(body=body, inferred=inferred)
        msg.content_type = "application/x-test"
        msg.correlation_id = "corr-1"
        msg.reply_to = "com.replies"
        msg.properties = {"name": "v", "n": int32(2)}
        msg.ttl = 600
        send(sender, msg)
        got = mqtt.next_message()
        assert got.payload == payload
        props = got.properties
        assert getattr(props, "PayloadFormatIndicator", 0) == (1 if type(body) is str else 0)
        assert props.ContentType == "application/x-test"
        assert props.CorrelationData == b"corr-1"
        assert props.ResponseTopic == "com.replies"
        assert props.UserProperty == [("name", "v"), ("n", "2")]
        assert 590 < props.MessageExpiryInterval <= 600
    finally:
        pool.close()


# --- WAMP <-> AMQP ----------------------------------------------------------------------

WAMP_TO_AMQP = [  # (args, kwargs) -> (AMQP body, inferred)
    (["text"], {}, "text", False),
    ([b"\x00bin"], {}, b"\x00bin", True),
    ([], {"k": 1, "b": b"\x01"}, {"k": 1, "b": b"\x01"}, False),
    ([1, "two"], {}, [1, "two"], False),
    ([1], {"k": 2}, {"args": [1], "kwargs": {"k": 2}}, False),
    ([2.5], {}, 2.5, False),
    ([[1, 2]], {}, [1, 2], False),
    ([None], {}, None, False),
    ([], {}, None, False),
]


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_wamp_args_and_kwargs_arrive_as_native_amqp_bodies(router, amqp, serializer):
    topic = address()
    receiver = amqp.create_receiver(topic, credit=20, name=unique("r"), options=Receive(1))

    async def scenario():
        wamp = await wamp_connect(router, "websocket", serializer)
        try:
            for args, kwargs, *_ in WAMP_TO_AMQP:
                await wamp.publish(topic, *args, options=_acknowledged(), **kwargs)
        finally:
            await wamp.close()

    run(scenario())
    for args, kwargs, body, inferred in WAMP_TO_AMQP:
        got, delivery = received(receiver)
        settle(receiver, delivery)
        assert (materialized(got.body), got.inferred) == (body, inferred), (args, kwargs)


AMQP_TO_WAMP = [  # (AMQP body, inferred) -> (args, kwargs)
    ("text", False, ["text"], {}),
    (b"\x00\xff", True, [b"\x00\xff"], {}),  # a data section that is not JSON: binary
    (b'{"j":1}', True, [], {"j": 1}),  # a data section of JSON: the realm's json mapping
    (b"bin", False, [b"bin"], {}),
    ({"k": [1, b"\x02"]}, False, [], {"k": [1, b"\x02"]}),
    ([1, "a"], False, [1, "a"], {}),  # a list is the args, like a JSON array from MQTT
    ([1, "a"], True, [1, "a"], {}),
    (ulong(7), False, [7], {}),
    (UUID, False, [str(UUID)], {}),
    (timestamp(1234), False, [1234], {}),
    (None, False, [], {}),
]


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_amqp_bodies_arrive_as_wamp_args_and_kwargs(router, amqp, serializer):
    topic = address()

    async def scenario():
        wamp = await wamp_connect(router, "websocket", serializer)
        try:
            events = await wamp.events(topic)
            sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
            for body, inferred, args, kwargs in AMQP_TO_WAMP:
                send(sender, Message(body=body, inferred=inferred))
                got_args, got_kwargs, _details = await next_item(events)
                assert (got_args, got_kwargs) == (args, kwargs), body
        finally:
            await wamp.close()

    run(scenario())


def _acknowledged():
    from autobahn.wamp.types import PublishOptions
    return PublishOptions(acknowledge=True)


def test_amqp_ttl_reaches_amqp_receivers_as_the_time_left(amqp):
    topic = address()
    receiver = amqp.create_receiver(topic, credit=10, name=unique("r"), options=Receive(1))
    sender = amqp.create_sender(topic, name=unique("s"), options=Send(1))
    msg = Message(body="soon gone")
    msg.ttl = 30
    send(sender, msg)
    got, delivery = received(receiver)
    settle(receiver, delivery)
    assert got.body == "soon gone" and 25 < got.ttl <= 30
    assert not got.expiry_time  # the publisher set none: the bare message is its own
