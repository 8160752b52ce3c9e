"""Handing freed memory back to the operating system.

The payloads a router holds for a slow or offline client (1 KB events, thousands of
them) are allocated by the C library's ``malloc``, not Python's small-object allocator.
When that client goes, Python frees them, but glibc keeps the freed chunks inside its
heap, between chunks that are still in use: the process stays as large as its peak
until something asks glibc to give the free pages back. :class:`MemoryReclaimer` does,
with ``malloc_trim(0)``: a few seconds after a connection closes (at most once per
``delay``, so connection churn costs one trim per interval) and every ``interval``
seconds (``memory.trim_interval``), because traffic that goes on after the slow
clients left scatters new chunks over the freed pages. The trim runs in a thread:
``malloc_trim`` walks the whole heap and ctypes releases the GIL while it does, so the
reactor never waits for it. Where the C library has no ``malloc_trim`` (not glibc), it
does nothing. Each trim is counted with its time and the resident memory it gave back
(metrics ``router_memory_trims``, ``router_memory_trim_seconds``,
``router_memory_trimmed_bytes``).

What the trim cannot give back is Python's own small-object memory: pymalloc returns an
arena (1 MiB) to the system only once every object in it is freed, and the few objects
that outlive a crowd of closed connections pin arenas those connections filled: after
19,800 idle MQTT sessions closed, 11 arenas each held by 1-4 pools of a few blocks (the
periodic loops' pending calls, the last ``$SYS`` values, the float free list, Twisted's
adapter caches filled at the first close). Making such objects again after the crowd does
not free their arenas: pymalloc serves each size from the partly used pools it freed into
last, which are those same arenas, so the new copies and every later short-lived object
land there (measured: ``$SYS`` figures published again after the crowd, no change beyond
the runs' spread). ``PYTHONMALLOC=malloc`` in the router's environment puts those
objects on the C heap, which the trim does release, at a measured cost in CPU and
per-session memory (docs/configuration.md, ``memory``).

Nor can it give back the tables that grew with the connections: a dict or set keeps the
size it reached when its entries go (the reactor's, the router's, each realm's and
broker's, the MQTT frontend's: ~6.6 MB after 19,800 MQTT sessions closed, every one
empty). Before the trim that follows closes, the reclaimer rebuilds those that are far
larger than what they hold (:func:`compact`). And after a crowd of closes (at least
:data:`MASS_CLOSE`, and as many as the connections still open) it runs a full collection
first: the node makes them rare, and until one runs, Python's free lists (dicts, lists,
tuples, floats kept for reuse) and the few reference cycles Twisted leaves (one per
``callInThread``) stay in the arenas the closed connections filled and keep them. Its cost
grows with the objects still alive, so it waits for as many closes as there are
connections left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import time
from typing import Any, Callable, Iterable

from twisted.internet import task

DELAY = 5.0

PAGE = os.sysconf("SC_PAGE_SIZE")

MASS_CLOSE = 1000
"""Closes since the last collection (and as many as the connections left) that make the
next trim after closes start with a full collection."""

COMPACT_FROM = 64 * 1024
"""Bytes under which a table is left as it is (rebuilding it would give back little)."""
BYTES_PER_ENTRY = 256
"""A table is rebuilt when it has more bytes than this per entry it holds: a full dict
needs ~30-60 bytes an entry, a set ~30-100, so it is then at least 4 times too large."""


def compact(table: dict[Any, Any] | set[Any]) -> int:
    """Rebuild ``table`` in place (the same object, entries and order) when it is at least
    :data:`COMPACT_FROM` bytes and mostly empty (:data:`BYTES_PER_ENTRY`); the bytes given
    back. CPython never shrinks a dict or set as entries are deleted, only when cleared.
    Not while anything iterates over it (the reactor's thread, between events)."""
    size = sys.getsizeof(table)
    if size < COMPACT_FROM or len(table) * BYTES_PER_ENTRY >= size:
        return 0
    kept = table.copy()
    table.clear()
    table.update(kept)  # type: ignore[arg-type]  # the same type as the table
    return size - sys.getsizeof(table)


def resident_bytes(pid: int | str = "self") -> int:
    """A process's (default: this one's) resident memory now (``/proc/<pid>/statm``, the
    same figure as ``VmRSS``; 0 where there is none)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE
    except OSError:
        return 0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


class MemoryReclaimer:
    """``released()`` after something large may have been freed; the trim follows later,
    after the ``tables`` (what grows with the connections) are compacted.
    ``start()`` adds a trim every ``interval`` seconds (0: only after releases)."""

    def __init__(self, clock: Any, in_thread: Callable[..., None], delay: float = DELAY,
                 interval: float = 0.0,
                 tables: Callable[[], Iterable[dict[Any, Any] | set[Any]]] = lambda: (),
                 connections: Callable[[], int] = lambda: 0) -> None:
        self._clock = clock
        self._in_thread = in_thread
        self._delay = delay
        self._interval = interval
        self.tables = tables
        """The tables to compact after releases (the node sets them once it has them)."""
        self.connections = connections
        """How many connections are open (the node sets it)."""
        self._closed = 0
        self._trim = _malloc_trim()
        self._pending = None
        self._periodic: task.LoopingCall | None = None
        self._running = False
        self.trims = 0
        """Trims done (each counted once it has returned)."""
        self.trim_seconds = 0.0
        """Time spent inside ``malloc_trim`` (in its thread, not the reactor's)."""
        self.trimmed_bytes = 0
        """Resident memory the trims gave back (what the process shrank by across each)."""
        self.compacted_bytes = 0
        """What rebuilding mostly empty tables gave back (:func:`compact`)."""
        self.collections = 0
        """Full collections after a crowd of closes (:data:`MASS_CLOSE`)."""

    @property
    def available(self) -> bool:
        return self._trim is not None

    def start(self) -> None:
        if self._trim is None or self._interval <= 0:
            return
        self._periodic = task.LoopingCall(self.trim)
        self._periodic.clock = self._clock
        self._periodic.start(self._interval, now=False)

    def released(self) -> None:
        self._closed += 1
        if self._pending is not None and self._pending.active():
            return
        self._pending = self._clock.callLater(self._delay, self._after_release)

    def _after_release(self) -> None:
        self._pending = None
        if self._closed >= MASS_CLOSE and self._closed >= self.connections():
            self._closed = 0
            self.collections += 1
            gc.collect()
        self.compacted_bytes += sum(compact(table) for table in self.tables())
        self.trim()

    def trim(self) -> None:
        """One trim now, in a thread (nothing where the C library has none, or while one
        is still running)."""
        if self._trim is not None and not self._running:
            self._running = True
            self._in_thread(self._measured_trim, self._trim)

    def _measured_trim(self, trim: Callable[[int], int]) -> None:
        """In the trim's thread: the trim, its time and what it gave back, counted."""
        try:
            before, started = resident_bytes(), time.perf_counter()
            trim(0)
            self.trim_seconds += time.perf_counter() - started
            self.trimmed_bytes += max(0, before - resident_bytes())
            self.trims += 1
        finally:
            self._running = False

    def cancel(self) -> None:
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        if self._periodic is not None and self._periodic.running:
            self._periodic.stop()
        self._periodic = None
