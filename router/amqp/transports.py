"""The Twisted transport for AMQP 1.0: TCP (default port 5672) or TLS (usually 5671)."""

from __future__ import annotations

from functools import partial
from typing import Callable

from twisted.internet.protocol import Factory, Protocol, connectionDone

from router.amqp.connection import AmqpConnection
from router.amqp.frontend import AmqpFrontend
from router.amqp.sasl import Answer, SaslServer
from router.flow import ConnectionFlow, FlowingProtocol
from router.held import HeldTransport
from router.limits import GatedProtocol
from router.tls import peer_common_name

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671


class AmqpTcpProtocol(GatedProtocol, FlowingProtocol, Protocol):
    def connectionMade(self) -> None:
        super().connectionMade()
        peer = self.transport.getPeer()
        self.peer = f"{peer.host}:{peer.port}"
        frontend = self.factory.frontend
        # a refused login's sasl-outcome is held back by the login guard's delay
        self.held = HeldTransport(frontend.scheduler, self.flow.counting(),
                                  self.flow.lose_connection)
        self.connection = AmqpConnection(frontend, self.held.write, self.held.close, self.peer,
                                         self.flow, self.factory.max_message_size)
        # the gate's methods, not the protocol's (which holds the connection): no reference
        # cycle, so a closed connection is freed at once, not by a full collection
        self.connection.handshake_done = self.gate.passed
        self.connection.verifying = self.gate.verifying
        self._sasl_ready = False
        self._header_bytes = 0

    def _prepare_sasl(self) -> None:
        """Per-connection SASL: EXTERNAL needs this connection's TLS client certificate,
        which is known only once the handshake is done (at the first bytes)."""
        self._sasl_ready = True
        frontend = self.factory.frontend
        client_cn = peer_common_name(self.transport) if self.factory.tls else None
        self.connection.sasl = SaslServer(
            frontend.mechanisms(client_cn),
            partial(self._authenticate, client_cn),
            allow_skip=frontend.realm.anonymous_role is not None,
            wake=self.connection.sasl_answered)

    def _authenticate(self, client_cn, mechanism: str, response: bytes, answer: Answer) -> None:
        def hold(delay: float) -> None:
            self.held.hold = delay
        self.factory.frontend.authenticate(mechanism, response, answer, self.peer, client_cn,
                                           hold)

    def dataReceived(self, data: bytes) -> None:
        if self.gate.refused:
            # over a cap: no clean AMQP refusal is possible before SASL and OPEN, so the
            # connection is closed once the client has sent its protocol header
            self._header_bytes += len(data)
            if self._header_bytes >= 8:
                self.flow.lose_connection()
            return
        if not self._sasl_ready:
            self._prepare_sasl()
        self.connection.data_received(data)

    def connectionLost(self, reason=connectionDone) -> None:
        super().connectionLost(reason)
        self.connection.connection_lost()


class AmqpTcpFactory(Factory):
    protocol = AmqpTcpProtocol

    def __init__(self, frontend: AmqpFrontend, new_flow: Callable[[object], ConnectionFlow],
                 max_message_size: int, tls: bool = False) -> None:
        self.frontend = frontend
        self.new_flow = new_flow
        self.max_message_size = max_message_size
        """The listener's ``max_message_size``: the largest message a client may send."""
        self.tls = tls
