"""Durable MQTT session state: sessions, subscriptions, queued messages, QoS 2 receipts.

Only persistent sessions (MQTT 3.1.1 clean session 0, MQTT 5 session expiry > 0)
are written. This module holds the records and the store contract
(:class:`MqttSessionStore`); the engines implement it (the embedded engine's SQLite
tables are in :mod:`router.engines.embedded.sessions`). Every write is stored in the
order it was made, so a PUBACK/PUBREC sent after ``when_durable`` covers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import msgpack

from router.core.engine import Claims

QUEUED, SENT, RELEASED = "queued", "sent", "released"
"""The states of a :class:`StoredOutbound` (a QoS 2 delivery is ``released`` after PUBREC)."""


@dataclass
class StoredMessage:
    """A QoS >= 1 delivery as it will be (re)sent; receivers with the same QoS share one."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict = field(default_factory=dict)
    expires_at: float | None = None
    # wire bytes per (protocol version, dup), shared by the receivers of one publication
    # (PUBLISH head under version * 2 + dup, the rest under -1 minus that); never stored
    encodings: dict = field(default_factory=dict, compare=False, repr=False)

    def pack(self) -> bytes:
        return msgpack.packb([self.topic, self.payload, self.qos, self.retain,
                              _pack_properties(self.properties), self.expires_at],
                             use_bin_type=True)

    @classmethod
    def unpack(cls, blob: bytes) -> "StoredMessage":
        topic, payload, qos, retain, properties, expires_at = msgpack.unpackb(blob, raw=False)
        return cls(topic, payload, qos, retain, _unpack_properties(properties), expires_at)


def _pack_properties(properties: dict) -> dict:
    return {key: [list(pair) for pair in value] if key == "user_property" else value
            for key, value in properties.items()}


def _unpack_properties(properties: dict) -> dict:
    return {key: [tuple(pair) for pair in value] if key == "user_property" else value
            for key, value in properties.items()}


@dataclass
class StoredOutbound:
    seq: int
    packet_id: int | None
    state: str
    message: StoredMessage


@dataclass(frozen=True)
class StoredWill:
    """A connected client's will, kept beyond its node (the Redis engine), so that another
    node publishes it if that node dies; ``expiry`` (the session's) bounds its delay."""

    authid: str
    authrole: str
    authmethod: str
    expiry: float
    message: StoredMessage

    def pack(self) -> bytes:
        return msgpack.packb([self.authid, self.authrole, self.authmethod, self.expiry,
                              self.message.pack()], use_bin_type=True)

    @classmethod
    def unpack(cls, blob: bytes) -> "StoredWill":
        authid, authrole, authmethod, expiry, message = msgpack.unpackb(blob, raw=False)
        return cls(authid, authrole, authmethod, expiry, StoredMessage.unpack(message))


@dataclass
class StoredSession:
    client_id: str
    authid: str
    authrole: str
    authmethod: str
    expiry: float | None
    disconnected_at: float | None
    subscriptions: dict[str, list] = field(default_factory=dict)
    outbound: list[StoredOutbound] = field(default_factory=list)
    inbound: set[int] = field(default_factory=set)


@runtime_checkable
class SessionClaims(Claims["StoredSession"], Protocol):
    """The Redis engine's :class:`Claims` of MQTT sessions: also the adoption of the
    sessions of a node that died, and a copy of each connection's will for it."""

    adopt: Callable[[str, "StoredSession | None", "StoredWill | None"], None]
    """Set by the frontend: ``adopt(client_id, session, will)`` of a client whose node
    died (or of this node's previous run): its session, if persistent, now lives here."""
    lost_will: Callable[[str, "StoredWill"], None]
    """Set by the frontend: ``lost_will(client_id, will)`` of a client whose node died
    after the client connected to another node (its session is that node's now)."""

    def keep_will(self, client_id: str, will: "StoredWill | None") -> None:
        """The will of the client's connection on this node (None: it has none, or it was
        published or is no longer this node's to publish)."""


class MqttSessionStore(Protocol):
    """Where a realm's persistent MQTT sessions live (the embedded engine's SQLite file or
    Redis): the frontend reads them at start and queues every change in order."""

    def load(self) -> list[StoredSession]:
        """Every stored session of the realm, with its subscriptions and queues."""

    def save_session(self, client_id: str, authid: str, authrole: str, authmethod: str,
                     expiry: float | None, disconnected_at: float | None) -> None:
        """The session's identity and expiry (``disconnected_at`` None: connected)."""

    def delete_session(self, client_id: str) -> None:
        """The session and all it holds are gone."""

    def save_subscription(self, client_id: str, topic_filter: str, options: list) -> None:
        """The session subscribes ``topic_filter`` with ``options``."""

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """The session no longer subscribes ``topic_filter``."""

    def enqueue(self, client_id: str, outbound: StoredOutbound) -> None:
        """A QoS >= 1 delivery queued for the session."""

    def update_outbound(self, client_id: str, seq: int, packet_id: int | None,
                        state: str) -> None:
        """A queued delivery was sent (``packet_id``) or moved on in its QoS flow."""

    def delete_outbound(self, client_id: str, seq: int) -> None:
        """A queued delivery is done with."""

    def add_inbound(self, client_id: str, packet_id: int) -> None:
        """A QoS 2 PUBLISH was received and not yet released."""

    def delete_inbound(self, client_id: str, packet_id: int) -> None:
        """A QoS 2 receipt was released."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every change queued so far is stored."""
