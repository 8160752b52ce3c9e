"""The event-log writer: buffer on the reactor thread, write JSON lines in a background thread.

Layout: ``<base>/realm=<name>/date=<yyyy-mm-dd>/part-<n>.jsonl`` on one node, and
``<base>/realm=<name>/date=<yyyy-mm-dd>/node=<node>/part-<n>.jsonl`` on a node of a cluster
(the Redis engine), so the trees of all nodes merge into one without two nodes ever writing
the same file, and Spark reads ``node`` as one more partition column. A part file is
closed and the next one started when it reaches ``max_file_bytes``, is older
than ``max_file_age`` seconds, or the UTC date changes. The age is also checked on a
reactor timer set for the moment the oldest open part comes of age, so a part closes on
time when no record follows it (an idle router); the timer only hands the writer thread
an empty batch, the closing itself is the writer thread's disk work. While open it is named
``.part-<n>.jsonl`` (hidden from Spark, whose file source reads a file only once)
and it is renamed when closed; a writer starting up renames the ones a crash
left open. Every flush writes whole lines and flushes the file, so a crash loses
at most the last flush interval; a line torn by a crash mid-write is the last
line of its file and readers skip it (the writer never appends to a file it did
not create, it starts a new part).

The event log is analytics, not a delivery promise: when the writer thread falls
behind by ``max_queued_records`` records, further records are dropped and counted
(incident ``eventlog_dropped``) instead of growing the router's memory.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import IO, Callable

import orjson
from twisted.internet.interfaces import IDelayedCall, IReactorCore

from router.background import BatchWorker
from router.core.incidents import EVENTLOG_DROPPED, Incidents

log = logging.getLogger(__name__)

Opener = Callable[[Path], IO[bytes]]


def _open_new(path: Path) -> IO[bytes]:
    return open(path, "xb")


@dataclass
class _PartFile:
    day_start: float
    day_end: float
    path: Path
    handle: IO[bytes]
    opened_at: float
    size: int = 0
    lines: list[bytes] = field(default_factory=list)


class EventLogWriter:
    """One per node; realms append records, a timer calls :meth:`flush`."""

    def __init__(self, base_dir: Path, max_file_bytes: int = 64 * 1024 * 1024,
                 max_file_age: float = 300.0, opener: Opener = _open_new,
                 clock: Callable[[], float] = time.time,
                 max_queued_records: int = 100_000, node: str | None = None) -> None:
        self.base_dir = base_dir
        self.node = node
        """This node's name in a cluster: its parts go under ``node=<name>`` in each day."""
        self.max_file_bytes = max_file_bytes
        self.max_file_age = max_file_age
        self.max_queued_records = max_queued_records
        self.incidents: Incidents | None = None
        """Where dropped records are counted (the router's, set once it exists)."""
        self._handed = 0
        """Records handed to the writer thread (written by the reactor thread only)."""
        self._written = 0
        """Records the writer thread has written (written by that thread only)."""
        self._opener = opener
        self._clock = clock
        self._buffer: list[tuple[str, dict]] = []
        self._files: dict[str, _PartFile] = {}
        self._reactor: IReactorCore | None = None
        """Set by :meth:`start`: parts then close by age without waiting for a record."""
        self._tick: IDelayedCall | None = None
        """The reactor's pending age check (reactor thread only)."""
        self._asked: float | None = None
        """When the writer thread last asked the reactor for an age check (that thread only)."""
        if base_dir.exists():
            recover_open_parts(base_dir)
        self._worker = BatchWorker("eventlog-writer", self._write_batches)

    def start(self, reactor: IReactorCore) -> None:
        """Close parts by age on ``reactor``'s clock, records or not (call on the reactor
        thread before the first record): without it an idle part stays open, hidden from
        batch readers, until the next record arrives."""
        self._reactor = reactor

    def append(self, realm: str, record: dict) -> None:
        """Buffer one record (reactor thread: no I/O, no encoding); drop it if the writer
        thread is ``max_queued_records`` behind."""
        if len(self._buffer) + self._handed - self._written >= self.max_queued_records:
            if self.incidents is not None:
                self.incidents.count(realm, "eventlog", EVENTLOG_DROPPED, record.get("kind", ""))
            return
        self._buffer.append((realm, record))

    @property
    def backlog(self) -> int:
        """Records appended but not yet written: how far the writer thread is behind."""
        return len(self._buffer) + self._handed - self._written

    def flush(self) -> None:
        """Hand everything buffered to the writer thread."""
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self._handed += len(batch)
            self._worker.put(batch)

    def close(self) -> None:
        """Write what is buffered and close the files (blocks; call from a thread or at exit)."""
        self.flush()
        self._worker.close()
        for part in self._files.values():
            _finish(part)
        self._files.clear()

    # writer thread --------------------------------------------------------------

    def _write_batches(self, batches: list[list[tuple[str, dict]]]) -> None:
        """Write each flushed batch; rotation by age is decided once per batch, and after
        the last one for every open part (an empty batch is the reactor's age check)."""
        dumps = orjson.dumps
        for batch in batches:
            if not batch:
                self._asked = None  # the check asked for has come: ask again for what is left
            now = self._clock()
            touched: dict[str, _PartFile] = {}
            try:
                for realm, record in batch:
                    try:
                        line = dumps(record, default=str) + b"\n"
                    except TypeError:  # a lone surrogate, which orjson refuses: JSON escapes it
                        line = json.dumps(record, default=str).encode() + b"\n"
                    part = touched.get(realm)
                    timestamp = record["ts"]
                    if (part is None or not part.day_start <= timestamp < part.day_end
                            or part.size >= self.max_file_bytes):
                        part = touched[realm] = self._part_for(realm, timestamp, now)
                    part.lines.append(line)
                    part.size += len(line)
                for part in touched.values():
                    self._write_out(part)
                    part.handle.flush()
            except Exception as exc:  # a full disk, or a bug: the batch is lost, counted, and
                if not isinstance(exc, OSError):  # the writer goes on with the next
                    log.exception("event log: a batch of %d record(s) failed", len(batch))
                for part in touched.values():
                    part.lines.clear()
                self._lost(batch, exc)
            self._written += len(batch)
        for realm, part in list(self._files.items()):
            if now >= self._due(part):
                _finish(part)
                del self._files[realm]
        self._ask_for_age_check()

    def _lost(self, batch: list[tuple[str, dict]], error: Exception) -> None:
        """Count a batch that could not be written (writer thread): on the reactor when
        the writer runs under one, else here."""
        if self.incidents is None:
            return
        for realm, lost in Counter(realm for realm, _ in batch).items():
            count = partial(self.incidents.count, realm, "eventlog", EVENTLOG_DROPPED,
                            f"{lost} record(s) not written: {error}", lost)
            if self._reactor is not None:
                self._reactor.callFromThread(count)
            else:
                count()

    def _due(self, part: _PartFile) -> float:
        """When ``part`` is old enough to close."""
        return part.opened_at + self.max_file_age

    def _ask_for_age_check(self) -> None:
        """Ask the reactor for an age check when the oldest open part comes of age."""
        due = min((self._due(part) for part in self._files.values()), default=None)
        if self._reactor is not None and due is not None and due != self._asked:
            self._asked = due
            self._reactor.callFromThread(self._schedule_age_check, due)

    # reactor thread ---------------------------------------------------------------

    def _schedule_age_check(self, due: float) -> None:
        if self._tick is not None and self._tick.active():
            self._tick.cancel()
        self._tick = self._reactor.callLater(max(0.0, due - self._clock()), self._age_check)

    def _age_check(self) -> None:
        self._tick = None
        self._worker.put([])

    @staticmethod
    def _write_out(part: _PartFile) -> None:
        part.handle.write(b"".join(part.lines))
        part.lines.clear()

    def _part_for(self, realm: str, timestamp: float, now: float) -> _PartFile:
        part = self._files.get(realm)
        if part is not None and (not part.day_start <= timestamp < part.day_end
                                 or part.size >= self.max_file_bytes
                                 or now >= self._due(part)):
            self._write_out(part)
            _finish(part)
            part = None
        if part is None:
            part = self._files[realm] = self._new_part(realm, timestamp, now)
        return part

    def _new_part(self, realm: str, timestamp: float, now: float) -> _PartFile:
        day = datetime.fromtimestamp(timestamp, timezone.utc).replace(
            hour=0, minute=0, second=0, microsecond=0)
        folder = self.base_dir / f"realm={realm}" / f"date={day:%Y-%m-%d}"
        if self.node is not None:
            folder = folder / f"node={self.node}"
        folder.mkdir(parents=True, exist_ok=True)
        numbers = [int(p.name.lstrip(".")[5:-6]) for p in folder.glob("*part-*.jsonl")
                   if p.name.lstrip(".")[5:-6].isdigit()]
        number = max(numbers, default=-1) + 1
        start = day.timestamp()
        path = folder / f".part-{number}.jsonl"
        return _PartFile(start, start + 86_400, path, self._opener(path), now)


def _finish(part: _PartFile) -> None:
    """Close a part and give it its visible name."""
    part.handle.close()
    part.path.rename(part.path.with_name(part.path.name[1:]))


def recover_open_parts(base_dir: Path) -> int:
    """Make the parts a crash left open visible (their complete lines count)."""
    recovered = 0
    for path in base_dir.glob("realm=*/date=*/**/.part-*.jsonl"):
        path.rename(path.with_name(path.name[1:]))
        recovered += 1
    return recovered
