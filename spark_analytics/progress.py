"""One line per stage on stderr, so a run over a big log shows where it is and what costs."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Prints ``[3/9] fan-out distribution ... 1.2 s`` as each stage starts and ends."""

    def __init__(self, total: int, out: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.out = out
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        self.done += 1
        self.out.write(f"[{self.done}/{self.total}] {label} ...")
        self.out.flush()
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            self.out.write(" failed\n")
            raise
        self.out.write(f" {time.perf_counter() - started:.1f} s\n")
        self.out.flush()

    @contextmanager
    def task(self, label: str) -> Iterator[None]:
        """A stage that runs alongside others: one whole line once it ends, in the order they
        end, so concurrent stages never write into each other's lines."""
        started = time.perf_counter()
        outcome = "failed"
        try:
            yield
            outcome = f"{time.perf_counter() - started:.1f} s"
        finally:
            with self._lock:
                self.done += 1
                self.out.write(f"[{self.done}/{self.total}] {label} ... {outcome}\n")
                self.out.flush()
