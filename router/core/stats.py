"""Plain counters the hot path bumps, read by the metrics collector and ``$SYS`` at scrape time.

A Prometheus client counter costs a label lookup and a lock per increment; these are dict and
int increments on objects the router owns, so counting a delivery costs next to nothing.
Keys carry the session's protocol name as it is (``wamp.websocket``, ``mqtt``...); readers
fold them into protocol families (:func:`family`), which keeps the hot path free of string work.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict


def family(protocol: str) -> str:
    """``wamp``, ``mqtt`` or ``amqp`` for a session's protocol name (``mqtt.websocket``...)."""
    return protocol.split(".", 1)[0].split("-", 1)[0]


class Histogram:
    """Cumulative-bucket histogram in the Prometheus sense, kept as plain ints.

    ``observe`` may run on one thread while a scrape reads on another: a scrape can see a
    count one ahead of a bucket, never a value that goes backwards.
    """

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        """Per bucket (not cumulative); the last one is +Inf."""
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation in its bucket; cheap enough for the writer thread's every
        commit."""
        self.buckets[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it) pairs, ``+Inf`` last."""
        total = 0
        pairs = []
        for bound, n in zip(self.bounds + (float("inf"),), self.buckets):
            total += n
            pairs.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return pairs


LATENCY_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5)
"""Seconds: delivery and commit latencies live between 100 µs and a few seconds."""


class RealmStats:
    """What one realm's publications and sessions did since start."""

    __slots__ = ("received", "delivered", "sessions_opened", "delivery_latency", "redelivered",
                 "retained_evictions", "retained_expiries",
                 "calls", "call_errors", "call_timeouts", "call_cancels")

    def __init__(self) -> None:
        self.received: list[defaultdict[str, int]] = [defaultdict(int) for _ in range(3)]
        """Per QoS: protocol -> publications accepted from clients. (A ``defaultdict``, not
        a ``Counter``: its ``+= 1`` is ~50 ns, a Counter's ~150 (a Python subclass of
        dict), and these count once per publish and per matching subscription.)"""
        self.delivered: list[defaultdict[str, int]] = [defaultdict(int) for _ in range(3)]
        """Per publication QoS: protocol -> publications handed to a receiving session."""
        self.sessions_opened: Counter[str] = Counter()
        """protocol -> sessions that joined."""
        self.delivery_latency = Histogram(LATENCY_BOUNDS)
        """Publication entering the core -> first receiver's write, once per publication."""
        self.redelivered: Counter[str] = Counter()
        """protocol -> QoS >= 1 messages sent again (MQTT DUP after a reconnect, AMQP
        in-flight messages back in the queue after their link went away)."""
        self.retained_evictions = 0
        self.retained_expiries = 0
        self.calls = 0
        self.call_errors = 0
        self.call_timeouts = 0
        self.call_cancels = 0
