"""Twisted transports for MQTT: plain TCP and WebSocket (subprotocol ``mqtt``)."""

from __future__ import annotations

from typing import Any, Callable

from autobahn.websocket.types import ConnectionDeny
from twisted.internet.interfaces import ILoggingContext, IProtocol
from twisted.internet.protocol import Factory, connectionDone
from zope.interface import implementer

from router.flow import ConnectionFlow, FlowingProtocol
from router.limits import GatedProtocol, ReleasesClosedFuture, SlottedGatedProtocol
from router.mqtt.connection import MqttConnection
from router.mqtt.frontend import MqttFrontend
from router.websocket import WebSocketServerFactory, WebSocketServerProtocol


class _TcpEnd:
    """Where the mixins' ``connectionMade`` and ``connectionLost`` chains end (below them
    in :class:`MqttTcpProtocol`'s bases)."""

    __slots__ = ()

    def connectionMade(self) -> None:
        """The end of the mixins' chain."""

    def connectionLost(self, reason: Any = connectionDone) -> None:
        """The end of the mixins' chain."""


@implementer(IProtocol, ILoggingContext)
class MqttTcpProtocol(MqttConnection, SlottedGatedProtocol, FlowingProtocol, _TcpEnd):
    """MQTT over TCP (or TLS): the Twisted protocol is the connection itself.

    A Twisted ``Protocol`` with an ``MqttConnection`` and a ``HeldTransport`` beside it
    (with two bound methods of the flow) were four objects and an instance dict, ~340
    bytes of every idle connection; this one is slotted and writes to its transport
    itself. (``MqttConnection`` comes first among the bases: its ``gate`` slot, not the
    mixin's class default, is what ``gate`` names.) What all connections of a listener
    share is in the listener's own subclass (``SlottedGatedProtocol.for_listener``)."""

    __slots__ = ()
    transport_name = "mqtt"
    factory: "MqttTcpFactory"

    def __init__(self) -> None:
        self.transport: Any = None
        self.gate = None

    # Twisted's IProtocol ----------------------------------------------------------------

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        self.connectionMade()

    def connectionMade(self) -> None:
        super().connectionMade()  # admitted by the gate, the flow made
        MqttConnection.__init__(self, self.factory.frontend, self.flow, self.transport,
                                self.gate)

    @property
    def peer(self) -> str:
        peer = self.transport.getPeer()
        return f"{peer.host}:{peer.port}"

    @property
    def info_peer(self) -> "MqttTcpProtocol":
        """The connection itself: its ``str`` is :attr:`peer`, made when asked (an idle
        session's info keeps no copy of the text, 64 bytes; it becomes the text when the
        connection is lost, :meth:`MqttFrontend.disconnected`)."""
        return self

    def __str__(self) -> str:
        return self.peer

    def logPrefix(self) -> str:
        return self.__class__.__name__

    # the listener's caps ------------------------------------------------------------

    # CONNECT passed the gate: an admitted connection lets it go (``limits.ADMITTED``)
    _handshake_passed = GatedProtocol.handshake_done

    def dataReceived(self, data: bytes) -> None:
        if self.counted_by is not None:
            self.counted_by.bytes_in += len(data)
        self.data_received(data)

    def connectionLost(self, reason: Any = connectionDone) -> None:
        super().connectionLost(reason)
        self.connection_lost()

    # what the connection writes with ----------------------------------------------------

    def _write_raw(self, data: bytes) -> None:
        self.transport.write(data)

    def _close_out(self) -> None:
        self.flow.lose_connection()


class MqttTcpFactory(Factory):
    """Makes :class:`MqttTcpProtocol` connections of one MQTT TCP (or TLS) listener."""

    def __init__(self, frontend: MqttFrontend, new_flow: Callable[[object], ConnectionFlow],
                 tls: bool = False) -> None:
        self.protocol = MqttTcpProtocol.for_listener(self, tls)
        self.frontend = frontend
        self.new_flow = new_flow

    def buildProtocol(self, addr: Any) -> MqttTcpProtocol:
        return self.protocol()


class _WebSocketConnection(MqttConnection):
    """The connection of an :class:`MqttWebSocketProtocol`: its packets go in binary
    WebSocket messages."""

    __slots__ = ("protocol",)
    transport_name = "mqtt.websocket"

    def __init__(self, protocol: "MqttWebSocketProtocol") -> None:
        self.protocol = protocol
        """(A reference cycle with the protocol's ``connection``, broken at ``onClose``.)"""
        super().__init__(protocol.factory.frontend, protocol.flow, protocol.transport,
                         protocol.gate)

    @property
    def peer(self) -> str:
        return self.protocol.peer

    def _write_raw(self, data: bytes) -> None:
        self.protocol.sendMessage(data, isBinary=True)

    def _close_out(self) -> None:
        self.protocol.sendClose(self.protocol.CLOSE_STATUS_CODE_NORMAL)


class MqttWebSocketProtocol(ReleasesClosedFuture, GatedProtocol, FlowingProtocol,
                            WebSocketServerProtocol):
    """MQTT packets in binary WebSocket messages (a packet may span messages)."""

    connection: MqttConnection | None = None

    def onConnect(self, request):
        self.deny_if_refused()
        if request.path != self.factory.path:
            raise ConnectionDeny(ConnectionDeny.NOT_FOUND, f"no MQTT endpoint at {request.path}")
        if "mqtt" not in request.protocols:
            raise ConnectionDeny(ConnectionDeny.BAD_REQUEST, "the subprotocol must be 'mqtt'")
        return "mqtt"

    def onOpen(self) -> None:
        self.connection = _WebSocketConnection(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if not isBinary:
            self.sendClose(self.CLOSE_STATUS_CODE_UNSUPPORTED_DATA, "MQTT needs binary messages")
            return
        self.connection.data_received(payload)

    def onClose(self, wasClean, code, reason) -> None:
        if self.connection is not None:
            self.connection.connection_lost()
            self.connection = None


class MqttWebSocketFactory(WebSocketServerFactory):
    protocol = MqttWebSocketProtocol

    def __init__(self, frontend: MqttFrontend, path: str, max_message_size: int,
                 new_flow: Callable[[object], ConnectionFlow]) -> None:
        super().__init__()
        self.frontend = frontend
        self.path = path
        self.new_flow = new_flow
        self.setProtocolOptions(maxMessagePayloadSize=max_message_size)
