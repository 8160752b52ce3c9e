"""WAMP Payload Passthru Mode through a real router: the opaque payload and its ppt_*
options reach PPT-capable receivers unchanged (live, retained, history, after a restart),
receivers that cannot take it are skipped and counted, ``ppt_scheme: "mqtt"`` bridges to
paho and AMQP both ways, and calls, results and errors carry it too."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest
from autobahn.wamp.interfaces import IPayloadCodec
from autobahn.wamp.types import EncodedPayload, PublishOptions, SubscribeOptions

from router.core.model import Passthru, Publication, SessionInfo
from router.engines.records import (decode_retained, encode_retained, pack_publication,
                                    unpack_publication)
from tests import amqp_clients
from tests.clients import SERIALIZERS, TIMEOUT, connect, raw_connect, run
from tests.harness import RedisServer, RouterProcess, redis_cluster
from tests.metrics_scrape import delta, scrape
from tests.mqtt_clients import listeners, mqtt_realm, publish_properties, unique

HELLO, WELCOME, ABORT, ERROR, PUBLISH, PUBLISHED = 1, 2, 3, 8, 16, 17
SUBSCRIBE, SUBSCRIBED, EVENT, CALL, RESULT = 32, 33, 36, 48, 50
REGISTER, REGISTERED, INVOCATION, YIELD = 64, 65, 68, 70

PPT = {"ppt_scheme": "x_test", "ppt_serializer": "cbor", "ppt_cipher": "xsalsa20poly1305",
       "ppt_keyid": "0x5e2f"}
PAYLOAD = b"\x00\xffopaque\x80\xfe" + os.urandom(8)  # not UTF-8, not any serializer's data


def ppt_roles(enabled: bool = True) -> dict:
    features = {"payload_passthru_mode": True} if enabled else {}
    return {role: {"features": dict(features)}
            for role in ("publisher", "subscriber", "caller", "callee")}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = mqtt_realm("realm1", history=[{"uri": "com.ppt.hist.", "match": "prefix",
                                           "limit": 5}])
    process = RouterProcess(
        tmp_path_factory.mktemp("ppt"), [realm],
        listeners=listeners("realm1") + [
            {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
            {"type": "metrics", "host": "127.0.0.1", "port": 0}]).start()
    yield process
    process.stop()


async def joined(router, serializer: str = "json", ppt: bool = True, transport="websocket"):
    client = await raw_connect(router, transport, serializer)
    welcome = await client.hello("realm1", {"roles": ppt_roles(ppt)})
    assert welcome[0] == WELCOME, welcome
    return client


async def subscribe(client, topic: str, **options) -> int:
    request = client.next_request()
    client.send([SUBSCRIBE, request, options, topic])
    reply = await client.recv()
    assert reply[:2] == [SUBSCRIBED, request], reply
    return reply[2]


async def publish(client, topic: str, options: dict, payload: list) -> int:
    request = client.next_request()
    client.send([PUBLISH, request, {"acknowledge": True, **options}, topic, payload])
    reply = await client.recv()
    assert reply[:2] == [PUBLISHED, request], reply
    return reply[2]


async def close(*clients) -> None:
    for client in clients:
        client.close()
    for client in clients:
        await asyncio.wait_for(client.closed, TIMEOUT)


# spec dialect, live / retained / history, every serializer ------------------------------------

@pytest.mark.parametrize("publisher_serializer,subscriber_serializer",
                         [("json", "json"), ("msgpack", "msgpack"), ("cbor", "cbor"),
                          ("json", "cbor"), ("cbor", "msgpack")])
def test_opaque_payload_and_options_pass_unchanged(router, publisher_serializer,
                                                   subscriber_serializer):
    topic = f"com.ppt.hist.{unique('t')}"

    async def scenario():
        subscriber = await joined(router, subscriber_serializer)
        publisher = await joined(router, publisher_serializer, transport="rawsocket")
        subscription = await subscribe(subscriber, topic)
        publication = await publish(publisher, topic, {**PPT, "retain": True}, [PAYLOAD])
        event = await subscriber.recv()
        assert event[:3] == [EVENT, subscription, publication]
        assert event[3] == PPT and event[4:] == [[PAYLOAD]], event

        late = await joined(router, subscriber_serializer)
        late_subscription = await subscribe(late, topic, get_retained=True)
        retained = await late.recv()
        assert retained[:3] == [EVENT, late_subscription, publication]
        assert retained[3] == {**PPT, "retained": True} and retained[4:] == [[PAYLOAD]]

        request = late.next_request()
        late.send([CALL, request, {}, "wamp.subscription.get_events", [late_subscription]])
        result = await late.recv()
        assert result[:2] == [RESULT, request], result
        [record] = result[3][0]
        assert record["publication"] == publication and record["args"] == [PAYLOAD]
        assert {key: record["details"][key] for key in PPT} == PPT
        await close(subscriber, publisher, late)

    run(scenario())


class _Opaque:
    """A payload codec for autobahn sessions: the args travel as one opaque blob in
    autobahn's ``enc_algo`` dialect, which the router must pass on without looking."""

    def encode(self, is_originating, uri, args=None, kwargs=None):
        return EncodedPayload(b"\x01" + repr(list(args)).encode()[::-1], "x_reversed", "x_repr")

    def decode(self, is_originating, uri, encoded_payload):
        assert encoded_payload.enc_algo == "x_reversed"
        assert encoded_payload.enc_serializer == "x_repr"
        return uri, [encoded_payload.payload[1:][::-1].decode()], None


