"""The subscription index: which subscriptions match a concrete topic.

Exact topics are a dict lookup, prefix subscriptions are probed once per distinct shape
(number of levels, length of the last level), or once per prefix of the topic when there
are more shapes than that, and wildcard and MQTT filter subscriptions are walked in a level
trie. The broker and the shared groups each keep one.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from typing import Any, Generic, Iterable, Iterator, Protocol, TypeVar

from router.core.topic import Topic
from router.core.trie import TopicTrie
from router.core.uri import EXACT, MQTT, PREFIX


class Pattern(Protocol):
    """What the index files an entry under: its id and its (topic pattern, match)."""

    @property
    def id(self) -> int:
        """The entry's id: the index's ``by_id`` finds it for UNSUBSCRIBE and the meta API."""

    @property
    def topic(self) -> Topic:
        """The topic pattern the entry is filed under."""

    @property
    def match(self) -> str:
        """The match policy (exact, prefix, wildcard, MQTT filter) that picks the structure it is
        filed in."""


class PatternEntry:
    """An index entry for what several holders share on one (topic pattern, match), when
    that is not a :class:`Subscription` (the shared groups on a pattern; in the Redis engine,
    the other nodes holding it): subclasses add what they keep."""

    __slots__ = ("id", "topic", "match")

    def __init__(self, entry_id: int, topic: Topic, match: str) -> None:
        self.id = entry_id
        self.topic = topic
        self.match = match


Entry = TypeVar("Entry", bound=Pattern)
"""What an index holds: the broker's :class:`Subscription`, the shared groups' entries
(every group on one pattern)."""


class SubscriptionIndex(Generic[Entry]):
    """Finds the subscriptions matching a concrete topic without scanning them all."""

    def __init__(self) -> None:
        self.exact: dict[Topic, Entry] = {}
        self.prefix: dict[Topic, Entry] = {}
        self._prefix_shapes: list[tuple[int, int]] = []
        self._shape_counts: Counter[tuple[int, int]] = Counter()
        """Prefix subscriptions per shape: the sorted shapes change only when a shape comes
        or goes, not on every prefix subscription."""
        self.wildcard: TopicTrie[Entry] = TopicTrie()
        self.filters: TopicTrie[Entry] = TopicTrie()
        self.by_id: dict[int, Entry] = {}
        self._patterns = 0
        """Entries on prefixes, wildcards and MQTT filters."""

    def _trie(self, match: str) -> TopicTrie[Entry]:
        return self.filters if match == MQTT else self.wildcard

    def tables(self) -> tuple[dict[Any, Any], ...]:
        """The tables that grow with the subscriptions (for :func:`router.memory.compact`)."""
        return (self.exact, self.prefix, self.by_id)

    def lookup(self, topic: Topic, match: str) -> Entry | None:
        """The entry on exactly (topic, match): a second SUBSCRIBE on the same pattern joins it."""
        if match == EXACT:
            return self.exact.get(topic)
        if match == PREFIX:
            return self.prefix.get(topic)
        return self._trie(match).get(topic)

    def add(self, subscription: Entry) -> None:
        """File an entry in the structure of its match policy, so :meth:`matching` finds it."""
        self.by_id[subscription.id] = subscription
        if subscription.match == EXACT:
            self.exact[subscription.topic] = subscription
        elif subscription.match == PREFIX:
            self.prefix[subscription.topic] = subscription
            shape = _shape(subscription.topic)
            self._shape_counts[shape] += 1
            if self._shape_counts[shape] == 1:
                insort(self._prefix_shapes, shape)
            self._count_patterns()
        else:
            self._trie(subscription.match).set(subscription.topic, subscription)
            self._count_patterns()

    def remove(self, subscription: Entry) -> None:
        """Drop an entry whose last subscriber left."""
        del self.by_id[subscription.id]
        if subscription.match == EXACT:
            del self.exact[subscription.topic]
        elif subscription.match == PREFIX:
            del self.prefix[subscription.topic]
            shape = _shape(subscription.topic)
            self._shape_counts[shape] -= 1
            if not self._shape_counts[shape]:
                del self._shape_counts[shape]
                self._prefix_shapes.remove(shape)
            self._count_patterns()
        else:
            self._trie(subscription.match).pop(subscription.topic)
            self._count_patterns()

    def _count_patterns(self) -> None:
        self._patterns = len(self.prefix) + len(self.wildcard) + len(self.filters)

    def matching(self, topic: Topic) -> Iterable[Entry]:
        """Every subscription whose (pattern, match) matches ``topic``: while every entry is
        on an exact topic (the commonest index), a tuple, without a generator's making and
        stepping per publication."""
        if not self._patterns:
            subscription = self.exact.get(topic)
            return () if subscription is None else (subscription,)
        return self._matching(topic)

    def _matching(self, topic: Topic) -> Iterator[Entry]:
        subscription = self.exact.get(topic)
        if subscription is not None:
            yield subscription
        shapes = self._prefix_shapes
        if shapes:
            prefixes = self.prefix
            depth = len(topic)
            if len(shapes) > FEW_SHAPES and len(shapes) > _prefix_count(topic):
                # more shapes than prefixes of the topic (one session's prefixes of 10,000
                # lengths made every publish ~10x as costly): probe the topic's own, in the
                # shapes' order
                for levels in range(1, depth + 1):
                    head, last = topic[:levels - 1], topic[levels - 1]
                    for length in range(len(last) + 1):
                        subscription = prefixes.get(head + (last[:length],))
                        if subscription is not None:
                            yield subscription
            else:
                for levels, length in shapes:
                    if levels > depth:
                        break
                    last = topic[levels - 1]
                    if length <= len(last):
                        subscription = prefixes.get(topic[:levels - 1] + (last[:length],))
                        if subscription is not None:
                            yield subscription
        if len(self.wildcard):
            yield from self.wildcard.match_patterns(topic)
        if len(self.filters):
            yield from self.filters.match_filters(topic)


FEW_SHAPES = 32
"""Up to this many prefix shapes a topic is probed for each (the commonest index: a few)."""


def _prefix_count(topic: Topic) -> int:
    """The prefixes of ``topic`` a prefix subscription could be on: per level, the levels
    before it and each start of it (the empty one included)."""
    return sum(map(len, topic)) + len(topic)


def _shape(prefix: Topic) -> tuple[int, int]:
    """(levels, length of the last level) of a prefix: the prefixes :meth:`matching`
    probes a topic for."""
    return len(prefix), len(prefix[-1])
