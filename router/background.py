"""A background thread that drains a queue in batches, for I/O kept off the reactor thread."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

_STOP = object()
log = logging.getLogger(__name__)


class BatchWorker:
    """Runs ``handle(batch)`` in its own thread on everything queued since the last batch.

    The reactor thread only calls :meth:`put`; a slow disk slows this thread, never
    the event loop. :meth:`close` processes what is queued, then stops.
    """

    def __init__(self, name: str, handle: Callable[[list[Any]], None],
                 max_batch: int = 10_000) -> None:
        self._handle = handle
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def close(self) -> None:
        """Finish the queued work and stop (blocks: call from a thread or at exit)."""
        self._queue.put(_STOP)
        self._thread.join()

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
                try:
                    self._handle(batch)
                except Exception:  # a bug in one batch must not stop every later one
                    log.exception("%s: a batch of %d item(s) failed",
                                  self._thread.name, len(batch))
            # let go of the handled items before waiting for more: each holds its callbacks,
            # and through them whoever waits for the write (an acknowledged publisher's
            # session, until the next batch came)
            del batch, item
