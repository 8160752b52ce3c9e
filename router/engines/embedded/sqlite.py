"""SQLite (WAL) persistence with a single writer thread and group commit.

The reactor thread only enqueues, and hands what a reactor turn queued (every
publisher's retained writes, session changes, the acknowledgements waiting on them) to
the writer at once at the end of the turn: one wake-up of the writer per turn, not one
per write. The writer drains everything handed over, writes it in one transaction
(coalescing repeated writes of the same key; the retained rows by multi-row statements, a
batch of retained writes alone by one statement that is its own transaction), commits
with ``synchronous=FULL`` and then reports durability back on the reactor thread, once
per batch.
With ``max_queued_writes`` writes waiting, ``on_pressure(True)`` asks the node to
stop reading from publishers; ``on_pressure(False)`` follows once half have been
written. Nothing is ever dropped: the intake pausing is what bounds the queue.

A retained row's ``topic`` is the JSON array of the topic's levels (``["a","b"]``),
so every topic (empty levels, ``.`` or ``/`` inside a level) has one key. Databases
written before topics were level tuples (``PRAGMA user_version`` 0) keyed rows by
the dotted URI; every such topic was a URI, so splitting on ``.`` is exact: they are
rewritten once, when the store is opened.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, TypeAlias

from router.background import BatchWorker
from router.core.incidents import STORE_FAILED, Incidents
from router.core.retention import RetainedEvent
from router.core.stats import LATENCY_BOUNDS, Histogram
from router.core.topic import Topic, from_uri
from router.engines.records import pack_topic, topic_key, unpack_topic

log = logging.getLogger(__name__)

Params: TypeAlias = "tuple[object, ...]"
"""The values of one SQL statement's placeholders."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
    realm TEXT NOT NULL,
    topic TEXT NOT NULL,
    entries BLOB NOT NULL,
    PRIMARY KEY (realm, topic)
) WITHOUT ROWID;
"""

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of a database whose retained rows are keyed by level arrays."""

RetainedLost = Callable[[str, Topic, list[bytes]], None]
"""(realm, topic, the entries the database still holds): a retained write failed, so
memory must go back to what is stored."""


STATEMENTS_CACHED = 256
"""Prepared statements the connection keeps (Python's default: 128): the retained upserts
of every size up to ``_UPSERT_ROWS`` and the other tables' ~50 statements, so none is
prepared again (preparing a 64-row upsert takes ~60 us)."""


