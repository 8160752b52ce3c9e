"""Black-box tests of the broker: publish/subscribe over every transport and serializer.

Raw clients (exact WAMP lists on the wire) are used wherever the check is about what
the router sends; autobahn clients where the check is about what an application sees.
"Nothing arrived" is always proven by a later sentinel event that the router orders
behind anything that could have arrived.
"""

from __future__ import annotations

import asyncio

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from router.core.credentials import hash_secret
from tests.clients import COMBINATIONS, connect, next_item, raw_connect, run
from tests.harness import OPEN_ROLE, RouterProcess, realm_file

HELLO, WELCOME, ABORT, CHALLENGE, AUTHENTICATE, GOODBYE = 1, 2, 3, 4, 5, 6
ERROR, PUBLISH, PUBLISHED, SUBSCRIBE, SUBSCRIBED, UNSUBSCRIBE, UNSUBSCRIBED, EVENT = (
    8, 16, 17, 32, 33, 34, 35, 36)

# Ticket principals in distinct roles (cheap hashes: the router reads the iteration count).
SECRETS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret",
           "hera": "hera-secret", "rita": "rita-secret"}
PRINCIPALS = {
    "alice": "alpha",
    "bob": "alpha",
    "carol": "beta",
    "hera": "herald",   # publishes on com.herald.* are always disclosed by role config
    "rita": "reader",   # may only subscribe, and only under com.
}
ROLES = {
    "anonymous": OPEN_ROLE,
    # alpha may even publish in wamp.* by its rules; the router must still refuse that
    "alpha": OPEN_ROLE + [{"uri": "wamp.", "match": "prefix", "allow": ["publish", "subscribe"]}],
    "beta": OPEN_ROLE,
    "herald": [
        {"uri": "com.herald.", "match": "prefix", "allow": ["publish"], "disclose": True},
        {"uri": "", "match": "prefix", "allow": ["publish", "subscribe"]},
    ],
    "reader": [{"uri": "com.", "match": "prefix", "allow": ["subscribe"]}],
}


@pytest.fixture(scope="module")
def broker_router(tmp_path_factory):
    principals = {authid: {"role": role, "ticket": hash_secret(SECRETS[authid], iterations=1000)}
                  for authid, role in PRINCIPALS.items()}
    realms = [
        realm_file("realm1", roles=ROLES, uri_check="strict", principals=principals),
        realm_file("loose1", uri_check="loose"),
    ]
    process = RouterProcess(tmp_path_factory.mktemp("pubsub"), realms).start()
    yield process
    process.stop()


# raw-client helpers -------------------------------------------------------------------

CLIENT_ROLES = {
    "publisher": {"features": {"publisher_exclusion": True, "publisher_identification": True,
                               "subscriber_blackwhite_listing": True}},
    "subscriber": {"features": {"pattern_based_subscription": True,
                                "publisher_identification": True}},
}


async def raw_join(router, transport="websocket", serializer="json", realm="realm1",
                   authid=None):
    """A raw client with an established session; ticket auth when ``authid`` is given."""
    client = await raw_connect(router, transport, serializer)
    details = {"roles": CLIENT_ROLES}
    if authid is not None:
        details.update(authmethods=["ticket"], authid=authid)
    client.send([HELLO, realm, details])
    reply = await client.recv()
    if authid is not None:
        assert reply[0] == CHALLENGE and reply[1] == "ticket", reply
        client.send([AUTHENTICATE, SECRETS[authid], {}])
        reply = await client.recv()
    assert reply[0] == WELCOME, reply
    client.session_id = reply[1]
    client.welcome_details = reply[2]
    return client


async def raw_subscribe(client, topic, **options) -> int:
    request = client.next_request()
    client.send([SUBSCRIBE, request, options, topic])
    reply = await client.recv()
    assert reply[:2] == [SUBSCRIBED, request], reply
    assert len(reply) == 3 and type(reply[2]) is int, reply
    return reply[2]


def raw_publish(client, topic, args=None, kwargs=None, **options) -> int:
    request = client.next_request()
    message = [PUBLISH, request, options, topic]
    if args is not None or kwargs is not None:
        message.append(args or [])
    if kwargs is not None:
        message.append(kwargs)
    client.send(message)
    return request


async def raw_publish_ack(client, topic, args=None, kwargs=None, **options) -> int:
    """Publish with acknowledge and return the publication id from PUBLISHED."""
    request = raw_publish(client, topic, args, kwargs, acknowledge=True, **options)
    reply = await client.recv()
    assert reply[:2] == [PUBLISHED, request], reply
    return reply[2]