IPayloadCodec.register(_Opaque)


@pytest.mark.parametrize("serializer", sorted(SERIALIZERS))
def test_autobahn_payload_transparency_round_trip_with_retained(router, serializer):
    topic = f"com.ppt.ab.{unique('t')}"

    async def scenario():
        publisher = await connect(router, "rawsocket", serializer)
        subscriber = await connect(router, "websocket", serializer)
        for session in (publisher, subscriber):
            session.set_payload_codec(_Opaque())
        received: asyncio.Queue = asyncio.Queue()
        await subscriber.subscribe(lambda *args, details=None: received.put_nowait(
            (args, details.retained)), topic, options=SubscribeOptions(details=True))
        await publisher.publish(topic, "live", 1, options=PublishOptions(
            acknowledge=True, retain=True))
        assert await asyncio.wait_for(received.get(), TIMEOUT) == (("['live', 1]",), None)
        late = await connect(router, "websocket", serializer)
        late.set_payload_codec(_Opaque())
        await late.subscribe(lambda *args, details=None: received.put_nowait(
            (args, details.retained)), topic,
            options=SubscribeOptions(details=True, get_retained=True))
        assert await asyncio.wait_for(received.get(), TIMEOUT) == (("['live', 1]",), True)
        for session in (publisher, subscriber, late):
            await session.close()

    run(scenario())


# receivers that cannot take it --------------------------------------------------------------

def test_receivers_that_cannot_take_it_are_skipped_and_counted(router, mqtt):
    topic = f"com.ppt.skip.{unique('t')}"

    async def scenario():
        before = scrape(router)
        plain = await joined(router, "json", ppt=False)
        capable = await joined(router, "msgpack")
        paho = mqtt()
        paho.subscribe((topic.replace(".", "/"), 0))
        amqp = amqp_clients.connect(router)
        receiver = amqp.create_receiver(topic, credit=10, options=amqp_clients.Receive(0))
        await subscribe(plain, topic)
        await subscribe(capable, topic)
        publisher = await joined(router, "cbor")
        await publish(publisher, topic, PPT, [PAYLOAD])
        event = await capable.recv()
        assert event[3] == PPT and event[4] == [PAYLOAD]
        # a plain publish after it: whoever skipped the opaque one gets this one first
        await publish(publisher, topic, {}, ["after"])
        assert (await plain.recv())[4] == ["after"]
        assert (await capable.recv())[4] == ["after"]
        assert paho.next_message().payload == b'"after"'
        message, _ = amqp_clients.received(receiver)
        assert message.body == "after"
        after = scrape(router)
        for protocol in ("wamp", "mqtt", "amqp"):
            assert delta(before, after, "router_messages_dropped_total", realm="realm1",
                         protocol=protocol, reason="passthru_skipped") == 1, protocol
        amqp.close()
        await close(plain, capable, publisher)

    run(scenario())


