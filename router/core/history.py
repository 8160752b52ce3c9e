"""Event history: recent events per configured topic pattern, served per subscription.

Bounded by count and age per rule; an event past its message expiry (MQTT 5) is not
returned. Publications whose eligibility names session ids are never stored (they mean
nothing later); results are filtered by the caller's eligibility against each original
publish. :class:`EventHistory` keeps the logs in this process (one node); the Redis
engine keeps them in Redis (:mod:`router.engines.redis.history`) and answers a read when
Redis replies, so a read goes through :meth:`History.read` with a callback.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Protocol

from router.core.model import Publication, SessionInfo
from router.core.topic import Topic, topic_matches


@dataclass(frozen=True)
class TimeWindow:
    """The spec's time filters: from (>=), after (>), before (<), until (<=); all optional."""

    from_time: float | None = None
    after_time: float | None = None
    before_time: float | None = None
    until_time: float | None = None

    def contains(self, timestamp: float) -> bool:
        """Is an event published at ``timestamp`` inside the window a history read asked for?"""
        return ((self.from_time is None or timestamp >= self.from_time)
                and (self.after_time is None or timestamp > self.after_time)
                and (self.before_time is None or timestamp < self.before_time)
                and (self.until_time is None or timestamp <= self.until_time))


@dataclass(frozen=True)
class HistoryRule:
    """Which events a realm keeps in its history (a topic pattern), how many and for how long:
    configured per realm, so memory stays bounded."""
    pattern: Topic
    match: str
    limit: int
    max_age: float | None = None


Answer = Callable[["list[Publication] | Exception"], None]
"""Told the events a read found, oldest first (or why it failed)."""


class History(Protocol):
    """Where a realm's history lives (see :mod:`router.core.engine`)."""

    def __bool__(self) -> bool:
        """False when the realm has no history rule: publishing skips recording."""

    def size(self) -> int:
        """Events this node keeps (for the metrics)."""

    def record(self, publication: Publication) -> None:
        """Keep ``publication`` in every rule's log that matches its topic."""

    def read(self, pattern: Topic, match: str, session: SessionInfo, limit: int | None,
             reverse: bool, window: "TimeWindow | None", answer: Answer) -> None:
        """Call ``answer`` with what :func:`select` picks from the logs."""


def recordable(publication: Publication) -> bool:
    """Events for named sessions are not kept: the ids mean nothing to a later reader."""
    return publication.eligibility is None or not publication.eligibility.names_sessions


def select(logged: Iterable[tuple[int, Publication]], pattern: Topic, match: str,
           session: SessionInfo, limit: int | None, reverse: bool,
           window: "TimeWindow | None", now: float) -> list[Publication]:
    """The (sequence, event) pairs a subscription (pattern, match) covers and ``session``
    may see, once each (several rules may keep one event), oldest first."""
    found: dict[int, Publication] = {}
    for sequence, publication in logged:
        expires_at = publication.expires_at
        if (topic_matches(pattern, match, publication.topic) and publication.admits(session)
                and (expires_at is None or expires_at > now)
                and (window is None or window.contains(publication.timestamp))):
            found[sequence] = publication
    ordered = [publication for _, publication in sorted(found.items())]
    if limit is not None:
        ordered = ordered[-limit:] if limit > 0 else []
    if reverse:
        ordered.reverse()
    return ordered


class EventHistory:
    """The history logs of one realm, in this process."""

    def __init__(self, rules: list[HistoryRule], clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._sequence = itertools.count()
        self._logs: list[tuple[HistoryRule, deque[tuple[int, Publication]]]] = [
            (rule, deque(maxlen=rule.limit)) for rule in rules]

    def __bool__(self) -> bool:
        return bool(self._logs)

    def size(self) -> int:
        """Events kept over all rules (an event two rules keep counts twice)."""
        return sum(len(log) for _, log in self._logs)

    def record(self, publication: Publication) -> None:
        """Keep a publication in every log whose rule matches it (the oldest goes when a log is
        full); events for named sessions are not recordable."""
        if not recordable(publication):
            return
        entry = None
        for rule, log in self._logs:
            if topic_matches(rule.pattern, rule.match, publication.topic):
                if entry is None:
                    entry = (next(self._sequence), publication)
                log.append(entry)

    def events(self, pattern: Topic, match: str, session: SessionInfo, limit: int | None = None,
               reverse: bool = False, window: "TimeWindow | None" = None) -> list[Publication]:
        """Stored events a subscription (pattern, match) covers, that ``session`` may see, oldest first."""
        now = self._clock()
        for rule, log in self._logs:
            if rule.max_age is not None:
                horizon = now - rule.max_age
                while log and log[0][1].timestamp < horizon:
                    log.popleft()
        return select(itertools.chain.from_iterable(log for _, log in self._logs), pattern,
                      match, session, limit, reverse, window, now)

    def read(self, pattern: Topic, match: str, session: SessionInfo, limit: int | None,
             reverse: bool, window: "TimeWindow | None", answer: Answer) -> None:
        """Answered at once: the logs are here."""
        answer(self.events(pattern, match, session, limit, reverse, window))


def rfc3339(timestamp: float) -> str:
    """A timestamp as the meta API answers it (RFC 3339, UTC, ``Z``), whatever the client's
    language."""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")