async def raw_request_error(client, message: list) -> list:
    """Send a request and return the ERROR it must get."""
    client.send(message)
    reply = await client.recv()
    assert reply[0] == ERROR and reply[1:3] == [message[0], message[1]], reply
    return reply


async def raw_events_until(client, sentinel_sub: int) -> list[list]:
    """Every EVENT received before the one on ``sentinel_sub`` (which must come)."""
    events = []
    while True:
        message = await client.recv()
        assert message[0] == EVENT, message
        if message[1] == sentinel_sub:
            return events
        events.append(message)


async def aclose_raw(*clients) -> None:
    for client in clients:
        client.close()
    for client in clients:
        await asyncio.wait_for(client.closed, 10)


# autobahn helpers ------------------------------------------------------------------

async def subscribe_into(session, queue: asyncio.Queue, topic: str, tag: str | None = None,
                         **options):
    """Subscribe; every event goes into ``queue`` as (tag, args, kwargs, details)."""

    def handler(*args, details=None, **kwargs):
        queue.put_nowait((tag or topic, list(args), kwargs, details))

    return await session.subscribe(handler, topic,
                                   options=SubscribeOptions(details=True, **options))


ACK = PublishOptions(acknowledge=True)


# basic pub/sub over every transport x serializer -------------------------------------------

@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_subscribe_publish_event_unsubscribe(broker_router, transport, serializer):
    async def scenario():
        sub = await connect(broker_router, transport, serializer)
        pub = await connect(broker_router, transport, serializer)
        received: asyncio.Queue = asyncio.Queue()
        topic_sub = await subscribe_into(sub, received, "com.basic.topic")
        await subscribe_into(sub, received, "com.basic.sentinel")

        publication = await pub.publish("com.basic.topic", 1, "two", [3.5, None],
                                        key={"nested": True}, options=ACK)
        tag, args, kwargs, details = await next_item(received)
        assert tag == "com.basic.topic"
        assert args == [1, "two", [3.5, None]] and kwargs == {"key": {"nested": True}}
        assert details.publication == publication.id

        # no payload at all
        await pub.publish("com.basic.topic", options=ACK)
        tag, args, kwargs, _ = await next_item(received)
        assert (tag, args, kwargs) == ("com.basic.topic", [], {})

        await topic_sub.unsubscribe()
        assert not topic_sub.active
        await pub.publish("com.basic.topic", "after unsubscribe", options=ACK)
        await pub.publish("com.basic.sentinel", "sentinel", options=ACK)
        tag, args, _, _ = await next_item(received)
        assert (tag, args) == ("com.basic.sentinel", ["sentinel"]), \
            "an event arrived after UNSUBSCRIBED"
        await pub.close()
        await sub.close()

    run(scenario())


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_wire_event_and_acknowledge(broker_router, transport, serializer):
    """Exact wire format of SUBSCRIBED/PUBLISHED/EVENT; no reply without acknowledge."""
    async def scenario():
        sub = await raw_join(broker_router, transport, serializer)
        pub = await raw_join(broker_router, transport, serializer)
        sub_id = await raw_subscribe(sub, "com.wire.topic")
        assert 1 <= sub_id <= 2 ** 53

        publication = await raw_publish_ack(pub, "com.wire.topic", [1, "two"], {"k": "v"})
        assert type(publication) is int and 1 <= publication <= 2 ** 53
        event = await sub.recv()
        assert event == [EVENT, sub_id, publication, {}, [1, "two"], {"k": "v"}]

        # args only, then nothing: trailing empty elements are dropped
        second = await raw_publish_ack(pub, "com.wire.topic", ["only"])
        assert await sub.recv() == [EVENT, sub_id, second, {}, ["only"]]
        third = await raw_publish_ack(pub, "com.wire.topic")
        assert await sub.recv() == [EVENT, sub_id, third, {}]
        assert len({publication, second, third}) == 3

        # without acknowledge the publisher gets no reply: the next thing it receives
        # is the PUBLISHED of a later acknowledged request
        silent = raw_publish(pub, "com.wire.topic", ["silent"])
        later = raw_publish(pub, "com.wire.topic", ["later"], acknowledge=True)
        reply = await pub.recv()
        assert reply[:2] == [PUBLISHED, later], f"reply to unacknowledged request {silent}: {reply}"
        # ... but the unacknowledged event was delivered, in order
        assert (await sub.recv())[4] == ["silent"]
        assert (await sub.recv())[4] == ["later"]
        await aclose_raw(sub, pub)

    run(scenario())


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_publisher_exclusion(broker_router, transport, serializer):
    async def scenario():
        me = await connect(broker_router, transport, serializer)
        other = await connect(broker_router, transport, serializer)
        mine: asyncio.Queue = asyncio.Queue()
        others: asyncio.Queue = asyncio.Queue()
        await subscribe_into(me, mine, "com.excl.topic")
        await subscribe_into(other, others, "com.excl.topic")

        await me.publish("com.excl.topic", "default", options=ACK)
        await me.publish("com.excl.topic", "included",
                         options=PublishOptions(acknowledge=True, exclude_me=False))
        _, args, _, _ = await next_item(mine)
        assert args == ["included"], "publisher received its own event despite default exclusion"
        assert [(await next_item(others))[1] for _ in range(2)] == [["default"], ["included"]]
        await me.close()
        await other.close()

    run(scenario())


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_publisher_identification_disclose_me(broker_router, transport, serializer):
    async def scenario():
        sub = await raw_join(broker_router, transport, serializer)
        pub = await raw_join(broker_router, transport, serializer, authid="alice")
        sub_id = await raw_subscribe(sub, "com.ident.topic")

        raw_publish(pub, "com.ident.topic", ["disclosed"], disclose_me=True)
        event = await sub.recv()
        assert event[:2] == [EVENT, sub_id] and event[4] == ["disclosed"], event
        assert event[3] == {"publisher": pub.session_id, "publisher_authid": "alice",
                            "publisher_authrole": "alpha"}

        # not asked to disclose (and no role rule says so): nothing about the publisher
        raw_publish(pub, "com.ident.topic", ["anonymous"])
        raw_publish(pub, "com.ident.topic", ["anonymous too"], disclose_me=False)
        for expected in (["anonymous"], ["anonymous too"]):
            event = await sub.recv()
            assert event[4] == expected and event[3] == {}, event
        await aclose_raw(sub, pub)

    run(scenario())


