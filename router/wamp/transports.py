"""Twisted transports for WAMP: WebSocket and RawSocket on autobahn's factories.

autobahn has no router side, so these subclasses route every received
transport message to :class:`WampSession.on_payload` (which answers protocol
violations with ABORT instead of dropping the connection silently).
"""

from __future__ import annotations

import logging
from typing import Callable

from autobahn.twisted.rawsocket import WampRawSocketServerFactory, WampRawSocketServerProtocol
from autobahn.twisted.websocket import WampWebSocketServerFactory, WampWebSocketServerProtocol
from autobahn.exception import PayloadExceededError
from autobahn.wamp.exception import TransportLost
from autobahn.wamp.interfaces import IObjectSerializer
from autobahn.wamp.serializer import Serializer
from autobahn.wamp.websocket import parseSubprotocolIdentifier
from autobahn.websocket.types import ConnectionDeny
from twisted.protocols.basic import Int32StringReceiver

from router.flow import ConnectionFlow, FlowingProtocol
from router.limits import GatedProtocol, ReleasesClosedFuture
from router.wamp.codec import WireMessage
from router.wamp.session import WampSession

log = logging.getLogger(__name__)

RAWSOCKET_MAGIC = 0x7F
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


class _NobodyWaits:
    """A closing future no one waits on: resolving it does nothing."""

    def callback(self, result: object) -> None:
        pass


_NOBODY_WAITS = _NobodyWaits()


class RouterRawSocketProtocol(GatedProtocol, FlowingProtocol, WampRawSocketServerProtocol):
    """WAMP over RawSocket, router side, with the spec's handshake error replies."""

    def connectionMade(self) -> None:
        # the names autobahn and Int32StringReceiver first set at the handshake, set now: a
        # name first set once a few dozen connections exist makes that connection's
        # instance a full dict (~830 bytes, see router.counting.CountingServer)
        self.MAX_LENGTH = self.MAX_LENGTH
        self._unprocessed = b""
        self.object_serializer = None
        super().connectionMade()
        # nothing in the router waits for autobahn's closing future (a Deferred and its
        # callback list, ~130 bytes per connection, and a cycle once resolved with the
        # protocol itself): connectionLost resolves this instead
        self.is_closed = _NOBODY_WAITS

    def dataReceived(self, data: bytes) -> None:
        if self._handshake_complete:  # straight to the frame parser (autobahn's checks again)
            Int32StringReceiver.dataReceived(self, data)
            return
        if len(self._handshake_bytes) + len(data) >= 4:
            if self.gate.refused:
                self._refuse(RAWSOCKET_ERROR_MAX_CONNECTIONS)
                return
            handshake = (self._handshake_bytes + data)[:4]
            serializer_id = handshake[1] & 0x0F
            if handshake[0] == RAWSOCKET_MAGIC:
                if handshake[2:4] != b"\x00\x00":
                    self._refuse(RAWSOCKET_ERROR_RESERVED_BITS)
                    return
                if serializer_id not in self.factory.object_serializers:
                    self._refuse(RAWSOCKET_ERROR_SERIALIZER_UNSUPPORTED)
                    return
                self.object_serializer = self.factory.object_serializers[serializer_id]
        super().dataReceived(data)
        if self._handshake_complete and self._serializer is not None:
            # autobahn copied the factory's serializer for this connection (for its
            # statistics, ~230 bytes); the router sends and decodes with the shared
            # object serializer, so the connection keeps the factory's own. Its transport
            # details (~240 bytes) and handshake bytes served the handshake; the router
            # reads the peer only.
            self._serializer = self.factory._serializers.get(
                self._serializer.RAWSOCKET_SERIALIZER_ID, self._serializer)
            self._transport_details = None
            self._handshake_bytes = b""

    def _refuse(self, code: int) -> None:
        self.transport.write(bytes([RAWSOCKET_MAGIC, code << 4, 0, 0]))
        self.flow.lose_connection()

    def stringReceived(self, payload: bytes) -> None:
        self._session.on_payload(payload, None)

    def send(self, msg: WireMessage) -> None:
        """Send one frame, refusing messages over the peer's announced maximum length."""
        if self._session is None:
            raise TransportLost()
        frame = msg.rawsocket_frame(self.object_serializer)
        if len(frame) - 4 > self._max_len_send:
            raise PayloadExceededError(f"{len(frame) - 4} octets exceed the peer's limit of "
                                       f"{self._max_len_send}")
        self.flow.write(frame)

    def lengthLimitExceeded(self, length: int) -> None:
        log.info("RawSocket peer %s sent %d octets, over the limit of %d: closing",
                 self.peer, length, self.MAX_LENGTH)
        self.transport.abortConnection()

    def close_wamp(self) -> None:
        self.flow.lose_connection()


class RouterRawSocketFactory(WampRawSocketServerFactory):
    protocol = RouterRawSocketProtocol

    def __init__(self, session_factory: Callable[[], WampSession], serializers: list[Serializer],
                 max_message_size: int, new_flow: Callable[[object], ConnectionFlow]) -> None:
        super().__init__(session_factory, serializers=serializers)
        self.object_serializers: dict[int, IObjectSerializer] = {
            serializer.RAWSOCKET_SERIALIZER_ID: serializer.object_serializer
            for serializer in serializers}
        """By RawSocket serializer id: the ones the router created, shared by connections."""
        self.setProtocolOptions(maxMessagePayloadSize=max_message_size)
        self.new_flow = new_flow
