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
that outlive a crowd of closed connections pin most of the arenas those connections
filled (bench/RESULTS.md: ~60 MB after 19,800 idle MQTT sessions closed, with the C
heap back at its size). ``PYTHONMALLOC=malloc`` in the router's environment puts those
objects on the C heap, which the trim does release, at a measured cost in CPU and
per-session memory (docs/configuration.md, ``memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from typing import Any, Callable

from twisted.internet import task

DELAY = 5.0

PAGE = os.sysconf("SC_PAGE_SIZE")


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
    """``released()`` after something large may have been freed; the trim follows later.
    ``start()`` adds a trim every ``interval`` seconds (0: only after releases)."""

    def __init__(self, clock: Any, in_thread: Callable[..., None], delay: float = DELAY,
                 interval: float = 0.0) -> None:
        self._clock = clock
        self._in_thread = in_thread
        self._delay = delay
        self._interval = interval
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
        if self._trim is None or (self._pending is not None and self._pending.active()):
            return
        self._pending = self._clock.callLater(self._delay, self._after_release)

    def _after_release(self) -> None:
        self._pending = None
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