def test_role_rule_with_disclose_always_discloses(broker_router):
    async def scenario():
        sub = await raw_join(broker_router, "rawsocket", "cbor")
        hera = await raw_join(broker_router, "websocket", "msgpack", authid="hera")
        herald_sub = await raw_subscribe(sub, "com.herald.news")
        other_sub = await raw_subscribe(sub, "com.other.news")

        raw_publish(hera, "com.herald.news", ["by role"])
        event = await sub.recv()
        assert event[:2] == [EVENT, herald_sub] and event[4] == ["by role"], event
        assert event[3] == {"publisher": hera.session_id, "publisher_authid": "hera",
                            "publisher_authrole": "herald"}
        # the rule that discloses covers only com.herald.*: elsewhere hera stays anonymous
        raw_publish(hera, "com.other.news", ["not covered"])
        event = await sub.recv()
        assert event[:2] == [EVENT, other_sub] and event[3] == {}, event
        await aclose_raw(sub, hera)

    run(scenario())


# pattern-based subscriptions ----------------------------------------------------------------

@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_prefix_and_wildcard_matching(broker_router, transport, serializer):
    async def scenario():
        sub = await raw_join(broker_router, transport, serializer, realm="loose1")
        pub = await raw_join(broker_router, "websocket", "json", realm="loose1")
        prefix = await raw_subscribe(sub, "com.a.emergency", match="prefix")
        wildcard = await raw_subscribe(sub, "com.myapp..userevent", match="wildcard")
        sentinel = await raw_subscribe(sub, "com.sentinel")
        assert len({prefix, wildcard, sentinel}) == 3

        topics = ["com.a.emergency", "com.a.emergency-low", "com.a.emergency.11",
                  "com.a.emerge", "com.a.emergenc", "com.b.emergency",
                  "com.myapp.foo.userevent", "com.myapp.bar.userevent",
                  "com.myapp.foo.userevent.bar", "com.myapp.userevent",
                  "com.myapp.foo.bar.userevent", "com.myapp.foo.userevents"]
        for topic in topics:
            raw_publish(pub, topic, [topic])
        raw_publish(pub, "com.sentinel", ["sentinel"])

        events = await raw_events_until(sub, sentinel)
        got = [(event[1], event[3].get("topic"), event[4][0]) for event in events]
        assert got == [
            (prefix, "com.a.emergency", "com.a.emergency"),
            (prefix, "com.a.emergency-low", "com.a.emergency-low"),
            (prefix, "com.a.emergency.11", "com.a.emergency.11"),
            (wildcard, "com.myapp.foo.userevent", "com.myapp.foo.userevent"),
            (wildcard, "com.myapp.bar.userevent", "com.myapp.bar.userevent"),
        ]
        await aclose_raw(sub, pub)

    run(scenario())


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_one_publish_delivered_once_per_matching_subscription(broker_router, transport,
                                                              serializer):
    async def scenario():
        sub = await raw_join(broker_router, transport, serializer)
        pub = await raw_join(broker_router, transport, serializer)
        exact = await raw_subscribe(sub, "com.multi.topic")
        prefix = await raw_subscribe(sub, "com.multi", match="prefix")
        wildcard = await raw_subscribe(sub, "com..topic", match="wildcard")
        sentinel = await raw_subscribe(sub, "com.multi_sentinel")
        assert len({exact, prefix, wildcard, sentinel}) == 4

        publication = await raw_publish_ack(pub, "com.multi.topic", ["x"])
        raw_publish(pub, "com.multi_sentinel")
        events = await raw_events_until(sub, sentinel)
        assert sorted(event[1] for event in events) == sorted([exact, prefix, wildcard])
        assert {event[2] for event in events} == {publication}
        for event in events:
            assert event[4] == ["x"]
            if event[1] == exact:
                assert "topic" not in event[3], event
            else:
                assert event[3]["topic"] == "com.multi.topic", event
        await aclose_raw(sub, pub)

    run(scenario())


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_binary_and_typed_payload_across_serializers(broker_router, transport, serializer):
    """A payload published in one serializer arrives intact in every other one."""
    async def scenario():
        pub = await connect(broker_router, transport, serializer)
        subscribers = [await connect(broker_router, t, s) for t, s in COMBINATIONS]
        queues = [await sub.events("com.payload.topic") for sub in subscribers]
        payload = [b"\x00\x01\xfe\xff", "h\u00e9llo \u2603", 2 ** 53, -1, 1.5, True, None,
                   {"nested": [b"\x10", "x"]}]
        await pub.publish("com.payload.topic", *payload, blob=b"\xff" * 3, options=ACK)
        for (t, s), queue in zip(COMBINATIONS, queues):
            args, kwargs, _ = await next_item(queue)
            assert args == payload, f"payload changed on the way to {t}/{s}"
            assert kwargs == {"blob": b"\xff" * 3}
        await pub.close()
        for sub in subscribers:
            await sub.close()

    run(scenario())


