"""The work of one packet spread over reactor turns.

A SUBSCRIBE or UNSUBSCRIBE may carry tens of thousands of filters; handled in one go it
would keep every other client of the router waiting for as long. Its handler is a
generator that yields after each small unit of work (decoding one filter, applying one);
it runs for at most :data:`TURN_BUDGET` seconds per reactor turn, then the reactor reads
and writes the other connections, and the next turn goes on where this one stopped. The
connection holds back the packets that follow meanwhile (see ``MqttConnection``), so its
own packets keep their order.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

TURN_BUDGET = 0.004
"""Seconds of one packet's work per reactor turn: small against the round trip any
other client may expect, large against the cost of a turn (one ``callLater(0)``)."""


def spread(work: Iterator[None], turn_over: Callable[[bool], None],
           later: Callable[[Callable[[], None]], None]) -> None:
    """Run ``work`` to its end, :data:`TURN_BUDGET` seconds of it per reactor turn.

    After each turn ``turn_over(finished)``; while not finished, ``later(run)`` must run
    ``run`` in a later reactor turn (or not at all: the connection is gone)."""
    _Spread(work, turn_over, later).run()


class _Spread:
    """One packet's work in progress. An object, not a closure that hands itself to
    ``later``: such a function holds itself through its own closure cell, a reference
    cycle that kept each subscribing MQTT session (the work and ``turn_over`` hold the
    connection) until the next full collection, which the node makes rare
    (tests/test_connection_garbage.py)."""

    __slots__ = ("_work", "_turn_over", "_later")

    def __init__(self, work: Iterator[None], turn_over: Callable[[bool], None],
                 later: Callable[[Callable[[], None]], None]) -> None:
        self._work = work
        self._turn_over = turn_over
        self._later = later

    def run(self) -> None:
        """One turn's share of the work."""
        deadline = time.monotonic() + TURN_BUDGET
        for _ in self._work:
            if time.monotonic() >= deadline:
                self._turn_over(False)
                self._later(self.run)
                return
        self._turn_over(True)
