"""Misbehaving peers: protocol violations, handshake failures, oversize messages, bad auth.

Every case checks two things: what the misbehaving peer gets (ABORT with the right
reason, then the connection closes), and that the router goes on serving everyone
else (a session opened *before* the incident still receives events published by a
session opened *after* it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct

import pytest
from autobahn.exception import PayloadExceededError
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions

from router.core.credentials import hash_secret
from tests.clients import (COMBINATIONS, TRANSPORTS, JoinFailed, connect, next_item,
                           raw_connect, run)
from tests.harness import OPEN_ROLE, RouterProcess, realm_file

HELLO, WELCOME, ABORT, CHALLENGE, AUTHENTICATE, GOODBYE = 1, 2, 3, 4, 5, 6
PUBLISH, PUBLISHED, SUBSCRIBE, SUBSCRIBED = 16, 17, 32, 33
PROTOCOL_VIOLATION = "wamp.error.protocol_violation"
MAX_MESSAGE_SIZE = 4096
TIMEOUT = 10.0

ROLES = {"publisher": {"features": {}}, "subscriber": {"features": {}}}
ALICE_SECRET = "alice-secret"
# open, plus the meta API (the witness checks that aborted sessions are gone)
OPEN_REALM_ROLES = {"anonymous": OPEN_ROLE + [
    {"uri": "wamp.session.", "match": "prefix", "allow": ["call"]},
    {"uri": "wamp.subscription.", "match": "prefix", "allow": ["call"]}]}


@pytest.fixture(scope="module")
def pv_router(tmp_path_factory):
    private = realm_file("private", anonymous_role=None, roles={"user": [
        {"uri": "com.", "match": "prefix", "allow": ["publish", "subscribe"]}]},
        principals={"alice": {"role": "user", "ticket": hash_secret(ALICE_SECRET, 1000)}})
    listeners = [
        {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws",
         "max_message_size": MAX_MESSAGE_SIZE},
        {"type": "rawsocket", "host": "127.0.0.1", "port": 0,
         "max_message_size": MAX_MESSAGE_SIZE},
    ]
    process = RouterProcess(tmp_path_factory.mktemp("violations"),
                            [realm_file("realm1", roles=OPEN_REALM_ROLES), private],
                            listeners=listeners).start()
    yield process
    process.stop()


# helpers -------------------------------------------------------------------------------

class Witness:
    """A session joined before an incident; proves afterwards that the router still routes."""

    def __init__(self, router) -> None:
        self.router = router

    async def __aenter__(self) -> "Witness":
        self.sub = await connect(self.router, "rawsocket", "msgpack")
        self.events = await self.sub.events("com.witness.topic")
        return self

    async def check(self, label: str = "alive") -> None:
        assert self.router.proc.poll() is None, "the router process died"
        pub = await connect(self.router, "websocket", "cbor")
        await pub.publish("com.witness.topic", label,
                          options=PublishOptions(acknowledge=True))
        args, _, _ = await next_item(self.events)
        assert args == [label]
        await pub.close()

    async def __aexit__(self, *exc) -> None:
        await self.sub.close()


async def join(client, realm="realm1") -> list:
    welcome = await client.hello(realm, {"roles": ROLES})
    assert welcome[0] == WELCOME, welcome
    return welcome


async def assert_aborted(client, reason: str = PROTOCOL_VIOLATION) -> list:
    """The peer gets exactly one ABORT with ``reason``, then the connection closes."""
    messages = await client.recv_until_closed()
    assert len(messages) == 1, f"expected one ABORT then close, got {messages}"
    abort = messages[0]
    assert abort[0] == ABORT and isinstance(abort[1], dict), abort
    assert abort[2] == reason, abort
    return abort


GARBAGE = {"json": b"{this is not json", "msgpack": b"\xc1\xc1\xc1\xc1",
           "cbor": b"\xff\xff\xff"}


def send_publish(options):
    return lambda client, serializer: client.send([PUBLISH, client.next_request(), options,
                                                   "com.pv.topic"])


# (id, needs an established session first, action(client, serializer))
VIOLATIONS = [
    ("publish before HELLO", False, lambda c, s: c.send([PUBLISH, 1, {}, "com.pv.topic"])),
    ("subscribe before HELLO", False, lambda c, s: c.send([SUBSCRIBE, 1, {}, "com.pv.topic"])),
    ("goodbye before HELLO", False, lambda c, s: c.send([GOODBYE, {}, "wamp.close.close_realm"])),
    ("unknown type before HELLO", False, lambda c, s: c.send([999])),
    ("empty array before HELLO", False, lambda c, s: c.send([])),
    ("garbage before HELLO", False, lambda c, s: c.send_bytes(GARBAGE[s])),
    ("second HELLO", True, lambda c, s: c.send([HELLO, "realm1", {"roles": ROLES}])),
    ("WELCOME from client", True, lambda c, s: c.send([WELCOME, 1, {}])),
    ("unknown message type", True, lambda c, s: c.send([999])),
    ("message type not an integer", True, lambda c, s: c.send(["16", 1, {}, "com.pv.topic"])),
    ("bad arity PUBLISH", True, lambda c, s: c.send([PUBLISH, 1])),
    ("bad arity SUBSCRIBE", True, lambda c, s: c.send([SUBSCRIBE, 2, {}])),
    ("request id not an integer", True,
     lambda c, s: c.send([SUBSCRIBE, "two", {}, "com.pv.topic"])),
    ("options not a dict", True, lambda c, s: c.send([PUBLISH, 1, [], "com.pv.topic"])),
    ("arguments not a list", True,
     lambda c, s: c.send([PUBLISH, 1, {}, "com.pv.topic", "not a list"])),
    ("keyword arguments not a dict", True,
     lambda c, s: c.send([PUBLISH, 1, {}, "com.pv.topic", [], ["not", "a", "dict"]])),
    ("acknowledge not a bool", True, send_publish({"acknowledge": "yes"})),
    ("acknowledge as integer", True, send_publish({"acknowledge": 1})),
    ("retain not a bool", True, send_publish({"retain": "hello"})),
    ("exclude_me not a bool", True, send_publish({"exclude_me": "no"})),
    ("exclude_authid not strings", True, send_publish({"exclude_authid": [123]})),
    ("eligible not integers", True, send_publish({"eligible": ["someone"]})),
    ("get_retained not a bool", True,
     lambda c, s: c.send([SUBSCRIBE, c.next_request(), {"get_retained": "yes"}, "com.pv.x"])),
    ("empty array", True, lambda c, s: c.send([])),
    ("undecodable bytes", True, lambda c, s: c.send_bytes(GARBAGE[s])),
    ("non-list message (object)", True, lambda c, s: c.send({"type": 16})),
    ("non-list message (integer)", True, lambda c, s: c.send(42)),
]


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
@pytest.mark.parametrize("name,established,action", VIOLATIONS,
                         ids=[case[0] for case in VIOLATIONS])
def test_protocol_violation_aborts_and_closes(pv_router, name, established, action,
                                              transport, serializer):
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, serializer)
            if established:
                welcome = await join(client)
                # a subscription the router must drop with the aborted session
                topic = f"com.pv.{transport}.{serializer}.owned"
                request = client.next_request()
                client.send([SUBSCRIBE, request, {}, topic])
                subscribed = await client.recv()
                assert subscribed[:2] == [SUBSCRIBED, request], subscribed
            action(client, serializer)
            await assert_aborted(client)
            await witness.check()
            if established:
                session_id = welcome[1]
                assert await witness.sub.call("wamp.subscription.lookup", topic) is None, \
                    "the aborted session's subscription survived"
                with pytest.raises(ApplicationError) as failure:
                    await witness.sub.call("wamp.session.get", session_id)
                assert failure.value.error == "wamp.error.no_such_session"

    run(scenario())


HUGE = 10 ** 400
"""An integer JSON and CBOR carry and no float can hold."""


@pytest.mark.parametrize("serializer", ["json", "cbor"])
@pytest.mark.parametrize("message", [
    [PUBLISH, 1, {"retain": True, "_retain_ttl": HUGE}, "com.pv.topic", [1]],
    [48, 1, {"timeout": HUGE}, "com.pv.procedure", [1]],  # CALL
], ids=["publish _retain_ttl", "call timeout"])
def test_a_duration_no_float_can_hold_is_a_protocol_violation(pv_router, serializer, message):
    # it was an unexpected error (OverflowError converting it to seconds): the connection
    # dropped without ABORT, a traceback logged at ERROR
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, "websocket", serializer)
            await join(client)
            client.send(message)
            await assert_aborted(client)
            await witness.check()

    run(scenario())


def test_a_call_reusing_the_request_id_of_one_in_progress_is_a_protocol_violation(pv_router):
    # the second call replaced the first in the caller's calls in progress: the caller's
    # bound (wamp.max_pending_calls) never grew past one, and the first call was orphaned
    register, registered, call, invocation = 64, 65, 48, 68
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, "rawsocket", "json")
            await client.hello("realm1", {"roles": {"caller": {}, "callee": {}}})
            client.send([register, 1, {}, "com.pv.late"])
            assert (await client.recv())[:2] == [registered, 1]
            client.send([call, 7, {}, "com.pv.late"])
            assert (await client.recv())[0] == invocation  # never answered
            client.send([call, 7, {}, "com.pv.late"])
            await assert_aborted(client)
            await witness.check()

    run(scenario())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nothing_processed_after_violation(pv_router, transport):
    """A message sent right behind the offending one is not processed."""
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, "json")
            await join(client)
            sentinel: asyncio.Queue = await witness.sub.events("com.pv.after_sentinel")
            client.send([999])
            client.send([PUBLISH, client.next_request(), {"acknowledge": True},
                         "com.witness.topic", ["after the violation"]])
            await assert_aborted(client)
            pub = await connect(pv_router, "websocket", "json")
            await pub.publish("com.pv.after_sentinel", options=PublishOptions(acknowledge=True))
            await next_item(sentinel)
            assert witness.events.empty(), \
                f"processed input after the violation: {witness.events.get_nowait()}"
            await pub.close()
            await witness.check()

    run(scenario())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unknown_realm(pv_router, transport):
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, "json")
            client.send([HELLO, "com.no.such.realm", {"roles": ROLES}])
            await assert_aborted(client, "wamp.error.no_such_realm")
            with pytest.raises(JoinFailed) as failure:
                await connect(pv_router, transport, "cbor", realm="com.no.such.realm")
            assert failure.value.reason == "wamp.error.no_such_realm"
            await witness.check()

    run(scenario())


LONE_SURROGATES = {
    "realm in HELLO": b'[1, "realm\\ud800", {"roles": {"subscriber": {}}}]',
    "authid in HELLO": b'[1, "realm1", {"roles": {"subscriber": {}}, "authid": "\\udc00", '
                       b'"authmethods": ["ticket"]}]',
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("where", list(LONE_SURROGATES))
def test_a_lone_surrogate_escape_in_json_is_a_protocol_violation(pv_router, transport, where):
    """JSON's escape "\\ud800" decodes (in Python) to a lone surrogate, which is no Unicode
    text and which no serializer can write: the router's ABORT naming that realm or authid
    raised in the reactor instead of being sent (no answer, a traceback in the log). It is
    refused as undecodable, as MessagePack and CBOR refuse invalid UTF-8."""
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, "json")
            client.send_bytes(LONE_SURROGATES[where])
            abort = await assert_aborted(client)
            assert "undecodable" in abort[1]["message"], abort
            await witness.check()

    run(scenario())


# oversize messages ---------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_oversize_message_closes_connection(pv_router, transport):
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, "json")
            await join(client)
            # control: just under the limit goes through
            request = client.next_request()
            client.send([PUBLISH, request, {"acknowledge": True}, "com.witness.topic",
                         ["x" * (MAX_MESSAGE_SIZE - 200)]])
            reply = await client.recv()
            assert reply[:2] == [PUBLISHED, request], reply
            args, _, _ = await next_item(witness.events)
            assert args == ["x" * (MAX_MESSAGE_SIZE - 200)]

            client.send([PUBLISH, client.next_request(), {"acknowledge": True},
                         "com.witness.topic", ["y" * (3 * MAX_MESSAGE_SIZE)]])
            messages = await client.recv_until_closed()
            assert [m for m in messages if m[0] != ABORT] == [], messages
            await witness.check("after oversize")  # the oversize event never arrived first

    run(scenario())


# peers that vanish mid-handshake ----------------------------------------------------------

async def open_tcp(router, transport):
    host, port, _ = router.address(transport)
    return await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)


def ws_upgrade_request(router, path: str) -> bytes:
    host, port, _ = router.address("websocket")
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: wamp.2.json\r\n\r\n").encode()


async def ws_upgrade(router, path: str):
    reader, writer = await open_tcp(router, "websocket")
    writer.write(ws_upgrade_request(router, path))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    return reader, writer, head.decode("latin-1").split("\r\n", 1)[0]


async def kill_half_rawsocket_handshake(router, abort):
    _, writer = await open_tcp(router, "rawsocket")
    writer.write(b"\x7f\xf1")
    await writer.drain()
    return writer


async def kill_half_rawsocket_frame(router, abort):
    reader, writer = await open_tcp(router, "rawsocket")
    writer.write(b"\x7f\xf1\x00\x00")
    reply = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
    assert reply[0] == 0x7F and reply[1] & 0x0F == 1
    hello = json.dumps([HELLO, "realm1", {"roles": ROLES}]).encode()
    writer.write(struct.pack("!I", len(hello)) + hello[: len(hello) // 2])
    await writer.drain()
    return writer


async def kill_half_ws_upgrade(router, abort):
    _, writer = await open_tcp(router, "websocket")
    writer.write(ws_upgrade_request(router, "/ws")[:40])
    await writer.drain()
    return writer


async def kill_half_ws_frame(router, abort):
    _, writer, status = await ws_upgrade(router, "/ws")
    assert status.split()[1] == "101", status
    # a masked text frame announcing 300 octets, of which only 10 are sent
    writer.write(bytes([0x81, 0x80 | 126]) + struct.pack("!H", 300) + os.urandom(4)
                 + b"[1,\"realm1")
    await writer.drain()
    return writer


HALF_HANDSHAKES = {
    "rawsocket handshake": kill_half_rawsocket_handshake,
    "rawsocket HELLO frame": kill_half_rawsocket_frame,
    "websocket upgrade": kill_half_ws_upgrade,
    "websocket HELLO frame": kill_half_ws_frame,
}


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("stage", list(HALF_HANDSHAKES))
def test_client_killed_mid_handshake(pv_router, stage, how):
    async def scenario():
        async with Witness(pv_router) as witness:
            writer = await HALF_HANDSHAKES[stage](pv_router, how)
            if how == "reset":
                writer.transport.abort()
            else:
                writer.close()
            await witness.check()

    run(scenario())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_gone_while_challenged(pv_router, transport):
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await raw_connect(pv_router, transport, "json")
            challenge = await client.hello("private", {"roles": ROLES, "authmethods": ["ticket"],
                                                       "authid": "alice"})
            assert challenge[:2] == [CHALLENGE, "ticket"], challenge
            client.close()
            await asyncio.wait_for(client.closed, TIMEOUT)
            await witness.check()
            alice = await connect(pv_router, transport, "json", realm="private",
                                  authid="alice", ticket=ALICE_SECRET)
            assert (await alice.joined).authid == "alice"
            await alice.close()

    run(scenario())


# RawSocket handshake ---------------------------------------------------------------------

async def rawsocket_handshake(router, octets: bytes) -> tuple[bytes, bytes]:
    """Send a handshake; return the 4-octet reply (or fewer) and whatever followed before EOF."""
    reader, writer = await open_tcp(router, "rawsocket")
    writer.write(octets)
    try:
        data = await asyncio.wait_for(reader.read(4), TIMEOUT)
        reply = data
        while data and len(reply) < 4:
            data = await asyncio.wait_for(reader.read(4 - len(reply)), TIMEOUT)
            reply += data
        rest = await asyncio.wait_for(reader.read(), TIMEOUT) if data else b""
    except ConnectionResetError:
        reply, rest = b"", b""
    writer.close()
    return reply, rest


def test_rawsocket_handshake_accepted(pv_router):
    async def scenario():
        reader, writer = await open_tcp(pv_router, "rawsocket")
        writer.write(b"\x7f\xf2\x00\x00")  # msgpack, we accept 16 MiB
        reply = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
        assert reply[0] == 0x7F and reply[1] & 0x0F == 2 and reply[2:] == b"\x00\x00"
        assert 2 ** (9 + (reply[1] >> 4)) == MAX_MESSAGE_SIZE, \
            "the router must announce the configured max_message_size"
        writer.close()

    run(scenario())


@pytest.mark.parametrize("octets,expected", [
    (b"\x7f\xf7\x00\x00", b"\x7f\x10\x00\x00"),  # serializer 7 does not exist
    (b"\x7f\xf4\x00\x00", b"\x7f\x10\x00\x00"),  # UBJSON: not offered by this router
    (b"\x7f\xf1\x00\x01", b"\x7f\x30\x00\x00"),  # reserved bits used
], ids=["serializer 7", "serializer 4", "reserved bits"])
def test_rawsocket_handshake_error_reply(pv_router, octets, expected):
    async def scenario():
        async with Witness(pv_router) as witness:
            reply, rest = await rawsocket_handshake(pv_router, octets)
            assert reply == expected
            assert rest == b"", "the router must close the connection after the error reply"
            await witness.check()

    run(scenario())


def test_rawsocket_bad_magic_fails_connection(pv_router):
    async def scenario():
        async with Witness(pv_router) as witness:
            reply, rest = await rawsocket_handshake(pv_router, b"GET / HTTP/1.1\r\n\r\n")
            assert reply + rest == b""  # closed, nothing sent
            await witness.check()

    run(scenario())


async def rawsocket_hello(router, length_exponent: int) -> list[list]:
    """A JSON RawSocket client announcing a maximum of 2 ** (9 + ``length_exponent``)
    octets sends HELLO; returns the messages it gets before the router closes (or the
    first one, if that is a WELCOME)."""
    reader, writer = await open_tcp(router, "rawsocket")
    try:
        writer.write(bytes([0x7F, length_exponent << 4 | 1, 0, 0]))
        reply = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
        assert reply[0] == 0x7F and reply[1] & 0x0F == 1, reply
        hello = json.dumps([HELLO, "realm1", {"roles": ROLES}]).encode()
        writer.write(struct.pack("!I", len(hello)) + hello)
        messages = []
        while True:
            try:
                header = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
            except asyncio.IncompleteReadError as closed:
                assert closed.partial == b"", closed.partial
                return messages
            length = struct.unpack("!I", header)[0] & 0xFFFFFF
            messages.append(json.loads(await reader.readexactly(length)))
            if messages[-1][0] == WELCOME:
                return messages
    finally:
        writer.close()


def test_welcome_over_the_clients_rawsocket_limit_aborts_the_session(pv_router):
    """The router's WELCOME (its roles alone are about 600 octets of JSON) does not fit in
    512: the session is aborted and never exists, and the incident is counted."""
    async def scenario():
        async with Witness(pv_router) as witness:
            welcome = await rawsocket_hello(pv_router, 1)  # 1024 octets: it fits
            assert [message[0] for message in welcome] == [WELCOME]
            assert len(json.dumps(welcome[0])) > 512
            messages = await rawsocket_hello(pv_router, 0)
            assert [message[0] for message in messages] == [ABORT], messages
            assert messages[0][2] == "wamp.error.payload_size_exceeded"
            line = pv_router.wait_for_log(r"realm1, wamp: too_large: session \d+: WELCOME")
            session_id = int(line.split("session ", 1)[1].split(":", 1)[0])
            with pytest.raises(ApplicationError) as failure:
                await witness.sub.call("wamp.session.get", session_id)
            assert failure.value.error == "wamp.error.no_such_session"
            await witness.check()

    run(scenario())


class SmallRawSocketClient:
    """A JSON RawSocket client that announces it takes at most 1024 octets, joined to realm1;
    :meth:`exchange` sends one message and reads the next one back."""

    async def open(self, router) -> "SmallRawSocketClient":
        self.reader, self.writer = await open_tcp(router, "rawsocket")
        self.writer.write(bytes([0x7F, 1 << 4 | 1, 0, 0]))
        assert (await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT))[0] == 0x7F
        assert (await self.exchange([HELLO, "realm1", {"roles": ROLES}]))[0] == WELCOME
        return self

    async def exchange(self, message: list) -> list:
        self.send(message)
        return await self.read()

    def send(self, message: list) -> None:
        data = json.dumps(message).encode()
        self.writer.write(struct.pack("!I", len(data)) + data)

    async def read(self) -> list:
        header = await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT)
        length = struct.unpack("!I", header)[0] & 0xFFFFFF
        return json.loads(await self.reader.readexactly(length))


def test_an_error_over_the_clients_rawsocket_limit_still_answers_the_request(pv_router):
    """The router's ERROR names the client's URI ("no callee registered for '<1,000
    octets>'"): over the 1024 octets the client announced, it was not sent at all (only
    counted too_large), and the CALL or SUBSCRIBE waited forever. The ERROR goes without
    its message then: the request is answered, with the URI that says why."""
    async def scenario():
        async with Witness(pv_router) as witness:
            client = await SmallRawSocketClient().open(pv_router)
            try:
                answer = await client.exchange([48, 1, {}, "nope." + "x" * 1000, []])
                assert answer == [8, 48, 1, {}, "wamp.error.no_such_procedure"], answer
                answer = await client.exchange([32, 2, {}, "wamp." + "y" * 1000])
                assert answer == [8, 32, 2, {}, "wamp.error.not_authorized"], answer
            finally:
                client.writer.close()
            await witness.check()

    run(scenario())


def test_a_result_over_the_callers_rawsocket_limit_ends_the_call_with_an_error(pv_router):
    """A final RESULT larger than the caller announced it can take was dropped (counted
    too_large) and the call never ended for the caller. It gets ERROR
    wamp.error.payload_size_exceeded instead, as autobahn's own peers answer."""
    async def scenario():
        async with Witness(pv_router) as witness:
            callee = await connect(pv_router, "websocket", "json")
            await callee.register(lambda size: "r" * size, "pv.big_result")

            def refuse(size: int) -> None:
                raise ApplicationError("com.pv.refused", "e" * size)

            await callee.register(refuse, "pv.big_error")
            client = await SmallRawSocketClient().open(pv_router)
            try:
                small = await client.exchange([48, 1, {}, "pv.big_result", [10]])
                assert small[:4] == [50, 1, {}, ["r" * 10]], small
                answer = await client.exchange([48, 2, {}, "pv.big_result", [2000]])
                assert answer[:5] == [8, 48, 2, {}, "wamp.error.payload_size_exceeded"], answer
                # the callee's own ERROR, over the maximum, was lost the same way
                answer = await client.exchange([48, 3, {}, "pv.big_error", [2000]])
                assert answer[:5] == [8, 48, 3, {}, "wamp.error.payload_size_exceeded"], answer
            finally:
                client.writer.close()
                await callee.close()
            await witness.check()

    run(scenario())