def test_realms_are_isolated(broker_router):
    async def scenario():
        loose_sub = await raw_join(broker_router, "rawsocket", "json", realm="loose1")
        strict_sub = await raw_join(broker_router, "websocket", "json")
        topic_loose = await raw_subscribe(loose_sub, "com.iso.topic")
        sentinel = await raw_subscribe(loose_sub, "com.iso_sentinel")
        topic_strict = await raw_subscribe(strict_sub, "com.iso.topic")
        pub = await raw_join(broker_router, "websocket", "msgpack")  # in realm1
        publication = await raw_publish_ack(pub, "com.iso.topic", ["realm1 only"])
        assert await strict_sub.recv() == [EVENT, topic_strict, publication, {},
                                           ["realm1 only"]]
        loose_pub = await raw_join(broker_router, "websocket", "cbor", realm="loose1")
        raw_publish(loose_pub, "com.iso_sentinel")
        events = await raw_events_until(loose_sub, sentinel)
        assert [e for e in events if e[1] == topic_loose] == [], "event crossed realms"
        await aclose_raw(loose_sub, strict_sub, pub, loose_pub)

    run(scenario())


def test_leaving_session_does_not_end_shared_subscription(broker_router):
    async def scenario():
        stays = await raw_join(broker_router, "rawsocket", "msgpack")
        leaves = await connect(broker_router, "websocket", "json")
        shared = await raw_subscribe(stays, "com.leave.topic")
        leaving_sub = await leaves.subscribe(lambda *a: None, "com.leave.topic")
        assert leaving_sub.id == shared
        await leaves.close()  # GOODBYE: the router drops its subscriptions
        pub = await raw_join(broker_router, "websocket", "cbor")
        publication = await raw_publish_ack(pub, "com.leave.topic", ["still here"])
        assert await stays.recv() == [EVENT, shared, publication, {}, ["still here"]]
        # once the last subscriber is gone the id is no longer the session's to use
        request = stays.next_request()
        stays.send([UNSUBSCRIBE, request, shared])
        assert await stays.recv() == [UNSUBSCRIBED, request]
        reply = await raw_request_error(stays, [UNSUBSCRIBE, stays.next_request(), shared])
        assert reply[4] == "wamp.error.no_such_subscription"
        await aclose_raw(stays, pub)

    run(scenario())


