"""The embedded engine's durable AMQP link store: SQLite tables in the node's file.

Implements :class:`router.amqp.persistence.AmqpStore`. ``amqp_expiry`` keeps each
subscription's timeout and when it was detached, ``amqp_shared`` its shared group,
``amqp_inbound`` the unsettled QoS 2 delivery tags of durable sender links
(:class:`SqliteInboundTags`, which the Redis engine's link store uses too: exactly-once
publishing is settled on the node the sender is attached to).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from router.amqp.persistence import Outgoing, StoredDurable, expired
from router.engines.embedded.sqlite import SqliteStore

log = logging.getLogger(__name__)

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
CREATE TABLE IF NOT EXISTS amqp_expiry (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL,
    timeout REAL NOT NULL, detached_at REAL,
    PRIMARY KEY (realm, container, link)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS amqp_shared (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL, share_group TEXT NOT NULL,
    PRIMARY KEY (realm, container, link)) WITHOUT ROWID;
"""
INBOUND_SCHEMA = """
CREATE TABLE IF NOT EXISTS amqp_inbound (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL, tag BLOB NOT NULL,
    PRIMARY KEY (realm, container, link, tag)) WITHOUT ROWID;
"""


class SqliteInboundTags:
    """A realm's unsettled QoS 2 delivery tags of durable sender links (exactly-once
    publishing), in the node's SQLite file: read at start-up, each change queued to the
    store's ordered writer."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(INBOUND_SCHEMA)
        self.inbound: dict[tuple[str, str], set[bytes]] = {}
        """Unsettled QoS 2 delivery tags per durable sender link (container, link)."""
        for container, link, tag in store.query(
                "SELECT container, link, tag FROM amqp_inbound WHERE realm = ?", (realm,)):
            self.inbound.setdefault((container, link), set()).add(bytes(tag))

    def has_inbound(self, key: tuple[str, str], tag: bytes) -> bool:
        """Was this delivery published and not settled yet? Then a resend is not
        published again (exactly once)."""
        return tag in self.inbound.get(key, ())

    def add_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """A QoS 2 delivery was published: kept until its settlement, across a restart."""
        self.inbound.setdefault(key, set()).add(tag)
        self._store.execute("INSERT OR IGNORE INTO amqp_inbound (realm, container, link, tag) "
                            "VALUES (?, ?, ?, ?)", (self._realm, key[0], key[1], tag))

    def delete_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """A QoS 2 delivery was settled: a later delivery with the same tag is a new one."""
        tags = self.inbound.get(key)
        if tags is None or tag not in tags:
            return
        tags.discard(tag)
        if not tags:
            del self.inbound[key]
        self._store.execute("DELETE FROM amqp_inbound WHERE realm = ? AND container = ? "
                            "AND link = ? AND tag = ?", (self._realm, key[0], key[1], tag))

    def forget_inbound(self, key: tuple[str, str]) -> None:
        """The sender link was closed: its unsettled deliveries are gone (spec 2.6.6)."""
        if self.inbound.pop(key, None) is not None:
            self._store.execute("DELETE FROM amqp_inbound WHERE realm = ? AND container = ? "
                                "AND link = ?", (self._realm, key[0], key[1]))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once the node's SQLite file holds every change so far."""
        self._store.when_durable(callback)


