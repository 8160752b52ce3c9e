"""What an MQTT session sees of its connection and of its frontend, as protocols.

The session is below both in the import graph (frontend -> session, connection ->
frontend -> session): it gets the objects, but knows them only by these shapes, so
neither module is imported by it and the package has no import cycle.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from router.core.realm import Realm
from router.flow import ConnectionFlow
from router.mqtt.persistence import MqttSessionStore, StoredMessage
from router.settings import MqttSettings

FLUSH_AT = 65536
"""Bytes of packets a connection gathers in one reactor turn before it writes them at once
(the transport's own buffer is about this size: its pausing is seen as before); also what
a retained batch gathers before it asks for room again."""


class Outlet(Protocol):
    """The connection a client is attached by: where its session writes, and what the
    frontend asks of it (an ``MqttConnection``)."""

    flow: ConnectionFlow
    peer: str
    transport_name: str
    send_quota: int
    """In-flight QoS >= 1 messages the client accepts (its receive maximum)."""
    outbound_alias_limit: int

    @property
    def version(self) -> int: ...

    @property
    def info_peer(self) -> object:
        """What the session's SessionInfo keeps as its peer while connected: the text, or
        an object whose ``str()`` is (see :attr:`SessionInfo.peer`)."""

    def send_publish(self, message: StoredMessage, packet_id: int | None, dup: bool) -> bool: ...

    def encode_publish(self, message: StoredMessage, packet_id: int | None = None,
                       dup: bool = False) -> bytes: ...

    def write_publish(self, data: bytes, topic: str) -> bool: ...

    @property
    def publish_encoder(self) -> Callable[[str, bytes, bool], bytes]: ...

    @property
    def max_packet(self) -> int | None: ...

    def write_packets(self, data: bytes) -> None: ...

    def flush(self) -> None:
        """Write what this reactor turn gathered."""

    def send_pubrel(self, packet_id: int, reason: int = ...) -> None: ...

    def store_failed(self, what: str) -> None: ...

    def kill(self, reason: str, message: str | None) -> None: ...


class SessionOwner(Protocol):
    """The realm's MQTT frontend, as its sessions use it (an ``MqttFrontend``)."""

    settings: MqttSettings
    store: MqttSessionStore
    realm: Realm

    def when_durable(self, callback: Callable[[bool], None]) -> None: ...

    def unsubscribe(self, session: Any, topic_filter: str) -> int:
        """Drop one of ``session``'s filters; its UNSUBACK reason code."""

    def delivery_acknowledged(self, session: Any, entry: Any) -> None:
        """A QoS >= 1 delivery (an ``Outbound`` of ``session``) was acknowledged."""
