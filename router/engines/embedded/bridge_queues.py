"""The embedded engine's bridge queues: one SQLite table in the node's file.

Implements :class:`router.core.bridge_queue.BridgeQueueStore`; every write goes through the
store's single writer thread in the order it was made (never disk on the reactor).
"""

from __future__ import annotations

from typing import Callable

from router.engines.embedded.sqlite import SqliteStore


SCHEMA = """
CREATE TABLE IF NOT EXISTS bridge_queue (
    realm TEXT NOT NULL, bridge TEXT NOT NULL, seq INTEGER NOT NULL, message BLOB NOT NULL,
    PRIMARY KEY (realm, bridge, seq)) WITHOUT ROWID;
"""


class SqliteBridgeQueue:
    """One bridge's queued messages in the node's SQLite file."""

    def __init__(self, store: SqliteStore, realm: str, bridge: str) -> None:
        self._store = store
        self._key = (realm, bridge)
        store.create_schema(SCHEMA)

    def load(self, answer: Callable[[list[tuple[int, bytes]]], None],
             failed: Callable[[str], None]) -> None:
        """At once: read at start-up, before the writer has work."""
        answer([(seq, bytes(message)) for seq, message in self._store.query(
            "SELECT seq, message FROM bridge_queue WHERE realm = ? AND bridge = ? ORDER BY seq",
            self._key)])

    def append(self, seq: int, message: bytes) -> None:
        """Queued to the ordered writer; :meth:`when_durable` tells when it is stored."""
        self._store.execute("INSERT OR REPLACE INTO bridge_queue (realm, bridge, seq, message) "
                            "VALUES (?, ?, ?, ?)", (*self._key, seq, message))

    def delete(self, seq: int) -> None:
        """Queued to the ordered writer, after the append it undoes."""
        self._store.execute("DELETE FROM bridge_queue WHERE realm = ? AND bridge = ? AND seq = ?",
                            (*self._key, seq))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """The writer's own durability signal, shared by every table it writes."""
        self._store.when_durable(callback)

