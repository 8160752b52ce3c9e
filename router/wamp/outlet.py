"""What a WAMP session sees of its transport, as a protocol.

The session is below the transports in the import graph (transports -> session): it gets
its transport in ``onOpen`` and knows it only by this shape, as the MQTT session knows its
connection (:mod:`router.mqtt.outlet`) and the AMQP subscriber its connection
(:mod:`router.amqp.outlet`).
"""

from __future__ import annotations

from typing import Any, Protocol

from autobahn.wamp.interfaces import IObjectSerializer

from router.flow import ConnectionFlow
from router.wamp.codec import WireMessage


class Outlet(Protocol):
    """A WebSocket or RawSocket connection (``RouterWebSocketProtocol``,
    ``RouterRawSocketProtocol``) as its session uses it."""

    flow: ConnectionFlow
    peer: str
    info_peer: object
    """What the session's :class:`~router.core.model.SessionInfo` keeps as its ``peer``: the
    peer text, or an object whose ``str`` makes it (the session keeps the text once the
    connection is lost)."""
    object_serializer: IObjectSerializer
    """The negotiated format, the one the router's listener created (shared by every
    connection that speaks it, so an event shared by many receivers is encoded once)."""
    transport: Any
    """Twisted's transport underneath (a TLS client certificate is read from it)."""

    def send(self, msg: WireMessage) -> None:
        """Write one message; raises ``TransportLost`` or ``PayloadExceededError``."""

    def send_once(self, raw: list) -> None:
        """Write a message that goes to this receiver only (a call's INVOCATION, RESULT or
        ERROR): encoded for it without :class:`WireMessage`'s cache. Raises what
        :meth:`send` raises, and ``Unencodable``."""

    def close_wamp(self) -> None:
        """Close the connection the transport's way (WebSocket close, or drop)."""

    def handshake_done(self) -> None:
        """The WAMP handshake ended: its timer no longer applies."""

    def verifying(self, active: bool) -> None:
        """A login is (no longer) being verified off the reactor."""