def test_acknowledged_delivery_carries_it_and_dialects_do_not_cross(router):
    """An at-least-once subscription gets the passthru EVENT with x_acknowledged_delivery; a
    session that announced only autobahn's dialect does not get the RFC's (skipped)."""
    topic = f"com.ppt.ack.{unique('t')}"

    async def scenario():
        before = scrape(router)
        acked = await joined(router, "msgpack")
        other_dialect = await raw_connect(router, "websocket", "json")
        roles = {"subscriber": {"features": {"payload_transparency": True}}}
        assert (await other_dialect.hello("realm1", {"roles": roles}))[0] == WELCOME
        subscription = await subscribe(acked, topic, _qos=1)
        await subscribe(other_dialect, topic)
        publisher = await joined(router, "cbor")
        publication = await publish(publisher, topic, {**PPT, "_qos": 1}, [PAYLOAD])
        event = await acked.recv()
        assert event[:3] == [EVENT, subscription, publication]
        assert event[3] == {**PPT, "x_acknowledged_delivery": True} and event[4] == [PAYLOAD]
        acked.send([337, publication])  # EVENT_RECEIVED
        await publish(publisher, topic, {}, ["after"])
        assert (await other_dialect.recv())[4] == ["after"]
        assert delta(before, scrape(router), "router_messages_dropped_total", realm="realm1",
                     protocol="wamp", reason="passthru_skipped") == 1
        await close(acked, other_dialect, publisher)

    run(scenario())


@pytest.mark.parametrize("message,why", [
    ([PUBLISH, 1, PPT, "com.ppt.v", [PAYLOAD]], "not announced"),
    ([PUBLISH, 1, PPT, "com.ppt.v", [PAYLOAD, PAYLOAD]], "two items"),
    ([PUBLISH, 1, PPT, "com.ppt.v", ["text"]], "not binary"),
    ([PUBLISH, 1, PPT, "com.ppt.v", [PAYLOAD], {"k": 1}], "with ArgumentsKw"),
    ([PUBLISH, 1, {**PPT, "ppt_scheme": ""}, "com.ppt.v", [PAYLOAD]], "empty scheme"),
    ([PUBLISH, 1, {**PPT, "ppt_keyid": 7}, "com.ppt.v", [PAYLOAD]], "keyid not a string"),
    ([CALL, 1, PPT, "com.ppt.v", [PAYLOAD, 1]], "call with two items"),
])
def test_passthru_misuse_is_a_protocol_violation(router, message, why):
    async def scenario():
        client = await joined(router, "msgpack", ppt=why != "not announced")
        client.send(message)
        reply = await client.recv()
        assert reply[0] == ABORT and reply[2] == "wamp.error.protocol_violation", reply
        await asyncio.wait_for(client.closed, TIMEOUT)

    run(scenario())


# ppt_scheme "mqtt" --------------------------------------------------------------------------

def test_mqtt_scheme_reaches_paho_and_amqp_as_the_bytes(router, mqtt):
    topic = f"com.ppt.mqtt.{unique('t')}"

    async def scenario():
        paho = mqtt()
        paho.subscribe((topic.replace(".", "/"), 1))
        amqp = amqp_clients.connect(router)
        receiver = amqp.create_receiver(topic, credit=10, options=amqp_clients.Receive(0))
        publisher = await joined(router, "json")
        options = {"ppt_scheme": "mqtt", "ppt_serializer": "mqtt", "retain": True}
        await publish(publisher, topic, options, [PAYLOAD])
        assert paho.expect(topic.replace(".", "/"), PAYLOAD)
        assert amqp_clients.body_bytes(amqp_clients.received(receiver)[0]) == PAYLOAD
        late = mqtt()
        late.subscribe((topic.replace(".", "/"), 0))
        message = late.expect(topic.replace(".", "/"), PAYLOAD)
        assert message.retain
        amqp.close()
        await close(publisher)

    run(scenario())


