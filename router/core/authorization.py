"""Role-based authorization, the same for every protocol.

A role holds permission rules ``(uri, match, actions)``; a rule's ``uri`` is split
on ``.`` into levels and applies to topics of every protocol as level tuples
(:mod:`router.core.topic`). An action on a topic is allowed iff some rule of the
role grants it and *covers* the topic: for a concrete topic that means the rule
matches it; for a pattern (a prefix, wildcard or MQTT filter subscription, or a
registration) it means every topic the pattern can match is matched by the rule.
Checking the pattern this way at subscribe time makes a per-event re-check at
delivery unnecessary.

The router's own ``wamp.`` namespace (meta API, retained-event administration)
is only granted by rules whose URI names it: a catch-all prefix rule ``""``
does not hand out ``wamp.retained.purge``.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.topic import (ONE, REST, Topic, is_reserved, prefix_matches,
                               wildcard_matches)
from router.core.uri import EXACT, MQTT, PREFIX

ACTIONS = ("publish", "subscribe", "call", "register")


@dataclass(frozen=True, slots=True)
class PermissionRule:
    """A rule of a role. ``pattern`` is the levels of the rule's ``uri`` (split on ``.``)."""

    pattern: Topic
    match: str
    actions: frozenset[str]
    disclose: bool = False
    """Always disclose the publisher/caller identity of sessions in this role."""

    def covers(self, topic: Topic, match: str = EXACT) -> bool:
        """True if every topic matched by ``(topic, match)`` is matched by this rule.

        Rules are applied level by level (:mod:`router.core.topic`), never on a dotted
        text, so a level holding ``.`` (an MQTT topic ``com.example/x``) cannot pass
        for several levels (``com.example.x``).
        """
        if is_reserved(topic) and not is_reserved(self.pattern):
            return False
        if self.match == PREFIX:
            return prefix_matches(self.pattern, _fixed_head(topic, match))
        if self.match == EXACT:
            return match == EXACT and topic == self.pattern
        if match == EXACT:
            return wildcard_matches(self.pattern, topic)
        if match == PREFIX or (match == MQTT and topic[-1] == REST):
            return False
        any_one = ONE if match == MQTT else ""
        return len(topic) == len(self.pattern) and all(
            rule == "" or (rule == level and level != any_one)
            for rule, level in zip(self.pattern, topic))


def _fixed_head(pattern: Topic, match: str) -> Topic:
    """A prefix pattern matching every topic ``(pattern, match)`` matches (maybe more):
    the levels before the first wildcard, then an empty partial level where a one-level
    wildcard stands."""
    if match == EXACT or match == PREFIX:
        return pattern
    one = ONE if match == MQTT else ""
    for index, level in enumerate(pattern):
        if level == one:
            return pattern[:index] + ("",)
        if match == MQTT and level == REST:
            return pattern[:index] if index else ("",)
    return pattern


class Role:
    """A named set of permission rules."""

    def __init__(self, name: str, rules: list[PermissionRule]) -> None:
        self.name = name
        self.rules = rules

    def allows(self, action: str, topic: Topic, match: str = EXACT) -> bool:
        return any(action in rule.actions and rule.covers(topic, match) for rule in self.rules)

    def discloses(self, action: str, topic: Topic) -> bool:
        return any(rule.disclose and action in rule.actions and rule.covers(topic)
                   for rule in self.rules)


class Authorizer:
    """Answers "may this role do that?" for a realm, with a cache for the hot publish path."""

    def __init__(self, roles: dict[str, Role]) -> None:
        self._roles = roles
        self._cache: dict[tuple[str, str, Topic, str], bool] = {}

    def allows(self, authrole: str, action: str, topic: Topic, match: str = EXACT) -> bool:
        key = (authrole, action, topic, match)
        decision = self._cache.get(key)
        if decision is None:
            role = self._roles.get(authrole)
            decision = role is not None and role.allows(action, topic, match)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def discloses(self, authrole: str, action: str, topic: Topic) -> bool:
        role = self._roles.get(authrole)
        return role is not None and role.discloses(action, topic)
