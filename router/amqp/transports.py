"""The Twisted transport for AMQP 1.0: plain TCP (default port 5672)."""

from __future__ import annotations

from twisted.internet.protocol import Factory, Protocol

from router.amqp.connection import AmqpConnection
from router.amqp.frontend import AmqpFrontend

DEFAULT_PORT = 5672


class AmqpTcpProtocol(Protocol):
    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.connection = AmqpConnection(self.factory.frontend, self.transport.write,
                                         self.transport.loseConnection,
                                         f"{peer.host}:{peer.port}")

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connectionLost(self, reason=None) -> None:
        self.connection.connection_lost()


class AmqpTcpFactory(Factory):
    protocol = AmqpTcpProtocol

    def __init__(self, frontend: AmqpFrontend) -> None:
        self.frontend = frontend
