"""SQLite (WAL) persistence with a single writer thread and group commit.

The reactor thread only enqueues, and hands what a reactor turn queued (every
publisher's retained writes, session changes, the acknowledgements waiting on them) to
the writer at once at the end of the turn: one wake-up of the writer per turn, not one
per write. The writer drains everything handed over, writes it in one transaction
(coalescing repeated writes of the same key; the retained rows by multi-row statements, a
batch of retained writes alone by one statement that is its own transaction), commits
with ``synchronous=FULL`` and then reports durability back on the reactor thread, once
per batch.

A batch's retained writes are appended to ``retained_log`` (``entries`` NULL: the topic
was cleared), not upserted into ``retained``: an append fills the log's last pages, where
upserting topics spread over the table dirtied a page per topic, each written whole to
the WAL and synced at every commit. Once
:data:`FOLD_ROWS` rows are logged, the writer folds them into ``retained`` in one
transaction (each page written once however many of its topics changed), after
reporting the batch that crossed it; the store folds what is left when it is opened
(after a crash) and closed. ``retained`` plus the log, newest row last, is the stored
state.
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
CREATE TABLE IF NOT EXISTS retained_log (
    seq INTEGER PRIMARY KEY,
    realm TEXT NOT NULL,
    topic TEXT NOT NULL,
    entries BLOB
);
"""

FOLD_ROWS = 4096
"""Rows of ``retained_log`` at which the writer folds it into ``retained``: the fold
rewrites the table's pages those topics are on once (4,096 new topics: about 15 ms of CPU
on a 2-core VM, which the next batch waits for), and the log never holds more rows than
this plus one batch."""

_FOLD = (
    # the newest value of every topic whose newest row is not a clear, in log order
    "INSERT INTO retained (realm, topic, entries) SELECT realm, topic, entries"
    " FROM retained_log WHERE entries IS NOT NULL ORDER BY seq"
    " ON CONFLICT (realm, topic) DO UPDATE SET entries = excluded.entries",
    # then the topics whose newest row is a clear
    "DELETE FROM retained WHERE (realm, topic) IN (SELECT realm, topic FROM retained_log"
    " GROUP BY realm, topic"
    " HAVING max(seq) = max(CASE WHEN entries IS NULL THEN seq END))",
    "DELETE FROM retained_log",
)
"""Fold ``retained_log`` into ``retained`` (in one transaction)."""

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of a database whose retained rows are keyed by level arrays."""

RetainedLost = Callable[[str, Topic, list[bytes]], None]
"""(realm, topic, the entries the database still holds): a retained write failed, so
memory must go back to what is stored."""


def _connect(path: Path, max_bytes: int | None) -> sqlite3.Connection:
    connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                                 cached_statements=256)  # the appends' sizes, and the rest
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    if max_bytes is not None:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count={max(1, max_bytes // page_size)}")
    connection.executescript(SCHEMA)
    _migrate(connection)
    _fold(connection)
    return connection


def _fold(connection: sqlite3.Connection) -> int:
    """Fold ``retained_log`` into ``retained`` in one transaction; the rows folded."""
    rows: int = connection.execute("SELECT count(*) FROM retained_log").fetchone()[0]
    if rows:
        with connection:
            connection.execute("BEGIN")
            for statement in _FOLD:
                connection.execute(statement)
    return rows


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
        self._logged = 0
        """Rows appended to ``retained_log`` since it was last folded (writer thread)."""
        self._worker = BatchWorker("sqlite-writer", self._write_batch)

    # reactor side -------------------------------------------------------------

    def load_retained(self, realm: str) -> list[tuple[Topic, list[bytes]]]:
        """Every stored topic of ``realm`` (call before the writer has work: at start-up)."""
        rows = dict(self._connection.execute(
            "SELECT topic, entries FROM retained WHERE realm = ?", (realm,)))
        for key, entries in self._connection.execute(  # empty unless written since opened
                "SELECT topic, entries FROM retained_log WHERE realm = ? ORDER BY seq", (realm,)):
            if entries is None:
                rows.pop(key, None)
            else:
                rows[key] = entries
        return [(tuple(json.loads(key)), unpack_topic(entries)) for key, entries in rows.items()]

    def save_retained(self, realm: str, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Queue a topic's retained entries for the writer (entries naming sessions are left out:
        the ids mean nothing after a restart); repeated writes of a topic in one batch
        coalesce."""
        if len(entries) == 1 and entries[0].publication.eligibility is None:
            blob: bytes | None = pack_topic(entries)  # the commonest: one event for everyone
        else:
            durable = [entry for entry in entries if not _names_sessions(entry)]
            blob = pack_topic(durable) if durable else None
        self._queue_write()
        number = self._write_numbers = self._write_numbers + 1
        self._retained_writes[(realm, topic)] = number
        self._hand(_RetainedWrite(realm, topic, blob, number))

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
        """Commit everything handed over, fold the retained log and stop the writer (blocks;
        call from a thread or at exit, after :meth:`hand_off` on the reactor thread)."""
        self._worker.close()
        try:
            _fold(self._connection)
        except sqlite3.Error:  # kept in the log: the next start folds it
            log.exception("folding the retained log at close")
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
                    writes[(item.realm, item.topic)] = item
                else:
                    callbacks.append(item)
        error = None
        if writes or statements:
            started = time.monotonic()
            error = self._write(writes, statements)
            self.commit_seconds.observe(time.monotonic() - started)
            self.batch_writes.observe(len(writes) + len(statements))
        lost = self._committed(writes) if error is not None else []
        self._call_in_loop(self._batch_done, items - len(callbacks), callbacks, error,
                           list(writes.values()), lost)
        if self._logged >= FOLD_ROWS:
            self._fold()

    def _fold(self) -> None:
        """Fold the retained log into the table (after the batch that filled it was reported:
        no acknowledgement waits for the fold; the next batch does)."""
        self._logged = 0
        try:
            started = time.monotonic()
            rows = _fold(self._connection)
            log.debug("folded %d retained log row(s) in %.1f ms", rows,
                      (time.monotonic() - started) * 1000)
        except sqlite3.Error:  # the log stays the stored state; the next fold tries again
            log.exception("folding the retained log")

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
            if (newest.get((write.realm, write.topic)) == write.number
                    and self.on_retained_lost is not None):
                self.on_retained_lost(write.realm, write.topic, stored)
        for write in retained:
            key = (write.realm, write.topic)
            if newest.get(key) == write.number:
                del newest[key]
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
            appends = _appends([(w.realm, topic_key(w.topic), w.blob) for w in writes.values()])
            if len(appends) == 1 and not statements:
                # one statement is its own transaction, committed (synchronous=FULL) before
                # it returns: the commonest batch, retained writes only, in one step
                connection.execute(*appends[0])
            else:
                with connection:
                    connection.execute("BEGIN")
                    for statement in statements:
                        connection.execute(statement.sql, statement.params)
                    for append in appends:
                        connection.execute(*append)
        except sqlite3.Error as exc:
            log.debug("writing a batch (%d retained topic(s), %d statement(s)) failed",
                      len(writes), len(statements), exc_info=True)
            return f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # (a value SQLite cannot take) failed like a commit,
            # not a writer thread gone with every later acknowledgement waiting on it
            log.exception("a batch (%d retained topic(s), %d statement(s)) could not be "
                          "written", len(writes), len(statements))
            return f"{type(exc).__name__}: {exc}"
        self._logged += len(writes)
        return None

    def _committed(self, writes: dict[tuple[str, Topic], "_RetainedWrite"]
                   ) -> list[tuple["_RetainedWrite", list[bytes]]]:
        """What the database holds for the topics of a failed batch (writer thread): the
        newest logged row of each, else its row in the table."""
        lost = []
        try:
            for write in writes.values():
                key = (write.realm, topic_key(write.topic))
                row = self._connection.execute(
                    "SELECT entries FROM retained_log WHERE realm = ? AND topic = ?"
                    " ORDER BY seq DESC LIMIT 1", key).fetchone()
                if row is None:
                    row = self._connection.execute(
                        "SELECT entries FROM retained WHERE realm = ? AND topic = ?",
                        key).fetchone()
                lost.append((write, unpack_topic(row[0])
                             if row is not None and row[0] is not None else []))
        except Exception:  # (sqlite3.Error, or the topic that failed the write)
            log.exception("reading back retained topics after a failed write")
        return lost


