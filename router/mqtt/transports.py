"""Twisted transports for MQTT: plain TCP and WebSocket (subprotocol ``mqtt``)."""

from __future__ import annotations

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.protocol import Factory, Protocol

from router.mqtt.connection import MqttConnection
from router.mqtt.frontend import MqttFrontend


class MqttTcpProtocol(Protocol):
    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.connection = MqttConnection(self.factory.frontend, self.transport.write,
                                         self.transport.loseConnection,
                                         f"{peer.host}:{peer.port}", "mqtt")

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connectionLost(self, reason=None) -> None:
        self.connection.connection_lost()


class MqttTcpFactory(Factory):
    protocol = MqttTcpProtocol

    def __init__(self, frontend: MqttFrontend) -> None:
        self.frontend = frontend


class MqttWebSocketProtocol(WebSocketServerProtocol):
    """MQTT packets in binary WebSocket messages (a packet may span messages)."""

    connection: MqttConnection | None = None

    def onConnect(self, request):
        if request.path != self.factory.path:
            raise ConnectionDeny(ConnectionDeny.NOT_FOUND, f"no MQTT endpoint at {request.path}")
        if "mqtt" not in request.protocols:
            raise ConnectionDeny(ConnectionDeny.BAD_REQUEST, "the subprotocol must be 'mqtt'")
        return "mqtt"

    def onOpen(self) -> None:
        self.connection = MqttConnection(
            self.factory.frontend, lambda data: self.sendMessage(data, isBinary=True),
            lambda: self.sendClose(self.CLOSE_STATUS_CODE_NORMAL), self.peer, "mqtt.websocket")

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

    def __init__(self, frontend: MqttFrontend, path: str, max_message_size: int) -> None:
        super().__init__()
        self.frontend = frontend
        self.path = path
        self.setProtocolOptions(maxMessagePayloadSize=max_message_size)
