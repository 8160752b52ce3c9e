"""Twisted transports for WAMP: WebSocket and RawSocket on autobahn's factories.

autobahn has no router side, so these subclasses route every received
transport message to :class:`WampSession.on_payload` (which answers protocol
violations with ABORT instead of dropping the connection silently).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from autobahn.exception import PayloadExceededError
from autobahn.wamp.exception import TransportLost
from autobahn.wamp.interfaces import IObjectSerializer
from autobahn.wamp.serializer import Serializer
from autobahn.wamp.websocket import parseSubprotocolIdentifier
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import ILoggingContext, IProtocol
from twisted.internet.protocol import Factory, connectionDone
from zope.interface import implementer

from router.flow import ConnectionFlow, FlowingProtocol
from router.limits import GatedProtocol, ReleasesClosedFuture, SlottedGatedProtocol
from router.wamp.codec import RAWSOCKET_LENGTH, WireMessage, encode, websocket_frame
from router.wamp.session import WampSession
from router.websocket import WampWebSocketServerFactory, WampWebSocketServerProtocol, peer2str

log = logging.getLogger(__name__)

RAWSOCKET_MAGIC = 0x7F
RAWSOCKET_PING, RAWSOCKET_PONG = 1, 2
"""Frame types (a frame header's first octet; 0 is a WAMP message)."""
RAWSOCKET_ERROR_SERIALIZER_UNSUPPORTED = 1
RAWSOCKET_ERROR_RESERVED_BITS = 3
RAWSOCKET_ERROR_MAX_CONNECTIONS = 4


class RouterWebSocketProtocol(ReleasesClosedFuture, GatedProtocol, FlowingProtocol,
                              WampWebSocketServerProtocol):
    """WAMP over WebSocket, router side."""

    def onConnect(self, request):
        self.deny_if_refused()
        if request.path != self.factory.path:
            raise ConnectionDeny(ConnectionDeny.NOT_FOUND, f"no WAMP endpoint at {request.path}")
        subprotocol, headers = super().onConnect(request)
        self.object_serializer = self.factory.object_serializers[
            parseSubprotocolIdentifier(subprotocol)[1]]
        return subprotocol, headers

    @property
    def info_peer(self) -> str:
        """The peer text autobahn keeps for the connection anyway (no copy of it)."""
        return self.peer

    def dataReceived(self, data: bytes) -> None:
        """autobahn's formats the arguments of a debug log line on every read; this one only
        hands the bytes to its WebSocket parser."""
        self._dataReceived(data)

    def onMessageEnd(self) -> None:
        """Hand the whole message to the session. autobahn's also fires a "message" event for
        observers, a Deferred and its callbacks per message, and the router has none."""
        if not self.failedByMe:
            self._onMessage(b"".join(self.message_data), self.message_is_binary)
        self.message_data = None

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self._session.on_payload(payload, isBinary)

    def send(self, msg: WireMessage) -> None:
        """Write the message's shared frame bytes (hot path: no per-receiver framing).

        With permessage-deflate the frame differs per connection, so autobahn frames it.
        """
        if self._session is None or self.state != self.STATE_OPEN:
            raise TransportLost()
        object_serializer = self.object_serializer
        if self._perMessageCompress is None and not self.send_queue:
            self.flow.write(msg.websocket_frame(object_serializer))
            return
        data = msg.serialize(object_serializer)
        self.sendMessage(data, object_serializer.BINARY)
        if self.flow.paused:
            self.flow.wrote(len(data))

    def send_once(self, raw: list) -> None:
        """Write a message that has this receiver only, encoded without a cache."""
        if (self._perMessageCompress is not None or self.send_queue or self._session is None
                or self.state != self.STATE_OPEN):
            self.send(WireMessage(raw))  # autobahn frames it, or TransportLost
            return
        object_serializer = self.object_serializer
        self.flow.write(websocket_frame(encode(object_serializer, raw), object_serializer.BINARY))

    def close_wamp(self) -> None:
        if self.state != self.STATE_CLOSED:
            self.sendClose(self.CLOSE_STATUS_CODE_NORMAL)


class RouterWebSocketFactory(WampWebSocketServerFactory):
    protocol = RouterWebSocketProtocol

    def __init__(self, session_factory: Callable[[], WampSession], serializers: list[Serializer],
                 path: str, max_message_size: int,
                 new_flow: Callable[[object], ConnectionFlow]) -> None:
        super().__init__(session_factory, serializers=serializers)
        self.object_serializers: dict[str, IObjectSerializer] = {
            serializer.SERIALIZER_ID: serializer.object_serializer for serializer in serializers}
        """By subprotocol serializer id: the ones the router created, shared by connections."""
        self.path = path
        self.new_flow = new_flow
        self.setProtocolOptions(maxMessagePayloadSize=max_message_size,
                                maxFramePayloadSize=max_message_size)


_MAX_LEN_SEND = tuple(2 ** (9 + exponent) for exponent in range(16))
"""The maximum a peer may announce, by its 4-bit exponent: one int object for all
connections (an int over 256 is 32 bytes per connection otherwise)."""


class _RawSocketEnd:
    """Where the mixins' ``connectionMade`` and ``connectionLost`` chains end (below them
    in :class:`RouterRawSocketProtocol`'s bases)."""

    __slots__ = ()
    transport: Any
    _session: WampSession | None

    def connectionMade(self) -> None:
        """The end of the mixins' chain."""

    def connectionLost(self, reason: Any = connectionDone) -> None:
        """The end of the mixins' chain: the session is told, errors logged and ignored."""
        session, self._session = self._session, None
        if session is not None:
            try:
                session.onClose(isinstance(reason.value, ConnectionDone))
            except Exception:
                log.exception("RawSocket session's onClose failed")


@implementer(IProtocol, ILoggingContext)
class RouterRawSocketProtocol(SlottedGatedProtocol, FlowingProtocol, _RawSocketEnd):
    """WAMP over RawSocket, router side: the handshake (with the spec's error replies) and
    the framing are its own, on Twisted's protocol interface.

    autobahn's server protocol (on Twisted's ``Int32StringReceiver``) kept a full instance
    dict per connection (Twisted's receiver reads ``self.__dict__`` on every frame), a
    copy of the serializer, transport details and a closing Deferred: about 450 bytes of
    every idle session. This one is slotted and keeps what the session uses; what all
    connections of a listener share is in the listener's own subclass
    (:meth:`~router.limits.SlottedGatedProtocol.for_listener`), not in each connection."""

    __slots__ = ("transport", "gate", "flow", "object_serializer", "_session", "_handshake",
                 "_buffer", "_max_len_send")
    factory: "RouterRawSocketFactory"

    def __init__(self) -> None:
        self.transport: Any = None
        self.gate = None
        self.object_serializer: IObjectSerializer | None = None
        self._session: WampSession | None = None
        self._handshake: bytes | None = b""
        """The handshake octets received so far; None once it is answered."""
        self._buffer: bytes | bytearray = b""
        """Octets of a frame not yet complete (a bytearray that the next reads extend)."""
        self._max_len_send = _MAX_LEN_SEND[-1]

    # Twisted's IProtocol ----------------------------------------------------------------

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        transport.setTcpNoDelay(True)
        self.connectionMade()

    @property
    def peer(self) -> str:
        """The peer as autobahn describes it (``tcp4:127.0.0.1:53124``), made when asked (the
        session's info keeps the text only once the connection is lost)."""
        return peer2str(self.transport) if self.transport is not None else "unknown"

    @property
    def info_peer(self) -> "RouterRawSocketProtocol":
        """The connection itself: its ``str`` is :attr:`peer`, made when the session meta
        API asks (an idle session keeps no copy of the text, about 70 bytes)."""
        return self

    def __str__(self) -> str:
        return self.peer

    def logPrefix(self) -> str:
        return self.__class__.__name__

    def dataReceived(self, data: bytes) -> None:
        if self.counted_by is not None:
            self.counted_by.bytes_in += len(data)
        if self._handshake is not None:
            data = self._handshake_received(data)
            if not data:
                return
        if self._session is None:
            return  # refused at the handshake, closing: TLS still hands over later records
        limit = self.factory.frame_limit
        buffer = self._buffer
        if buffer:
            # a frame begun in an earlier read: its reads are gathered in one bytearray
            # (amortized linear; joining the bytes on every read was quadratic, ~8 GB of
            # copying for a 16 MiB frame) and made bytes once, when the frame is complete
            buffer += data  # type: ignore[operator]
            if len(buffer) < 4:
                return
            length = RAWSOCKET_LENGTH.unpack_from(buffer)[0]
            if length > limit:
                length = self._control_length(length)
                if length < 0:
                    return
            if len(buffer) < 4 + length:
                return
            data = bytes(buffer)
            self._buffer = b""
        offset, end = 0, len(data)
        while end - offset >= 4:
            header = length = RAWSOCKET_LENGTH.unpack_from(data, offset)[0]
            if length > limit:  # (a regular frame's header is its length: the commonest)
                length = self._control_length(header)
                if length < 0:
                    return
            start = offset + 4
            offset = start + length
            if offset > end:
                offset = start - 4
                break
            if header > limit:
                self._control(header >> 24, data[start:offset])
                continue
            self._session.on_payload(data[start:offset], None)  # type: ignore[union-attr]
        if offset < end:
            self._buffer = bytearray(memoryview(data)[offset:])

    # the handshake ----------------------------------------------------------------------

    def _handshake_received(self, data: bytes) -> bytes:
        """Take the handshake's octets from ``data``; what follows it is returned."""
        handshake = self._handshake + data  # type: ignore[operator]
        if len(handshake) < 4:
            self._handshake = handshake
            return b""
        self._handshake = None
        if self.gate.refused:  # type: ignore[union-attr]
            self._refuse(RAWSOCKET_ERROR_MAX_CONNECTIONS)
            return b""
        if handshake[0] != RAWSOCKET_MAGIC:
            log.info("RawSocket peer %s sent no RawSocket handshake: closing", self.peer)
            self.transport.abortConnection()
            return b""
        if handshake[2:4] != b"\x00\x00":
            self._refuse(RAWSOCKET_ERROR_RESERVED_BITS)
            return b""
        serializer_id = handshake[1] & 0x0F
        object_serializer = self.factory.object_serializers.get(serializer_id)
        if object_serializer is None:
            self._refuse(RAWSOCKET_ERROR_SERIALIZER_UNSUPPORTED)
            return b""
        self.object_serializer = object_serializer
        self._max_len_send = _MAX_LEN_SEND[handshake[1] >> 4]
        self.transport.write(bytes([RAWSOCKET_MAGIC,
                                    self.factory.length_exponent << 4 | serializer_id, 0, 0]))
        try:
            self._session = session = self.factory.session_factory()
            session.onOpen(self)
        except Exception:
            log.exception("RawSocket session could not start")
            self._session = None
            self.transport.abortConnection()
            return b""
        return handshake[4:]

    def _refuse(self, code: int) -> None:
        self.transport.write(bytes([RAWSOCKET_MAGIC, code << 4, 0, 0]))
        self.flow.lose_connection()

    # what the session uses (router.wamp.outlet.Outlet) ----------------------------------

    def send(self, msg: WireMessage) -> None:
        """Send one frame, refusing messages over the peer's announced maximum length."""
        if self._session is None:
            raise TransportLost()
        frame = msg.rawsocket_frame(self.object_serializer)
        if len(frame) - 4 > self._max_len_send:
            raise PayloadExceededError(f"{len(frame) - 4} octets exceed the peer's limit of "
                                       f"{self._max_len_send}")
        self.flow.write(frame)

    def send_once(self, raw: list) -> None:
        """Write a message that has this receiver only, encoded without a cache."""
        if self._session is None:
            raise TransportLost()
        payload = encode(self.object_serializer, raw)
        if len(payload) > self._max_len_send:
            raise PayloadExceededError(f"{len(payload)} octets exceed the peer's limit of "
                                       f"{self._max_len_send}")
        self.flow.write(RAWSOCKET_LENGTH.pack(len(payload)) + payload)  # (rawsocket_frame)

    def _control_length(self, header: int) -> int:
        """The payload length of a frame whose header is over the length limit: a PING or
        PONG (its first octet the frame type 1 or 2, RawSocket's 24-bit length after it);
        -1 once the connection is closed for any other (too long, or a reserved type)."""
        kind, length = header >> 24, header & 0xFFFFFF
        if kind not in (RAWSOCKET_PING, RAWSOCKET_PONG):
            if kind:
                log.info("RawSocket peer %s sent a frame of reserved type %d: closing",
                         self.peer, kind)
                self._buffer = b""
                self.transport.abortConnection()
            else:
                self.lengthLimitExceeded(header)
            return -1
        if length > self.factory.frame_limit:
            self.lengthLimitExceeded(length)
            return -1
        return length

    def _control(self, kind: int, payload: bytes) -> None:
        """A PING is answered with a PONG of its payload (counted as any write while the
        client does not read, not sent once it is over its bound, as a WebSocket pong); a
        PONG needs nothing."""
        if kind != RAWSOCKET_PING:
            return
        if not self.flow.over:
            self.flow.write(bytes((RAWSOCKET_PONG,)) + len(payload).to_bytes(3, "big") + payload)

    def lengthLimitExceeded(self, length: int) -> None:
        log.info("RawSocket peer %s sent %d octets, over the limit of %d: closing",
                 self.peer, length, self.factory.max_length)
        self._buffer = b""
        self.transport.abortConnection()

    def close_wamp(self) -> None:
        self.flow.lose_connection()


class RouterRawSocketFactory(Factory):
    """Makes :class:`RouterRawSocketProtocol` connections of one RawSocket listener."""

    def __init__(self, session_factory: Callable[[], WampSession], serializers: list[Serializer],
                 max_message_size: int, new_flow: Callable[[object], ConnectionFlow],
                 tls: bool = False) -> None:
        self.protocol = RouterRawSocketProtocol.for_listener(self, tls)
        self.session_factory = session_factory
        self.object_serializers: dict[int, IObjectSerializer] = {
            serializer.RAWSOCKET_SERIALIZER_ID: serializer.object_serializer
            for serializer in serializers}
        """By RawSocket serializer id: the ones the router created, shared by connections."""
        self.length_exponent = max(0, math.ceil(math.log2(max_message_size)) - 9)
        """What the handshake reply announces: 2 ** (9 + this) octets, at least
        ``max_message_size`` (as autobahn rounded it)."""
        self.max_length = 2 ** (9 + self.length_exponent)
        """The longest frame a peer may send."""
        self.frame_limit = min(self.max_length, 0xFFFFFF)
        """The longest regular frame it can send: its header is its length, 24 bits (the
        first octet is the frame type, 0)."""
        self.new_flow = new_flow

    def buildProtocol(self, addr: Any) -> RouterRawSocketProtocol:
        return self.protocol()
