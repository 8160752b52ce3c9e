"""autobahn's WebSocket server protocol on Twisted, without the ``autobahn.twisted`` package.

autobahn's WebSocket protocol is written against no network framework
(``autobahn.websocket.protocol``, and ``autobahn.wamp.websocket`` for WAMP over it); its
Twisted glue is ``autobahn.twisted.websocket``. Importing that module runs the package's
``autobahn/twisted/__init__.py``, which imports autobahn's WAMP client
(``autobahn.twisted.wamp``, for ``ApplicationSession``), its ``autobahn.wamp.auth`` and with
it ``cryptography``, whose Rust extension alone is ~5.6 MB resident: 6.2 MB of an idle
router's 54 (bench/RESULTS.md), for a client and client-side authenticators the router never
uses (it checks WAMP credentials itself, router/core/credentials.py). So the router's
WebSocket listeners (WAMP and MQTT over WebSocket) build on the framework-free classes, and
this module is the part of autobahn's Twisted glue a server uses: Twisted's ``Protocol``
entry points handed to autobahn's, autobahn's ``_onX`` callbacks handed to the ``onX``
methods, closing and producers through the Twisted transport, the reactor on the factory.
What it leaves out is client-side (agents, ``connectWS``) or unused by the router (transport
details with TLS channel ids and peer certificates: the router reads the client certificate
from the Twisted transport, router/tls.py).
"""

from __future__ import annotations

from typing import Any

import txaio
from autobahn.wamp import websocket as wamp_websocket
from autobahn.websocket import protocol
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone

txaio.use_twisted()  # autobahn's futures are Deferreds (autobahn.twisted.websocket does this too)


def peer2str(transport: Any) -> str:
    """The peer as autobahn describes it: ``tcp4:127.0.0.1:53124``, ``tcp6:...``,
    ``unix:/path``, else ``unknown`` (autobahn.twisted.util.peer2str for socket transports)."""
    addr = transport.getPeer()
    if isinstance(addr, IPv4Address):
        return f"tcp4:{addr.host}:{addr.port}"
    if isinstance(addr, IPv6Address):
        return f"tcp6:{addr.host}:{addr.port}"
    if isinstance(addr, UNIXAddress):
        return f"unix:{addr.name}" if addr.name else "unix"
    return "unknown"


class WebSocketServerProtocol(Protocol, protocol.WebSocketServerProtocol):
    """A WebSocket server connection on a Twisted transport (what
    ``autobahn.twisted.websocket.WebSocketServerProtocol`` does for a server)."""

    log = txaio.make_logger()
    is_server = True
    peer: str | None = None
    flow: Any = None
    """The connection's :class:`router.flow.ConnectionFlow` (set by ``FlowingProtocol``)."""

    def connectionMade(self) -> None:
        self.peer = peer2str(self.transport)
        try:
            self.transport.setTcpNoDelay(self.tcpNoDelay)
        except Exception:  # not TCP (a Unix socket refuses it)
            pass
        self._connectionMade()

    def connectionLost(self, reason: Any = connectionDone) -> None:
        self._connectionLost(reason)

    def dataReceived(self, data: bytes) -> None:
        self._dataReceived(data)

    def _closeConnection(self, abort: bool = False) -> None:
        if abort and hasattr(self.transport, "abortConnection"):
            self.transport.abortConnection()
        else:
            self.transport.loseConnection()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self.transport.unregisterProducer()

    # autobahn's protocol calls these; a framework's glue hands each to its public callback

    def _onOpen(self) -> None:
        self.onOpen()

    def _onMessageBegin(self, isBinary: bool) -> None:
        self.onMessageBegin(isBinary)

    def _onMessageFrameBegin(self, length: int) -> None:
        self.onMessageFrameBegin(length)

    def _onMessageFrameData(self, payload: bytes) -> None:
        self.onMessageFrameData(payload)

    def _onMessageFrameEnd(self) -> None:
        self.onMessageFrameEnd()

    def _onMessageFrame(self, payload: list[bytes]) -> None:
        self.onMessageFrame(payload)

    def _onMessageEnd(self) -> None:
        self.onMessageEnd()

    def _onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.onMessage(payload, isBinary)

    def _onPing(self, payload: bytes) -> None:
        flow = self.flow
        if flow is not None and flow.paused:
            # the client does not read: a pong per ping piled up in memory as fast as it
            # pinged (940,000 pings in 30 s: +145 MB, never counted). Counted as any write
            # while paused, and dropped once over the bound, whose slow-consumer clock then
            # closes the connection
            if flow.over:
                return
            flow.wrote(len(payload) + 2)
        self.onPing(payload)

    def _onPong(self, payload: bytes) -> None:
        self.onPong(payload)

    def _onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.onClose(wasClean, code, reason)


class WebSocketServerFactory(protocol.WebSocketServerFactory, ServerFactory):
    """A Twisted server factory of WebSocket connections; ``reactor`` keyword as autobahn's
    (default: the global reactor)."""

    log = txaio.make_logger()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        reactor = kwargs.pop("reactor", None)
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        protocol.WebSocketServerFactory.__init__(self, *args, **kwargs)
        # autobahn's default answers a request without Upgrade with an HTML status page
        # (naming its version) on any path, and ``?redirect=URL`` with a 303 to that URL
        # (an open redirect); without it such a request gets 426 Upgrade Required
        self.setProtocolOptions(webStatus=False)


class WampWebSocketServerProtocol(wamp_websocket.WampWebSocketServerProtocol,
                                  WebSocketServerProtocol):
    """WAMP over a WebSocket server connection (subprotocol negotiation, the session)."""


class WampWebSocketServerFactory(wamp_websocket.WampWebSocketServerFactory,
                                 WebSocketServerFactory):
    """Factory of :class:`WampWebSocketServerProtocol`: ``factory`` makes the WAMP session,
    ``serializers`` the accepted subprotocols (autobahn's signature)."""

    protocol = WampWebSocketServerProtocol

    def __init__(self, factory: Any, *args: Any, **kwargs: Any) -> None:
        serializers = kwargs.pop("serializers", None)
        wamp_websocket.WampWebSocketServerFactory.__init__(self, factory, serializers)
        kwargs["protocols"] = self._protocols
        WebSocketServerFactory.__init__(self, *args, **kwargs)
