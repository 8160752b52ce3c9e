"""Event retention as the WAMP spec defines it, over the wire."""

from __future__ import annotations

import asyncio
import json

import pytest
from autobahn.wamp.types import PublishOptions

from tests.clients import COMBINATIONS, connect, next_item, run
from tests.harness import RouterProcess
from tests.retention_helpers import (EVENT, SUBSCRIBED, call, joined, publish,
                                     retained_after_subscribe, retention_realm)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = retention_realm(
        retention={"decline": [{"uri": "com.noretain.", "match": "prefix"}],
                   "max_restricted": 2})
    process = RouterProcess(tmp_path_factory.mktemp("retention"), [realm]).start()
    yield process
    process.stop()


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_subscriber_gets_retained_event_with_original_id(router, transport, serializer):
    topic = f"com.ret.basic.{transport}.{serializer}"

    async def scenario():
        publisher = await connect(router, transport, serializer)
        published = await publisher.publish(topic, 21, unit="C",
                                            options=PublishOptions(retain=True, acknowledge=True))
        subscriber = await connect(router, transport, serializer)
        events = await subscriber.events(topic, get_retained=True)
        args, kwargs, details = await next_item(events)
        assert (args, kwargs) == ([21], {"unit": "C"})
        assert details.retained is True
        assert details.publication == published.id
        await subscriber.close()
        await publisher.close()

    run(scenario())


