"""Role-based authorization, the same for every protocol.

A role holds permission rules ``(pattern, match, actions)``: a WAMP ``uri`` split on
``.`` (``exact``, ``prefix``, ``wildcard``) or an MQTT topic filter split on ``/``
(match ``mqtt``: ``+`` one level, a last ``#`` this level and all below, as Mosquitto's
``topic`` lines); either applies to topics of every protocol as level tuples
(:mod:`router.core.topic`). An action on a topic is allowed iff some rule of the
role grants it and *covers* the topic: for a concrete topic that means the rule
matches it; for a pattern (a prefix, wildcard or MQTT filter subscription, or a
registration) it means every topic the pattern can match is matched by the rule.
Checking the pattern this way at subscribe time makes a per-event re-check at
delivery unnecessary.

The router's own ``wamp.`` namespace (meta API, retained-event administration)
is only granted by rules whose URI names it: a catch-all prefix rule ``""``
does not hand out ``wamp.retained.purge``; nor does a filter rule starting with a
wildcard reach ``$SYS`` topics (MQTT's rule for topics whose first level starts with ``$``).

A filter rule may hold the whole levels ``%u`` (the session's authid; never matches an
anonymous session) and ``%c`` (its MQTT client id; never matches a WAMP or AMQP session).
Such a rule is bound once per identity and the decisions are cached per identity, so the
publish path stays one dictionary lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.model import SessionInfo
from router.core.topic import (ONE, RESERVED, REST, Topic, is_reserved, pattern_text,
                               prefix_matches, wildcard_matches)
from router.core.uri import EXACT, MQTT, PREFIX, WILDCARD

ACTIONS = ("publish", "subscribe", "call", "register")
USER, CLIENT = "%u", "%c"
"""The substitution levels of a filter rule: the session's authid and MQTT client id."""
MAX_IDENTITIES = 10_000
"""Identities whose ``%u``/``%c`` rules are kept bound; past it they are bound afresh."""


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
        if self.match == MQTT:
            return filter_covers(self.pattern, topic, match)
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

    @property
    def everywhere(self) -> bool:
        """Does the rule cover every topic, but those of ``wamp`` and those whose first level
        starts with ``$`` (a prefix rule ``""``, a filter rule ``#``)?"""
        return ((self.match == PREFIX and self.pattern == ("",))
                or (self.match == MQTT and self.pattern == (REST,)))

    @property
    def personal(self) -> bool:
        """Does the rule name the session (``%u``, ``%c``), so it holds once bound?"""
        return self.match == MQTT and (USER in self.pattern or CLIENT in self.pattern)

    def bind(self, authid: str | None, client_id: str | None) -> "PermissionRule | None":
        """The rule for one session: ``%u``/``%c`` levels replaced by its values; None
        (no rule) when a value is missing or could act as a wildcard or level separator."""
        values = {USER: authid, CLIENT: client_id}
        levels = []
        for level in self.pattern:
            if level in values:
                value = values[level]
                if not value or any(char in value for char in "/+#\0"):
                    return None
                level = value
            levels.append(level)
        return PermissionRule(tuple(levels), MQTT, self.actions, self.disclose)

    def text(self) -> str:
        """How the rule reads in a realm file (for logs and ``role list``)."""
        if self.match == MQTT:
            return f"topic '{pattern_text(self.pattern, MQTT)}'"
        return f"uri '{'.'.join(self.pattern)}' ({self.match})"


def filter_covers(rule: Topic, topic: Topic, match: str) -> bool:
    """True if the MQTT filter ``rule`` matches every topic ``(topic, match)`` matches.

    Level by level: a rule ``#`` covers whatever follows, a rule ``+`` one level of any
    kind, a literal only the same literal. The request's last level may stand for many
    levels (an MQTT ``#``: nothing or anything below; a WAMP prefix's partial level: any
    level starting with it, and anything below). A rule wildcard in first place never
    covers a first level that may start with ``$``."""
    one = ONE if match == MQTT else ("" if match == WILDCARD else None)
    open_last = match == PREFIX or (match == MQTT and topic[-1] == REST)
    fixed = topic[:-1] if open_last else topic
    for index, level in enumerate(fixed):
        if index == len(rule):
            return False
        ruled = rule[index]
        if ruled == REST or ruled == ONE:
            if index == 0 and ((level == one and match == WILDCARD)
                               or (level != one and level.startswith("$"))):
                return False
            if ruled == REST:
                return True
        elif level == one or ruled != level:
            return False
    depth = len(fixed)
    below = rule[depth:]
    if not open_last:
        return below == () or below == (REST,)
    if match == MQTT:  # a last '#': this level and everything below (a topic has a level)
        return below == (REST,) or (depth == 0 and below == (ONE, REST))
    partial = topic[-1]  # a WAMP prefix: any level starting with it, anything below
    if depth == 0 and (partial == "" or partial.startswith("$")):
        return False
    return below == (REST,) or below == (ONE, REST)


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
    """A named set of permission rules; ``%u``/``%c`` rules hold only once :meth:`bind` ran."""

    def __init__(self, name: str, rules: list[PermissionRule]) -> None:
        self.name = name
        self.rules = rules
        self.personal = any(rule.personal for rule in rules)
        self.discloser = any(rule.disclose for rule in rules)
        self.everywhere = frozenset(action for rule in rules if rule.everywhere
                                    for action in rule.actions)
        """Actions a rule grants on every topic outside ``wamp`` and the ``$`` topics (a
        prefix ``""`` or a filter ``#``): decided without walking the rules."""

    def bind(self, authid: str | None, client_id: str | None) -> "Role":
        """This role for one session: its ``%u``/``%c`` rules with the session's values."""
        bound = [rule.bind(authid, client_id) if rule.personal else rule for rule in self.rules]
        return Role(self.name, [rule for rule in bound if rule is not None])

    def allows(self, action: str, topic: Topic, match: str = EXACT) -> bool:
        """Does a rule of the role (not a personal ``%u``/``%c`` one, which needs the session)
        allow ``action`` on the pattern?"""
        return any(action in rule.actions and not rule.personal and rule.covers(topic, match)
                   for rule in self.rules)

    def discloses(self, action: str, topic: Topic) -> bool:
        """Must the caller or publisher be disclosed to receivers (a rule with ``disclose``),
        whatever the client asked?"""
        return any(rule.disclose and action in rule.actions and rule.covers(topic)
                   and not rule.personal for rule in self.rules)

    def nearest(self, action: str, topic: Topic) -> PermissionRule | None:
        """The rule closest to a refused request: the most leading levels in common with
        it (a wildcard level counting as common), then one that allows the action."""
        def closeness(rule: PermissionRule) -> tuple[int, bool]:
            common = 0
            for ruled, level in zip(rule.pattern, topic):
                if ruled != level and not (rule.match == MQTT and ruled in (ONE, REST)):
                    break
                common += 1
            return common, action in rule.actions
        return max(self.rules, key=closeness, default=None)


