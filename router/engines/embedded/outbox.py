"""The embedded engine's durable outbound queues (webhooks): one SQLite table in the node's
file. Implements :class:`router.core.engine.OutboxStore`; every write goes through the
store's single writer thread in the order it was made."""

from __future__ import annotations

from typing import Callable

from router.core.engine import OutboxRecord
from router.engines.embedded.sqlite import SqliteStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    realm TEXT NOT NULL, queue TEXT NOT NULL, seq INTEGER NOT NULL,
    body BLOB NOT NULL, expires_at REAL,
    PRIMARY KEY (realm, queue, seq)) WITHOUT ROWID;
"""


class SqliteOutboxStore:
    """A realm's outbound queues in the node's SQLite file: read at start-up, each change
    queued to the store's ordered writer."""

    def __init__(self, store: SqliteStore, realm: str) -> None:
        self._store = store
        self._realm = realm
        store.create_schema(SCHEMA)

    def load(self, queue: str) -> list[OutboxRecord]:
        """The queue's rows left by an earlier run, oldest first (start-up only: a read on the
        calling thread)."""
        return [OutboxRecord(seq, bytes(body), expires_at)
                for seq, body, expires_at in self._store.query(
                    "SELECT seq, body, expires_at FROM outbox WHERE realm = ? AND queue = ? "
                    "ORDER BY seq", (self._realm, queue))]

    def forget_others(self, queues: set[str]) -> int:
        """Drop the rows of webhooks no longer configured (start-up only, as :meth:`load`)."""
        gone = [(queue, n) for queue, n in self._store.query(
            "SELECT queue, COUNT(*) FROM outbox WHERE realm = ? GROUP BY queue", (self._realm,))
            if queue not in queues]
        for queue, _ in gone:
            self._store.execute("DELETE FROM outbox WHERE realm = ? AND queue = ?",
                                (self._realm, queue))
        return sum(n for _, n in gone)

    def append(self, queue: str, record: OutboxRecord) -> None:
        """Queued to the ordered writer; :meth:`when_durable` tells when it is stored."""
        self._store.execute("INSERT OR REPLACE INTO outbox (realm, queue, seq, body, expires_at) "
                            "VALUES (?, ?, ?, ?, ?)",
                            (self._realm, queue, record.seq, record.body, record.expires_at))

    def remove(self, queue: str, seq: int) -> None:
        """Queued to the ordered writer, after the appends it follows."""
        self._store.execute("DELETE FROM outbox WHERE realm = ? AND queue = ? AND seq = ?",
                            (self._realm, queue, seq))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """The writer's own durability signal: one for every table it writes."""
        self._store.when_durable(callback)

