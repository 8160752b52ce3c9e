"""One line per stage on stderr, so a run over a big log shows where it is and what costs.

The JVM writes to the same terminal (its warnings, Spark's errors): its output is relayed
line by line through :data:`CONSOLE` (see :func:`relay_jvm_stderr`), so it never lands in
the middle of a stage's line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Console:
    """A terminal stream shared by threads: whole lines, and at most one open line (a stage
    that has started), which a line written meanwhile does not split."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._open: str | None = None

    @property
    def out(self) -> TextIO:
        """The stream given, or the process's stderr as it is now."""
        return self._out or sys.stderr

    def begin(self, text: str) -> None:
        """Start a line that :meth:`end` finishes."""
        with self._lock:
            self.out.write(text)
            self.out.flush()
            self._open = text

    def end(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()
            self._open = None

    def line(self, text: str) -> None:
        """A whole line; an open line is continued below it, repeated."""
        with self._lock:
            self.out.write(("\n" if self._open is not None else "") + text + "\n"
                           + (self._open or ""))
            self.out.flush()


CONSOLE = Console()


@contextmanager
def relay_jvm_stderr(console: Console = CONSOLE) -> Iterator[None]:
    """A JVM started inside writes its stderr through ``console`` (as ``JVM: <line>``).

    pyspark starts the JVM with this process's stderr; here that is, for the moment of the
    start, a pipe, whose lines are copied to ``console``: what the JVM wrote while starting
    (a pipe holds 64 KiB) once the block ends, the rest by a thread. Nothing else changes:
    the process's own stderr is back once the block ends."""
    reading, writing = os.pipe()
    saved = os.dup(2)
    sys.stderr.flush()
    os.dup2(writing, 2)
    os.close(writing)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end is now the JVM's, if one started
        os.close(saved)
    os.set_blocking(reading, False)
    written = b""
    try:
        while chunk := os.read(reading, 65536):
            written += chunk
    except BlockingIOError:  # all the start wrote; the JVM still runs
        pass
    *lines, rest = written.split(b"\n")
    for line in lines:
        console.line("JVM: " + line.decode(errors="replace"))
    os.set_blocking(reading, True)
    threading.Thread(target=_copy_lines, args=(reading, rest, console), name="jvm-stderr",
                     daemon=True).start()


def _copy_lines(reading: int, rest: bytes, console: Console) -> None:
    with os.fdopen(reading, "rb") as pipe:
        for line in pipe:
            console.line("JVM: " + (rest + line).rstrip(b"\n").decode(errors="replace"))
            rest = b""


class Progress:
    """Prints ``[3/9] fan-out distribution ... 1.2 s`` as each stage starts and ends."""

    def __init__(self, total: int, console: Console = CONSOLE) -> None:
        self.total = total
        self.done = 0
        self.console = console
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        self.done += 1
        self.console.begin(f"[{self.done}/{self.total}] {label} ...")
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            self.console.end(" failed")
            raise
        self.console.end(f" {time.perf_counter() - started:.1f} s")

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
                self.console.line(f"[{self.done}/{self.total}] {label} ... {outcome}")