def test_pattern_subscription_seen_by_autobahn_application(broker_router):
    async def scenario():
        sub = await connect(broker_router, "rawsocket", "msgpack")
        pub = await connect(broker_router, "websocket", "cbor")
        received: asyncio.Queue = asyncio.Queue()
        await subscribe_into(sub, received, "com.app", tag="prefix", match="prefix")
        await pub.publish("com.app.one.two", "hi", options=ACK)
        tag, args, _, details = await next_item(received)
        assert (tag, args, details.topic) == ("prefix", ["hi"], "com.app.one.two")
        await pub.close()
        await sub.close()

    run(scenario())


# subscription identity ----------------------------------------------------------------

def test_subscription_ids_shared_and_idempotent(broker_router):
    async def scenario():
        a = await raw_join(broker_router, "websocket", "json")
        b = await raw_join(broker_router, "rawsocket", "msgpack")
        pub = await raw_join(broker_router, "rawsocket", "cbor")
        first = await raw_subscribe(a, "com.share.topic")
        assert await raw_subscribe(b, "com.share.topic") == first, \
            "two sessions on the same topic+match must share the subscription id"
        assert await raw_subscribe(a, "com.share.topic") == first, \
            "subscribing twice from one session must return the existing id"
        assert await raw_subscribe(a, "com.share.topic", match="prefix") != first
        a_sentinel = await raw_subscribe(a, "com.share_sentinel")
        b_sentinel = await raw_subscribe(b, "com.share_sentinel")

        # a double subscribe is one subscription: one event, not two
        publication = await raw_publish_ack(pub, "com.share.topic", ["one"])
        raw_publish(pub, "com.share_sentinel")
        a_events = await raw_events_until(a, a_sentinel)
        assert [(e[1], e[2]) for e in a_events if e[1] == first] == [(first, publication)]
        b_events = await raw_events_until(b, b_sentinel)
        assert [(e[1], e[2]) for e in b_events] == [(first, publication)]

        # a unsubscribes from the shared subscription: b keeps receiving on the same id
        request = a.next_request()
        a.send([UNSUBSCRIBE, request, first])
        assert await a.recv() == [UNSUBSCRIBED, request]
        publication = await raw_publish_ack(pub, "com.share.topic", ["two"])
        raw_publish(pub, "com.share_sentinel")
        b_events = await raw_events_until(b, b_sentinel)
        assert [(e[1], e[2], e[4]) for e in b_events] == [(first, publication, ["two"])]
        a_events = await raw_events_until(a, a_sentinel)
        assert [e[1] for e in a_events if e[1] == first] == [], "event after UNSUBSCRIBED"
        await aclose_raw(a, b, pub)

    run(scenario())


def test_unsubscribe_unknown_or_foreign_subscription(broker_router):
    async def scenario():
        a = await raw_join(broker_router)
        b = await raw_join(broker_router)
        reply = await raw_request_error(a, [UNSUBSCRIBE, a.next_request(), 987654321])
        assert reply[4] == "wamp.error.no_such_subscription"

        # b's subscription id is not a's to drop
        b_sub = await raw_subscribe(b, "com.foreign.topic")
        reply = await raw_request_error(a, [UNSUBSCRIBE, a.next_request(), b_sub])
        assert reply[4] == "wamp.error.no_such_subscription"

        # unsubscribing twice: the second one is unknown
        a_sub = await raw_subscribe(a, "com.twice.topic")
        request = a.next_request()
        a.send([UNSUBSCRIBE, request, a_sub])
        assert await a.recv() == [UNSUBSCRIBED, request]
        reply = await raw_request_error(a, [UNSUBSCRIBE, a.next_request(), a_sub])
        assert reply[4] == "wamp.error.no_such_subscription"

        # the session is fine afterwards, and b is still subscribed
        pub_id = await raw_publish_ack(a, "com.foreign.topic", ["still there"])
        assert await b.recv() == [EVENT, b_sub, pub_id, {}, ["still there"]]
        await aclose_raw(a, b)

    run(scenario())