def test_an_invocation_over_the_callees_rawsocket_limit_ends_the_call_with_an_error(pv_router):
    """An INVOCATION larger than the callee announced it can take was dropped (counted
    too_large) and the caller waited for ever (or until its timeout): it gets ERROR
    wamp.error.payload_size_exceeded, and the callee's next call goes on."""
    async def scenario():
        async with Witness(pv_router) as witness:
            callee = await SmallRawSocketClient().open(pv_router)
            caller = await connect(pv_router, "websocket", "json")
            try:
                registered = await callee.exchange([64, 1, {}, "pv.small_callee"])
                assert registered[:2] == [65, 1], registered
                with pytest.raises(PayloadExceededError) as failure:  # autobahn's for the URI
                    await caller.call("pv.small_callee", "a" * 2000)
                assert "callee's maximum" in str(failure.value)
                small = asyncio.ensure_future(caller.call("pv.small_callee", "b"))
                invocation = await callee.read()
                assert invocation[0] == 68 and invocation[4] == ["b"], invocation
                callee.send([70, invocation[1], {}, ["done"]])  # YIELD
                assert await asyncio.wait_for(small, TIMEOUT) == "done"
            finally:
                callee.writer.close()
                await caller.close()
            await witness.check()

    run(scenario())


# WebSocket path ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/wrong", "/", "/ws/extra", "/WS"])
def test_websocket_wrong_path_refused(pv_router, path):
    async def scenario():
        async with Witness(pv_router) as witness:
            _, writer, status = await ws_upgrade(pv_router, "/ws")
            assert status.split()[1] == "101", status  # control: the right path upgrades
            writer.close()
            _, writer, status = await ws_upgrade(pv_router, path)
            assert status.split()[1] == "404", status
            writer.close()
            await witness.check()

    run(scenario())


