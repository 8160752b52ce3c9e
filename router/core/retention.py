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
a component trie.

Every topic is charged to its owner: the principal who published its newest entry
(:func:`owner_of`; anonymous clients share one owner per role, so reconnecting gets no
fresh quota). The router's own topics (``$SYS``, no publisher) have no owner and count
against no bound. Bounds, checked after each retain:

* an owner over its quota (``max_topics_per_principal`` / ``max_bytes_per_principal``)
  loses its own topic set longest ago, until it fits again: a publisher only ever pushes
  out its own retained events, and the one it just published is kept, so its
  acknowledgement stays true;
* the realm over its bound (``max_topics`` / ``max_bytes``) loses the oldest topic of
  the owner holding the most (topics or bytes, whichever is over; the publisher on a
  tie of topics), found in O(log owners), so a flood evicts the flooder's own events as
  soon as it holds the most;
* one event larger than either byte bound could never be kept: the publish is refused
  (:class:`RetainRefused`) before anyone receives it.

Each eviction is told to :attr:`RetainedStore.evicted` with its reason.

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
from typing import Callable, Iterable, Iterator, NamedTuple

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
    max_topics_per_principal: int = 100_000
    """Topics one owner may hold (equal to ``max_topics`` by default: fair eviction at
    the realm bound already protects the others; lower it to reserve room)."""
    max_bytes_per_principal: int = 256 * 1024 * 1024
    declined: tuple[tuple[Topic, str], ...] = ()
    """(pattern levels, match) on which ``retain`` is silently ignored."""


class Owner(NamedTuple):
    """Whom a retained topic is charged to: ``("authid", <authid>)`` for a principal,
    ``("anonymous", <authrole>)`` for every anonymous client of that role together."""

    kind: str
    name: str

    def __str__(self) -> str:
        return self.name if self.kind == "authid" else f"anonymous clients (role {self.name})"


def owner_of(publisher: SessionInfo | None) -> Owner | None:
    """The owner a publication is charged to; None for the router's own (outside every
    bound). Anonymous clients are one class: their authid is per connection."""
    if publisher is None:
        return None
    if publisher.authmethod == "anonymous":
        return _tuple(Owner, ("anonymous", publisher.authrole))
    return _tuple(Owner, ("authid", publisher.authid))


_tuple = tuple.__new__
"""Makes a NamedTuple from its fields' tuple, as its generated ``__new__`` does, without that
Python-level call: once per retained publish."""


QUOTA = "quota"
"""Eviction reason: the owner went over its own quota."""
REALM_LIMIT = "realm_limit"
"""Eviction reason: the realm went over its bound."""


class RetainRefused(Exception):
    """A retained event larger than the byte bounds allow: no eviction could make room."""


@dataclass(slots=True, eq=False)
class RetainedEvent:
    """One retained entry of a topic: the publication and what retention bounds need to know of
    it (expiry, size, owner)."""
    publication: Publication
    expires_at: float | None
    size: int
    """Length of the entry's persisted encoding: what counts toward ``max_bytes``."""
    blob: bytes | None = None
    """That encoding (opaque to the core), offered once to the change listeners and then
    dropped: keeping it would double a retained event's memory. Later saves re-encode."""
    owner: Owner | None = None
    """Whom it is charged to, kept with the entry: a restored publisher has lost its
    authmethod, so the owner cannot be worked out again after a restart."""

    @property
    def general(self) -> bool:
        """Does every subscriber get it (no black/white lists)? A newer general event supersedes
        all older entries."""
        return self.publication.eligibility is None


def _size(entries: list[RetainedEvent]) -> int:
    """The bytes ``entries`` count for (most topics hold one entry)."""
    if len(entries) == 1:
        return entries[0].size
    return sum(entry.size for entry in entries) if entries else 0


def earliest(first: float | None, second: float | None) -> float | None:
    """The earlier of two optional deadlines (None: no deadline)."""
    if first is None:
        return second
    if second is None:
        return first
    return first if first < second else second


Encoder = Callable[[Publication, "float | None", "Owner | None"], bytes]
"""Encodes a retained entry (publication, expiry, owner) for persistence; raises
TypeError/ValueError if it cannot."""