def test_without_get_retained_nothing_is_sent(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.ret.optin", ["old"], retain=True)
        subscriber = await joined(router, "websocket", "cbor")
        assert await retained_after_subscribe(router, subscriber, "com.ret.optin",
                                              "com.ret.optin") == []

    run(scenario())


def test_order_is_subscribed_then_retained_then_live(router):
    async def scenario():
        publisher = await joined(router)
        retained_id = await publish(publisher, "com.ret.order", ["retained"], retain=True)
        subscriber = await joined(router, "websocket", "msgpack")
        request = subscriber.next_request()
        subscriber.send([32, request, {"get_retained": True}, "com.ret.order"])
        live_id = await publish(publisher, "com.ret.order", ["live"])
        first, second, third = [await subscriber.recv() for _ in range(3)]
        assert first[0] == SUBSCRIBED
        assert second[0] == EVENT and second[2] == retained_id
        assert second[3]["retained"] is True and second[4] == ["retained"]
        assert third[0] == EVENT and third[2] == live_id and "retained" not in third[3]

    run(scenario())


def test_latest_retained_event_wins_and_non_retained_do_not_replace_it(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.ret.latest", ["first"], retain=True)
        second = await publish(publisher, "com.ret.latest", ["second"], retain=True)
        await publish(publisher, "com.ret.latest", ["not retained"])
        subscriber = await joined(router)
        events = await retained_after_subscribe(router, subscriber, "com.ret.latest",
                                                "com.ret.latest", get_retained=True)
        assert [(e[2], e[4]) for e in events] == [(second, ["second"])]

    run(scenario())


def test_disclosed_publisher_identity_is_kept(router):
    async def scenario():
        publisher = await joined(router, authid="alice")
        await publish(publisher, "com.ret.disclosed", ["x"], retain=True, disclose_me=True)
        await publish(publisher, "com.ret.hidden", ["y"], retain=True)
        subscriber = await joined(router)
        disclosed, = await retained_after_subscribe(router, subscriber, "com.ret.disclosed",
                                                    "com.ret.disclosed", get_retained=True)
        assert disclosed[3]["publisher"] == publisher.session_id
        assert disclosed[3]["publisher_authid"] == "alice"
        assert disclosed[3]["publisher_authrole"] == "alpha"
        other = await joined(router)
        hidden, = await retained_after_subscribe(router, other, "com.ret.hidden",
                                                 "com.ret.hidden", get_retained=True)
        assert "publisher" not in hidden[3]

    run(scenario())


def test_retain_wrong_type_is_a_protocol_violation(router):
    async def scenario():
        publisher = await joined(router)
        publisher.send([16, 1, {"retain": "yes"}, "com.ret.badtype", ["x"]])
        abort = await publisher.recv()
        assert abort[0] == 3 and abort[2] == "wamp.error.protocol_violation"
        publisher2 = await joined(router)
        publisher2.send([32, 1, {"get_retained": 1}, "com.ret.badtype"])
        abort = await publisher2.recv()
        assert abort[0] == 3 and abort[2] == "wamp.error.protocol_violation"

    run(scenario())


def test_retained_even_without_subscribers_and_declined_topics_are_not(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.noretain.x", ["declined"], retain=True)
        await publish(publisher, "com.ret.nobody", ["kept"], retain=True)
        subscriber = await joined(router)
        assert await retained_after_subscribe(router, subscriber, "com.noretain.x",
                                              "com.noretain.x", get_retained=True) == []
        kept = await retained_after_subscribe(router, subscriber, "com.ret.nobody",
                                              "com.ret.nobody", get_retained=True)
        assert [e[4] for e in kept] == [["kept"]]

    run(scenario())


@pytest.mark.parametrize("options,receives", [
    ({"exclude_authid": ["bob"]}, {"alice": True, "bob": False, "anon": True}),
    ({"exclude_authrole": ["alpha"]}, {"alice": False, "bob": True, "anon": True}),
    ({"eligible_authid": ["bob"]}, {"alice": False, "bob": True, "anon": False}),
    ({"eligible_authrole": ["alpha"]}, {"alice": True, "bob": False, "anon": False}),
    ({"eligible_authrole": ["alpha", "beta"], "exclude_authid": ["alice"]},
     {"alice": False, "bob": True, "anon": False}),
    ({"eligible_authid": []}, {"alice": False, "bob": False, "anon": False}),
])
def test_eligibility_by_authid_and_authrole(router, options, receives):
    topic = "com.ret.elig." + "_".join(sorted(options)) + str(len(str(options)))

    async def scenario():
        publisher = await joined(router, authid="carol")
        await publish(publisher, topic, ["general"], retain=True, exclude_me=False)
        restricted_id = await publish(publisher, topic, ["restricted"], retain=True, **options)
        got = {}
        for who in receives:
            client = await joined(router, authid=None if who == "anon" else who)
            events = await retained_after_subscribe(router, client, topic, topic,
                                                    get_retained=True)
            assert len(events) == 1
            got[who] = events[0][2] == restricted_id
            client.close()
        assert got == receives

    run(scenario())


def test_eligibility_by_session_id(router):
    async def scenario():
        publisher = await joined(router)
        insider = await joined(router)
        outsider = await joined(router)
        topic = "com.ret.elig.session"
        await publish(publisher, topic, ["general"], retain=True)
        restricted = await publish(publisher, topic, ["for insider"], retain=True,
                                   eligible=[insider.session_id])
        excluded = await joined(router)
        after_exclude = await publish(publisher, topic, ["not for excluded"], retain=True,
                                      exclude=[excluded.session_id])
        got_insider = await retained_after_subscribe(router, insider, topic, topic,
                                                     get_retained=True)
        got_outsider = await retained_after_subscribe(router, outsider, topic, topic,
                                                      get_retained=True)
        got_excluded = await retained_after_subscribe(router, excluded, topic, topic,
                                                      get_retained=True)
        assert [e[2] for e in got_insider] == [after_exclude]
        assert [e[2] for e in got_outsider] == [after_exclude]
        assert [e[4] for e in got_excluded] == [["general"]]
        assert restricted != after_exclude

    run(scenario())


def test_publisher_excluded_by_default_gets_the_previous_event(router):
    async def scenario():
        first = await joined(router)
        second = await joined(router)
        topic = "com.ret.exclude_me"
        await publish(first, topic, ["from first"], retain=True)
        await publish(second, topic, ["from second"], retain=True)
        own = await retained_after_subscribe(router, second, topic, topic, get_retained=True)
        assert [e[4] for e in own] == [["from first"]]
        other = await joined(router)
        theirs = await retained_after_subscribe(router, other, topic, topic, get_retained=True)
        assert [e[4] for e in theirs] == [["from second"]]
        await publish(first, "com.ret.exclude_me_off", ["mine too"], retain=True,
                      exclude_me=False)
        mine = await retained_after_subscribe(router, first, "com.ret.exclude_me_off",
                                              "com.ret.exclude_me_off", get_retained=True)
        assert [e[4] for e in mine] == [["mine too"]]

    run(scenario())


def test_restricted_events_supersede_only_for_their_audience(router):
    async def scenario():
        publisher = await joined(router)
        topic = "com.ret.supersede"
        await publish(publisher, topic, ["general"], retain=True)
        await publish(publisher, topic, ["alpha only"], retain=True, eligible_authrole=["alpha"])
        await publish(publisher, topic, ["beta only"], retain=True, eligible_authrole=["beta"])
        seen = {}
        for who in ("alice", "bob", None):
            client = await joined(router, authid=who)
            events = await retained_after_subscribe(router, client, topic, topic,
                                                    get_retained=True)
            seen[who] = [e[4] for e in events]
        assert seen == {"alice": [["alpha only"]], "bob": [["beta only"]], None: [["general"]]}
        await publish(publisher, topic, ["new general"], retain=True)
        client = await joined(router, authid="alice")
        events = await retained_after_subscribe(router, client, topic, topic, get_retained=True)
        assert [e[4] for e in events] == [["new general"]]

    run(scenario())


def test_restricted_tail_is_bounded_but_general_event_survives(router):
    async def scenario():
        publisher = await joined(router)
        topic = "com.ret.bounded"
        await publish(publisher, topic, ["general"], retain=True)
        await publish(publisher, topic, ["a1"], retain=True, eligible_authid=["alice"])
        await publish(publisher, topic, ["b1"], retain=True, eligible_authid=["bob"])
        await publish(publisher, topic, ["b2"], retain=True, eligible_authid=["bob"])
        alice = await joined(router, authid="alice")
        events = await retained_after_subscribe(router, alice, topic, topic, get_retained=True)
        assert [e[4] for e in events] == [["general"]]  # a1 fell out of the bounded tail (2)
        bob = await joined(router, authid="bob")
        events = await retained_after_subscribe(router, bob, topic, topic, get_retained=True)
        assert [e[4] for e in events] == [["b2"]]

    run(scenario())


def test_prefix_and_wildcard_subscriptions_get_every_matching_topic(router):
    async def scenario():
        publisher = await joined(router)
        ids = {}
        for topic in ("com.pat.a.temp", "com.pat.b.temp", "com.pat.b.humidity",
                      "com.pat.bc.temp", "com.other.temp"):
            ids[topic] = await publish(publisher, topic, [topic], retain=True)
        subscriber = await joined(router, "websocket", "json")
        prefix = await retained_after_subscribe(router, subscriber, "com.pat.b",
                                                "com.pat.b.sentinel", match="prefix",
                                                get_retained=True)
        assert {e[3]["topic"]: e[2] for e in prefix} == {
            t: ids[t] for t in ("com.pat.b.temp", "com.pat.b.humidity", "com.pat.bc.temp")}
        assert all(e[3]["retained"] is True for e in prefix)
        other = await joined(router)
        wildcard = await retained_after_subscribe(router, other, "com.pat..temp",
                                                  "com.pat.z.temp", match="wildcard",
                                                  get_retained=True)
        assert {e[3]["topic"] for e in wildcard} == {"com.pat.a.temp", "com.pat.b.temp",
                                                    "com.pat.bc.temp"}

    run(scenario())


def test_ttl_expires_retained_event(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.ret.ttl", ["short-lived"], retain=True, _retain_ttl=0.5)
        await publish(publisher, "com.ret.ttl_long", ["long-lived"], retain=True, _retain_ttl=60)
        first = await joined(router)
        events = await retained_after_subscribe(router, first, "com.ret.ttl", "com.ret.ttl",
                                                get_retained=True)
        assert [e[4] for e in events] == [["short-lived"]]
        await asyncio.sleep(0.6)  # the TTL is the feature under test: let it pass
        second = await joined(router)
        assert await retained_after_subscribe(router, second, "com.ret.ttl", "com.ret.ttl",
                                              get_retained=True) == []
        events = await retained_after_subscribe(router, second, "com.ret.ttl_long",
                                                "com.ret.ttl_long", get_retained=True)
        assert [e[4] for e in events] == [["long-lived"]]

    run(scenario())


def test_retain_clear_option_removes_the_retained_event(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.ret.clear", ["stale"], retain=True)
        await publish(publisher, "com.ret.clear", _retain_clear=True)
        subscriber = await joined(router)
        assert await retained_after_subscribe(router, subscriber, "com.ret.clear",
                                              "com.ret.clear", get_retained=True) == []

    run(scenario())


def test_operator_lists_and_purges_and_others_may_not(router):
    async def scenario():
        publisher = await joined(router)
        await publish(publisher, "com.admin.one", [1], retain=True)
        await publish(publisher, "com.admin.two", [2], retain=True)
        anonymous = await joined(router)
        denied = await call(anonymous, "wamp.retained.purge", kwargs={"prefix": ""})
        assert denied[0] == 8 and denied[4] == "wamp.error.not_authorized"
        operator = await joined(router, authid="op")
        listed = await call(operator, "wamp.retained.list", ["com.admin."])
        assert [item["topic"] for item in listed[3][0]] == ["com.admin.one", "com.admin.two"]
        purged = await call(operator, "wamp.retained.purge", kwargs={"prefix": "com.admin."})
        assert purged[3] == [2]
        listed = await call(operator, "wamp.retained.list", ["com.admin."])
        assert listed[3] == [[]]

    run(scenario())


def test_limits_evict_the_topic_set_longest_ago(tmp_path):
    realm = retention_realm(retention={"max_topics": 3})
    router = RouterProcess(tmp_path, [realm]).start()
    try:
        async def scenario():
            publisher = await joined(router)
            for n in range(4):
                await publish(publisher, f"com.lim.t{n}", [n], retain=True)
            subscriber = await joined(router)
            events = await retained_after_subscribe(router, subscriber, "com.lim.",
                                                    "com.lim.sentinel", match="prefix",
                                                    get_retained=True)
            assert sorted(e[3]["topic"] for e in events) == ["com.lim.t1", "com.lim.t2",
                                                            "com.lim.t3"]

        run(scenario())
    finally:
        router.stop()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_acknowledged_retained_events_survive_a_restart(tmp_path, how):
    router = RouterProcess(tmp_path, [retention_realm()]).start()
    try:
        async def before():
            publisher = await joined(router, authid="alice")
            ids = {"plain": await publish(publisher, "com.dur.plain", ["kept"], retain=True,
                                          disclose_me=True),
                   "by_role": await publish(publisher, "com.dur.role", ["alpha"], retain=True,
                                            eligible_authrole=["alpha"])}
            await publish(publisher, "com.dur.session", ["gone"], retain=True,
                          eligible=[publisher.session_id])
            binary = await publish(publisher, "com.dur.binary", [b"\x00\xffbytes"], retain=True)
            # a general event, then a restricted one: the topic's row is written again with
            # both, so the general event is re-encoded from memory for that second write
            ids["mixed_general"] = await publish(publisher, "com.dur.mixed", ["everyone"],
                                                 retain=True)
            ids["mixed_alpha"] = await publish(publisher, "com.dur.mixed", ["alpha only"],
                                               retain=True, eligible_authrole=["alpha"])
            return ids, binary

        ids, binary_id = run(before())
        if how == "kill9":
            router.kill9()
        else:
            assert router.stop() == 0
        router.start()

        async def after():
            alice = await joined(router, authid="alice")
            plain = await retained_after_subscribe(router, alice, "com.dur.plain",
                                                   "com.dur.plain", get_retained=True)
            assert [(e[2], e[4], e[3]["publisher_authid"]) for e in plain] == [
                (ids["plain"], ["kept"], "alice")]
            role = await retained_after_subscribe(router, alice, "com.dur.role", "com.dur.role",
                                                  get_retained=True)
            assert [e[2] for e in role] == [ids["by_role"]]
            bob = await joined(router, authid="bob")
            assert await retained_after_subscribe(router, bob, "com.dur.role", "com.dur.role",
                                                  get_retained=True) == []
            mixed = await retained_after_subscribe(router, bob, "com.dur.mixed", "com.dur.mixed",
                                                   get_retained=True)
            assert [(e[2], e[4]) for e in mixed] == [(ids["mixed_general"], ["everyone"])]
            carol = await joined(router, authid="carol")  # alpha, and not the publisher
            mixed = await retained_after_subscribe(router, carol, "com.dur.mixed",
                                                   "com.dur.mixed", get_retained=True)
            assert [(e[2], e[4]) for e in mixed] == [(ids["mixed_alpha"], ["alpha only"])]
            again = await joined(router, authid="alice")
            assert await retained_after_subscribe(router, again, "com.dur.session",
                                                  "com.dur.session", get_retained=True) == []
            binary = await joined(router, "rawsocket", "msgpack")
            events = await retained_after_subscribe(router, binary, "com.dur.binary",
                                                    "com.dur.binary", get_retained=True)
            assert [(e[2], e[4]) for e in events] == [(binary_id, [b"\x00\xffbytes"])]

        run(after())
    finally:
        router.stop()


def test_cli_lists_and_purges_retained_events_of_a_running_router(router):
    import os
    import subprocess
    import sys

    async def seed():
        publisher = await joined(router)
        await publish(publisher, "com.cli.one", [1], retain=True)
        await publish(publisher, "com.cli.two", [2], retain=True)

    run(seed())
    env = dict(os.environ, ROUTER_TICKET="operator-secret")
    base = [sys.executable, "-m", "router", "retained"]
    common = ["--realm", "realm1", "--url", router.urls["websocket"], "--authid", "op"]
    listed = subprocess.run(base + ["list", "--json", "--prefix", "com.cli."] + common, env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [item["topic"] for item in json.loads(listed.stdout)] == ["com.cli.one", "com.cli.two"]
    purged = subprocess.run(base + ["purge", "--topic", "com.cli.one"] + common, env=env,
                            capture_output=True, text=True, timeout=60)
    assert purged.returncode == 0 and "purged 1 retained topic(s)" in purged.stdout, \
        purged.stderr
    denied = subprocess.run(base + ["purge", "--prefix", ""] + common[:4], env=env,
                            capture_output=True, text=True, timeout=60)
    assert denied.returncode != 0 and "wamp.error.not_authorized" in denied.stderr
    assert "without --url and --authid: it then uses the admin socket" in denied.stderr

    async def check():
        subscriber = await joined(router)
        events = await retained_after_subscribe(router, subscriber, "com.cli.", "com.cli.zz",
                                                match="prefix", get_retained=True)
        assert [e[3]["topic"] for e in events] == ["com.cli.two"]

    run(check())
