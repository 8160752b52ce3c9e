"""WAMP clients for the tests: autobahn sessions, and a raw client for exact wire checks."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

import msgpack
import txaio

txaio.use_asyncio()

from autobahn.asyncio.rawsocket import WampRawSocketClientFactory  # noqa: E402
from autobahn.asyncio.wamp import ApplicationSession  # noqa: E402
from autobahn.asyncio.websocket import (WampWebSocketClientFactory,  # noqa: E402
                                        WebSocketClientFactory, WebSocketClientProtocol)
from autobahn.wamp.serializer import (CBORSerializer, JsonSerializer,  # noqa: E402
                                      MsgPackSerializer)
from autobahn.wamp.types import ComponentConfig, SubscribeOptions  # noqa: E402

from router.wamp.json_serializer import FastJsonSerializer  # noqa: E402
from tests.lean_websocket import LeanWebSocketProtocol  # noqa: E402

SERIALIZERS = {"json": JsonSerializer, "msgpack": MsgPackSerializer, "cbor": CBORSerializer}
RAWSOCKET_IDS = {"json": 1, "msgpack": 2, "cbor": 3}
TRANSPORTS = ("websocket", "rawsocket")
COMBINATIONS = [(t, s) for t in TRANSPORTS for s in SERIALIZERS]

TIMEOUT = 10.0


def rawsocket_frame(payload: bytes) -> bytes:
    """One WAMP RawSocket frame (a regular message): the 4-octet length, then ``payload``."""
    return struct.pack("!I", len(payload)) + payload


def msgpack_frame(message: list) -> bytes:
    """A WAMP message as a RawSocket frame in MessagePack (for clients on plain sockets)."""
    return rawsocket_frame(msgpack.packb(message))

def run(coro, timeout: float = 60.0) -> Any:
    """Run one async scenario with an overall deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class JoinFailed(Exception):
    def __init__(self, reason: str, message: str | None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class Client(ApplicationSession):
    """An autobahn session that reports join, leave and disconnect as futures."""

    def __init__(self, config: ComponentConfig, authid: str | None, ticket: str | None,
                 authmethods: list[str] | None) -> None:
        super().__init__(config)
        self._authid = authid
        self._ticket = ticket
        self._authmethods = authmethods
        loop = asyncio.get_running_loop()
        self.joined: asyncio.Future = loop.create_future()
        self.left: asyncio.Future = loop.create_future()
        self.disconnected: asyncio.Future = loop.create_future()

    def onConnect(self) -> None:
        methods = self._authmethods or (["ticket"] if self._ticket else ["anonymous"])
        self.join(self.config.realm, authmethods=methods, authid=self._authid)

    def onChallenge(self, challenge):
        return self._ticket

    def onJoin(self, details) -> None:
        self.joined.set_result(details)

    def onLeave(self, details) -> None:
        if not self.joined.done():
            self.joined.set_exception(JoinFailed(details.reason, details.message))
        if not self.left.done():
            self.left.set_result(details)
        self.disconnect()

    def onDisconnect(self) -> None:
        if not self.joined.done():
            self.joined.set_exception(JoinFailed("disconnected", None))
        if not self.left.done():
            self.left.set_result(None)
        if not self.disconnected.done():
            self.disconnected.set_result(None)

    async def events(self, topic: str, **options) -> "asyncio.Queue":
        """Subscribe and return a queue of (args, kwargs, details) per event."""
        received: asyncio.Queue = asyncio.Queue()

        def on_event(*args, details=None, **kwargs):
            received.put_nowait((list(args), kwargs, details))

        await self.subscribe(on_event, topic, options=SubscribeOptions(details=True, **options))
        return received

    async def close(self) -> None:
        if self.is_attached():
            self.leave()
        await asyncio.wait_for(asyncio.shield(self.disconnected), TIMEOUT)


async def connect(router, transport: str = "websocket", serializer: str = "json",
                  realm: str = "realm1", authid: str | None = None, ticket: str | None = None,
                  authmethods: list[str] | None = None) -> Client:
    """Open a transport to the router and join ``realm``; raises JoinFailed on ABORT."""
    loop = asyncio.get_running_loop()
    host, port, path = router.address(transport)
    holder: list[Client] = []

    def make_session() -> Client:
        session = Client(ComponentConfig(realm), authid, ticket, authmethods)
        holder.append(session)
        return session

    if transport == "websocket":
        factory = WampWebSocketClientFactory(make_session, url=f"ws://{host}:{port}{path}",
                                             serializers=[SERIALIZERS[serializer]()])
    else:
        factory = WampRawSocketClientFactory(make_session, serializer=SERIALIZERS[serializer]())
    await loop.create_connection(factory, host, port)
    while not holder:
        await asyncio.sleep(0)
    session = holder[0]
    await asyncio.wait_for(asyncio.shield(session.joined), TIMEOUT)
    return session


async def next_item(q: asyncio.Queue, timeout: float = TIMEOUT) -> Any:
    return await asyncio.wait_for(q.get(), timeout)


async def assert_empty(q: asyncio.Queue, sentinel_roundtrip) -> None:
    """Assert nothing arrived, after a round trip that the router orders behind any event."""
    await sentinel_roundtrip()
    assert q.empty(), f"unexpected: {q.get_nowait()!r}"


class RawClient:
    """A WAMP peer that sends and receives raw message lists, for exact wire-level checks."""

    def __init__(self, serializer: str, lean: bool = False) -> None:
        self.serializer = (FastJsonSerializer() if lean and serializer == "json"
                           else SERIALIZERS[serializer]())
        self.object_serializer = self.serializer._serializer
        self.received: asyncio.Queue = asyncio.Queue()
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self._send_payloads = None
        self._request = 0
        self.transport: asyncio.Transport | None = None
        """The connection's socket transport (``pause_reading()`` makes a stalled reader)."""

    def next_request(self) -> int:
        self._request += 1
        return self._request

    def send(self, message: list) -> None:
        self._send_payloads([self.object_serializer.serialize(message)])

    def send_many(self, messages: list[list]) -> None:
        """Send several messages; RawSocket and lean WebSocket clients write them with one
        socket write, as a busy publisher would."""
        serialize = self.object_serializer.serialize
        self._send_payloads([serialize(message) for message in messages])

    def send_bytes(self, data: bytes) -> None:
        self._send_payloads([data])

    async def recv(self, timeout: float = TIMEOUT) -> list:
        if self.received.empty():
            async with asyncio.timeout(timeout):  # unlike wait_for, no extra task per call
                item = await self.received.get()
        else:
            item = self.received.get_nowait()
        if item is None:
            raise ConnectionError("connection closed")
        return item

    async def recv_until_closed(self, timeout: float = TIMEOUT) -> list[list]:
        messages = []
        while True:
            item = await asyncio.wait_for(self.received.get(), timeout)
            if item is None:
                return messages
            messages.append(item)

    def _deliver(self, payload: bytes) -> None:
        for message in self.object_serializer.unserialize(payload):
            self.received.put_nowait(message)

    def _closed(self) -> None:
        self.received.put_nowait(None)
        if not self.closed.done():
            self.closed.set_result(None)

    async def hello(self, realm: str = "realm1", details: dict | None = None) -> list:
        roles = {"publisher": {"features": {}}, "subscriber": {"features": {}},
                 "caller": {"features": {}}, "callee": {"features": {}}}
        self.send([1, realm, details or {"roles": roles}])
        return await self.recv()

    def close(self) -> None:
        self._close()


class _RawSocketProtocol(asyncio.Protocol):
    def __init__(self, client: RawClient, serializer_id: int) -> None:
        self.client = client
        self.serializer_id = serializer_id
        self.buffer = bytearray()
        self.handshake: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(bytes([0x7F, 0xF0 | self.serializer_id, 0, 0]))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.handshake.done():
            if len(buffer) < 4:
                return
            self.handshake.set_result(bytes(buffer[:4]))
            del buffer[:4]
        offset, end = 0, len(buffer)
        while end - offset >= 4:  # walk the frames by offset; one trim of the buffer at the end
            header, = struct.unpack_from("!I", buffer, offset)
            kind, length = header >> 24, header & 0xFFFFFF
            if end - offset < 4 + length:
                break
            if kind & 0x07 == 0:
                self.client._deliver(bytes(buffer[offset + 4:offset + 4 + length]))
            offset += 4 + length
        del buffer[:offset]

    def connection_lost(self, exc) -> None:
        if not self.handshake.done():
            self.handshake.set_exception(ConnectionError("closed during handshake"))
        self.client._closed()


class _RawWebSocketProtocol(WebSocketClientProtocol):
    def onOpen(self) -> None:
        self.factory.opened.set_result(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.client._deliver(payload)

    def onClose(self, wasClean, code, reason) -> None:
        if not self.factory.opened.done():
            self.factory.opened.set_exception(ConnectionError(f"closed: {code} {reason}"))
        self.factory.client._closed()


async def raw_connect(router, transport: str = "rawsocket", serializer: str = "json",
                      lean: bool = False) -> RawClient:
    """A RawClient connected to ``router``.

    ``lean`` is for load generators, so that the client is not the limit: JSON through
    orjson (same values as autobahn's decoder, see test_wamp_json) and WebSocket through
    the minimal client of tests/lean_websocket.py instead of autobahn's.
    """
    loop = asyncio.get_running_loop()
    client = RawClient(serializer, lean)
    host, port, path = router.address(transport)
    if transport == "rawsocket":
        _, protocol = await loop.create_connection(
            lambda: _RawSocketProtocol(client, RAWSOCKET_IDS[serializer]), host, port)
        await asyncio.wait_for(protocol.handshake, TIMEOUT)
        client._send_payloads = lambda payloads: protocol.transport.write(
            b"".join([rawsocket_frame(data) for data in payloads]))
        client._close = protocol.transport.close
    elif lean:
        _, protocol = await loop.create_connection(
            lambda: LeanWebSocketProtocol(host, port, path, f"wamp.2.{serializer}",
                                          client._deliver, client._closed), host, port)
        await asyncio.wait_for(protocol.opened, TIMEOUT)
        binary = client.object_serializer.BINARY
        client._send_payloads = lambda payloads: protocol.send_messages(payloads, binary)
        client._close = protocol.close
    else:
        factory = WebSocketClientFactory(f"ws://{host}:{port}{path}",
                                         protocols=[f"wamp.2.{serializer}"])
        factory.protocol = _RawWebSocketProtocol
        factory.client = client
        factory.opened = loop.create_future()
        await loop.create_connection(factory, host, port)
        protocol = await asyncio.wait_for(factory.opened, TIMEOUT)
        binary = client.object_serializer.BINARY
        client._send_payloads = lambda payloads: [protocol.sendMessage(data, isBinary=binary)
                                                  for data in payloads]
        client._close = lambda: protocol.sendClose(1000)
    client.transport = protocol.transport  # load tools pause reading or shrink buffers on it
    return client


class Sessions:
    """Opens autobahn and raw sessions and closes them all at the end of a scenario."""

    def __init__(self, router) -> None:
        self.router = router
        self.opened = []
        self.raw = []

    async def __call__(self, transport="websocket", serializer="json", **kwargs):
        session = await connect(self.router, transport, serializer, **kwargs)
        self.opened.append(session)
        return session

    async def raw_client(self, transport="websocket", serializer="json", realm="realm1",
                         callee_features: dict | None = None):
        client = await raw_connect(self.router, transport, serializer)
        self.raw.append(client)
        roles = {"caller": {"features": {"call_canceling": True}},
                 "callee": {"features": callee_features or {}}}
        welcome = await client.hello(realm, {"roles": roles})
        assert welcome[0] == 2, welcome
        return client, welcome

    async def __aenter__(self) -> "Sessions":
        return self

    async def __aexit__(self, *exc) -> None:
        for session in self.opened:
            with contextlib.suppress(Exception):
                await session.close()
        for client in self.raw:
            with contextlib.suppress(Exception):
                client.close()