_CACHED_ACTIONS = frozenset({"publish", "call"})
"""The actions of the hot paths, whose decisions are cached. A subscribe or register is
decided once per session and topic: cached, 20,000 sessions on topics of their own left
20,000 entries (a key tuple and its topic) behind them, scattered over the heap, holding
on to memory those sessions had freed."""


class Authorizer:
    """Answers "may this session do that?" for a realm, with a cache for the hot publish path.

    Decisions are cached per role, or per identity (role, authid, client id) for a role
    with ``%u``/``%c`` rules, whose binding is kept too (both bounded)."""

    def __init__(self, roles: dict[str, Role]) -> None:
        self._roles = roles
        self._personal = {name for name, role in roles.items() if role.personal}
        self._everywhere = {name: role.everywhere for name, role in roles.items()
                            if role.everywhere}
        self._bound: dict[tuple[str, str | None, str | None], Role] = {}
        self._cache: dict[tuple[object, str, Topic, str], bool] = {}
        self.disclosing = any(role.discloser for role in roles.values())
        """Has any role a disclosing rule? Without one, a publish asks :meth:`discloses`
        nothing."""

    def allows(self, info: SessionInfo, action: str, topic: Topic, match: str = EXACT) -> bool:
        """The authorization check of every request, cached per (role or identity, action, topic,
        match): asked on each publish and call, so the rules are walked once per distinct
        request. An action a rule of the role grants everywhere is allowed on a topic that
        is neither ``wamp`` nor ``$``: not cached, so topics of their own (a sensor each)
        neither walk the rules nor fill the cache."""
        if match == EXACT:
            everywhere = self._everywhere.get(info.authrole)
            if everywhere and action in everywhere:
                first = topic[0]
                if first != RESERVED and not first.startswith("$"):
                    return True
        subject: object = info.authrole
        if self._personal and subject in self._personal:
            subject = _identity(info)
        if action not in _CACHED_ACTIONS:
            role = self.role(info)
            return role is not None and role.allows(action, topic, match)
        key = (subject, action, topic, match)
        decision = self._cache.get(key)
        if decision is None:
            role = self.role(info)
            decision = role is not None and role.allows(action, topic, match)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def discloses(self, info: SessionInfo, action: str, topic: Topic) -> bool:
        """Does the session's role force disclosure of its identity for ``action`` on ``topic``?
        Roles without any disclosing rule answer at once."""
        role = self._roles.get(info.authrole)
        if role is None or not role.discloser:  # most roles: nothing more on every publish
            return False
        role = self.role(info)
        return role is not None and role.discloses(action, topic)

    def role(self, info: SessionInfo) -> Role | None:
        """The session's role, its ``%u``/``%c`` rules bound to it; None if there is none."""
        role = self._roles.get(info.authrole)
        if role is None or not role.personal:
            return role
        identity = _identity(info)
        bound = self._bound.get(identity)
        if bound is None:
            if len(self._bound) >= MAX_IDENTITIES:
                self._bound.clear()
            bound = self._bound[identity] = role.bind(identity[1], identity[2])
        return bound

    def explain(self, info: SessionInfo, action: str, topic: Topic, match: str) -> str:
        """Why a request was refused, for the operator's log: the rule set checked, the
        nearest rule and what would grant the request."""
        role = self._roles.get(info.authrole)
        if role is None:
            return f"the realm has no role '{info.authrole}'"
        nearest = (self.role(info) or role).nearest(action, topic)
        if nearest is None:
            return f"role '{role.name}' has no rules" + (
                " that apply to this session (its %u/%c rules need an authenticated authid "
                "/ an MQTT client id)" if role.rules else "")
        why = f"nearest rule: {nearest.text()} allows {', '.join(sorted(nearest.actions))}"
        if action not in nearest.actions:
            hint = f"it does not allow {action}"
        elif match == EXACT:
            hint = "it does not match this topic"
        else:
            hint = "a pattern is granted only by a rule that covers every topic it can match"
            if nearest.match == PREFIX and match == MQTT:
                hint += ("; a WAMP prefix rule is a string prefix of the dotted URI, for "
                         f"MQTT filters write a topic rule such as {{\"topic\": "
                         f"\"{pattern_text(topic, MQTT)}\"}}")
        return f"{why}; {hint}"


def _identity(info: SessionInfo) -> tuple[str, str | None, str | None]:
    """What ``%u``/``%c`` rules depend on: role, authid (None if anonymous), client id."""
    return (info.authrole, None if info.authmethod == "anonymous" else info.authid,
            info.client_id)
