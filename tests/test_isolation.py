"""One receiver's failure is its own: a payload some wire formats cannot carry reaches every
receiver that can take it, is counted for the others, and the publisher gets a true answer.

The publisher speaks CBOR, which can carry values (a tag of its own, ``undefined``) that
JSON, MessagePack, MQTT's JSON bytes and AMQP's bodies cannot. Receivers on every protocol
listen. Dates, UUIDs and decimals are the exception, by one rule for all of those receivers:
they get them as text (docs/mqtt-and-amqp.md, "Payloads across protocols").
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

import cbor2
import pytest

from tests.amqp_clients import Receive, amqp_listeners, received, settle
from tests.amqp_clients import connect as amqp_connect
from tests.clients import Sessions, raw_connect, run
from tests.harness import RouterProcess
from tests.mqtt_clients import mqtt_realm, unique

PUBLISH, PUBLISHED, ERROR, SUBSCRIBE, SUBSCRIBED, EVENT = 16, 17, 8, 32, 33, 36
CALL, RESULT, REGISTER, REGISTERED, INVOCATION, YIELD = 48, 50, 64, 65, 68, 70
EPOCH_TAG = 1  # CBOR tag 1: epoch-based date/time, which cbor2 decodes to a datetime
PRIVATE_TAG = 80_000  # a CBOR tag nobody registered: cbor2 keeps it a CBORTag


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    listeners = amqp_listeners("realm1") + [{"type": "rawsocket", "host": "127.0.0.1",
                                             "port": 0}]
    process = RouterProcess(tmp_path_factory.mktemp("isolation"), [mqtt_realm("realm1")],
                            listeners=listeners).start()
    yield process
    process.stop()


def cbor_publish(request: int, topic: str, args: list, **options) -> bytes:
    """A PUBLISH as raw CBOR bytes (autobahn would refuse to encode a tag for us)."""
    return cbor2.dumps([PUBLISH, request, {"acknowledge": True, **options}, topic, args])


async def subscribed(client, topic: str, **options) -> int:
    request = client.next_request()
    client.send([SUBSCRIBE, request, options, topic])
    reply = await client.recv()
    assert reply[:2] == [SUBSCRIBED, request], reply
    return reply[2]


def test_an_unencodable_event_skips_only_the_receivers_that_cannot_take_it(router, mqtt):
    topic = f"com.iso.{unique('t')}"
    mqtt_subscriber = mqtt()
    mqtt_subscriber.subscribe((topic.replace(".", "/"), 0))
    amqp = amqp_connect(router)
    amqp_receiver = amqp.create_receiver(topic, credit=10, options=Receive(0))

    async def scenario():
        async with Sessions(router) as sessions:
            json_subscribers = [await raw_connect(router, "websocket", "json") for _ in range(2)]
            msgpack_subscriber = await raw_connect(router, "rawsocket", "msgpack")
            cbor_subscriber = await raw_connect(router, "rawsocket", "cbor")
            publisher = await raw_connect(router, "websocket", "cbor")
            others = json_subscribers + [msgpack_subscriber]
            sessions.raw.extend(others + [cbor_subscriber, publisher])
            for client in others + [cbor_subscriber, publisher]:
                assert (await client.hello())[0] == 2
            for client in others + [cbor_subscriber]:
                await subscribed(client, topic)

            tagged = cbor2.CBORTag(PRIVATE_TAG, "x")
            publisher.send_bytes(cbor_publish(1, topic, [tagged]))
            assert (await publisher.recv())[:2] == [PUBLISHED, 1]
            event = await cbor_subscriber.recv()
            assert event[0] == EVENT and event[4] == [tagged], event

            publisher.send_bytes(cbor_publish(2, topic, ["after"]))
            assert (await publisher.recv())[:2] == [PUBLISHED, 2]
            for client in others + [cbor_subscriber]:
                event = await client.recv()  # JSON, MessagePack: "after" comes first
                assert event[0] == EVENT and event[4] == ["after"], event

    run(scenario())
    # MQTT (JSON bytes) and AMQP (native values) cannot take the tag: "after" comes next
    mqtt_subscriber.expect(topic.replace(".", "/"), b'"after"')
    msg, delivery = received(amqp_receiver)
    assert msg.body == "after"  # a WAMP string arg is an amqp-value string
    settle(amqp_receiver, delivery, None)
    amqp.close()
    router.wait_for_log(r"realm realm1, (wamp|mqtt|amqp): unencodable")
    assert not [line for line in router.log_lines if "Unhandled" in line or "CRITICAL" in line]


def test_dates_uuids_and_decimals_reach_every_receiver_as_text(router, mqtt):
    """One rule for every receiver whose format has no such type (WAMP JSON and MessagePack,
    MQTT's JSON payload, AMQP's body): the text; a CBOR receiver gets the values as sent."""
    topic = f"com.iso.{unique('d')}"
    mqtt_subscriber = mqtt()
    mqtt_subscriber.subscribe((topic.replace(".", "/"), 0))
    amqp = amqp_connect(router)
    amqp_receiver = amqp.create_receiver(topic, credit=10, options=Receive(0))
    identifier = uuid.UUID("12345678-1234-5678-1234-567812345678")
    sent = {"at": cbor2.CBORTag(EPOCH_TAG, 1_700_000_000.25), "on": datetime.date(2024, 5, 1),
            "id": identifier, "price": decimal.Decimal("12.50")}
    as_values = {"at": datetime.datetime(2023, 11, 14, 22, 13, 20, 250_000,
                                         tzinfo=datetime.timezone.utc),
                 "on": datetime.date(2024, 5, 1), "id": identifier,
                 "price": decimal.Decimal("12.50")}
    as_text = {"at": "2023-11-14T22:13:20.250000+00:00", "on": "2024-05-01",
               "id": "12345678-1234-5678-1234-567812345678", "price": "12.50"}

    async def scenario():
        async with Sessions(router) as sessions:
            receivers = {"json": await raw_connect(router, "websocket", "json"),
                         "msgpack": await raw_connect(router, "rawsocket", "msgpack"),
                         "cbor": await raw_connect(router, "rawsocket", "cbor")}
            publisher = await raw_connect(router, "websocket", "cbor")
            sessions.raw.extend([*receivers.values(), publisher])
            for client in [*receivers.values(), publisher]:
                assert (await client.hello())[0] == 2
            for client in receivers.values():
                await subscribed(client, topic)
            publisher.send_bytes(cbor_publish(1, topic, [sent]))
            assert (await publisher.recv())[:2] == [PUBLISHED, 1]
            got = {name: (await client.recv())[4] for name, client in receivers.items()}
            assert got == {"json": [as_text], "msgpack": [as_text], "cbor": [as_values]}
            # the retained store holds no such value: refused, as the README says
            publisher.send_bytes(cbor_publish(2, topic, [sent], retain=True))
            error = await publisher.recv()
            assert error[:3] == [ERROR, PUBLISH, 2] and error[4] == "wamp.error.invalid_argument"

    run(scenario())
    assert json.loads(mqtt_subscriber.next_message().payload) == as_text
    msg, delivery = received(amqp_receiver)
    assert msg.body == as_text  # an amqp-value map of strings
    settle(amqp_receiver, delivery, None)
    amqp.close()


def test_a_retained_event_that_cannot_be_stored_is_refused_before_anyone_gets_it(router):
    topic = f"com.iso.{unique('r')}"

    async def scenario():
        async with Sessions(router) as sessions:
            publisher = await raw_connect(router, "websocket", "cbor")
            listener = await raw_connect(router, "websocket", "json")
            sessions.raw.extend([publisher, listener])
            for client in (publisher, listener):
                assert (await client.hello())[0] == 2
            await subscribed(listener, topic)
            publisher.send_bytes(cbor_publish(1, topic, ["kept"], retain=True))
            assert (await publisher.recv())[:2] == [PUBLISHED, 1]
            assert (await listener.recv())[4] == ["kept"]

            publisher.send_bytes(cbor_publish(2, topic, [cbor2.undefined], retain=True))
            error = await publisher.recv()
            assert error[:3] == [ERROR, PUBLISH, 2] and error[4] == "wamp.error.invalid_argument"
            assert "retained" in error[5][0]

            late = await raw_connect(router, "websocket", "json")
            sessions.raw.append(late)
            assert (await late.hello())[0] == 2
            await subscribed(late, topic, get_retained=True)
            retained = await late.recv()
            assert retained[4] == ["kept"] and retained[3]["retained"] is True
            # the refused event was delivered to nobody: "next" is the listener's next event
            publisher.send_bytes(cbor_publish(3, topic, ["next"]))
            assert (await publisher.recv())[:2] == [PUBLISHED, 3]
            assert (await listener.recv())[4] == ["next"]

    run(scenario())


async def callee_and_caller(router, sessions: Sessions, procedure: str,
                            callee_format: str, caller_format: str) -> tuple:
    """A callee (RawSocket) registered for ``procedure`` and a caller (WebSocket), joined."""
    callee = await raw_connect(router, "rawsocket", callee_format)
    caller = await raw_connect(router, "websocket", caller_format)
    sessions.raw.extend([callee, caller])
    for client in (callee, caller):
        assert (await client.hello())[0] == 2
    callee.send([REGISTER, 1, {}, procedure])
    assert (await callee.recv())[0] == REGISTERED
    return callee, caller


def test_a_result_the_caller_cannot_decode_fails_that_call_only(router):
    procedure = f"com.iso.{unique('p')}"

    async def scenario():
        async with Sessions(router) as sessions:
            callee, caller = await callee_and_caller(router, sessions, procedure, "cbor",
                                                     "msgpack")
            for request, result in ((1, cbor2.undefined), (2, "fine")):
                caller.send([CALL, request, {}, procedure, []])
                invocation = await callee.recv()
                assert invocation[0] == INVOCATION
                callee.send_bytes(cbor2.dumps([YIELD, invocation[1], {}, [result]]))
                reply = await caller.recv()
                if request == 1:
                    assert reply[:3] == [ERROR, CALL, 1]
                    assert reply[4] == "wamp.error.invalid_argument", reply
                else:
                    assert reply == [RESULT, 2, {}, ["fine"]]

    run(scenario())


def test_arguments_the_callee_cannot_decode_fail_the_call_with_an_error(router):
    procedure = f"com.iso.{unique('p')}"

    async def scenario():
        async with Sessions(router) as sessions:
            callee, caller = await callee_and_caller(router, sessions, procedure, "msgpack",
                                                     "cbor")
            caller.send_bytes(cbor2.dumps([CALL, 7, {}, procedure, [cbor2.undefined]]))
            reply = await caller.recv()
            assert reply[:3] == [ERROR, CALL, 7] and reply[4] == "wamp.error.invalid_argument"
            caller.send([CALL, 8, {}, procedure, ["ok"]])
            invocation = await callee.recv()
            assert invocation[0] == INVOCATION and invocation[4] == ["ok"]

    run(scenario())
