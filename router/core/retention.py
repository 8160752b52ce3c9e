"""Event retention (WAMP Advanced Profile), shared by every frontend.

Per topic the store keeps a short list of retained events, newest last:

* the latest event every subscriber may receive ("general"), and
* later events of limited distribution (black/white lists) that supersede it
  only for their audience, at most ``max_restricted`` of them, and
* when the general event excluded its own publisher (``exclude_me``), the newest
  older event that publisher's session may receive, so that session still gets
  "the most recent retained event it would have received".

A subscriber gets, per matching topic, the newest entry it is eligible for and
that has not expired. Topic lookups for prefix and wildcard subscriptions walk
a component trie. Limits per realm bound topics and bytes; over a limit, the
topic whose retained event was set longest ago is evicted first.

An entry expires at the earlier of its retention TTL and its message expiry (MQTT 5
message expiry interval). The expiry heap is pruned lazily: an entry superseded or
cleared leaves its heap item behind until the heap holds more stale items than live
ones, then the heap is rebuilt from the live entries, so its size stays bounded by the
number of retained entries with an expiry, not by the number of publishes.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from router.core.model import Publication, SessionInfo
from router.core.topic import Topic, topic_matches
from router.core.trie import TopicTrie
from router.core.uri import EXACT, MQTT, PREFIX


@dataclass(frozen=True)
class RetentionPolicy:
    """Per-realm retention settings (the ``retention`` block of a realm file)."""

    default_ttl: float | None = None
    max_topics: int = 100_000
    max_bytes: int = 256 * 1024 * 1024
    max_restricted: int = 8
    declined: tuple[tuple[Topic, str], ...] = ()
    """(pattern levels, match) on which ``retain`` is silently ignored."""


@dataclass(slots=True, eq=False)
class RetainedEvent:
    publication: Publication
    expires_at: float | None
    size: int
    """Length of the entry's persisted encoding: what counts toward ``max_bytes``."""
    blob: bytes | None = None
    """That encoding (opaque to the core), offered once to the change listeners and then
    dropped: keeping it would double a retained event's memory. Later saves re-encode."""

    @property
    def general(self) -> bool:
        return self.publication.eligibility is None


def earliest(first: float | None, second: float | None) -> float | None:
    """The earlier of two optional deadlines (None: no deadline)."""
    if first is None:
        return second
    if second is None:
        return first
    return first if first < second else second


Encoder = Callable[[Publication, "float | None"], bytes]
"""Encodes a retained entry for persistence; raises TypeError/ValueError if it cannot."""

ChangeListener = Callable[[Topic, list[RetainedEvent], str, "Publication | None"], None]
"""Called with (topic, entries, action, publication) after every change: action is one of
set, clear, expire, evict; ``publication`` is the one set or expired. An empty list
means the topic is gone."""


