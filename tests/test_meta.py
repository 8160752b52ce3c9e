"""Session meta API, subscription meta API and session testaments against the real router."""

from __future__ import annotations

import asyncio

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from router.core.credentials import hash_secret
from tests.clients import TIMEOUT, Sessions, next_item, run
from tests.harness import OPEN_ROLE, RouterProcess, realm_file

NO_SUCH_SESSION = "wamp.error.no_such_session"
NO_SUCH_SUBSCRIPTION = "wamp.error.no_such_subscription"
NOT_AUTHORIZED = "wamp.error.not_authorized"

# realm2: anonymous may subscribe/call on com.* and use the session meta API, but may
# publish only under com.pub.; the ticket user 'alice' has the role 'user'.
REALM2 = realm_file(
    "realm2",
    roles={
        "anonymous": [
            {"uri": "com.", "match": "prefix", "allow": ["subscribe", "call", "register"]},
            {"uri": "com.pub.", "match": "prefix", "allow": ["publish"]},
            {"uri": "wamp.session.", "match": "prefix", "allow": ["call", "subscribe"]},
        ],
        "user": OPEN_ROLE,
    },
    principals={"alice": {"role": "user", "ticket": hash_secret("s3cret", iterations=1000)}},
)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("router-meta"),
                            [realm_file("realm1"), REALM2]).start()
    yield process
    process.stop()


def session_id(session) -> int:
    return session.joined.result().session


def details_of(session):
    return session.joined.result()