@pytest.mark.parametrize("target", ["/ws", "/wrong", "/ws?redirect=https%3A%2F%2Fevil.example%2F"])
def test_a_plain_http_request_gets_no_status_page_and_no_redirect(pv_router, target):
    """Without an Upgrade header autobahn served its HTML status page (with its version) on
    any path, and ``?redirect=URL`` answered 303 to that URL: an open redirect on the
    router's address. A WebSocket listener answers such a request 426 Upgrade Required."""
    async def scenario():
        host, port, _ = pv_router.address("websocket")
        reader, writer = await open_tcp(pv_router, "websocket")
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)).decode("latin-1")
        writer.close()
        assert head.split()[1] == "426", head
        assert "evil.example" not in head, head

    run(scenario())


# authentication ----------------------------------------------------------------------------

@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_wrong_ticket_aborts(pv_router, transport, serializer):
    async def scenario():
        with pytest.raises(JoinFailed) as failure:
            await connect(pv_router, transport, serializer, realm="private", authid="alice",
                          ticket="not-the-secret")
        assert failure.value.reason == "wamp.error.authentication_failed"

        client = await raw_connect(pv_router, transport, serializer)
        challenge = await client.hello("private", {"roles": ROLES, "authmethods": ["ticket"],
                                                   "authid": "alice"})
        assert challenge[:2] == [CHALLENGE, "ticket"], challenge
        client.send([AUTHENTICATE, "wrong", {}])
        await assert_aborted(client, "wamp.error.authentication_failed")

        alice = await connect(pv_router, transport, serializer, realm="private", authid="alice",
                              ticket=ALICE_SECRET)  # control: the right secret works
        await alice.close()

    run(scenario())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_anonymous_refused_without_anonymous_role(pv_router, transport):
    async def scenario():
        with pytest.raises(JoinFailed) as failure:
            await connect(pv_router, transport, "json", realm="private")
        assert failure.value.reason == "wamp.error.no_matching_auth_method"

        client = await raw_connect(pv_router, transport, "msgpack")
        client.send([HELLO, "private", {"roles": ROLES}])
        await assert_aborted(client, "wamp.error.no_matching_auth_method")

        anonymous = await connect(pv_router, transport, "json")  # realm1 is open: control
        await anonymous.close()

    run(scenario())