class RetainedStore:
    """The retained events of one realm."""

    def __init__(self, policy: RetentionPolicy, encoder: Encoder,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self._encoder = encoder
        self._clock = clock
        self._topics: TopicTrie[list[RetainedEvent]] = TopicTrie()
        self._recency: OrderedDict[Topic, None] = OrderedDict()
        self._expiry: list[tuple[float, int, Topic, RetainedEvent]] = []
        """Heap of (expires_at, tie-breaker, topic, entry); items of entries no longer
        in ``_timed`` are stale and skipped."""
        self._timed: dict[RetainedEvent, Topic] = {}
        """Live entries that expire, with their topic."""
        self._pushes = itertools.count()
        self.bytes = 0
        self.listeners: list[ChangeListener] = []

    def __len__(self) -> int:
        return len(self._topics)

    # writing --------------------------------------------------------------

    def declines(self, topic: Topic) -> bool:
        return any(topic_matches(pattern, match, topic) for pattern, match in self.policy.declined)

    def retain(self, publication: Publication) -> RetainedEvent:
        """Make ``publication`` the topic's retained event (for its audience).

        Raises TypeError/ValueError if the payload cannot be encoded for storage.
        """
        topic = publication.topic
        ttl = publication.retain_ttl or self.policy.default_ttl
        expires_at = earliest(publication.timestamp + ttl if ttl else None,
                              publication.expires_at)
        blob = self._encoder(publication, expires_at)
        event = RetainedEvent(publication, expires_at, len(blob), blob)
        entries = self._topics.get(topic) or []
        self._set(topic, self.supersede(entries, event), "set", publication)
        self._recency[topic] = None
        self._recency.move_to_end(topic)
        self._enforce_limits()
        return event

    def supersede(self, entries: list[RetainedEvent], event: RetainedEvent) -> list[RetainedEvent]:
        """``entries`` with ``event`` added: what it replaces dropped, what it keeps kept
        (also what a clustered engine applies to a topic another node changed meanwhile)."""
        publication = event.publication
        if not event.general:
            restricted = [e for e in entries if not e.general]
            kept = entries
            if len(restricted) >= self.policy.max_restricted:
                oldest = restricted[0]
                kept = [e for e in entries if e is not oldest]
            return kept + [event]
        publisher = publication.publisher
        if publication.exclude_me and publisher is not None:
            for older in reversed(entries):
                if older.publication.admits(publisher):
                    return [older, event]
        return [event]

    def clear(self, topic: Topic) -> int:
        """Remove every retained event of ``topic``; returns how many there were."""
        entries = self._topics.get(topic)
        if not entries:
            return 0
        self._set(topic, [], "clear", None)
        return len(entries)

    def restore(self, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Load persisted entries at start-up (no change notification)."""
        self._topics.set(topic, entries)
        self._recency[topic] = None
        self.bytes += sum(e.size for e in entries)
        self._track(topic, (), entries)

    def revert(self, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Go back to what the store holds after a write of ``topic`` failed: memory never
        claims a retained event that a restart would not bring back (no notification)."""
        self._replace(topic, entries)
        if entries:
            self._recency.setdefault(topic, None)

    def _set(self, topic: Topic, entries: list[RetainedEvent], action: str,
             publication: Publication | None) -> None:
        self._replace(topic, entries)
        for listener in self.listeners:
            listener(topic, entries, action, publication)
        for entry in entries:
            entry.blob = None

    def _replace(self, topic: Topic, entries: list[RetainedEvent]) -> None:
        """A topic's entries become ``entries``: bytes, expiry heap and trie follow."""
        old = self._topics.get(topic) or []
        self.bytes += sum(e.size for e in entries) - sum(e.size for e in old)
        self._track(topic, old, entries)
        if entries:
            self._topics.set(topic, entries)
        else:
            self._topics.pop(topic)
            self._recency.pop(topic, None)

    def _track(self, topic: Topic, old: Iterable[RetainedEvent],
               new: list[RetainedEvent]) -> None:
        """Keep the expiry heap in step with a topic's entries going from ``old`` to ``new``."""
        timed = self._timed
        for entry in old:
            if entry not in new:
                timed.pop(entry, None)
        for entry in new:
            if entry.expires_at is not None and entry not in timed:
                timed[entry] = topic
                heapq.heappush(self._expiry, (entry.expires_at, next(self._pushes), topic, entry))
        if len(self._expiry) > 2 * len(timed) + 16:
            self._expiry = [(entry.expires_at, next(self._pushes), topic, entry)
                            for entry, topic in timed.items()]
            heapq.heapify(self._expiry)

    def _enforce_limits(self) -> None:
        policy = self.policy
        while self._recency and (len(self._topics) > policy.max_topics
                                 or self.bytes > policy.max_bytes):
            oldest = next(iter(self._recency))
            self._set(oldest, [], "evict", None)

    def expire(self) -> int:
        """Drop entries whose TTL or message expiry has passed; returns how many."""
        now = self._clock()
        dropped = 0
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, _, topic, entry = heapq.heappop(heap)
            if entry not in self._timed:
                continue  # superseded or cleared since
            entries = self._topics.get(topic) or []
            dropped += 1
            self._set(topic, [e for e in entries if e is not entry], "expire", entry.publication)
            heap = self._expiry  # _set may have rebuilt it
        return dropped

    # reading --------------------------------------------------------------

    def topics(self, pattern: Topic, match: str) -> Iterator[tuple[Topic, list[RetainedEvent]]]:
        """(topic, entries) for every retained topic matched by (pattern, match)."""
        if match == EXACT:
            entries = self._topics.get(pattern)
            if entries:
                yield pattern, entries
        elif match == PREFIX:
            yield from self._topics.under_prefix(pattern)
        elif match == MQTT:
            yield from self._topics.matching_filter(pattern)
        else:
            yield from self._topics.matching_wildcard(pattern)

    def for_subscriber(self, pattern: Topic, match: str,
                       session: SessionInfo) -> Iterator[Publication]:
        """Per matching topic, the newest live retained event ``session`` is eligible for.
        Lazy: a paced backlog takes it over many reactor turns (expiry is checked as it
        goes, and the walk tolerates changes of the store between two steps)."""
        clock = self._clock
        for _, entries in self.topics(pattern, match):
            for entry in reversed(entries):
                if entry.expires_at is not None and entry.expires_at <= clock():
                    continue
                if entry.publication.admits(session):
                    yield entry.publication
                    break
