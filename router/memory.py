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
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

from twisted.internet import task

DELAY = 5.0


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
        """One trim now, in a thread (nothing where the C library has none)."""
        if self._trim is not None:
            self._in_thread(self._trim, 0)

    def cancel(self) -> None:
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        if self._periodic is not None and self._periodic.running:
            self._periodic.stop()
        self._periodic = None
