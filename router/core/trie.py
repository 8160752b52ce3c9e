"""A topic trie keyed by level tuples (see :mod:`router.core.topic`).

One structure serves both directions of matching:

* stored keys are *patterns* (wildcard subscriptions, registrations) and the query
  is a concrete topic: :meth:`TopicTrie.match_patterns`;
* stored keys are *concrete topics* (retained events) and the query is a pattern:
  :meth:`TopicTrie.under_prefix` and :meth:`TopicTrie.matching_wildcard`.

Walks touch only the branches that can match, never every key. They are lazy and may
be resumed after the trie changed (a retained backlog walks over many reactor turns):
a key added meanwhile may or may not be yielded, a key removed before it was reached is
not, and nothing raises.
"""

from __future__ import annotations

from enum import Enum
from typing import Generic, Iterator, TypeVar

from router.core.topic import ONE, REST, Topic

V = TypeVar("V")


class _Missing(Enum):
    """No value at a node (None may be a stored value)."""

    MISSING = "missing"


_MISSING = _Missing.MISSING


class _Node(Generic[V]):
    __slots__ = ("children", "value", "key")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] = {}
        self.value: V | _Missing = _MISSING
        self.key: Topic = ()
        """The full key of the value here (meaningless while there is none)."""


class TopicTrie(Generic[V]):
    """Maps level tuples to values, with pattern walks over levels."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def get(self, key: Topic, default: V | None = None) -> V | None:
        """The value stored under exactly ``key`` (no pattern matching), else ``default``."""
        node = self._root
        for part in key:
            child = node.children.get(part)
            if child is None:
                return default
            node = child
        return default if node.value is _MISSING else node.value

    def set(self, key: Topic, value: V) -> None:
        """Store ``value`` under ``key``, creating the levels it needs."""
        self.exchange(key, value)

    def exchange(self, key: Topic, value: V) -> V | None:
        """Store ``value`` under ``key`` (as :meth:`set`) and return the value it replaced,
        None if there was none: a lookup and a store in one walk (a retained publish)."""
        node = self._root
        for part in key:
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Node()
            node = child
        old = node.value
        node.value = value
        node.key = key
        if old is _MISSING:
            self._size += 1
            return None
        return old

    def pop(self, key: Topic, default: V | None = None) -> V | None:
        """Remove and return the value under ``key``, pruning levels left empty so the trie does
        not grow with churn."""
        path = [self._root]
        parts = key
        for part in parts:
            child = path[-1].children.get(part)
            if child is None:
                return default
            path.append(child)
        node = path[-1]
        if node.value is _MISSING:
            return default
        value = node.value
        node.value = _MISSING
        node.key = ()
        self._size -= 1
        for depth in range(len(parts), 0, -1):
            current = path[depth]
            if current.children or current.value is not _MISSING:
                break
            del path[depth - 1].children[parts[depth - 1]]
        return value

    def items(self) -> Iterator[tuple[Topic, V]]:
        """Every stored (key, value), for listings and restores."""
        yield from self._subtree(self._root)

    def match_patterns(self, topic_parts: Topic) -> Iterator[V]:
        """Values stored under WAMP wildcard patterns ('' = any one level) matching the topic."""
        last = len(topic_parts)
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == last:
                if node.value is not _MISSING:
                    yield node.value
                continue
            children = node.children
            exact = children.get(topic_parts[depth])
            if exact is not None:
                stack.append((exact, depth + 1))
            if topic_parts[depth] != "":
                wild = children.get("")
                if wild is not None:
                    stack.append((wild, depth + 1))

    def match_filters(self, topic_parts: Topic) -> Iterator[V]:
        """Values stored under MQTT filters that match the topic.

        In stored filters ``+`` is one level and a last ``#`` is this level and
        everything below, including nothing more (``a/#`` matches ``a``). A topic
        whose first level starts with ``$`` is not matched by a filter that starts
        with a wildcard (MQTT's rule). A filter level is never a literal ``+``, so
        a topic level ``+`` (possible in a loose WAMP URI) is reached through the
        wildcard child only once.
        """
        last = len(topic_parts)
        system = last > 0 and topic_parts[0].startswith("$")
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            wild_allowed = depth > 0 or not system
            if wild_allowed:
                rest = node.children.get(REST)
                if rest is not None and rest.value is not _MISSING:
                    yield rest.value
            if depth == last:
                if node.value is not _MISSING:
                    yield node.value
                continue
            level = topic_parts[depth]
            exact = node.children.get(level)
            if exact is not None and (level != ONE or wild_allowed):
                stack.append((exact, depth + 1))
            if wild_allowed and level != ONE:
                one = node.children.get(ONE)
                if one is not None:
                    stack.append((one, depth + 1))

    def matching_filter(self, filter_parts: Topic) -> Iterator[tuple[Topic, V]]:
        """Stored (key, value) pairs whose key matches an MQTT filter (see match_filters)."""
        return self._walk(filter_parts, mqtt=True)

    def _subtree_public(self, node: _Node[V]) -> Iterator[tuple[Topic, V]]:
        """The whole trie except topics whose first level starts with ``$``."""
        for name, child in list(node.children.items()):
            if not name.startswith("$"):
                yield from self._subtree(child)

    def under_prefix(self, prefix: Topic) -> Iterator[tuple[Topic, V]]:
        """Stored (key, value) pairs matched by a WAMP prefix pattern (levelwise: every level
        but the last equal, the last a string prefix: ``a.b`` yields ``a.b``, ``a.b.c``
        and ``a.bc``; see :func:`router.core.topic.prefix_matches`)."""
        node = self._root
        for part in prefix[:-1]:
            child = node.children.get(part)
            if child is None:
                return
            node = child
        partial = prefix[-1]
        for name, child in list(node.children.items()):
            if name.startswith(partial):
                yield from self._subtree(child)

    def matching_wildcard(self, pattern_parts: Topic) -> Iterator[tuple[Topic, V]]:
        """Stored (key, value) pairs whose key matches the WAMP wildcard pattern."""
        return self._walk(pattern_parts, mqtt=False)

    def _walk(self, parts: Topic, mqtt: bool) -> Iterator[tuple[Topic, V]]:
        """Stored keys matching a pattern: a wildcard level ('' for WAMP, '+' with ``mqtt``)
        is any one level; with ``mqtt``, a last '#' is the rest (including nothing) and
        wildcards in first place skip ``$`` topics."""
        one = ONE if mqtt else ""
        last = len(parts)
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == last:
                if node.value is not _MISSING:
                    yield node.key, node.value
                continue
            part = parts[depth]
            if mqtt and part == REST:
                yield from self._subtree(node) if depth > 0 else self._subtree_public(node)
            elif part == one:
                stack.extend((child, depth + 1) for name, child in node.children.items()
                             if not (mqtt and depth == 0 and name.startswith("$")))
            else:
                child = node.children.get(part)
                if child is not None:
                    stack.append((child, depth + 1))

    @staticmethod
    def _subtree(node: _Node[V]) -> Iterator[tuple[Topic, V]]:
        stack = [node]
        while stack:
            current = stack.pop()
            if current.value is not _MISSING:
                yield current.key, current.value
            if current.children:  # a leaf (most nodes under a '#'): no view to extend by
                stack.extend(current.children.values())
