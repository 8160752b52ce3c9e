"""Twisted transports for MQTT: plain TCP and WebSocket (subprotocol ``mqtt``)."""

from __future__ import annotations

from typing import Callable

from autobahn.websocket.types import ConnectionDeny
from twisted.internet.protocol import Factory, Protocol, connectionDone

from router.flow import ConnectionFlow, FlowingProtocol
from router.held import HeldTransport
from router.limits import GatedProtocol, ReleasesClosedFuture
from router.mqtt.connection import MqttConnection
from router.mqtt.frontend import MqttFrontend
from router.mqtt.packets import ReasonCode
from router.websocket import WebSocketServerFactory, WebSocketServerProtocol


def _attach(connection: MqttConnection, protocol: GatedProtocol, transport) -> MqttConnection:
    """What the frontend needs beyond the bytes: the transport (for the TLS client
    certificate's CN, if it verified one), and the listener's gate (CONNECT ends the
    handshake; over a cap, CONNECT is refused)."""
    connection.transport = transport
    # the gate's own method, not the protocol's: the protocol holds the connection, so a
    # bound method of the protocol here would be a reference cycle (freed only by a full
    # collection, long after the connection closed)
    connection.handshake_done = protocol.gate.passed
    if protocol.gate.refused:
        connection.refusal = ReasonCode.QUOTA_EXCEEDED
    return connection


class MqttTcpProtocol(GatedProtocol, FlowingProtocol, Protocol):
    def connectionMade(self) -> None:
        super().connectionMade()
        peer = self.transport.getPeer()
        held = HeldTransport(self.factory.frontend.scheduler,
                             self.flow.counting(),
                             self.flow.lose_connection)
        self.connection = _attach(MqttConnection(self.factory.frontend, held,
                                                 f"{peer.host}:{peer.port}", "mqtt", self.flow),
                                  self, self.transport)

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connectionLost(self, reason=connectionDone) -> None:
        super().connectionLost(reason)
        self.connection.connection_lost()


class MqttTcpFactory(Factory):
    protocol = MqttTcpProtocol

    def __init__(self, frontend: MqttFrontend,
                 new_flow: Callable[[object], ConnectionFlow]) -> None:
        self.frontend = frontend
        self.new_flow = new_flow


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
        held = HeldTransport(self.factory.frontend.scheduler,
                             self.flow.counting(lambda data: self.sendMessage(data, isBinary=True)),
                             lambda: self.sendClose(self.CLOSE_STATUS_CODE_NORMAL))
        self.connection = _attach(MqttConnection(self.factory.frontend, held, self.peer,
                                                 "mqtt.websocket", self.flow),
                                  self, self.transport)

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
