"""The embedded engine's MQTT session store: four SQLite tables in the node's file.

Implements :class:`router.mqtt.persistence.MqttSessionStore`; every write goes through the
store's single writer thread in the order it was made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import msgpack

from router.engines.embedded.sqlite import SqliteStore
from router.mqtt.persistence import StoredMessage, StoredOutbound, StoredSession

if TYPE_CHECKING:
    from router.mqtt.persistence import MqttSessionStore

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


class SqliteSessionStore:
    """Realm's persistent MQTT sessions in the node's SQLite file: read at start-up, each
    change queued to the store's ordered writer."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(SCHEMA)

    def load(self) -> list[StoredSession]:
        """Start-up: every stored session of the realm with its subscriptions and queues, so
        persistent sessions survive a restart."""
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
        """The session's identity and expiry as a row (upserted: a reconnect updates it)."""
        self._store.execute(
            "INSERT INTO mqtt_session (realm, client_id, authid, authrole, authmethod, expiry, "
            "disconnected_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (realm, client_id) DO "
            "UPDATE SET authid = excluded.authid, authrole = excluded.authrole, "
            "authmethod = excluded.authmethod, expiry = excluded.expiry, "
            "disconnected_at = excluded.disconnected_at",
            (self._realm, client_id, authid, authrole, authmethod, expiry, disconnected_at))

    def delete_session(self, client_id: str) -> None:
        """The session ended or expired: every row it had goes."""
        for table in ("mqtt_session", "mqtt_subscription", "mqtt_outbound", "mqtt_inbound"):
            self._store.execute(f"DELETE FROM {table} WHERE realm = ? AND client_id = ?",
                                (self._realm, client_id))

    def save_subscription(self, client_id: str, topic_filter: str, options: list[int]) -> None:
        """A subscription of the session, restored with it."""
        self._store.execute(
            "INSERT OR REPLACE INTO mqtt_subscription (realm, client_id, filter, options) "
            "VALUES (?, ?, ?, ?)",
            (self._realm, client_id, topic_filter, msgpack.packb(options)))

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """The session no longer subscribes ``topic_filter``."""
        self._store.execute("DELETE FROM mqtt_subscription WHERE realm = ? AND client_id = ? "
                            "AND filter = ?", (self._realm, client_id, topic_filter))

    def enqueue(self, client_id: str, outbound: StoredOutbound) -> None:
        """A QoS >= 1 message queued for the session, kept until it is acknowledged."""
        self._store.execute(
            "INSERT INTO mqtt_outbound (realm, client_id, seq, packet_id, state, message) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._realm, client_id, outbound.seq, outbound.packet_id, outbound.state,
             outbound.message.pack()))

    def update_outbound(self, client_id: str, seq: int, packet_id: int | None,
                        state: str) -> None:
        """A queued message's packet id and QoS 2 state, so a resumed session continues the flow
        where it was."""
        self._store.execute("UPDATE mqtt_outbound SET packet_id = ?, state = ? WHERE realm = ? "
                            "AND client_id = ? AND seq = ?",
                            (packet_id, state, self._realm, client_id, seq))

    def delete_outbound(self, client_id: str, seq: int) -> None:
        """A queued message was acknowledged: it is not resent."""
        self._store.execute("DELETE FROM mqtt_outbound WHERE realm = ? AND client_id = ? "
                            "AND seq = ?", (self._realm, client_id, seq))

    def add_inbound(self, client_id: str, packet_id: int) -> None:
        """An inbound QoS 2 packet id was received and not released: a resend after a restart is
        not published twice."""
        self._store.execute("INSERT OR IGNORE INTO mqtt_inbound (realm, client_id, packet_id) "
                            "VALUES (?, ?, ?)", (self._realm, client_id, packet_id))

    def delete_inbound(self, client_id: str, packet_id: int) -> None:
        """The client released the packet id (PUBREL): it may be used for a new message."""
        self._store.execute("DELETE FROM mqtt_inbound WHERE realm = ? AND client_id = ? "
                            "AND packet_id = ?", (self._realm, client_id, packet_id))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once the SQLite file holds every change so far: an acknowledgement
        waits for it."""
        self._store.when_durable(callback)


if TYPE_CHECKING:
    _: type[MqttSessionStore] = SqliteSessionStore