# URI checks and the reserved namespace -------------------------------------------------------

@pytest.mark.parametrize("topic,match", [
    ("com..bad", "exact"),
    ("com.Bad.upper", "exact"),          # strict realm: [0-9a-z_] only
    ("com.with space", "exact"),
    ("com.bad.", "exact"),
    ("com.a.#", "prefix"),
    ("com..bad", "prefix"),              # empty components only for wildcard
])
def test_subscribe_invalid_uri(broker_router, topic, match):
    async def scenario():
        client = await raw_join(broker_router)
        reply = await raw_request_error(client, [SUBSCRIBE, client.next_request(),
                                                 {"match": match}, topic])
        assert reply[4] == "wamp.error.invalid_uri"
        # the session survives a refused request
        assert await raw_subscribe(client, "com.valid.topic") >= 1
        await aclose_raw(client)

    run(scenario())


@pytest.mark.parametrize("topic", [
    "com..bad",
    "com.Bad",
    "com.with space",
    "",
    "com.x.",
    "com.a-b",
])
def test_publish_invalid_uri(broker_router, topic):
    async def scenario():
        client = await raw_join(broker_router)
        reply = await raw_request_error(client, [PUBLISH, client.next_request(),
                                                 {"acknowledge": True}, topic])
        assert reply[4] == "wamp.error.invalid_uri"
        assert await raw_publish_ack(client, "com.valid.topic") >= 1  # the session survives
        await aclose_raw(client)

    run(scenario())


def test_publish_in_reserved_wamp_namespace_refused(broker_router):
    async def scenario():
        alice = await raw_join(broker_router, "websocket", "json", authid="alice")
        bob = await raw_join(broker_router, "rawsocket", "msgpack", authid="bob")
        anon = await raw_join(broker_router, "websocket", "cbor")
        wamp_sub = await raw_subscribe(alice, "wamp.x")  # alpha's rules allow this
        sentinel = await raw_subscribe(alice, "com.reserved_sentinel")
        for publisher in (bob, anon):
            reply = await raw_request_error(publisher, [
                PUBLISH, publisher.next_request(), {"acknowledge": True}, "wamp.x", ["forged"]])
            assert reply[4] in ("wamp.error.not_authorized", "wamp.error.invalid_uri"), reply
            raw_publish(publisher, "wamp.x", ["forged, unacknowledged"])
        raw_publish(bob, "com.reserved_sentinel")
        events = await raw_events_until(alice, sentinel)
        assert [e for e in events if e[1] == wamp_sub] == [], "a client forged a wamp.* event"
        await aclose_raw(alice, bob, anon)

    run(scenario())


@pytest.mark.parametrize("pattern,match", [("", "prefix"), ("wa", "prefix"),
                                           (".session.on_join", "wildcard")])
def test_catch_all_pattern_does_not_leak_meta_events(broker_router, pattern, match):
    """A role whose only rule is the catch-all prefix "" has no rights in wamp.*: a
    pattern subscription it is allowed to make must not deliver the router's meta events
    (wamp.session.on_join carries other sessions' authid and peer address)."""
    async def scenario():
        spy = await raw_join(broker_router, "websocket", "json")  # anonymous: OPEN_ROLE only
        message = [SUBSCRIBE, spy.next_request(), {"match": match}, pattern]
        spy.send(message)
        reply = await spy.recv()
        if reply[0] == ERROR:  # refusing the pattern outright is fine too
            assert reply[4] == "wamp.error.not_authorized", reply
            await aclose_raw(spy)
            return
        assert reply[:2] == [SUBSCRIBED, message[1]], reply
        sentinel = await raw_subscribe(spy, "com.meta_sentinel")
        newcomer = await raw_join(broker_router, "rawsocket", "json", authid="carol")
        raw_publish(newcomer, "com.meta_sentinel")
        events = await raw_events_until(spy, sentinel)
        leaked = [e for e in events if str(e[3].get("topic", "")).startswith("wamp.")]
        assert leaked == [], f"meta events leaked to a role without wamp.* rights: {leaked}"
        await aclose_raw(spy, newcomer)

    run(scenario())


# authorization -----------------------------------------------------------------------------

