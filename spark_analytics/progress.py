"""One line per stage on stderr, so a run over a big log shows where it is and what costs."""

from __future__ import annotations

import sys
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