async def expect_error(awaitable, *uris: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await asyncio.wait_for(awaitable, TIMEOUT)
    assert info.value.error in uris, f"expected {uris}, got {info.value.error}: {info.value}"
    return info.value


async def disconnect(session, how: str) -> None:
    """'leave' = GOODBYE handshake; 'abort' = drop the TCP connection, no goodbye at all."""
    if how == "leave":
        await session.close()
    else:
        session._transport.transport.abort()
        await asyncio.wait_for(asyncio.shield(session.disconnected), TIMEOUT)


async def until(queue: asyncio.Queue, predicate, timeout: float = TIMEOUT):
    """The first item of ``queue`` that satisfies ``predicate`` (others are skipped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        item = await asyncio.wait_for(queue.get(), max(0.01, deadline - loop.time()))
        if predicate(item):
            return item


# --------------------------------------------------------------------------------------
# session meta API


def test_session_count_list_get(router):
    async def scenario():
        async with Sessions(router) as open_session:
            me = await open_session(realm="realm2")
            other = await open_session("rawsocket", "msgpack", realm="realm2")
            alice = await open_session("rawsocket", "cbor", realm="realm2", authid="alice",
                                       ticket="s3cret")
            assert details_of(alice).authrole == "user"
            ids = {session_id(s) for s in (me, other, alice)}

            listed = await me.call("wamp.session.list")
            assert ids <= set(listed) and len(listed) == len(set(listed))
            assert await me.call("wamp.session.count") == len(listed)

            assert await me.call("wamp.session.list", ["user"]) == [session_id(alice)]
            assert await me.call("wamp.session.count", ["user"]) == 1
            anonymous = await me.call("wamp.session.list", ["anonymous"])
            assert {session_id(me), session_id(other)} <= set(anonymous)
            assert session_id(alice) not in anonymous
            assert set(await me.call("wamp.session.list", ["anonymous", "user"])) >= ids
            assert await me.call("wamp.session.list", ["nobody"]) == []
            assert await me.call("wamp.session.count", ["nobody"]) == 0

            got = await me.call("wamp.session.get", session_id(other))
            assert got["session"] == session_id(other)
            host, port = other._transport.transport.get_extra_info("sockname")[:2]
            assert got["transport"] == {"type": "wamp.rawsocket", "peer": f"tcp4:{host}:{port}"}
            assert got["authid"] == details_of(other).authid
            assert got["authrole"] == "anonymous"
            assert got["authmethod"] == "anonymous"
            got = await other.call("wamp.session.get", session_id(alice))
            assert (got["session"], got["authid"], got["authrole"], got["authmethod"]) == (
                session_id(alice), "alice", "user", "ticket")
            own = await me.call("wamp.session.get", session_id(me))
            assert own["session"] == session_id(me)
            host, port = me._transport.transport.get_extra_info("sockname")[:2]
            assert own["transport"] == {"type": "wamp.websocket", "peer": f"tcp4:{host}:{port}"}

            await expect_error(me.call("wamp.session.get", 424242), NO_SUCH_SESSION)
            # A session of another realm is not visible here.
            stranger = await open_session(realm="realm1")
            await expect_error(me.call("wamp.session.get", session_id(stranger)),
                               NO_SUCH_SESSION)
            assert session_id(stranger) not in await me.call("wamp.session.list")

            # Once a session is gone, it is gone from the meta API too.
            gone = session_id(other)
            await other.close()
            await expect_error(me.call("wamp.session.get", gone), NO_SUCH_SESSION)
            assert gone not in await me.call("wamp.session.list")

    run(scenario())


@pytest.mark.parametrize("how", ["leave", "abort"])
def test_session_join_and_leave_meta_events(router, how):
    async def scenario():
        async with Sessions(router) as open_session:
            observer = await open_session("rawsocket", "json")
            joins = await observer.events("wamp.session.on_join")
            leaves = await observer.events("wamp.session.on_leave")
            newcomer = await open_session("websocket", "cbor")
            sid, details = session_id(newcomer), details_of(newcomer)

            args, kwargs, _ = await until(
                joins, lambda e: e[0] and isinstance(e[0][0], dict)
                and e[0][0].get("session") == sid)
            joined = args[0]
            assert joined["authid"] == details.authid
            assert joined["authrole"] == details.authrole == "anonymous"

            await disconnect(newcomer, how)
            args, kwargs, _ = await until(leaves, lambda e: e[0] and e[0][0] == sid)
            assert args == [sid, details.authid, "anonymous"]

    run(scenario())


# --------------------------------------------------------------------------------------
# subscription meta API

META_EVENTS = ("on_create", "on_subscribe", "on_unsubscribe", "on_delete")


async def watch_subscription_meta(observer) -> asyncio.Queue:
    """One queue, in arrival order, of (event name, args) for all four meta events."""
    received: asyncio.Queue = asyncio.Queue()
    for name in META_EVENTS:
        def on_event(*args, _name=name, **kwargs):
            received.put_nowait((_name, list(args)))
        await observer.subscribe(on_event, f"wamp.subscription.{name}")
    return received


async def collect_meta(received: asyncio.Queue, ids: set[int], uris: set[str], stop) -> list:
    """Meta events about our subscriptions, up to and including the ``stop`` event."""
    events = []
    while True:
        name, args = await next_item(received)
        if name == "on_create":
            if args[1]["uri"] not in uris:
                continue
            ids.add(args[1]["id"])
        elif args[1] not in ids:
            continue
        events.append((name, args))
        if stop(events):
            return events


def test_subscription_meta_events_and_procedures(router):
    async def scenario():
        async with Sessions(router) as open_session:
            observer = await open_session()
            received = await watch_subscription_meta(observer)
            first = await open_session("rawsocket", "msgpack")
            second = await open_session("websocket", "cbor")
            topic = "com.meta.sub.alpha"
            ids: set[int] = set()

            sub1 = await first.subscribe(lambda *a: None, topic)
            sub2 = await second.subscribe(lambda *a: None, topic)
            events = await collect_meta(
                received, ids, {topic},
                lambda ev: ev[-1] == ("on_subscribe", [session_id(second), ev[-1][1][1]]))
            sub_id = sub1.id
            assert sub2.id == sub_id, "subscribers of one topic share the subscription"
            [(name, args)] = [e for e in events if e[0] == "on_create"]
            assert args[0] == session_id(first)
            assert {k: args[1][k] for k in ("id", "uri", "match")} == {
                "id": sub_id, "uri": topic, "match": "exact"}
            assert isinstance(args[1]["created"], str) and args[1]["created"]
            assert events == [
                ("on_create", [session_id(first), args[1]]),
                ("on_subscribe", [session_id(first), sub_id]),
                ("on_subscribe", [session_id(second), sub_id]),
            ]

            # procedures
            prefix_sub = await first.subscribe(lambda *a, **k: None, "com.meta.sub.",
                                               options=SubscribeOptions(match="prefix"))
            listed = await observer.call("wamp.subscription.list")
            assert sub_id in listed["exact"] and prefix_sub.id in listed["prefix"]
            assert sub_id not in listed["prefix"] + listed["wildcard"]
            assert await observer.call("wamp.subscription.lookup", topic) == sub_id
            assert await observer.call("wamp.subscription.lookup", topic,
                                       {"match": "exact"}) == sub_id
            assert await observer.call("wamp.subscription.lookup", "com.meta.sub.",
                                       {"match": "prefix"}) == prefix_sub.id
            assert await observer.call("wamp.subscription.lookup", topic,
                                       {"match": "prefix"}) is None
            assert await observer.call("wamp.subscription.lookup", "com.meta.none") is None
            assert sorted(await observer.call("wamp.subscription.match", topic)) == sorted(
                [sub_id, prefix_sub.id])
            assert await observer.call("wamp.subscription.match", "com.meta.other") is None
            got = await observer.call("wamp.subscription.get", sub_id)
            assert (got["id"], got["uri"], got["match"]) == (sub_id, topic, "exact")
            assert got["created"] == args[1]["created"]
            assert sorted(await observer.call("wamp.subscription.list_subscribers", sub_id)) \
                == sorted([session_id(first), session_id(second)])
            assert await observer.call("wamp.subscription.count_subscribers", sub_id) == 2

            # unsubscribe one: on_unsubscribe only; disconnect the other abruptly: then delete
            await sub2.unsubscribe()
            events = await collect_meta(received, ids, {topic},
                                        lambda ev: ev[-1][0] == "on_unsubscribe")
            assert events == [("on_unsubscribe", [session_id(second), sub_id])]
            assert await observer.call("wamp.subscription.count_subscribers", sub_id) == 1
            assert await observer.call("wamp.subscription.list_subscribers", sub_id) == [
                session_id(first)]

            ids.add(prefix_sub.id)
            await disconnect(first, "abort")
            events = await collect_meta(
                received, ids, {topic},
                lambda ev: {a[1] for n, a in ev if n == "on_delete"} >= {sub_id, prefix_sub.id})
            by_sub = {s: [(n, a) for n, a in events if a[1] == s]
                      for s in (sub_id, prefix_sub.id)}
            for sid_ in (sub_id, prefix_sub.id):
                assert by_sub[sid_] == [("on_unsubscribe", [session_id(first), sid_]),
                                        ("on_delete", [session_id(first), sid_])]

            for procedure in ("get", "list_subscribers", "count_subscribers"):
                await expect_error(observer.call(f"wamp.subscription.{procedure}", sub_id),
                                   NO_SUCH_SUBSCRIPTION)
            assert await observer.call("wamp.subscription.lookup", topic) is None
            listed = await observer.call("wamp.subscription.list")
            assert sub_id not in listed["exact"] and prefix_sub.id not in listed["prefix"]

    run(scenario())


@pytest.mark.parametrize("how", ["leave", "abort"])
def test_subscriber_leaving_fires_unsubscribe_then_delete(router, how):
    async def scenario():
        async with Sessions(router) as open_session:
            observer = await open_session("rawsocket", "cbor")
            received = await watch_subscription_meta(observer)
            subscriber = await open_session()
            topic, pattern = f"com.meta.leave.{how}", f"com.meta..{how}"
            ids: set[int] = set()
            exact = await subscriber.subscribe(lambda *a: None, topic)
            wild = await subscriber.subscribe(lambda *a, **k: None, pattern,
                                              options=SubscribeOptions(match="wildcard"))
            sid = session_id(subscriber)
            created = await collect_meta(
                received, ids, {topic, pattern},
                lambda ev: sum(1 for n, _ in ev if n == "on_subscribe") == 2)
            assert [(n, a[0]) for n, a in created] == [("on_create", sid), ("on_subscribe", sid),
                                                       ("on_create", sid), ("on_subscribe", sid)]
            assert [a[1]["match"] for n, a in created if n == "on_create"] == ["exact",
                                                                              "wildcard"]
            await disconnect(subscriber, how)
            events = await collect_meta(
                received, ids, set(),
                lambda ev: sum(1 for n, _ in ev if n == "on_delete") == 2)
            for sub in (exact.id, wild.id):
                assert [(n, a) for n, a in events if a[1] == sub] == [
                    ("on_unsubscribe", [sid, sub]), ("on_delete", [sid, sub])]

    run(scenario())


def test_meta_procedures_reject_bad_arguments(router):
    async def scenario():
        async with Sessions(router) as open_session:
            me = await open_session()
            for procedure, args in (("wamp.session.get", ["not-an-id"]),
                                    ("wamp.session.get", []),
                                    ("wamp.session.list", ["anonymous"]),
                                    ("wamp.subscription.get", []),
                                    ("wamp.subscription.lookup", [42])):
                await expect_error(me.call(procedure, *args), "wamp.error.invalid_argument")
            # The session is still fine afterwards.
            assert isinstance(await me.call("wamp.session.count"), int)

    run(scenario())


# --------------------------------------------------------------------------------------
# testaments


async def publish_sentinel(publisher, topic: str) -> None:
    """A publication the router orders after everything it did before it got this PUBLISH."""
    await publisher.publish(topic, "sentinel", options=PublishOptions(acknowledge=True))


@pytest.mark.parametrize("how", ["leave", "abort"])
@pytest.mark.parametrize("transport,serializer", [("websocket", "json"), ("rawsocket", "cbor")])
def test_testament_is_published_when_the_session_goes(router, how, transport, serializer):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session()
            topic = f"com.testament.{how}.{transport}.{serializer}"
            events = await subscriber.events(topic)
            leaves = await subscriber.events("wamp.session.on_leave")
            testator = await open_session(transport, serializer)
            result = await testator.call("wamp.session.add_testament", topic, ["bye", 1],
                                         {"who": "testator"})
            assert result is None
            sid = session_id(testator)
            await disconnect(testator, how)
            args, kwargs, _ = await next_item(events)
            assert (args, kwargs) == (["bye", 1], {"who": "testator"})
            await until(leaves, lambda e: e[0][0] == sid)
            assert events.empty(), "the testament was published more than once"

    run(scenario())


def test_testament_is_not_published_while_the_session_lives(router):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session()
            publisher = await open_session()
            topic = "com.testament.alive"
            events = await subscriber.events(topic)
            testator = await open_session()
            await testator.call("wamp.session.add_testament", topic, ["bye"], {})
            await publish_sentinel(publisher, topic)
            args, _, _ = await next_item(events)
            assert args == ["sentinel"]
            await testator.close()
            args, _, _ = await next_item(events)
            assert args == ["bye"]

    run(scenario())


def test_flush_testaments_returns_the_count_and_nothing_is_published(router):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session()
            publisher = await open_session("rawsocket", "json")
            topic = "com.testament.flushed"
            events = await subscriber.events(topic)
            testator = await open_session("rawsocket", "msgpack")
            add = "wamp.session.add_testament"
            await testator.call(add, topic, ["destroyed-1"], {})
            await testator.call(add, topic, ["destroyed-2"], {}, scope="destroyed")
            await testator.call(add, topic, ["detached-1"], {}, scope="detached")
            assert await testator.call("wamp.session.flush_testaments") == 2
            assert await testator.call("wamp.session.flush_testaments") == 0
            assert await testator.call("wamp.session.flush_testaments", scope="detached") == 1
            assert await testator.call("wamp.session.flush_testaments",
                                       scope="destroyed") == 0
            # A testament added after the flush still counts.
            await testator.call(add, topic, ["after-flush"], {}, scope="detached")
            await disconnect(testator, "abort")
            args, _, _ = await next_item(events)
            assert args == ["after-flush"]
            await publish_sentinel(publisher, topic)
            args, _, _ = await next_item(events)
            assert args == ["sentinel"], f"a flushed testament was published: {args}"

    run(scenario())


def test_flushed_testaments_publish_nothing(router):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session()
            publisher = await open_session()
            topic = "com.testament.all_flushed"
            events = await subscriber.events(topic)
            leaves = await subscriber.events("wamp.session.on_leave")
            testator = await open_session()
            await testator.call("wamp.session.add_testament", topic, ["gone"], {})
            await testator.call("wamp.session.add_testament", topic, ["gone"], {},
                                scope="detached")
            assert await testator.call("wamp.session.flush_testaments") == 1
            assert await testator.call("wamp.session.flush_testaments", scope="detached") == 1
            sid = session_id(testator)
            await disconnect(testator, "leave")
            await until(leaves, lambda e: e[0][0] == sid)
            await publish_sentinel(publisher, topic)
            args, _, _ = await next_item(events)
            assert args == ["sentinel"], f"a flushed testament was published: {args}"

    run(scenario())


def test_detached_testaments_are_published_before_destroyed_ones(router):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session("rawsocket", "cbor")
            topic = "com.testament.order"
            events = await subscriber.events(topic)
            testator = await open_session()
            add = "wamp.session.add_testament"
            await testator.call(add, topic, ["destroyed-1"], {})
            await testator.call(add, topic, ["detached-1"], {}, scope="detached")
            await testator.call(add, topic, ["destroyed-2"], {}, scope="destroyed")
            await testator.call(add, topic, ["detached-2"], {}, scope="detached")
            await disconnect(testator, "abort")
            order = [(await next_item(events))[0][0] for _ in range(4)]
            assert order == ["detached-1", "detached-2", "destroyed-1", "destroyed-2"]

    run(scenario())


def test_testament_honours_publish_options(router):
    async def scenario():
        async with Sessions(router) as open_session:
            chosen = await open_session()
            other = await open_session("rawsocket", "msgpack")
            publisher = await open_session()
            topic = "com.testament.options"
            chosen_events = await chosen.events(topic)
            other_events = await other.events(topic)
            testator = await open_session()
            await testator.call("wamp.session.add_testament", topic, ["for you"], {},
                                publish_options={"eligible": [session_id(chosen)]})
            await disconnect(testator, "leave")
            args, _, _ = await next_item(chosen_events)
            assert args == ["for you"]
            await publish_sentinel(publisher, topic)
            args, _, _ = await next_item(other_events)
            assert args == ["sentinel"], "the testament reached a session not in 'eligible'"

    run(scenario())


@pytest.mark.parametrize("kwargs", [{"scope": "sometime"}, {"scope": 1},
                                    {"publish_options": {"acknowledge": "yes"}}])
def test_add_testament_with_bad_options_is_refused(router, kwargs):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session()
            publisher = await open_session()
            topic = "com.testament.bad"
            events = await subscriber.events(topic)
            testator = await open_session()
            await expect_error(
                testator.call("wamp.session.add_testament", topic, ["x"], {}, **kwargs),
                "wamp.error.invalid_argument", "wamp.error.testament_error")
            if "scope" in kwargs:
                await expect_error(
                    testator.call("wamp.session.flush_testaments", **kwargs),
                    "wamp.error.invalid_argument", "wamp.error.testament_error")
            await disconnect(testator, "leave")
            await publish_sentinel(publisher, topic)
            args, _, _ = await next_item(events)
            assert args == ["sentinel"], "a refused testament was published"

    run(scenario())


def test_testament_on_a_topic_the_role_may_not_publish(router):
    async def scenario():
        async with Sessions(router) as open_session:
            subscriber = await open_session(realm="realm2")
            publisher = await open_session(realm="realm2", authid="alice", ticket="s3cret")
            events = await subscriber.events("com.nopub.will")
            allowed_events = await subscriber.events("com.pub.will")
            testator = await open_session("rawsocket", "json", realm="realm2")
            add = "wamp.session.add_testament"
            await expect_error(testator.call(add, "com.nopub.will", ["x"], {}), NOT_AUTHORIZED)
            await expect_error(testator.call(add, "wamp.session.on_leave", ["x"], {}),
                               NOT_AUTHORIZED)
            await testator.call(add, "com.pub.will", ["allowed"], {})  # the control
            await disconnect(testator, "abort")
            args, _, _ = await next_item(allowed_events)
            assert args == ["allowed"]
            await publish_sentinel(publisher, "com.nopub.will")
            args, _, _ = await next_item(events)
            assert args == ["sentinel"], "a refused testament was published"

    run(scenario())
