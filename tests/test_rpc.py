"""Remote procedure calls against the real router: autobahn callers/callees and raw peers."""

from __future__ import annotations

import asyncio

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, CallResult, RegisterOptions

from tests.clients import COMBINATIONS, SERIALIZERS, TIMEOUT, Sessions, run
from tests.harness import RouterProcess, realm_file

NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
NOT_AUTHORIZED = "wamp.error.not_authorized"
CANCELED = "wamp.error.canceled"

RESTRICTED_ROLES = {"anonymous": [
    {"uri": "com.ok.", "match": "prefix", "allow": ["call", "register"]},
    {"uri": "com.callonly.", "match": "prefix", "allow": ["call"]},
    {"uri": "com.regonly.", "match": "prefix", "allow": ["register"]},
]}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """realm1 is open to anonymous; 'restricted' grants call/register only on some URIs."""
    process = RouterProcess(tmp_path_factory.mktemp("router-rpc"), [
        realm_file("realm1"),
        realm_file("restricted", roles=RESTRICTED_ROLES),
    ]).start()
    yield process
    process.stop()


async def expect_error(awaitable, uri: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await asyncio.wait_for(awaitable, TIMEOUT)
    assert info.value.error == uri, f"expected {uri}, got {info.value.error}: {info.value}"
    return info.value


def abort_transport(session) -> None:
    """Drop the TCP connection without GOODBYE or a WebSocket close handshake."""
    session._transport.transport.abort()


# --------------------------------------------------------------------------------------
# basic call / result


def _other(transport: str, serializer: str) -> tuple[str, str]:
    """A different transport and serializer, so each call also crosses encodings."""
    names = list(SERIALIZERS)
    return ("rawsocket" if transport == "websocket" else "websocket",
            names[(names.index(serializer) + 1) % len(names)])


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_register_call_result(router, transport, serializer):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session(transport, serializer)
            caller = await open_session(transport, serializer)
            other = await open_session(*_other(transport, serializer))
            uri = f"com.rpc.echo.{transport}.{serializer}"

            def echo(*args, **kwargs):
                return CallResult(*args, **kwargs)

            await callee.register(echo, uri)
            await callee.register(lambda a, b: a + b, uri + ".add")
            for session in (caller, other):
                result = await asyncio.wait_for(
                    session.call(uri, 1, "two", [3, 4.5], None, key={"nested": [True, False]},
                                 other="x"), TIMEOUT)
                assert list(result.results) == [1, "two", [3, 4.5], None]
                assert result.kwresults == {"key": {"nested": [True, False]}, "other": "x"}
                assert await asyncio.wait_for(session.call(uri + ".add", 40, 2), TIMEOUT) == 42
                assert await asyncio.wait_for(session.call(uri + ".add", "ab", "c"),
                                              TIMEOUT) == "abc"

    run(scenario())


def test_call_without_arguments_and_kwargs_only(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session("rawsocket", "msgpack")
            caller = await open_session("websocket", "cbor")
            seen = []

            def proc(*args, **kwargs):
                seen.append((args, kwargs))
                return kwargs.get("x")

            await callee.register(proc, "com.rpc.kwonly")
            assert await caller.call("com.rpc.kwonly") is None
            assert await caller.call("com.rpc.kwonly", x={"deep": ["list", 1]}) == {
                "deep": ["list", 1]}
            assert seen == [((), {}), ((), {"x": {"deep": ["list", 1]}})]

    run(scenario())


PROTOCOL_VIOLATION = "wamp.error.protocol_violation"


@pytest.mark.parametrize("call,answer", [
    ([48, 1, {}, "com.rpc..double_dot", []], "wamp.error.invalid_uri"),
    ([48, 1, {}, "com.rpc.echo", {"not": "a list"}], PROTOCOL_VIOLATION),
    ([48, 1, {}, "com.rpc.echo", [], ["not a dict"]], PROTOCOL_VIOLATION),
    ([48, 2**53 + 1, {}, "com.rpc.echo"], PROTOCOL_VIOLATION),
    ([48, 1, {"timeout": "soon"}, "com.rpc.echo"], PROTOCOL_VIOLATION),
    ([48, 1, {}, "com.rpc.echo", "passthru payload"], PROTOCOL_VIOLATION),
    ([48, 1, [], "com.rpc.echo"], PROTOCOL_VIOLATION),
])
def test_malformed_call_is_refused(router, call, answer):
    """A CALL in the common shape is parsed by the router's own fast path; every other
    shape, and every bad value, gets the full parse's answer: ERROR for a bad URI, ABORT for
    anything else."""
    async def scenario():
        async with Sessions(router) as open_session:
            caller, _ = await open_session.raw_client("rawsocket", "msgpack")
            caller.send(call)
            reply = await caller.recv()
            if answer == PROTOCOL_VIOLATION:
                assert reply[0] == 3 and reply[2] == PROTOCOL_VIOLATION, reply
            else:
                assert reply[:3] == [8, 48, 1] and reply[4] == answer, reply

    run(scenario())


@pytest.mark.parametrize("options,payload", [
    ({"progress": "yes"}, [["x"]]),
    ({"callee": "not an id"}, [["x"]]),
    ({}, ["not a list"]),
    ({}, [["x"], ["not a dict"]]),
])
def test_malformed_yield_aborts_the_callee(router, options, payload):
    """A YIELD with a bad option or payload is a protocol violation however it is parsed;
    its caller is told the callee left."""
    async def scenario():
        async with Sessions(router) as open_session:
            callee, _ = await open_session.raw_client("websocket", "json")
            callee.send([64, 1, {}, "com.rpc.bad_yield"])
            assert (await callee.recv())[:2] == [65, 1]
            caller, _ = await open_session.raw_client("rawsocket", "msgpack")
            caller.send([48, 7, {}, "com.rpc.bad_yield", ["x"]])
            invocation = await callee.recv()
            assert invocation[0] == 68, invocation
            callee.send([70, invocation[1], options, *payload])
            reply = await callee.recv()
            assert reply[0] == 3 and reply[2] == PROTOCOL_VIOLATION, reply
            reply = await caller.recv()
            assert reply[:3] == [8, 48, 7] and reply[4] == CANCELED, reply

    run(scenario())


def test_progressive_yield_in_the_common_shape(router):
    """Raw peers: YIELD {"progress": true} reaches a caller that asked for progress as a
    progressive RESULT, the final YIELD {} as the RESULT."""
    async def scenario():
        async with Sessions(router) as open_session:
            callee, _ = await open_session.raw_client("rawsocket", "msgpack")
            callee.send([64, 1, {}, "com.rpc.raw_progress"])
            assert (await callee.recv())[:2] == [65, 1]
            caller, _ = await open_session.raw_client("websocket", "json")
            caller.send([48, 3, {"receive_progress": True}, "com.rpc.raw_progress", [1]])
            invocation = await callee.recv()
            assert invocation[0] == 68 and invocation[3] == {"receive_progress": True}
            callee.send([70, invocation[1], {"progress": True}, ["half"]])
            callee.send([70, invocation[1], {}, ["done"], {"k": 1}])
            assert await caller.recv() == [50, 3, {"progress": True}, ["half"]]
            assert await caller.recv() == [50, 3, {}, ["done"], {"k": 1}]

    run(scenario())


def test_call_to_unknown_procedure(router):
    async def scenario():
        async with Sessions(router) as open_session:
            caller = await open_session()
            await expect_error(caller.call("com.rpc.nobody.home"), NO_SUCH_PROCEDURE)

    run(scenario())


def test_registering_an_existing_procedure_is_refused(router):
    async def scenario():
        async with Sessions(router) as open_session:
            first = await open_session()
            second = await open_session("rawsocket", "cbor")
            caller = await open_session()
            await first.register(lambda: "first", "com.rpc.taken")
            await expect_error(second.register(lambda: "second", "com.rpc.taken"),
                               "wamp.error.procedure_already_exists")
            await expect_error(first.register(lambda: "again", "com.rpc.taken"),
                               "wamp.error.procedure_already_exists")
            assert await caller.call("com.rpc.taken") == "first"

    run(scenario())


def test_unregister_then_call(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session()
            caller = await open_session()
            registration = await callee.register(lambda: "here", "com.rpc.temp")
            assert await caller.call("com.rpc.temp") == "here"
            await registration.unregister()
            await expect_error(caller.call("com.rpc.temp"), NO_SUCH_PROCEDURE)
            # The URI is free again, for anyone.
            other = await open_session("rawsocket", "json")
            await other.register(lambda: "back", "com.rpc.temp")
            assert await caller.call("com.rpc.temp") == "back"

    run(scenario())


def test_application_error_reaches_the_caller(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session("rawsocket", "msgpack")
            caller = await open_session()

            def fail(reason):
                raise ApplicationError("com.example.error.x", reason, code=42)

            await callee.register(fail, "com.rpc.fails")
            error = await expect_error(caller.call("com.rpc.fails", "because"),
                                       "com.example.error.x")
            assert error.args == ("because",)
            assert error.kwargs == {"code": 42}

    run(scenario())


# --------------------------------------------------------------------------------------
# progressive results, timeout, cancel


@pytest.mark.parametrize("transport,serializer", [("websocket", "json"), ("rawsocket", "cbor")])
def test_progressive_call_results(router, transport, serializer):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session(transport, serializer)
            caller = await open_session(*_other(transport, serializer))

            async def count(n, details=None):
                assert details.progress is not None, "caller asked for progress"
                for i in range(n):
                    details.progress(i, step=f"s{i}")
                return "done"

            await callee.register(count, "com.rpc.progress",
                                  options=RegisterOptions(details_arg="details"))
            progress = []
            result = await asyncio.wait_for(caller.call(
                "com.rpc.progress", 3,
                options=CallOptions(on_progress=lambda *a, **kw: progress.append((a, kw)))),
                TIMEOUT)
            assert result == "done"
            assert progress == [((0,), {"step": "s0"}), ((1,), {"step": "s1"}),
                                ((2,), {"step": "s2"})]

    run(scenario())


def _never_answering(started: asyncio.Future, cancelled: asyncio.Future):
    async def never(*args, **kwargs):
        if not started.done():
            started.set_result(args)
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if not cancelled.done():
                cancelled.set_result(True)
            raise
    return never


def test_call_timeout_interrupts_the_callee(router):
    async def scenario():
        loop = asyncio.get_running_loop()
        started, cancelled = loop.create_future(), loop.create_future()
        async with Sessions(router) as open_session:
            callee = await open_session("rawsocket", "json")
            caller = await open_session()
            await callee.register(_never_answering(started, cancelled), "com.rpc.never")
            begin = loop.time()
            await expect_error(caller.call("com.rpc.never", options=CallOptions(timeout=300)),
                               "wamp.error.timeout")
            assert loop.time() - begin >= 0.25, "the timeout fired early"
            assert started.done()
            assert await asyncio.wait_for(cancelled, TIMEOUT) is True
            # The callee is still usable afterwards.
            await callee.register(lambda: "fine", "com.rpc.after_timeout")
            assert await caller.call("com.rpc.after_timeout") == "fine"

    run(scenario())


def test_call_cancel_by_the_caller(router):
    async def scenario():
        loop = asyncio.get_running_loop()
        started, cancelled = loop.create_future(), loop.create_future()
        async with Sessions(router) as open_session:
            callee = await open_session("websocket", "msgpack")
            caller = await open_session("rawsocket", "cbor")
            await callee.register(_never_answering(started, cancelled), "com.rpc.cancel_me")
            await callee.register(lambda: "pong", "com.rpc.ping")
            pending = caller.call("com.rpc.cancel_me", 1)
            assert await asyncio.wait_for(started, TIMEOUT) == (1,)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            assert await asyncio.wait_for(cancelled, TIMEOUT) is True
            # Both sessions survive the cancel (no protocol error on either side).
            assert await asyncio.wait_for(caller.call("com.rpc.ping"), TIMEOUT) == "pong"

    run(scenario())


def test_call_cancel_wire_level_error(router):
    """A raw caller sees the router's ERROR wamp.error.canceled for its CANCEL."""
    async def scenario():
        loop = asyncio.get_running_loop()
        started, cancelled = loop.create_future(), loop.create_future()
        async with Sessions(router) as open_session:
            callee = await open_session()
            await callee.register(_never_answering(started, cancelled), "com.rpc.cancel_raw")
            caller, _ = await open_session.raw_client("rawsocket", "json")
            caller.send([48, 1, {}, "com.rpc.cancel_raw", ["x"]])
            await asyncio.wait_for(started, TIMEOUT)
            caller.send([49, 1, {"mode": "killnowait"}])
            reply = await caller.recv()
            assert reply[:3] == [8, 48, 1] and reply[4] == CANCELED, reply
            assert await asyncio.wait_for(cancelled, TIMEOUT) is True

    run(scenario())


def test_cancel_kill_mode_caller_gets_an_answer_when_callee_yields(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee, _ = await open_session.raw_client(
                "websocket", "json", callee_features={"call_canceling": True})
            callee.send([64, 1, {}, "com.rpc.kill_mode"])
            registered = await callee.recv()
            assert registered[:2] == [65, 1], registered
            caller, _ = await open_session.raw_client("rawsocket", "msgpack")
            caller.send([48, 1, {}, "com.rpc.kill_mode"])
            invocation = await callee.recv()
            assert invocation[0] == 68, invocation
            caller.send([49, 1, {"mode": "kill"}])
            interrupt = await callee.recv()
            assert interrupt[0] == 69 and interrupt[1] == invocation[1], interrupt
            assert interrupt[2].get("mode") == "kill"
            callee.send([70, invocation[1], {}, ["finished anyway"]])
            # RFC: in 'kill' mode the caller gets RESULT or ERROR, whichever the callee sent.
            reply = await caller.recv(timeout=2.0)
            assert reply[0] in (50, 8) and reply[1] == 1, reply

    run(scenario())


@pytest.mark.parametrize("how", ["leave", "abort"])
def test_callee_leaving_mid_call_fails_the_call(router, how):
    async def scenario():
        loop = asyncio.get_running_loop()
        started, cancelled = loop.create_future(), loop.create_future()
        async with Sessions(router) as open_session:
            callee = await open_session("rawsocket", "msgpack")
            caller = await open_session()
            uri = f"com.rpc.leaving.{how}"
            await callee.register(_never_answering(started, cancelled), uri)
            pending = caller.call(uri)
            await asyncio.wait_for(started, TIMEOUT)
            if how == "leave":
                callee.leave()
            else:
                abort_transport(callee)
            await expect_error(pending, CANCELED)
            await expect_error(caller.call(uri), NO_SUCH_PROCEDURE)

    run(scenario())


def test_caller_leaving_mid_call_interrupts_the_callee(router):
    async def scenario():
        loop = asyncio.get_running_loop()
        started, cancelled = loop.create_future(), loop.create_future()
        async with Sessions(router) as open_session:
            callee = await open_session()
            caller = await open_session("rawsocket", "cbor")
            await callee.register(_never_answering(started, cancelled), "com.rpc.orphan")
            pending = caller.call("com.rpc.orphan")
            await asyncio.wait_for(started, TIMEOUT)
            abort_transport(caller)
            assert await asyncio.wait_for(cancelled, TIMEOUT) is True
            pending.cancel()

    run(scenario())


# --------------------------------------------------------------------------------------
# shared registrations


async def _two_callees(open_session, uri: str, policy: str):
    names = []
    for name in ("A", "B"):
        session = await open_session("websocket" if name == "A" else "rawsocket", "json")
        await session.register(lambda name=name: name, uri,
                               options=RegisterOptions(invoke=policy))
        names.append(session)
    return names


def test_shared_registration_roundrobin_alternates(router):
    async def scenario():
        async with Sessions(router) as open_session:
            await _two_callees(open_session, "com.rpc.rr", "roundrobin")
            caller = await open_session()
            results = [await caller.call("com.rpc.rr") for _ in range(6)]
            assert results == ["A", "B", "A", "B", "A", "B"]

    run(scenario())


def test_shared_registration_random_spreads(router):
    async def scenario():
        async with Sessions(router) as open_session:
            await _two_callees(open_session, "com.rpc.random", "random")
            caller = await open_session()
            results = await asyncio.gather(*(caller.call("com.rpc.random") for _ in range(60)))
            assert set(results) == {"A", "B"}
            # Chance of failing with a fair coin is about 1e-6.
            assert 10 <= results.count("A") <= 50, results.count("A")

    run(scenario())


@pytest.mark.parametrize("policy,expected,after_leave", [("first", "A", "B"),
                                                          ("last", "B", "A")])
def test_shared_registration_first_and_last(router, policy, expected, after_leave):
    async def scenario():
        async with Sessions(router) as open_session:
            a, b = await _two_callees(open_session, f"com.rpc.{policy}", policy)
            caller = await open_session()
            results = [await caller.call(f"com.rpc.{policy}") for _ in range(3)]
            assert results == [expected] * 3
            await (a if expected == "A" else b).close()
            assert await caller.call(f"com.rpc.{policy}") == after_leave

    run(scenario())


@pytest.mark.parametrize("first_policy,second_policy", [
    ("roundrobin", "random"), ("first", "last"), ("single", "roundrobin"),
    ("roundrobin", "single"),
])
def test_shared_registration_mixed_policies_are_refused(router, first_policy, second_policy):
    async def scenario():
        async with Sessions(router) as open_session:
            uri = f"com.rpc.mixed.{first_policy}.{second_policy}"
            first = await open_session()
            second = await open_session("rawsocket", "msgpack")
            await first.register(lambda: 1, uri, options=RegisterOptions(invoke=first_policy))
            await expect_error(
                second.register(lambda: 2, uri, options=RegisterOptions(invoke=second_policy)),
                "wamp.error.procedure_exists_with_different_invocation_policy")

    run(scenario())


# --------------------------------------------------------------------------------------
# caller identification, pattern-based registration


def test_caller_identification_with_disclose_me(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee, _ = await open_session.raw_client("rawsocket", "cbor")
            callee.send([64, 1, {}, "com.rpc.whoami"])
            registered = await callee.recv()
            assert registered[:2] == [65, 1], registered
            caller, welcome = await open_session.raw_client("websocket", "json")
            caller_id, caller_details = welcome[1], welcome[2]

            caller.send([48, 1, {"disclose_me": True}, "com.rpc.whoami", [1]])
            invocation = await callee.recv()
            assert invocation[0] == 68 and invocation[2] == registered[2], invocation
            details = invocation[3]
            assert details["caller"] == caller_id
            assert details["caller_authid"] == caller_details["authid"]
            assert details["caller_authrole"] == caller_details["authrole"] == "anonymous"
            assert invocation[4] == [1]
            callee.send([70, invocation[1], {}, ["ok"]])
            assert await caller.recv() == [50, 1, {}, ["ok"]]

            caller.send([48, 2, {}, "com.rpc.whoami"])
            invocation = await callee.recv()
            assert not {"caller", "caller_authid", "caller_authrole"} & set(invocation[3]), \
                "the caller is not disclosed unless it asks"
            callee.send([70, invocation[1], {}])
            assert await caller.recv() == [50, 2, {}]

    run(scenario())


def test_pattern_based_registration(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session("rawsocket", "json")
            special = await open_session()
            caller = await open_session("websocket", "msgpack")

            def tell(tag):
                def proc(*args, details=None):
                    return [tag, details.procedure, list(args)]
                return proc

            await callee.register(tell("prefix"), "com.rpc.pat.",
                                  options=RegisterOptions(match="prefix", details_arg="details"))
            await callee.register(tell("wild"), "com.rpc.wild..get",
                                  options=RegisterOptions(match="wildcard",
                                                          details_arg="details"))
            await special.register(tell("exact"), "com.rpc.pat.special",
                                   options=RegisterOptions(details_arg="details"))
            assert await caller.call("com.rpc.pat.x.y", 1) == ["prefix", "com.rpc.pat.x.y", [1]]
            assert await caller.call("com.rpc.wild.item7.get") == [
                "wild", "com.rpc.wild.item7.get", []]
            exact = await caller.call("com.rpc.pat.special")
            assert exact[0] == "exact", "an exact registration wins over a prefix one"
            assert exact[1] in (None, "com.rpc.pat.special")
            await expect_error(caller.call("com.rpc.wild.item7.put"), NO_SUCH_PROCEDURE)
            await expect_error(caller.call("com.rpc.wild.a.b.get"), NO_SUCH_PROCEDURE)

    run(scenario())


def test_registering_in_the_wamp_namespace_is_refused(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session()
            for uri, options in (("wamp.x", None), ("wamp.session.count", None),
                                 ("wamp.", RegisterOptions(match="prefix"))):
                with pytest.raises(ApplicationError) as info:
                    await asyncio.wait_for(callee.register(lambda: "mine", uri, options=options),
                                           TIMEOUT)
                assert info.value.error in (NOT_AUTHORIZED, "wamp.error.invalid_uri")
            # Nothing got registered there: a call finds no callee (or is not even allowed).
            caller = await open_session()
            with pytest.raises(ApplicationError) as info:
                await asyncio.wait_for(caller.call("wamp.x"), TIMEOUT)
            assert info.value.error in (NO_SUCH_PROCEDURE, NOT_AUTHORIZED)
            assert isinstance(await caller.call("wamp.session.count"), int), \
                "the router's own wamp.session.count was not replaced"

    run(scenario())


# --------------------------------------------------------------------------------------
# authorization


def test_register_and_call_denied_by_role(router):
    async def scenario():
        async with Sessions(router) as open_session:
            callee = await open_session(realm="restricted")
            caller = await open_session("rawsocket", "cbor", realm="restricted")
            # allowed: a control, so the denials below are about rights, not the realm
            await callee.register(lambda: "ok", "com.ok.proc")
            assert await caller.call("com.ok.proc") == "ok"

            await expect_error(callee.register(lambda: 1, "com.callonly.proc"), NOT_AUTHORIZED)
            await expect_error(callee.register(lambda: 1, "com.elsewhere.proc"), NOT_AUTHORIZED)

            await callee.register(lambda: "secret", "com.regonly.proc")
            await expect_error(caller.call("com.regonly.proc"), NOT_AUTHORIZED)
            await expect_error(caller.call("com.callonly.nothing"), NO_SUCH_PROCEDURE)

            # A prefix registration must stay inside the granted prefix: 'com.regonly'
            # would also match 'com.regonlyX', which the rule 'com.regonly.' does not grant.
            await expect_error(callee.register(lambda: 1, "com.regonly",
                                               options=RegisterOptions(match="prefix")),
                               NOT_AUTHORIZED)
            await callee.register(lambda: 1, "com.regonly.sub.",
                                  options=RegisterOptions(match="prefix"))
            await expect_error(callee.register(lambda: 1, "com..proc",
                                               options=RegisterOptions(match="wildcard")),
                               NOT_AUTHORIZED)

    run(scenario())


@pytest.mark.parametrize("pattern,match", [("wam", "prefix"), (".session.kill", "wildcard")])
def test_pattern_registration_cannot_capture_the_wamp_namespace(router, pattern, match):
    """A pattern that also matches wamp.* must not let a client serve router procedures."""
    async def scenario():
        async with Sessions(router) as open_session:
            impostor = await open_session()
            caller = await open_session("rawsocket", "json")
            invoked = []

            def fake(*args, details=None):
                invoked.append(details.procedure)
                return "spoofed"

            try:
                await asyncio.wait_for(impostor.register(
                    fake, pattern, options=RegisterOptions(match=match, details_arg="details")),
                    TIMEOUT)
            except ApplicationError as exc:
                assert exc.error in (NOT_AUTHORIZED, "wamp.error.invalid_uri")
                return  # refused outright: fine
            # Registered: then calls into wamp.* must still never reach this callee.
            try:
                result = await asyncio.wait_for(caller.call("wamp.session.kill", 1), TIMEOUT)
            except ApplicationError:
                pass
            else:
                pytest.fail(f"wamp.session.kill was answered by a client callee: {result!r}")
            assert invoked == []

    run(scenario())


def test_unregister_unknown_or_foreign_registration(router):
    async def scenario():
        async with Sessions(router) as open_session:
            owner, _ = await open_session.raw_client("rawsocket", "msgpack")
            owner.send([64, 1, {}, "com.rpc.owned"])
            registered = await owner.recv()
            assert registered[:2] == [65, 1], registered
            registration_id = registered[2]
            thief, _ = await open_session.raw_client("websocket", "json")
            thief.send([66, 1, registration_id])
            reply = await thief.recv()
            assert reply[:3] == [8, 66, 1] and reply[4] == "wamp.error.no_such_registration", \
                reply
            caller = await open_session()
            owner_call = caller.call("com.rpc.owned", "still here?")
            invocation = await owner.recv()
            assert invocation[0] == 68 and invocation[4] == ["still here?"], invocation
            owner.send([70, invocation[1], {}, ["yes"]])
            assert await asyncio.wait_for(owner_call, TIMEOUT) == "yes"
            owner.send([66, 2, registration_id])
            assert await owner.recv() == [67, 2]
            owner.send([66, 3, registration_id])
            reply = await owner.recv()
            assert reply[:3] == [8, 66, 3] and reply[4] == "wamp.error.no_such_registration", \
                reply

    run(scenario())
