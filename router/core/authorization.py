"""Role-based authorization, the same for every protocol.

A role holds permission rules ``(uri, match, actions)``. An action on a URI is
allowed iff some rule of the role grants it and *covers* the URI: for a concrete
URI that means the rule matches it; for a pattern (a prefix or wildcard
subscription or registration) it means every URI the pattern can match is
matched by the rule. Checking the pattern this way at subscribe time makes a
per-event re-check at delivery unnecessary.

The router's own ``wamp.`` namespace (meta API, retained-event administration)
is only granted by rules whose URI names it: a catch-all prefix rule ``""``
does not hand out ``wamp.retained.purge``.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.uri import EXACT, MQTT, PREFIX, WILDCARD, is_reserved, wildcard_matches

ACTIONS = ("publish", "subscribe", "call", "register")


@dataclass(frozen=True, slots=True)
class PermissionRule:
    uri: str
    match: str
    actions: frozenset[str]
    disclose: bool = False
    """Always disclose the publisher/caller identity of sessions in this role."""

    def covers(self, uri: str, match: str = EXACT) -> bool:
        """True if every URI matched by ``(uri, match)`` is matched by this rule."""
        if is_reserved(uri) and not is_reserved(self.uri):
            return False
        if self.match == PREFIX:
            if match == WILDCARD:
                return _wildcard_fixed_head(uri).startswith(self.uri)
            if match == MQTT:
                return _filter_fixed_head(uri).startswith(self.uri)
            return uri.startswith(self.uri)
        if self.match == EXACT:
            return match == EXACT and uri == self.uri
        rule_parts = self.uri.split(".")
        if match == EXACT:
            return wildcard_matches(rule_parts, uri)
        if match == WILDCARD or (match == MQTT and not uri.endswith("#")):
            parts = uri.split(".")
            return len(parts) == len(rule_parts) and all(
                r == "" or r == p for r, p in zip(rule_parts, parts))
        return False


def _wildcard_fixed_head(pattern: str) -> str:
    """The literal text every match of a wildcard pattern starts with."""
    parts = pattern.split(".")
    if "" not in parts:
        return pattern
    fixed = parts[:parts.index("")]
    return ".".join(fixed) + "." if fixed else ""


def _filter_fixed_head(pattern: str) -> str:
    """The literal text every topic an MQTT-style filter matches starts with.

    ``a.b.#`` matches ``a.b`` itself, so its head is ``a.b``; a one-level
    wildcard first seen after ``a.`` leaves ``a.``.
    """
    parts = pattern.split(".")
    fixed = []
    for part in parts:
        if part == "#":
            return ".".join(fixed)
        if part == "":
            return ".".join(fixed) + "." if fixed else ""
        fixed.append(part)
    return pattern


class Role:
    """A named set of permission rules."""

    def __init__(self, name: str, rules: list[PermissionRule]) -> None:
        self.name = name
        self.rules = rules

    def allows(self, action: str, uri: str, match: str = EXACT) -> bool:
        return any(action in rule.actions and rule.covers(uri, match) for rule in self.rules)

    def discloses(self, action: str, uri: str) -> bool:
        return any(rule.disclose and action in rule.actions and rule.covers(uri)
                   for rule in self.rules)


class Authorizer:
    """Answers "may this role do that?" for a realm, with a cache for the hot publish path."""

    def __init__(self, roles: dict[str, Role]) -> None:
        self._roles = roles
        self._cache: dict[tuple[str, str, str, str], bool] = {}

    def allows(self, authrole: str, action: str, uri: str, match: str = EXACT) -> bool:
        key = (authrole, action, uri, match)
        decision = self._cache.get(key)
        if decision is None:
            role = self._roles.get(authrole)
            decision = role is not None and role.allows(action, uri, match)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def discloses(self, authrole: str, action: str, uri: str) -> bool:
        role = self._roles.get(authrole)
        return role is not None and role.discloses(action, uri)