def test_mqtt_and_amqp_bytes_reach_a_raw_view_subscription_as_mqtt_scheme(router, mqtt):
    topic = f"com.ppt.raw.{unique('t')}"

    async def scenario():
        raw_view = await joined(router, "cbor")
        mapped = await joined(router, "json")
        raw_subscription = await subscribe(raw_view, topic, _ppt_scheme="mqtt")
        await subscribe(mapped, topic)
        paho = mqtt()
        paho.publish(topic.replace(".", "/"), b'{"a": 1}', qos=1, properties=publish_properties(
            ContentType="application/json", UserProperty=[("k", "v")]))
        event = await raw_view.recv()
        assert event[:2] == [EVENT, raw_subscription]
        details = event[3]
        assert (details["ppt_scheme"], details["ppt_serializer"]) == ("mqtt", "mqtt")
        assert details["_mqtt_properties"] == {"content_type": "application/json",
                                               "user_property": [["k", "v"]]}
        assert event[4] == [b'{"a": 1}']
        plain = await mapped.recv()
        assert "ppt_scheme" not in plain[3] and plain[5] == {"a": 1}, plain

        amqp = amqp_clients.connect(router)
        sender = amqp.create_sender(topic, options=amqp_clients.Send(1))
        amqp_clients.send(sender, amqp_clients.message(PAYLOAD))
        event = await raw_view.recv()
        assert (event[3]["ppt_scheme"], event[3]["ppt_serializer"]) == ("mqtt", "amqp")
        assert event[4] == [PAYLOAD]
        assert (await mapped.recv())[4] == [PAYLOAD]  # the realm's mapping: a binary arg
        amqp.close()
        await close(raw_view, mapped)

    run(scenario())


def test_raw_view_needs_the_announcement_and_the_mqtt_scheme(router):
    async def scenario():
        for ppt, scheme, error in ((False, "mqtt", "wamp.error.feature_not_supported"),
                                   (True, "x_other", "wamp.error.invalid_argument")):
            client = await joined(router, "json", ppt=ppt)
            client.send([SUBSCRIBE, 1, {"_ppt_scheme": scheme}, "com.ppt.refused"])
            reply = await client.recv()
            assert reply[:3] == [ERROR, SUBSCRIBE, 1] and reply[4] == error, reply
            await close(client)

    run(scenario())


# calls --------------------------------------------------------------------------------------

async def registered(router, procedure: str, ppt: bool = True):
    callee = await joined(router, "msgpack", ppt=ppt)
    callee.send([REGISTER, 1, {}, procedure])
    assert (await callee.recv())[:2] == [REGISTERED, 1]
    return callee


def test_call_invocation_yield_result_and_error_carry_the_payload(router):
    procedure = f"com.ppt.rpc.{unique('p')}"
    answer = {"ppt_scheme": "x_test", "ppt_keyid": "callee-key"}

    async def scenario():
        callee = await registered(router, procedure)
        caller = await joined(router, "json")
        caller.send([CALL, 1, PPT, procedure, [PAYLOAD]])
        invocation = await callee.recv()
        assert invocation[0] == INVOCATION and invocation[3] == PPT
        assert invocation[4:] == [[PAYLOAD]]
        callee.send([YIELD, invocation[1], answer, [PAYLOAD[::-1]]])
        result = await caller.recv()
        assert result == [RESULT, 1, answer, [PAYLOAD[::-1]]]

        caller.send([CALL, 2, PPT, procedure, [PAYLOAD]])
        invocation = await callee.recv()
        callee.send([ERROR, INVOCATION, invocation[1], answer, "com.ppt.failed", [b"why"]])
        error = await caller.recv()
        assert error == [ERROR, CALL, 2, answer, "com.ppt.failed", [b"why"]]
        await close(callee, caller)

    run(scenario())


def test_callee_or_caller_without_the_feature_gets_feature_not_supported(router):
    procedure = f"com.ppt.rpc.{unique('p')}"

    async def scenario():
        before = scrape(router)
        plain_callee = await registered(router, procedure, ppt=False)
        caller = await joined(router, "cbor")
        caller.send([CALL, 1, PPT, procedure, [PAYLOAD]])
        error = await caller.recv()
        assert error[:3] == [ERROR, CALL, 1] and error[4] == "wamp.error.feature_not_supported"
        assert delta(before, scrape(router), "router_messages_dropped_total", realm="realm1",
                     protocol="wamp", reason="passthru_skipped") == 1
        await close(plain_callee)

        other = f"{procedure}.b"
        callee = await registered(router, other)
        plain_caller = await joined(router, "json", ppt=False)
        plain_caller.send([CALL, 1, {}, other, ["plain"]])
        invocation = await callee.recv()
        assert invocation[4] == ["plain"]
        callee.send([YIELD, invocation[1], PPT, [PAYLOAD]])  # an opaque answer it cannot read
        error = await plain_caller.recv()
        assert error[:3] == [ERROR, CALL, 1] and error[4] == "wamp.error.feature_not_supported"
        await close(callee, caller, plain_caller)

    run(scenario())


