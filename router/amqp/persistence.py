"""Durable AMQP subscriptions and their unacknowledged QoS >= 1 deliveries.

A receiver link attached with a durable source (durability ``unsettled-state``
and expiry policy ``never``, or another expiry policy with a timeout > 0) is a
durable subscription, keyed by the client's container id and the link name. Its
definition and every QoS >= 1 message not yet accepted are written through the
store's ordered writer, so they survive a disconnect and a router restart. The
delivery count of a message is written (incremented) as it is sent, so a message
in flight when the router dies comes back counted.

Every durable source expires (``amqp_expiry`` keeps the timeout and when it was
detached) that many seconds after its link went away: its own timeout, capped by
the realm's ``amqp.max_link_expiry``, which is also the timeout of a source with
expiry policy ``never``. The subscription and its queue are dropped, at run time
or at start-up when the time passed while the router was down (timeouts stored
before a lower cap are capped when they are read).

``amqp_inbound`` holds the delivery tags of QoS 2 messages received on a
client's durable sender link (target durability other than ``none``, receiver
settle mode ``second``), keyed by container id and link name, that were
published but not yet settled by the client: a delivery resent with such a tag
(after a lost disposition, on a re-attached link or after a router restart) is
accepted again but not published again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import logging

import msgpack

from router.amqp.body import bytes_message
from router.core.engine import Claims
from router.store.sqlite import SqliteStore

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
CREATE TABLE IF NOT EXISTS amqp_inbound (
    realm TEXT NOT NULL, container TEXT NOT NULL, link TEXT NOT NULL, tag BLOB NOT NULL,
    PRIMARY KEY (realm, container, link, tag)) WITHOUT ROWID;
"""


@dataclass
class Outgoing:
    """One delivery to one receiver, as it will be (re)sent."""

    seq: int
    topic: str
    bare: bytes
    """The encoded bare message (shared by the receivers of one publication); the header
    and annotations are added as it is sent."""
    published_qos: int
    qos: int
    retained: bool
    delivery_count: int = 0
    expires_at: float | None = None
    """Message expiry: not sent after this time."""
    sent_at: float = field(default=0.0, compare=False)
    """When it was last sent (not stored): for the acknowledgement latency."""
    publication: Any = field(default=None, compare=False, repr=False)
    """The publication, kept (not stored) when it came through a shared group: another
    member takes it if this one goes away first."""

    def pack(self) -> bytes:
        return msgpack.packb([self.topic, self.bare, self.published_qos, self.qos,
                              self.retained, self.expires_at, BARE_MESSAGE], use_bin_type=True)

    @classmethod
    def unpack(cls, seq: int, blob: bytes, delivery_count: int) -> "Outgoing":
        topic, body, published_qos, qos, retained, *rest = msgpack.unpackb(blob, raw=False)
        expires_at = rest[0] if rest else None  # stored before messages had an expiry
        if rest[1:] != [BARE_MESSAGE]:  # stored as the payload of a data section
            body = bytes_message(topic, body)
        return cls(seq, topic, body, published_qos, qos, retained, delivery_count, expires_at)


BARE_MESSAGE = 1
"""The format mark of a queued message stored as its encoded bare message."""


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
    group: str | None = None
    """The shared group the link is a member of (``amqp_shared``), if any."""


@runtime_checkable
class LinkClaims(Claims, Protocol):
    """The Redis engine's :class:`Claims` of durable links: also the adoption of the links
    of a node that died."""

    adopt: Callable[[str, "StoredDurable | None"], None]
    """Set by the frontend: ``adopt(link id, stored)`` of a durable link whose node died:
    the link, if Redis holds it and it has not expired, now lives here."""


def expired(timeout: float, detached_at: float | None, now: float) -> bool:
    """Whether a durable subscription detached at ``detached_at`` (None: attached) with
    expiry ``timeout`` is over at ``now``."""
    return detached_at is not None and detached_at + timeout <= now


def link_id(container: str, link: str) -> str:
    """One string for a durable link's (container id, link name), whatever their characters
    (the id of its state among nodes); :func:`link_key` reads it back."""
    return f"{len(container)}:{container}{link}"


def link_key(owned: str) -> tuple[str, str]:
    """(container id, link name) of a :func:`link_id`."""
    length, rest = owned.split(":", 1)
    return rest[:int(length)], rest[int(length):]


class AmqpStore:
    """Reads durable subscriptions at start-up and queues their changes to the store."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(SCHEMA)
        self._expiry: dict[tuple[str, str], tuple[float, float | None]] = {}
        self.inbound: dict[tuple[str, str], set[bytes]] = {}
        """Unsettled QoS 2 delivery tags per durable sender link (container, link)."""
        for container, link, tag in store.query(
                "SELECT container, link, tag FROM amqp_inbound WHERE realm = ?", (realm,)):
            self.inbound.setdefault((container, link), set()).add(bytes(tag))

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

    # inbound QoS 2 ---------------------------------------------------------------------

    def has_inbound(self, key: tuple[str, str], tag: bytes) -> bool:
        return tag in self.inbound.get(key, ())

    def add_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        self.inbound.setdefault(key, set()).add(tag)
        self._store.execute("INSERT OR IGNORE INTO amqp_inbound (realm, container, link, tag) "
                            "VALUES (?, ?, ?, ?)", (self._realm, key[0], key[1], tag))

    def delete_inbound(self, key: tuple[str, str], tag: bytes) -> None:
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

    def save(self, container: str, link: str, address: str, qos: int, policy: str,
             authid: str, authrole: str, authmethod: str, group: str | None = None) -> None:
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
        self._expiry.pop((container, link), None)
        for table in ("amqp_durable", "amqp_queued", "amqp_expiry", "amqp_shared"):
            self._store.execute(f"DELETE FROM {table} WHERE realm = ? AND container = ? "
                                "AND link = ?", (self._realm, container, link))

    def enqueue(self, container: str, link: str, item: Outgoing) -> None:
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
        self._store.execute("DELETE FROM amqp_queued WHERE realm = ? AND container = ? "
                            "AND link = ? AND seq = ?", (self._realm, container, link, seq))

    def when_durable(self, callback) -> None:
        self._store.when_durable(callback)
