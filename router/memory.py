"""Handing freed memory back to the operating system after connections go away.

The payloads a router holds for a slow or offline client (1 KB events, thousands of
them) are allocated by the C library's ``malloc``, not Python's small-object allocator.
When that client goes, Python frees them, but glibc keeps the freed chunks inside its
heap: the process stays as large as its peak until something asks glibc to give the
free pages back. :class:`MemoryReclaimer` does, with ``malloc_trim(0)``, a few seconds
after a connection closes (at most once per ``delay``, so connection churn costs one
trim per interval). A trim of a few hundred MB of heap takes milliseconds. Where the
C library has no ``malloc_trim`` (not glibc), it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

DELAY = 5.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


class MemoryReclaimer:
    """``released()`` after something large may have been freed; the trim follows later."""

    def __init__(self, clock: Any, delay: float = DELAY) -> None:
        self._clock = clock
        self._delay = delay
        self._trim = _malloc_trim()
        self._pending = None

    @property
    def available(self) -> bool:
        return self._trim is not None

    def released(self) -> None:
        if self._trim is None or (self._pending is not None and self._pending.active()):
            return
        self._pending = self._clock.callLater(self._delay, self._run)

    def _run(self) -> None:
        self._pending = None
        self._trim(0)

    def cancel(self) -> None:
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
