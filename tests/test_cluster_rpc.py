"""RPC and the session meta API across three router nodes on one real redis-server.

Callers are on node a, callees on b and c. A node learns another node's registrations a
moment after they are made, in the order Redis took them: :func:`synced` registers a
marker after the registrations under test and calls it from the caller's node until it
answers; every earlier registration is then known there too.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, RegisterOptions, SubscribeOptions

from tests.clients import TIMEOUT, connect, raw_connect, run
from tests.harness import RedisServer, RouterProcess, realm_file, redis_cluster

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (README command 2)")

NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
_names = itertools.count(1)


def start_node(base, redis: RedisServer, name: str, **cluster) -> RouterProcess:
    """A node of the cluster; ``cluster`` sets the config's ``cluster`` bounds."""
    extra = {"engine": {"type": "redis", "url": redis.url, "node": name}}
    if cluster:
        extra["cluster"] = cluster
    return RouterProcess(base / name, [realm_file("realm1")], extra_config=extra).start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("cluster-rpc"), start_node) as running:
        yield running


def procedure(prefix: str = "rpc") -> str:
    return f"cl.{prefix}.p{next(_names)}"


async def synced(caller, registrar) -> None:
    """Wait until ``caller``'s node knows every registration made so far (see the module
    docstring); ``registrar`` is any session of the cluster."""
    marker = procedure("sync")
    await registrar.register(lambda: "synced", marker)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert await asyncio.wait_for(caller.call(marker), TIMEOUT) == "synced"
            return
        except ApplicationError as exc:
            assert exc.error == NO_SUCH_PROCEDURE and time.monotonic() < deadline, exc
            await asyncio.sleep(0.02)


