"""Event history: recent events per configured topic pattern, served per subscription.

Kept in memory, bounded by count and age per rule; an event past its message expiry
(MQTT 5) is not returned. Publications whose
eligibility names session ids are never stored (they mean nothing later);
results are filtered by the caller's eligibility against each original publish.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

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
        return ((self.from_time is None or timestamp >= self.from_time)
                and (self.after_time is None or timestamp > self.after_time)
                and (self.before_time is None or timestamp < self.before_time)
                and (self.until_time is None or timestamp <= self.until_time))


@dataclass(frozen=True)
class HistoryRule:
    pattern: Topic
    match: str
    limit: int
    max_age: float | None = None


class EventHistory:
    """The history logs of one realm."""

    def __init__(self, rules: list[HistoryRule], clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._sequence = itertools.count()
        self._logs = [(rule, deque(maxlen=rule.limit)) for rule in rules]

    def __bool__(self) -> bool:
        return bool(self._logs)

    def size(self) -> int:
        """Events kept over all rules (an event two rules keep counts twice)."""
        return sum(len(log) for _, log in self._logs)

    def record(self, publication: Publication) -> None:
        if publication.eligibility is not None and publication.eligibility.names_sessions:
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
        found: dict[int, Publication] = {}
        for rule, log in self._logs:
            if rule.max_age is not None:
                horizon = now - rule.max_age
                while log and log[0][1].timestamp < horizon:
                    log.popleft()
            for sequence, publication in log:
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


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")
