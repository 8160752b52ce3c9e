"""Durable AMQP subscriptions and their unacknowledged QoS >= 1 deliveries.

A receiver link attached with a durable source (durability ``unsettled-state``
and expiry policy ``never``) is a durable subscription, keyed by the client's
container id and the link name. Its definition and every QoS >= 1 message not
yet accepted are written through the store's ordered writer, so they survive a
disconnect and a router restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from router.store.sqlite import SqliteStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS amqp_durable (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL,
    address TEXT NOT NULL, qos INTEGER NOT NULL, policy TEXT NOT NULL,
    authid TEXT NOT NULL, authrole TEXT NOT NULL, authmethod TEXT NOT NULL,
    PRIMARY KEY (realm, container, link)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS amqp_queued (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL, seq INTEGER NOT NULL,
    message BLOB NOT NULL, delivery_count INTEGER NOT NULL,
    PRIMARY KEY (realm, container, link, seq)) WITHOUT ROWID;
"""


@dataclass
class Outgoing:
    """One delivery to one receiver, as it will be (re)sent."""

    seq: int
    topic: str
    payload: bytes
    published_qos: int
    qos: int
    retained: bool
    delivery_count: int = 0

    def pack(self) -> bytes:
        return msgpack.packb([self.topic, self.payload, self.published_qos, self.qos,
                              self.retained], use_bin_type=True)

    @classmethod
    def unpack(cls, seq: int, blob: bytes, delivery_count: int) -> "Outgoing":
        topic, payload, published_qos, qos, retained = msgpack.unpackb(blob, raw=False)
        return cls(seq, topic, payload, published_qos, qos, retained, delivery_count)


@dataclass
class StoredDurable:
    container: str
    link: str
    address: str
    qos: int
    policy: str
    authid: str
    authrole: str
    authmethod: str
    queued: list[Outgoing] = field(default_factory=list)


class AmqpStore:
    """Reads durable subscriptions at start-up and queues their changes to the store."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(SCHEMA)

    def load(self) -> list[StoredDurable]:
        realm = (self._realm,)
        durable = {(row[0], row[1]): StoredDurable(*row) for row in self._store.query(
            "SELECT container, link, address, qos, policy, authid, authrole, authmethod "
            "FROM amqp_durable WHERE realm = ?", realm)}
        for container, link, seq, message, count in self._store.query(
                "SELECT container, link, seq, message, delivery_count FROM amqp_queued "
                "WHERE realm = ? ORDER BY container, link, seq", realm):
            entry = durable.get((container, link))
            if entry is not None:
                entry.queued.append(Outgoing.unpack(seq, message, count))
        return list(durable.values())

    def save(self, container: str, link: str, address: str, qos: int, policy: str,
             authid: str, authrole: str, authmethod: str) -> None:
        self._store.execute(
            "INSERT OR REPLACE INTO amqp_durable (realm, container, link, address, qos, policy, "
            "authid, authrole, authmethod) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self._realm, container, link, address, qos, policy, authid, authrole, authmethod))

    def delete(self, container: str, link: str) -> None:
        for table in ("amqp_durable", "amqp_queued"):
            self._store.execute(f"DELETE FROM {table} WHERE realm = ? AND container = ? "
                                "AND link = ?", (self._realm, container, link))

    def enqueue(self, container: str, link: str, item: Outgoing) -> None:
        self._store.execute(
            "INSERT OR REPLACE INTO amqp_queued (realm, container, link, seq, message, "
            "delivery_count) VALUES (?, ?, ?, ?, ?, ?)",
            (self._realm, container, link, item.seq, item.pack(), item.delivery_count))

    def update_count(self, container: str, link: str, item: Outgoing) -> None:
        self._store.execute("UPDATE amqp_queued SET delivery_count = ? WHERE realm = ? AND "
                            "container = ? AND link = ? AND seq = ?",
                            (item.delivery_count, self._realm, container, link, item.seq))

    def remove(self, container: str, link: str, seq: int) -> None:
        self._store.execute("DELETE FROM amqp_queued WHERE realm = ? AND container = ? "
                            "AND link = ? AND seq = ?", (self._realm, container, link, seq))

    def when_durable(self, callback) -> None:
        self._store.when_durable(callback)