EXACT_APPENDS = 64
"""Batches of up to this many retained rows are logged by one statement of their own size."""

_APPENDS: dict[int, str] = {}
"""The append statement of each size used so far (at most EXACT_APPENDS + 2 of them)."""


def _append_statement(rows: int) -> str:
    """``INSERT`` of ``rows`` rows into the log (made once per size)."""
    statement = _APPENDS.get(rows)
    if statement is None:
        statement = _APPENDS[rows] = ("INSERT INTO retained_log (realm, topic, entries) VALUES "
                                      + ",".join(["(?,?,?)"] * rows))
    return statement


def _appends(rows: list[tuple[str, str, bytes | None]]) -> list[tuple[str, list[object]]]:
    """(statement, parameters) logging ``rows`` (none twice). A batch of up to
    :data:`EXACT_APPENDS` rows (the commonest) is one statement of its own size, committed
    on its own (one step of SQLite: one release of the GIL by the writer, no BEGIN and
    COMMIT); a larger one takes 256- or 128-row chunks, or 64, until at most 64 are left.
    So at most 66 prepared statements serve every batch (about 1 MB at most in the
    connection's statement cache; all 256 sizes would be about 15 MB)."""
    appends: list[tuple[str, list[object]]] = []
    start = 0
    while start < len(rows):
        left = len(rows) - start
        size = left if left <= EXACT_APPENDS else min(256, 1 << (left.bit_length() - 1))
        values: list[object] = [value for row in rows[start:start + size] for value in row]
        appends.append((_append_statement(size), values))
        start += size
    return appends


BATCH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Writes per batch: one publisher gives batches of 1, a burst of thousands."""


class _RetainedWrite(NamedTuple):
    realm: str
    topic: Topic
    blob: bytes | None
    number: int


class _Statement(NamedTuple):
    sql: str
    params: Params


_Item: TypeAlias = "_Statement | _RetainedWrite | Callable[[bool], None]"
"""What the writer is handed: a statement, a retained write, or a durability callback."""


def _names_sessions(entry: RetainedEvent) -> bool:
    eligibility = entry.publication.eligibility
    return eligibility is not None and eligibility.names_sessions