class SqliteLinkStore(SqliteInboundTags):
    """A realm's durable AMQP links in the node's SQLite file: read at start-up, each change
    queued to the store's ordered writer."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        super().__init__(store, realm)
        store.create_schema(SCHEMA)
        self._expiry: dict[tuple[str, str], tuple[float, float | None]] = {}

    def load(self, max_expiry: float, now: float | None = None) -> list[StoredDurable]:
        """The durable subscriptions to restore; expired ones are deleted instead."""
        now = time.time() if now is None else now
        realm = (self._realm,)
        self._expiry = {(container, link): (min(timeout, max_expiry), detached_at)
                        for container, link, timeout, detached_at in self._store.query(
                            "SELECT container, link, timeout, detached_at FROM amqp_expiry "
                            "WHERE realm = ?", realm)}
        durable = {(row[0], row[1]): StoredDurable(*row) for row in self._store.query(
            "SELECT container, link, address, qos, policy, authid, authrole, authmethod "
            "FROM amqp_durable WHERE realm = ?", realm)}
        for container, link, group in self._store.query(
                "SELECT container, link, share_group FROM amqp_shared WHERE realm = ?", realm):
            entry = durable.get((container, link))
            if entry is not None:
                entry.group = group
        for container, link, seq, message, count in self._store.query(
                "SELECT container, link, seq, message, delivery_count FROM amqp_queued "
                "WHERE realm = ? ORDER BY container, link, seq", realm):
            entry = durable.get((container, link))
            if entry is not None:
                entry.queued.append(Outgoing.unpack(seq, message, count))
        alive = []
        for key, entry in durable.items():
            # no row: stored before every durable source expired, as "never"
            timeout, detached_at = self._expiry.setdefault(key, (max_expiry, None))
            if expired(timeout, detached_at, now):
                log.info("AMQP durable subscription %s/%s expired while the router was down",
                         *key)
                self.delete(*key)
                continue
            alive.append(entry)
        return alive

    def expiry_of(self, container: str, link: str) -> tuple[float, float | None]:
        """(timeout, detached_at) of a subscription read by :meth:`load`."""
        return self._expiry[(container, link)]

    def set_expiry(self, container: str, link: str, timeout: float,
                   detached_at: float | None = None) -> None:
        """The subscription's timeout, and since when it is detached (None: attached)."""
        self._expiry[(container, link)] = (timeout, detached_at)
        self._store.execute(
            "INSERT OR REPLACE INTO amqp_expiry (realm, container, link, timeout, detached_at) "
            "VALUES (?, ?, ?, ?, ?)", (self._realm, container, link, timeout, detached_at))

    def save(self, container: str, link: str, address: str, qos: int, policy: str,
             authid: str, authrole: str, authmethod: str, group: str | None = None) -> None:
        """A durable link's definition (and its shared group) as a row, so the link is restored
        after a restart."""
        self._store.execute(
            "INSERT OR REPLACE INTO amqp_durable (realm, container, link, address, qos, policy, "
            "authid, authrole, authmethod) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self._realm, container, link, address, qos, policy, authid, authrole, authmethod))
        if group is None:
            self._store.execute("DELETE FROM amqp_shared WHERE realm = ? AND container = ? "
                                "AND link = ?", (self._realm, container, link))
        else:
            self._store.execute("INSERT OR REPLACE INTO amqp_shared (realm, container, link, "
                                "share_group) VALUES (?, ?, ?, ?)",
                                (self._realm, container, link, group))

    def delete(self, container: str, link: str) -> None:
        """The link is gone: every row it had, in the same ordered batch as its earlier writes."""
        self._expiry.pop((container, link), None)
        for table in ("amqp_durable", "amqp_queued", "amqp_expiry", "amqp_shared"):
            self._store.execute(f"DELETE FROM {table} WHERE realm = ? AND container = ? "
                                "AND link = ?", (self._realm, container, link))

    def enqueue(self, container: str, link: str, item: Outgoing) -> None:
        """A message queued for the link, kept until it is accepted, across a restart."""
        self._store.execute(
            "INSERT OR REPLACE INTO amqp_queued (realm, container, link, seq, message, "
            "delivery_count) VALUES (?, ?, ?, ?, ?, ?)",
            (self._realm, container, link, item.seq, item.pack(), item.delivery_count))

    def update_count(self, container: str, link: str, item: Outgoing,
                     count: int | None = None) -> None:
        """Store the item's delivery count (or ``count``)."""
        self._store.execute("UPDATE amqp_queued SET delivery_count = ? WHERE realm = ? AND "
                            "container = ? AND link = ? AND seq = ?",
                            (item.delivery_count if count is None else count, self._realm,
                             container, link, item.seq))

    def remove(self, container: str, link: str, seq: int) -> None:
        """A queued message was accepted or dropped: it is not redelivered after a restart."""
        self._store.execute("DELETE FROM amqp_queued WHERE realm = ? AND container = ? "
                            "AND link = ? AND seq = ?", (self._realm, container, link, seq))