# persistence ----------------------------------------------------------------------------------

def test_records_of_both_engines_keep_the_passthru():
    """SQLite rows and Redis hashes/lists/channels all use these two codecs."""
    for passthru in (Passthru(dict(PPT)), Passthru({"enc_algo": "cryptobox",
                                                     "enc_key": "k", "enc_serializer": "json"},
                                                    transparency=True)):
        publication = Publication(7, ("com", "ppt"), [PAYLOAD], None,
                                  SessionInfo(1, "realm1", "alice", "user"), retain=True,
                                  passthru=passthru)
        retained = decode_retained(encode_retained(publication, None, None), "realm1")
        assert retained.publication.passthru == passthru
        assert retained.publication.args == [PAYLOAD]
        _, forwarded = unpack_publication(pack_publication("realm1", publication))
        assert forwarded.passthru == passthru and forwarded.args == [PAYLOAD]
    _, plain = unpack_publication(pack_publication("realm1", Publication(
        8, ("a",), ["x"], None, None)))
    assert plain.passthru is None


def test_retained_passthru_survives_a_restart(tmp_path):
    topic = "com.ppt.durable"
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")]).start()

    async def publish_it():
        publisher = await joined(process, "cbor")
        await publish(publisher, topic, {**PPT, "retain": True}, [PAYLOAD])
        await close(publisher)

    async def read_it():
        subscriber = await joined(process, "msgpack")
        await subscribe(subscriber, topic, get_retained=True)
        event = await subscriber.recv()
        assert event[3] == {**PPT, "retained": True} and event[4] == [PAYLOAD]
        await close(subscriber)

    try:
        run(publish_it())
        process.stop()
        process.start()
        run(read_it())
    finally:
        process.stop()


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server is not installed (README command 2)")
def test_passthru_crosses_nodes_of_the_redis_engine(tmp_path):
    """Forwarded live, retained in Redis and read from its history on another node."""
    topic = "com.ppt.hist.cluster"
    realm = mqtt_realm("realm1", history=[{"uri": "com.ppt.hist.", "match": "prefix",
                                           "limit": 5}])

    def start_node(base, redis: RedisServer, name: str) -> RouterProcess:
        return RouterProcess(base / name, [realm], extra_config={
            "engine": {"type": "redis", "url": redis.url, "node": name}}).start()

    async def scenario(nodes):
        subscriber = await joined(nodes["b"], "cbor")
        subscription = await subscribe(subscriber, topic)
        publisher = await joined(nodes["a"], "json")
        # until b's interest reached a, a's publications do not go to b: publish until one does
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "b's interest never reached a"
            publisher.send([PUBLISH, publisher.next_request(), {**PPT, "retain": True}, topic,
                            [PAYLOAD]])
            try:
                event = await subscriber.recv(0.1)
                break
            except TimeoutError:
                continue
        assert event[:2] == [EVENT, subscription] and event[3] == PPT
        assert event[4] == [PAYLOAD]
        late = await joined(nodes["b"], "msgpack")
        late_subscription = await subscribe(late, topic, get_retained=True)
        retained = await late.recv()
        assert retained[3] == {**PPT, "retained": True} and retained[4] == [PAYLOAD]
        late.send([CALL, 1, {}, "wamp.subscription.get_events", [late_subscription]])
        result = await late.recv()
        assert result[0] == RESULT and result[3][0], result
        assert all(record["args"] == [PAYLOAD] and record["details"]["ppt_keyid"] == "0x5e2f"
                   for record in result[3][0])
        await close(subscriber, publisher, late)

    with redis_cluster(tmp_path, start_node, ("a", "b")) as (_, nodes):
        run(scenario(nodes))