def test_publish_not_authorized(broker_router):
    async def scenario():
        sub = await raw_join(broker_router, "rawsocket", "json")
        rita = await raw_join(broker_router, "websocket", "cbor", authid="rita")
        other = await raw_join(broker_router, "websocket", "json")
        topic_sub = await raw_subscribe(sub, "com.acl.topic")
        sentinel = await raw_subscribe(sub, "com.acl_sentinel")

        raw_publish(rita, "com.acl.topic", ["denied silently"])
        reply = await raw_request_error(rita, [PUBLISH, rita.next_request(),
                                               {"acknowledge": True}, "com.acl.topic", ["denied"]])
        assert reply[4] == "wamp.error.not_authorized"
        # (raw_request_error checked that this ERROR is the first reply: none for the
        # unacknowledged request)

        raw_publish(other, "com.acl_sentinel")
        events = await raw_events_until(sub, sentinel)
        assert [e for e in events if e[1] == topic_sub] == [], "a denied publish was delivered"
        await aclose_raw(sub, rita, other)

    run(scenario())


@pytest.mark.parametrize("topic,match,allowed", [
    ("com.acl.topic", "exact", True),
    ("org.acl.topic", "exact", False),
    ("com.acl", "prefix", True),
    ("co", "prefix", False),            # would also match e.g. 'corp.x', outside com.
    ("com..topic", "wildcard", True),
    (".acl.topic", "wildcard", False),  # would also match 'org.acl.topic'
])
def test_subscribe_authorization(broker_router, topic, match, allowed):
    async def scenario():
        rita = await raw_join(broker_router, "rawsocket", "msgpack", authid="rita")
        message = [SUBSCRIBE, rita.next_request(), {"match": match}, topic]
        rita.send(message)
        reply = await rita.recv()
        if allowed:
            assert reply[:2] == [SUBSCRIBED, message[1]], reply
        else:
            assert reply[:3] == [ERROR, SUBSCRIBE, message[1]], reply
            assert reply[4] == "wamp.error.not_authorized"
        await aclose_raw(rita)

    run(scenario())


def test_denied_subscribe_seen_by_autobahn(broker_router):
    async def scenario():
        rita = await connect(broker_router, "websocket", "json", authid="rita",
                             ticket=SECRETS["rita"])
        with pytest.raises(ApplicationError) as failure:
            await rita.subscribe(lambda *a: None, "org.secret.topic")
        assert failure.value.error == "wamp.error.not_authorized"
        with pytest.raises(ApplicationError) as failure:
            await rita.publish("com.acl.topic", options=ACK)
        assert failure.value.error == "wamp.error.not_authorized"
        await rita.close()

    run(scenario())


# subscriber black- and whitelisting ---------------------------------------------------------

AUDIENCE = {  # name -> (transport, serializer, authid); "anon" is an anonymous session
    "alice": ("websocket", "json", "alice"),
    "bob": ("rawsocket", "msgpack", "bob"),
    "carol": ("websocket", "cbor", "carol"),
    "anon": ("rawsocket", "json", None),
}

BLACKWHITE_CASES = [
    ("no lists", lambda s: {}, {"alice", "bob", "carol", "anon"}),
    ("exclude", lambda s: {"exclude": [s["bob"], s["anon"]]}, {"alice", "carol"}),
    ("exclude_authid", lambda s: {"exclude_authid": ["alice"]}, {"bob", "carol", "anon"}),
    ("exclude_authrole", lambda s: {"exclude_authrole": ["alpha"]}, {"carol", "anon"}),
    ("eligible", lambda s: {"eligible": [s["alice"], s["carol"]]}, {"alice", "carol"}),
    ("eligible_authid", lambda s: {"eligible_authid": ["bob", "carol"]}, {"bob", "carol"}),
    ("eligible_authrole", lambda s: {"eligible_authrole": ["beta", "anonymous"]},
     {"carol", "anon"}),
    ("exclusion wins", lambda s: {"eligible": [s["alice"], s["bob"]], "exclude": [s["alice"]]},
     {"bob"}),
    ("exclude_authid beats eligible_authrole",
     lambda s: {"eligible_authrole": ["alpha"], "exclude_authid": ["alice"]}, {"bob"}),
    ("exclude_authrole beats eligible",
     lambda s: {"eligible": [s["alice"], s["carol"]], "exclude_authrole": ["beta"]}, {"alice"}),
    ("lists combine with AND",
     lambda s: {"eligible_authid": ["alice", "carol"], "eligible_authrole": ["beta"]}, {"carol"}),
    ("empty eligible is nobody", lambda s: {"eligible": []}, set()),
    ("empty eligible_authid is nobody", lambda s: {"eligible_authid": []}, set()),
    ("empty exclude is nobody excluded", lambda s: {"exclude": []},
     {"alice", "bob", "carol", "anon"}),
]