def _connect(path: Path, max_bytes: int | None) -> sqlite3.Connection:
    connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                                 cached_statements=STATEMENTS_CACHED)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    if max_bytes is not None:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count={max(1, max_bytes // page_size)}")
    connection.executescript(SCHEMA)
    _migrate(connection)
    return connection


def _migrate(connection: sqlite3.Connection) -> None:
    """Rewrite the dotted keys of a database from before level tuples (one transaction)."""
    if connection.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    with connection:
        connection.execute("BEGIN")
        rows = connection.execute("SELECT realm, topic FROM retained").fetchall()
        connection.executemany("UPDATE retained SET topic = ? WHERE realm = ? AND topic = ?",
                               [(topic_key(from_uri(topic)), realm, topic)
                                for realm, topic in rows])
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    if rows:
        log.info("%d retained topic(s) rekeyed by level", len(rows))


class SqliteStore:
    """The node's SQLite file: the embedded engine's retained events (the realm's
    :class:`router.core.engine.Durability`), MQTT sessions and AMQP links, and the QoS 2
    tags of AMQP sender links on any engine; one writer thread, ordered writes."""

    def __init__(self, path: Path, call_in_loop: Callable[..., None],
                 max_bytes: int | None = None, max_queued_writes: int = 50_000,
                 at_turn_end: Callable[[Callable[[], None]], object] | None = None
                 ) -> None:
        """``at_turn_end`` (the reactor's, or its ``callLater(0)``): what a turn queues goes to
        the writer at its end; without, each write goes at once."""
        self.path = path
        self._call_in_loop = call_in_loop
        self._at_turn_end = at_turn_end
        self._turn: list[_Item] | None = None
        """What this reactor turn queued, handed to the writer at its end."""
        self._connection = _connect(path, max_bytes)
        self.incidents = Incidents()
        """Failed commits are counted here (the node hands in the router's)."""
        self.commit_seconds = Histogram(LATENCY_BOUNDS)
        """How long each batch's commit took (written by the writer thread only)."""
        self.batch_writes = Histogram(BATCH_BOUNDS)
        """Writes (retained topics and statements) per committed batch."""
        self.on_retained_lost: RetainedLost | None = None
        self._retained_writes: dict[tuple[str, Topic], int] = {}
        """(realm, topic) -> number of its newest queued write, while one is queued: a
        failed write is undone in memory only if no newer write of the topic follows."""
        self._write_numbers = 0
        self._queued_writes = 0
        """Writes handed to the writer thread (reactor thread only)."""
        self._finished_writes = 0
        """Writes whose batch has finished and whose callbacks have run (reactor thread)."""
        self.on_pressure: Callable[[bool], None] = lambda pressed: None
        """Stop (True) / restart (False) intake; the node sets it to its intake gate."""
        self._max_queued_writes = max_queued_writes
        self._pressed = False
        self._worker = BatchWorker("sqlite-writer", self._write_batch)

    # reactor side -------------------------------------------------------------

    def load_retained(self, realm: str) -> list[tuple[Topic, list[bytes]]]:
        """Every stored topic of ``realm`` (call before the writer has work: at start-up)."""
        rows = self._connection.execute(
            "SELECT topic, entries FROM retained WHERE realm = ?", (realm,)).fetchall()
        return [(tuple(json.loads(key)), unpack_topic(entries)) for key, entries in rows]

    def save_retained(self, realm: str, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Queue a topic's retained entries for the writer (entries naming sessions are left out:
        the ids mean nothing after a restart); repeated writes of a topic in one batch
        coalesce."""
        if len(entries) != 1 or entries[0].publication.eligibility is not None:
            # (the commonest: one entry, for every subscriber, kept as it is)
            entries = [entry for entry in entries if not _names_sessions(entry)]
        self._queue_write()
        self._write_numbers += 1
        key = (realm, topic)
        self._retained_writes[key] = self._write_numbers
        self._hand(_retained_write((key, pack_topic(entries) if entries else None,
                                    self._write_numbers)))

    def _queue_write(self) -> None:
        """Count one more write for the writer thread; at ``max_queued_writes`` outstanding,
        ask the node to stop reading from publishers (nothing is ever dropped)."""
        self._queued_writes += 1
        if (not self._pressed
                and self._queued_writes - self._finished_writes >= self._max_queued_writes):
            self._pressed = True
            self.on_pressure(True)

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Run ``callback(ok)`` once every write queued so far is committed: at once when
        none is outstanding (a QoS 1 publish that wrote nothing is not held up)."""
        if self._finished_writes == self._queued_writes:
            callback(True)
        else:
            self._hand(callback)

    def execute(self, statement: str, params: Params = ()) -> None:
        """Queue one write; writes run in the order queued, in the next committed batch."""
        self._queue_write()
        self._hand(_Statement(statement, params))

    def _hand(self, item: "_Item") -> None:
        """Queue ``item`` for the writer with the rest of this reactor turn's."""
        turn = self._turn
        if turn is None:
            if self._at_turn_end is None:
                self._worker.put([item])
                return
            turn = self._turn = []
            self._at_turn_end(self.hand_off)
        turn.append(item)

    def hand_off(self) -> None:
        """Give the writer what this turn queued (at the end of the turn; the node also
        calls it before :meth:`close`)."""
        turn, self._turn = self._turn, None
        if turn:
            self._worker.put(turn)

    def create_schema(self, script: str) -> None:
        """Create tables at start-up (before the writer has work)."""
        self._connection.executescript(script)

    def query(self, statement: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Read at start-up (before the writer has work)."""
        return self._connection.execute(statement, params).fetchall()

    def close(self) -> None:
        """Commit everything handed over and stop the writer (blocks; call from a thread or
        at exit, after :meth:`hand_off` on the reactor thread)."""
        self._worker.close()
        self._connection.close()

    # writer thread --------------------------------------------------------------

    def _write_batch(self, turns: list[list["_Item"]]) -> None:
        writes: dict[tuple[str, Topic], _RetainedWrite] = {}
        statements: list[_Statement] = []
        callbacks = []
        items = 0
        for turn in turns:
            items += len(turn)
            for item in turn:
                if type(item) is _Statement:
                    statements.append(item)
                elif type(item) is _RetainedWrite:
                    writes[item.key] = item
                else:
                    callbacks.append(item)
        error = None
        took = None
        if writes or statements:
            started = time.monotonic()
            error = self._write(writes, statements)  # (catches everything: a failed batch)
            took = time.monotonic() - started
        lost = self._committed(writes) if error is not None else []
        # the outcome first: nothing after this line can keep the callbacks from running
        self._call_in_loop(self._batch_done, items - len(callbacks), callbacks, error,
                           list(writes.values()), lost)
        if took is not None:
            self.commit_seconds.observe(took)
            self.batch_writes.observe(len(writes) + len(statements))

    def _batch_done(self, writes: int, callbacks: list[Callable[[bool], None]], error: str | None,
                    retained: list["_RetainedWrite"],
                    lost: list[tuple["_RetainedWrite", list[bytes]]]) -> None:
        """On the reactor thread, in batch order: count the writes, undo lost retained
        state, then acknowledge, so an acknowledgement answered at once can never overtake
        one of an earlier batch. Each callback runs on its own: one that fails costs only
        its own acknowledgement."""
        self._finished_writes += writes
        if (self._pressed and self._queued_writes - self._finished_writes
                <= self._max_queued_writes // 2):
            self._pressed = False
            self.on_pressure(False)
        newest = self._retained_writes
        for write, stored in lost:
            if newest.get(write.key) == write.number and self.on_retained_lost is not None:
                self.on_retained_lost(*write.key, stored)
        for write in retained:  # one lookup per write: the topic's newest write is done...
            number = newest.pop(write.key, write.number)
            if number != write.number:
                newest[write.key] = number  # ... unless a later one is queued
        if error is not None:
            self.incidents.count("", "store", STORE_FAILED,
                                 f"{self.path.name}: {error} ({writes} write(s) not stored)")
        ok = error is None
        for callback in callbacks:
            try:
                callback(ok)
            except Exception as exc:  # a bug in one acknowledgement must not cost the others
                log.exception("a durability callback failed: %s", exc)

    def _write(self, writes: dict[tuple[str, Topic], "_RetainedWrite"],
               statements: list["_Statement"]) -> str | None:
        """Commit one batch; the error message if it failed (nothing of it is stored)."""
        connection = self._connection
        try:
            stored = [(realm, topic_key(topic), w.blob) for (realm, topic), w in writes.items()
                      if w.blob is not None]
            upserts = _upserts(stored)
            if len(upserts) == 1 and not statements and len(stored) == len(writes):
                # one statement is its own transaction, committed (synchronous=FULL) before
                # it returns: the commonest batch, retained writes only, in one step
                connection.execute(*upserts[0])
                return None
            with connection:
                connection.execute("BEGIN")
                for statement in statements:
                    connection.execute(statement.sql, statement.params)
                for upsert in upserts:
                    connection.execute(*upsert)
                if len(stored) < len(writes):
                    connection.executemany(
                        "DELETE FROM retained WHERE realm = ? AND topic = ?",
                        [(realm, topic_key(topic)) for (realm, topic), w in writes.items()
                         if w.blob is None])
        except sqlite3.Error as exc:
            log.debug("writing a batch (%d retained topic(s), %d statement(s)) failed",
                      len(writes), len(statements), exc_info=True)
            return f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # (a value SQLite cannot take) failed like a commit,
            # not a writer thread gone with every later acknowledgement waiting on it
            log.exception("a batch (%d retained topic(s), %d statement(s)) could not be "
                          "written", len(writes), len(statements))
            return f"{type(exc).__name__}: {exc}"
        return None

    def _committed(self, writes: dict[tuple[str, Topic], "_RetainedWrite"]
                   ) -> list[tuple["_RetainedWrite", list[bytes]]]:
        """What the database holds for the topics of a failed batch (writer thread)."""
        lost = []
        try:
            for (realm, topic), write in writes.items():
                row = self._connection.execute(
                    "SELECT entries FROM retained WHERE realm = ? AND topic = ?",
                    (realm, topic_key(topic))).fetchone()
                lost.append((write, unpack_topic(row[0]) if row is not None else []))
        except Exception:  # (sqlite3.Error, or the topic that failed the write)
            log.exception("reading back retained topics after a failed write")
        return lost


_UPSERT_ROWS = 64
"""Most retained rows one statement stores: a batch of up to this many (the commonest:
15-35 while publishers wait for their acknowledgements) is one statement, its own
transaction; the statements of every size up to it are prepared once each."""


@functools.cache
def _upsert(rows: int) -> str:
    """The statement storing ``rows`` retained rows (none twice) in one step."""
    return ("INSERT INTO retained (realm, topic, entries) VALUES " + ",".join(["(?,?,?)"] * rows)
            + " ON CONFLICT (realm, topic) DO UPDATE SET entries = excluded.entries")


def _upserts(rows: list[tuple[str, str, bytes]]) -> list[tuple[str, list[object]]]:
    """(statement, parameters) storing ``rows`` (none twice), ``_UPSERT_ROWS`` at a time:
    SQLite takes each chunk in one step (one release of the GIL by the writer) instead of
    one per row, and a batch that fits one statement needs no BEGIN and COMMIT of its own
    (1.6 us less per row than chunks of powers of two in a transaction, 25-row batches
    with synchronous=FULL)."""
    return [(_upsert(len(chunk)), [value for row in chunk for value in row])
            for chunk in (rows[start:start + _UPSERT_ROWS]
                          for start in range(0, len(rows), _UPSERT_ROWS))]


BATCH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Writes per batch: one publisher gives batches of 1, a burst of thousands."""


class _RetainedWrite(NamedTuple):
    key: tuple[str, Topic]
    """(realm, topic), made once: it keys the coalescing and the newest write of a topic."""
    blob: bytes | None
    number: int


_retained_write = functools.partial(tuple.__new__, _RetainedWrite)
"""A :class:`_RetainedWrite` from its fields' tuple, without the Python-level ``__new__`` a
NamedTuple has (half the cost, once per retained publish on the reactor thread)."""


class _Statement(NamedTuple):
    sql: str
    params: Params


_Item: TypeAlias = "_Statement | _RetainedWrite | Callable[[bool], None]"
"""What the writer is handed: a statement, a retained write, or a durability callback."""


def _names_sessions(entry: RetainedEvent) -> bool:
    eligibility = entry.publication.eligibility
    return eligibility is not None and eligibility.names_sessions