Evicted = Callable[[Topic, Owner, str, Publication], None]
"""Told (topic, its owner, reason, the publication whose retain caused it) per eviction."""

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
        self._owners: dict[Owner, _Holding] = {}
        self._owned_topics = 0
        self._owned_bytes = 0
        """Topics and bytes of every owner together: what the realm bounds limit."""
        self._by_count: dict[int, dict[Owner, None]] = {}
        """Number of topics -> the owners holding that many, and ``_most``, the highest:
        the owner holding the most is found in O(1), however many owners there are."""
        self._most = 0
        self._heaviest: list[tuple[int, int, Owner]] = []
        """Max-heap of (-bytes, tie-breaker, owner); items whose bytes are no longer the
        owner's are stale and skipped, and the heap is rebuilt when they outnumber the owners."""
        self._reweighed: dict[Owner, None] = {}
        """Owners whose bytes changed since ``_heaviest`` was last looked at, in the order of
        their last change: their items are pushed then, in that order (ties among owners of
        equal bytes go as when each change pushed its own), not on every retain (the heap
        serves only evictions at ``max_bytes``)."""
        self._expiry: list[tuple[float, int, Topic, RetainedEvent]] = []
        """Heap of (expires_at, tie-breaker, topic, entry); items of entries no longer
        in ``_timed`` are stale and skipped."""
        self._timed: dict[RetainedEvent, Topic] = {}
        """Live entries that expire, with their topic."""
        self._pushes = itertools.count()
        self.bytes = 0
        self.listeners: list[ChangeListener] = []
        self.evicted: Evicted | None = None

    def __len__(self) -> int:
        return len(self._topics)

    # writing --------------------------------------------------------------

    def declines(self, topic: Topic) -> bool:
        """Is the topic one the realm's policy does not retain (``retention.decline``)? Then a
        retained publication is only routed."""
        declined = self.policy.declined
        return bool(declined) and any(topic_matches(pattern, match, topic)
                                      for pattern, match in declined)

    def retain(self, publication: Publication) -> RetainedEvent:
        """Make ``publication`` the topic's retained event (for its audience).

        Raises TypeError/ValueError if the payload cannot be encoded for storage,
        :class:`RetainRefused` if it is larger than a byte bound (nothing changed then).
        """
        topic = publication.topic
        policy = self.policy
        ttl = publication.retain_ttl or policy.default_ttl
        expires_at = earliest(publication.timestamp + ttl if ttl else None,
                              publication.expires_at)
        owner = owner_of(publication.publisher)
        holding = self._owners.get(owner) if owner is not None else None
        if holding is not None:
            owner = holding.owner  # one Owner object per principal, not one per entry
        blob = self._encoder(publication, expires_at, owner)
        if owner is not None and len(blob) > min(policy.max_bytes_per_principal,
                                                 policy.max_bytes):
            raise RetainRefused(f"{len(blob)} bytes, over the retained quota of "
                                f"{min(policy.max_bytes_per_principal, policy.max_bytes)}")
        event = RetainedEvent(publication, expires_at, len(blob), blob, owner)
        if publication.eligibility is None and not (publication.exclude_me
                                                    and publication.publisher is not None):
            # (the commonest: every MQTT retained publish) it replaces all the topic held,
            # as :meth:`supersede` says: the trie is walked once, to look up and store
            entries = [event]
            old = self._topics.exchange(topic, entries) or []
        else:
            old = self._topics.get(topic) or []
            entries = self.supersede(old, event)
            self._topics.set(topic, entries)
        self._account(topic, old, entries)
        self._tell(topic, entries, "set", publication)
        if owner is not None:
            if old and old[-1].owner == owner:  # a topic it held: now its newest
                self._owners[owner].topics.move_to_end(topic)
            self._enforce_limits(topic, owner, publication)
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

    def restore(self, topics: Iterable[tuple[Topic, list[RetainedEvent]]]) -> None:
        """Load persisted topics at start-up (no change notification), oldest first, so
        that evictions after a restart still take each owner's oldest."""
        for topic, entries in sorted(topics, key=lambda item: item[1][-1].publication.timestamp):
            self._replace(topic, entries)

    def revert(self, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Go back to what the store holds after a write of ``topic`` failed: memory never
        claims a retained event that a restart would not bring back (no notification)."""
        self._replace(topic, entries)

    def _set(self, topic: Topic, entries: list[RetainedEvent], action: str,
             publication: Publication | None) -> None:
        self._replace(topic, entries)
        self._tell(topic, entries, action, publication)

    def _tell(self, topic: Topic, entries: list[RetainedEvent], action: str,
              publication: Publication | None) -> None:
        """Tell the listeners of a change, then drop the encodings offered to them."""
        for listener in self.listeners:
            listener(topic, entries, action, publication)
        for entry in entries:
            entry.blob = None

    def _replace(self, topic: Topic, entries: list[RetainedEvent]) -> None:
        """A topic's entries become ``entries``: trie, bytes, owners and expiry heap follow."""
        old = self._topics.get(topic) or []
        if entries:
            self._topics.set(topic, entries)
        else:
            self._topics.pop(topic)
        self._account(topic, old, entries)

    def _account(self, topic: Topic, old: list[RetainedEvent],
                 entries: list[RetainedEvent]) -> None:
        """Bytes, owners and expiry heap after a topic's entries went from ``old`` to
        ``entries`` (the trie holds them already)."""
        old_size = _size(old)
        new_size = _size(entries)
        self.bytes += new_size - old_size
        old_owner = old[-1].owner if old else None
        new_owner = entries[-1].owner if entries else None
        if old_owner == new_owner:  # the commonest: a topic set again by its owner
            if new_owner is not None and new_size != old_size:
                self._charge(new_owner, topic, new_size - old_size, 0)
        else:
            if old_owner is not None:
                self._charge(old_owner, topic, -old_size, -1)
            if new_owner is not None:
                self._charge(new_owner, topic, new_size, 1)
        if self._timed or len(entries) != 1 or entries[0].expires_at is not None:
            self._track(topic, old, entries)  # (else nothing expires: nothing to keep in step)

    def _charge(self, owner: Owner, topic: Topic, size: int, topics: int) -> None:
        """Add ``size`` bytes (negative: take them back) to ``owner``; ``topics`` 1: the
        topic joins the owner's (newest), -1: it leaves them, 0: it stays where it is."""
        holding = self._owners.get(owner)
        if holding is None:
            holding = self._owners[owner] = _Holding(owner)
        held = len(holding.topics)
        holding.bytes += size
        self._owned_bytes += size
        if topics > 0:
            holding.topics[topic] = None
        elif topics < 0:
            del holding.topics[topic]
            if not holding.topics:
                del self._owners[owner]
                self._reweighed.pop(owner, None)
        if topics:
            self._owned_topics += topics
            self._recount(owner, held, held + topics)
        if size and holding.topics:
            reweighed = self._reweighed
            reweighed.pop(owner, None)
            reweighed[owner] = None

    def _recount(self, owner: Owner, before: int, after: int) -> None:
        """``owner`` went from holding ``before`` topics to ``after`` (one more or less)."""
        by_count = self._by_count
        alone = None
        if before:
            owners = by_count[before]
            if len(owners) == 1:  # (the commonest: one flooding owner) its dict moves with it
                alone = by_count.pop(before)
            else:
                del owners[owner]
        if after:
            joined = by_count.get(after)
            if joined is not None:
                joined[owner] = None
            else:
                by_count[after] = alone if alone is not None else {owner: None}
        if after > self._most:
            self._most = after
        elif before == self._most and before not in by_count:
            self._most = after

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
                            for entry, topic in timed.items() if entry.expires_at is not None]
            heapq.heapify(self._expiry)

    def _enforce_limits(self, kept: Topic, owner: Owner, cause: Publication) -> None:
        """After ``owner`` set ``kept``: its own quota first, then the realm's bounds (see
        the module docstring); ``kept`` itself is never evicted."""
        policy = self.policy
        holding = self._owners.get(owner)
        while holding is not None and (len(holding.topics) > policy.max_topics_per_principal
                                       or holding.bytes > policy.max_bytes_per_principal):
            if not self._evict(holding, kept, QUOTA, cause):
                break
            holding = self._owners.get(owner)
        while (self._owned_topics > policy.max_topics
               or self._owned_bytes > policy.max_bytes):
            largest = (self._most_topics(owner) if self._owned_topics > policy.max_topics
                       else self._most_bytes(owner))
            if largest is None:
                break
            self._evict(largest, kept, REALM_LIMIT, cause)

    def _most_topics(self, publisher: Owner) -> "_Holding | None":
        """The owner holding the most topics, ``publisher`` on a tie; None if that is only
        the publisher with the one topic it just set."""
        most = self._most
        owners = self._by_count[most]
        if publisher in owners and most > 1:
            return self._owners[publisher]
        for owner in owners:
            if owner != publisher:
                return self._owners[owner]
        return None

    def _most_bytes(self, publisher: Owner) -> "_Holding | None":
        """The owner holding the most bytes, passing over ``publisher`` if all it holds is
        the topic it just set."""
        heap = self._reweigh()
        passed = None
        found = None
        while heap:
            negative, _, owner = heap[0]
            holding = self._owners.get(owner)
            if holding is None or holding.bytes != -negative:
                heapq.heappop(heap)  # stale
            elif owner == publisher and len(holding.topics) == 1:
                passed = heapq.heappop(heap)
            else:
                found = holding
                break
        if passed is not None:
            heapq.heappush(heap, passed)
        return found

    def _evict(self, holding: "_Holding", kept: Topic, reason: str,
               cause: Publication) -> bool:
        """Evict the oldest topic of ``holding`` other than ``kept``; False if it has none."""
        for oldest in holding.topics:
            if oldest != kept:
                break
        else:
            return False
        self._set(oldest, [], "evict", None)
        if self.evicted is not None:
            self.evicted(oldest, holding.owner, reason, cause)
        return True

    def _reweigh(self) -> list[tuple[int, int, Owner]]:
        """``_heaviest`` with an item for the bytes each owner holds now (rebuilt when its
        stale items outnumber the owners)."""
        heap = self._heaviest
        for owner in self._reweighed:
            holding = self._owners.get(owner)
            if holding is not None:
                heapq.heappush(heap, (-holding.bytes, next(self._pushes), owner))
        self._reweighed.clear()
        if len(heap) > 2 * len(self._owners) + 16:
            heap = self._heaviest = [(-h.bytes, next(self._pushes), h.owner)
                                     for h in self._owners.values()]
            heapq.heapify(heap)
        return heap

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
        """(topic, entries) for every retained topic matched by (pattern, match): the
        trie's own walk, not a generator around it (one level less per retained event)."""
        if match == EXACT:
            entries = self._topics.get(pattern)
            return iter(((pattern, entries),) if entries else ())
        if match == PREFIX:
            return self._topics.under_prefix(pattern)
        if match == MQTT:
            return self._topics.matching_filter(pattern)
        return self._topics.matching_wildcard(pattern)

    def for_subscriber(self, pattern: Topic, match: str,
                       session: SessionInfo) -> Iterator[Publication]:
        """Per matching topic, the newest live retained event ``session`` is eligible for.
        Lazy: a paced backlog takes it over many reactor turns (expiry is checked as it
        goes, and the walk tolerates changes of the store between two steps)."""
        clock = self._clock
        for _, entries in self.topics(pattern, match):
            newest = entries[-1]
            publication = newest.publication
            if (newest.expires_at is None and publication.eligibility is None
                    and not publication.exclude_me):
                yield publication  # for everyone, no expiry: the commonest entry
                continue
            for entry in reversed(entries):
                if entry.expires_at is not None and entry.expires_at <= clock():
                    continue
                if entry.publication.admits(session):
                    yield entry.publication
                    break


class _Holding:
    """One owner's retained topics, the one set longest ago first, and their bytes."""

    __slots__ = ("owner", "topics", "bytes")

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.topics: OrderedDict[Topic, None] = OrderedDict()
        self.bytes = 0