@pytest.mark.parametrize("name,make_options,expected", BLACKWHITE_CASES,
                         ids=[case[0] for case in BLACKWHITE_CASES])
def test_subscriber_black_and_whitelisting(broker_router, name, make_options, expected):
    async def scenario():
        sessions, queues, ids = {}, {}, {}
        for who, (transport, serializer, authid) in AUDIENCE.items():
            session = await connect(broker_router, transport, serializer, authid=authid,
                                    ticket=SECRETS.get(authid))
            details = await session.joined
            if authid is not None:
                assert (details.authid, details.authrole) == (authid, PRINCIPALS[authid])
            queues[who] = asyncio.Queue()
            await subscribe_into(session, queues[who], "com.bw.topic")
            await subscribe_into(session, queues[who], "com.bw.sentinel")
            sessions[who], ids[who] = session, details.session
        pub = await raw_join(broker_router, "websocket", "msgpack")

        publication = await raw_publish_ack(pub, "com.bw.topic", [name], **make_options(ids))
        raw_publish(pub, "com.bw.sentinel", ["sentinel"])
        received = set()
        for who, queue in queues.items():
            tag, args, _, details = await next_item(queue)
            if tag == "com.bw.topic":
                assert args == [name] and details.publication == publication
                received.add(who)
                tag, args, _, _ = await next_item(queue)
            assert (tag, args) == ("com.bw.sentinel", ["sentinel"])
        assert received == expected
        await aclose_raw(pub)
        for session in sessions.values():
            await session.close()

    run(scenario())


def test_blackwhite_lists_apply_to_publisher_with_exclude_me_false(broker_router):
    async def scenario():
        alice = await raw_join(broker_router, "rawsocket", "cbor", authid="alice")
        own = await raw_subscribe(alice, "com.bw.self")
        sentinel = await raw_subscribe(alice, "com.bw.self_sentinel")
        # exclude_me=false but alice is blacklisted by authid: she must not get it
        raw_publish(alice, "com.bw.self", ["blacklisted"], exclude_me=False,
                    exclude_authid=["alice"])
        raw_publish(alice, "com.bw.self", ["whitelisted"], exclude_me=False,
                    eligible_authrole=["alpha"])
        raw_publish(alice, "com.bw.self_sentinel", exclude_me=False)
        events = await raw_events_until(alice, sentinel)
        assert [(e[1], e[4]) for e in events] == [(own, ["whitelisted"])]
        await aclose_raw(alice)

    run(scenario())


# WELCOME ----------------------------------------------------------------------------------

PUBSUB_FEATURES = ("publisher_identification", "pattern_based_subscription",
                   "subscriber_blackwhite_listing", "publisher_exclusion")


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_welcome_announces_broker_features_and_valid_session_id(broker_router, transport,
                                                                 serializer):
    async def scenario():
        clients = [await raw_join(broker_router, transport, serializer) for _ in range(3)]
        ids = [client.session_id for client in clients]
        for session_id in ids:
            assert type(session_id) is int and 1 <= session_id <= 2 ** 53
        assert len(set(ids)) == 3
        details = clients[0].welcome_details
        assert details["realm"] == "realm1"
        assert details["authrole"] == "anonymous" and details["authmethod"] == "anonymous"
        assert isinstance(details["authid"], str) and details["authid"]
        features = details["roles"]["broker"]["features"]
        for feature in PUBSUB_FEATURES:
            assert features.get(feature) is True, f"broker feature {feature} not announced"
        # opaque payloads pass through (tests/test_ppt.py), in both dialects
        assert features.get("payload_passthru_mode") is True
        assert features.get("payload_transparency") is True
        assert all(value is True for value in features.values()), features
        await aclose_raw(*clients)

    run(scenario())


def test_welcome_for_ticket_principal(broker_router):
    async def scenario():
        carol = await raw_join(broker_router, "rawsocket", "msgpack", authid="carol")
        details = carol.welcome_details
        assert (details["authid"], details["authrole"], details["authmethod"]) == (
            "carol", "beta", "ticket")
        session = await connect(broker_router, "websocket", "cbor", authid="carol",
                                ticket=SECRETS["carol"])
        joined = await session.joined
        assert (joined.authid, joined.authrole) == ("carol", "beta")
        assert joined.session != carol.session_id
        await session.close()
        await aclose_raw(carol)

    run(scenario())