async def expect_error(awaitable, uri: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await asyncio.wait_for(awaitable, TIMEOUT)
    assert info.value.error == uri, f"expected {uri}, got {info.value.error}: {info.value}"
    return info.value


async def callees(nodes, uri: str, policy: str) -> dict:
    """A callee answering its node's name on b, then one on c, under ``policy``."""
    sessions = {}
    for name in ("b", "c"):
        session = sessions[name] = await connect(nodes[name], "rawsocket", "msgpack")
        await session.register(lambda name=name: name, uri,
                               options=RegisterOptions(invoke=policy))
    return sessions


async def caller_of(nodes, uri: str, policy: str) -> tuple:
    """Callees on b and c under ``policy`` (:func:`callees`) and a caller on a that knows
    both registrations: (caller, callee sessions)."""
    sessions = await callees(nodes, uri, policy)
    caller = await connect(nodes["a"])
    await synced(caller, sessions["c"])
    return caller, sessions


async def close_all(*sessions) -> None:
    for session in sessions:
        await session.close()


def test_call_result_errors_disclosure_and_patterns_across_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        callee = await connect(nodes["b"], "rawsocket", "cbor")
        caller = await connect(nodes["a"])
        base = procedure()

        def echo(*args, details=None, **kwargs):
            return [list(args), kwargs, details.caller, details.procedure]

        def fail(reason):
            raise ApplicationError("com.example.error.x", reason, code=42)

        await callee.register(echo, f"{base}.echo",
                              options=RegisterOptions(details_arg="details"))
        await callee.register(fail, f"{base}.fail")
        await callee.register(echo, f"{base}.pre.", options=RegisterOptions(
            match="prefix", details_arg="details"))
        await callee.register(echo, f"{base}..get", options=RegisterOptions(
            match="wildcard", details_arg="details"))
        await synced(caller, callee)
        assert (await caller.call(f"{base}.echo", 1, [2.5, None], key={"x": True}))[:3] == [
            [1, [2.5, None]], {"key": {"x": True}}, None]  # not disclosed unasked
        discloser = await raw_connect(nodes["a"], "rawsocket", "msgpack")
        caller_id = (await discloser.hello())[1]
        discloser.send([48, 1, {"disclose_me": True}, f"{base}.echo"])
        reply = await discloser.recv()
        assert reply[:3] == [50, 1, {}] and reply[3][0][:3] == [[], {}, caller_id], reply
        discloser.close()
        error = await expect_error(caller.call(f"{base}.fail", "because"),
                                   "com.example.error.x")
        assert (error.args, error.kwargs) == (("because",), {"code": 42})
        assert (await caller.call(f"{base}.pre.x.y", 7))[::3] == [[7], f"{base}.pre.x.y"]
        assert (await caller.call(f"{base}.item.get"))[3] == f"{base}.item.get"
        await expect_error(caller.call(f"{base}.item.put"), NO_SUCH_PROCEDURE)
        await expect_error(caller.call(procedure("nobody")), NO_SUCH_PROCEDURE)
        await close_all(callee, caller)

    run(scenario())


def test_roundrobin_alternates_between_callees_on_two_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        uri = procedure()
        caller, sessions = await caller_of(nodes, uri, "roundrobin")
        assert [await caller.call(uri) for _ in range(6)] == ["b", "c"] * 3
        await close_all(caller, *sessions.values())

    run(scenario())


def test_random_reaches_callees_on_both_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        uri = procedure()
        caller, sessions = await caller_of(nodes, uri, "random")
        results = [await caller.call(uri) for _ in range(40)]
        assert 5 <= results.count("b") <= 35, results  # fails with odds of about 1e-6
        await close_all(caller, *sessions.values())

    run(scenario())


@pytest.mark.parametrize("policy,picked,then", [("first", "b", "c"), ("last", "c", "b")])
def test_first_and_last_pick_by_registration_order_in_the_cluster(cluster, policy, picked,
                                                                  then):
    _, nodes = cluster

    async def scenario():
        uri = procedure()
        caller, sessions = await caller_of(nodes, uri, policy)
        assert [await caller.call(uri) for _ in range(3)] == [picked] * 3
        await sessions.pop(picked).close()
        await synced(caller, sessions[then])  # the leave is known at a now
        assert await caller.call(uri) == then
        await close_all(caller, *sessions.values())

    run(scenario())


def test_single_and_policy_conflicts_are_refused_across_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        first = await connect(nodes["b"])
        second = await connect(nodes["c"], "rawsocket", "json")
        single, shared = procedure(), procedure()
        await first.register(lambda: "first", single)
        await expect_error(second.register(lambda: "second", single),
                           "wamp.error.procedure_already_exists")
        await first.register(lambda: "rr", shared, options=RegisterOptions(invoke="roundrobin"))
        await expect_error(second.register(lambda: "first", shared,
                                           options=RegisterOptions(invoke="first")),
                           "wamp.error.procedure_exists_with_different_invocation_policy")
        caller = await connect(nodes["a"])
        await synced(caller, first)
        assert await caller.call(single) == "first"
        await first.close()  # the procedure is free again, for a session on any node
        await second.register(lambda: "second", single)
        await synced(caller, second)
        assert await caller.call(single) == "second"
        await close_all(second, caller)

    run(scenario())


def test_progressive_results_across_nodes(cluster):
    _, nodes = cluster

    async def scenario():
        callee = await connect(nodes["c"], "rawsocket", "cbor")
        caller = await connect(nodes["a"])
        uri = procedure()

        async def count(n, details=None):
            for i in range(n):
                details.progress(i, step=f"s{i}")
            return "done"

        await callee.register(count, uri, options=RegisterOptions(details_arg="details"))
        await synced(caller, callee)
        progress = []
        assert await caller.call(uri, 3, options=CallOptions(
            on_progress=lambda *a, **kw: progress.append((a, kw)))) == "done"
        assert progress == [((i,), {"step": f"s{i}"}) for i in range(3)]
        await close_all(callee, caller)

    run(scenario())


def _never_answering(started: asyncio.Future, interrupted: asyncio.Future):
    async def never(*args):
        started.set_result(args)
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            interrupted.set_result(True)
            raise
    return never


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_cancel_and_timeout_interrupt_the_callee_on_another_node(cluster, how):
    _, nodes = cluster

    async def scenario():
        loop = asyncio.get_running_loop()
        started, interrupted = loop.create_future(), loop.create_future()
        callee = await connect(nodes["b"])
        caller = await connect(nodes["a"], "rawsocket", "msgpack")
        uri = procedure()
        await callee.register(_never_answering(started, interrupted), uri)
        await callee.register(lambda: "pong", uri + ".ping")
        await synced(caller, callee)
        if how == "cancel":
            pending = caller.call(uri, 1)
            assert await asyncio.wait_for(started, TIMEOUT) == (1,)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        else:
            begin = loop.time()
            await expect_error(caller.call(uri, 1, options=CallOptions(timeout=300)),
                               "wamp.error.timeout")
            assert loop.time() - begin >= 0.25, "the timeout fired early"
        assert await asyncio.wait_for(interrupted, TIMEOUT) is True
        assert await caller.call(uri + ".ping") == "pong"  # both sessions carry on
        await close_all(callee, caller)

    run(scenario())


def test_a_call_to_a_killed_node_fails_and_forwarded_calls_are_bounded(cluster, tmp_path):
    """The caller's node has room for one forwarded call and waits 1 s for any answer."""
    redis, nodes = cluster
    bounded = start_node(tmp_path, redis, "bounded", max_pending_calls=1, call_timeout=1)
    doomed = start_node(tmp_path, redis, "doomed")

    async def scenario():
        loop = asyncio.get_running_loop()
        started, interrupted = loop.create_future(), loop.create_future()
        callee = await connect(nodes["b"])
        caller = await connect(bounded)
        slow, held = procedure(), procedure()
        await callee.register(_never_answering(started, interrupted), slow)
        lost = await connect(doomed)
        await lost.register(lambda: "never", held)
        await synced(caller, callee)
        pending = caller.call(slow)  # no timeout of its own: the node's bound applies
        await asyncio.wait_for(started, TIMEOUT)
        await expect_error(caller.call(slow), "wamp.error.limit_exceeded")
        await expect_error(pending, "wamp.error.timeout")
        assert await asyncio.wait_for(interrupted, TIMEOUT) is True
        doomed.kill9()  # its registration stays in Redis: calls to it fail, clearly
        error = await expect_error(caller.call(held), "wamp.error.canceled")
        assert "doomed" in str(error.args), error
        await close_all(callee, caller)

    run(scenario())
    bounded.stop()
    assert "queue_full" in "\n".join(bounded.log_lines)


async def session_ids(caller, expected: set[int], present: bool) -> int:
    """Poll ``wamp.session.list`` until every id of ``expected`` is (or none is) listed;
    the session count then."""
    deadline = time.monotonic() + 10
    while True:
        listed = set(await caller.call("wamp.session.list"))
        if (expected <= listed) if present else not (expected & listed):
            return await caller.call("wamp.session.count")
        assert time.monotonic() < deadline, (expected, listed)
        await asyncio.sleep(0.02)


def test_session_meta_counts_sessions_of_every_node(cluster):
    _, nodes = cluster

    async def scenario():
        sessions = {name: await connect(node) for name, node in nodes.items()}
        ids = {session._session_id for session in sessions.values()}
        for asker in sessions.values():
            total = await session_ids(asker, ids, True)
            assert total >= 3
        gone = sessions.pop("c")
        await gone.close()
        after = await session_ids(sessions["a"], {gone._session_id}, False)
        assert after < total
        assert await sessions["b"].call("wamp.session.count", ["nobody-has-this-role"]) == 0
        await close_all(*sessions.values())

    run(scenario())


def test_subscription_meta_answers_for_every_node(cluster):
    _, nodes = cluster

    async def scenario():
        on_b = await connect(nodes["b"])
        on_c = await connect(nodes["c"], "rawsocket", "msgpack")
        asker = await connect(nodes["a"])
        topic = procedure("sub")
        exact = await on_b.subscribe(lambda *a: None, topic)
        prefix = await on_c.subscribe(lambda *a: None, topic + ".",
                                      options=SubscribeOptions(match="prefix"))
        deadline = time.monotonic() + 10
        while len(await asker.call("wamp.subscription.match", topic + ".x") or ()) < 1:
            assert time.monotonic() < deadline, "c's subscription never showed"
            await asyncio.sleep(0.02)
        while await asker.call("wamp.subscription.lookup", topic) is None:
            assert time.monotonic() < deadline, "b's subscription never showed"
            await asyncio.sleep(0.02)
        assert await asker.call("wamp.subscription.lookup", topic) == exact.id
        assert await asker.call("wamp.subscription.lookup", topic + ".",
                                {"match": "prefix"}) == prefix.id
        assert await asker.call("wamp.subscription.match", topic + ".x") == [prefix.id]
        listed = await asker.call("wamp.subscription.list")
        assert exact.id in listed["exact"] and prefix.id in listed["prefix"]
        await on_c.close()
        while await asker.call("wamp.subscription.match", topic + ".x") is not None:
            assert time.monotonic() < deadline, "c's subscription stayed listed"
            await asyncio.sleep(0.02)
        await close_all(on_b, asker)

    run(scenario())
