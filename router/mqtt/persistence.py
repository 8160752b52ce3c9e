"""Durable MQTT session state: sessions, subscriptions, queued messages, QoS 2 receipts.

Only persistent sessions (MQTT 3.1.1 clean session 0, MQTT 5 session expiry > 0)
are written. Every write goes through the store's single writer thread in the
order it was made, so a PUBACK/PUBREC sent after ``when_durable`` covers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import msgpack

from router.core.engine import Claims
from router.store.sqlite import SqliteStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS mqtt_session (
    realm TEXT NOT NULL, client_id TEXT NOT NULL, authid TEXT NOT NULL, authrole TEXT NOT NULL,
    authmethod TEXT NOT NULL, expiry REAL, disconnected_at REAL,
    PRIMARY KEY (realm, client_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mqtt_subscription (
    realm TEXT NOT NULL, client_id TEXT NOT NULL, filter TEXT NOT NULL, options BLOB NOT NULL,
    PRIMARY KEY (realm, client_id, filter)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mqtt_outbound (
    realm TEXT NOT NULL, client_id TEXT NOT NULL, seq INTEGER NOT NULL,
    packet_id INTEGER, state TEXT NOT NULL, message BLOB NOT NULL,
    PRIMARY KEY (realm, client_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mqtt_inbound (
    realm TEXT NOT NULL, client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    PRIMARY KEY (realm, client_id, packet_id)) WITHOUT ROWID;
"""


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
class SessionClaims(Claims, Protocol):
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


class MqttSessionStore:
    """Reads session state at start-up and queues its changes to the store."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(SCHEMA)

    def load(self) -> list[StoredSession]:
        realm = (self._realm,)
        sessions = {row[0]: StoredSession(*row) for row in self._store.query(
            "SELECT client_id, authid, authrole, authmethod, expiry, disconnected_at "
            "FROM mqtt_session WHERE realm = ?", realm)}
        for client_id, topic_filter, options in self._store.query(
                "SELECT client_id, filter, options FROM mqtt_subscription WHERE realm = ?", realm):
            if client_id in sessions:
                sessions[client_id].subscriptions[topic_filter] = msgpack.unpackb(options)
        for client_id, seq, packet_id, state, message in self._store.query(
                "SELECT client_id, seq, packet_id, state, message FROM mqtt_outbound "
                "WHERE realm = ? ORDER BY client_id, seq", realm):
            if client_id in sessions:
                sessions[client_id].outbound.append(
                    StoredOutbound(seq, packet_id, state, StoredMessage.unpack(message)))
        for client_id, packet_id in self._store.query(
                "SELECT client_id, packet_id FROM mqtt_inbound WHERE realm = ?", realm):
            if client_id in sessions:
                sessions[client_id].inbound.add(packet_id)
        return list(sessions.values())

    def save_session(self, client_id: str, authid: str, authrole: str, authmethod: str,
                     expiry: float | None, disconnected_at: float | None) -> None:
        self._store.execute(
            "INSERT INTO mqtt_session (realm, client_id, authid, authrole, authmethod, expiry, "
            "disconnected_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (realm, client_id) DO "
            "UPDATE SET authid = excluded.authid, authrole = excluded.authrole, "
            "authmethod = excluded.authmethod, expiry = excluded.expiry, "
            "disconnected_at = excluded.disconnected_at",
            (self._realm, client_id, authid, authrole, authmethod, expiry, disconnected_at))

    def delete_session(self, client_id: str) -> None:
        for table in ("mqtt_session", "mqtt_subscription", "mqtt_outbound", "mqtt_inbound"):
            self._store.execute(f"DELETE FROM {table} WHERE realm = ? AND client_id = ?",
                                (self._realm, client_id))

    def save_subscription(self, client_id: str, topic_filter: str, options: list) -> None:
        self._store.execute(
            "INSERT OR REPLACE INTO mqtt_subscription (realm, client_id, filter, options) "
            "VALUES (?, ?, ?, ?)",
            (self._realm, client_id, topic_filter, msgpack.packb(options)))

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        self._store.execute("DELETE FROM mqtt_subscription WHERE realm = ? AND client_id = ? "
                            "AND filter = ?", (self._realm, client_id, topic_filter))

    def enqueue(self, client_id: str, outbound: StoredOutbound) -> None:
        self._store.execute(
            "INSERT INTO mqtt_outbound (realm, client_id, seq, packet_id, state, message) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._realm, client_id, outbound.seq, outbound.packet_id, outbound.state,
             outbound.message.pack()))

    def update_outbound(self, client_id: str, seq: int, packet_id: int | None,
                        state: str) -> None:
        self._store.execute("UPDATE mqtt_outbound SET packet_id = ?, state = ? WHERE realm = ? "
                            "AND client_id = ? AND seq = ?",
                            (packet_id, state, self._realm, client_id, seq))

    def delete_outbound(self, client_id: str, seq: int) -> None:
        self._store.execute("DELETE FROM mqtt_outbound WHERE realm = ? AND client_id = ? "
                            "AND seq = ?", (self._realm, client_id, seq))

    def add_inbound(self, client_id: str, packet_id: int) -> None:
        self._store.execute("INSERT OR IGNORE INTO mqtt_inbound (realm, client_id, packet_id) "
                            "VALUES (?, ?, ?)", (self._realm, client_id, packet_id))

    def delete_inbound(self, client_id: str, packet_id: int) -> None:
        self._store.execute("DELETE FROM mqtt_inbound WHERE realm = ? AND client_id = ? "
                            "AND packet_id = ?", (self._realm, client_id, packet_id))

    def when_durable(self, callback) -> None:
        self._store.when_durable(callback)
