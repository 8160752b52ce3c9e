"""A background thread that drains a queue in batches, for I/O kept off the reactor thread."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_STOP = object()


class BatchWorker:
    """Runs ``handle(batch)`` in its own thread on everything queued since the last batch.

    The reactor thread only calls :meth:`put`; a slow disk slows this thread, never
    the event loop. :meth:`close` processes what is queued, then stops.

    Bounded by its user, not by refusing work (a write that was promised must be written):
    :attr:`pending` is what is queued and not yet handled, and with ``high_water`` set,
    ``on_pressure(True)`` runs (in :meth:`put`, on the reactor thread) when ``pending``
    reaches it and ``on_pressure(False)`` (through ``call_in_loop``, on the reactor
    thread) once it is back to half of it, so the caller can stop and restart its intake.
    """

    def __init__(self, name: str, handle: Callable[[list[Any]], None],
                 max_batch: int = 10_000, high_water: int | None = None,
                 on_pressure: Callable[[bool], None] | None = None,
                 call_in_loop: Callable[..., None] | None = None) -> None:
        self._handle = handle
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._high_water = high_water
        self._low_water = high_water // 2 if high_water is not None else 0
        self._on_pressure = on_pressure
        self._call_in_loop = call_in_loop
        self._lock = threading.Lock()
        self.pending = 0
        """Items queued and not yet handled (written under the lock, read anywhere)."""
        self._pressed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        with self._lock:
            self.pending += 1
            pressed = (self._high_water is not None and not self._pressed
                       and self.pending >= self._high_water)
            if pressed:
                self._pressed = True
        self._queue.put(item)
        if pressed:
            self._on_pressure(True)

    def close(self) -> None:
        """Finish the queued work and stop (blocks: call from a thread or at exit)."""
        self._queue.put(_STOP)
        self._thread.join()

    def _handled(self, count: int) -> None:
        """Worker thread: ``count`` items are done; ask the reactor to resume intake if low."""
        with self._lock:
            self.pending -= count
            drained = self._pressed and self.pending <= self._low_water
        if drained:
            self._call_in_loop(self._release)

    def _release(self) -> None:
        """Reactor thread: end the pressure unless new work has raised it again meanwhile."""
        with self._lock:
            released = self._pressed and self.pending <= self._low_water
            if released:
                self._pressed = False
        if released:
            self._on_pressure(False)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = []
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
                if stopping or len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._handle(batch)
                self._handled(len(batch))
