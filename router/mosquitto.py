"""Reading a Mosquitto password file and ACL file into principals and roles of a realm.

Password files hold ``user:$7$...`` (PBKDF2-SHA512, Mosquitto 2) or ``user:$6$...``
(salted SHA-512) lines; the hashes are kept as they are (the router verifies both, see
:mod:`router.core.credentials`), so users keep their passwords.

ACL files hold ``user <name>``, ``topic [read|write|readwrite] <filter>`` and
``pattern [read|write|readwrite] <filter>`` lines: ``topic`` lines before the first
``user`` are for anonymous clients, later ones for the user above them, ``pattern`` lines
(with ``%u``/``%c``) for everyone. ``read`` is subscribe, ``write`` publish. The router's
rules only allow, so a ``deny`` line is refused with its line number rather than imported
as something it does not mean.

Roles: ``mosquitto-<user>`` for a user with ``topic`` lines, ``mosquitto-anonymous`` for
the anonymous lines, ``mosquitto`` for users with none; each also gets every ``pattern``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from router.core.credentials import MOSQUITTO_HASHES

SHARED_ROLE = "mosquitto"
ANONYMOUS_ROLE = "mosquitto-anonymous"
ACCESS = {"read": ["subscribe"], "write": ["publish"], "readwrite": ["publish", "subscribe"]}


class MosquittoError(ValueError):
    """A line the import cannot take, with its file and line number in the message."""


@dataclass
class Acl:
    """The grants of an ACL file: filter -> actions, per user (None: anonymous) and for all."""

    users: dict[str | None, dict[str, list[str]]] = field(default_factory=dict)
    patterns: dict[str, list[str]] = field(default_factory=dict)


def read_passwords(path: Path) -> dict[str, str]:
    """user -> hash of a Mosquitto password file."""
    users: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, colon, stored = line.partition(":")
        if not colon or not user:
            raise MosquittoError(f"{path}:{number}: not 'user:hash'")
        if not stored.startswith(MOSQUITTO_HASHES):
            raise MosquittoError(f"{path}:{number}: user '{user}' has no $7$ or $6$ hash "
                               "(a plain-text file? hash it first with 'mosquitto_passwd -U')")
        users[user] = stored
    return users


def read_acl(path: Path) -> Acl:
    """The grants of a Mosquitto ACL file (see the module docstring)."""
    acl = Acl()
    user: str | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        rest = rest.strip()
        if keyword == "user":
            if not rest:
                raise MosquittoError(f"{path}:{number}: 'user' needs a user name")
            user = rest
            acl.users.setdefault(user, {})
            continue
        if keyword not in ("topic", "pattern"):
            raise MosquittoError(f"{path}:{number}: unknown line {line!r} (expected user, topic "
                               "or pattern)")
        access, _, topic_filter = rest.partition(" ")
        if access not in ACCESS and access != "deny":
            access, topic_filter = "readwrite", rest  # no access word: read and write
        topic_filter = topic_filter.strip()
        if access == "deny":
            raise MosquittoError(f"{path}:{number}: {line!r}: the router's rules only allow "
                               "(a topic no rule allows is refused); remove the deny line "
                               "and narrow the allowing lines instead")
        if not topic_filter:
            raise MosquittoError(f"{path}:{number}: {line!r} names no topic filter")
        if keyword == "topic" and ("%u" in topic_filter or "%c" in topic_filter):
            raise MosquittoError(f"{path}:{number}: {line!r}: %u and %c are substituted only "
                               "in pattern lines")
        grants = acl.patterns if keyword == "pattern" else acl.users.setdefault(user, {})
        actions = grants.setdefault(topic_filter, [])
        actions.extend(action for action in ACCESS[access] if action not in actions)
    return acl


def role_name(user: str | None, acl: Acl | None) -> str:
    """The role an imported user (None: anonymous clients) gets."""
    if user is None:
        return ANONYMOUS_ROLE
    return f"{SHARED_ROLE}-{user}" if acl is not None and acl.users.get(user) else SHARED_ROLE


def roles(acl: Acl | None) -> dict[str, list[dict]]:
    """The realm file's rules of every imported role. Without an ACL file Mosquitto lets
    every client do everything: the shared role then allows ``#`` (never ``$SYS``)."""
    if acl is None:
        return {SHARED_ROLE: [{"topic": "#", "allow": ["publish", "subscribe"]}]}

    def rules(grants: dict[str, list[str]]) -> list[dict]:
        merged = {topic_filter: set(actions) for topic_filter, actions in grants.items()}
        for topic_filter, actions in acl.patterns.items():
            merged.setdefault(topic_filter, set()).update(actions)
        return [{"topic": topic_filter, "allow": sorted(actions)}
                for topic_filter, actions in merged.items()]

    result = {SHARED_ROLE: rules({})}
    for user, grants in acl.users.items():
        if grants or user is None:
            result[role_name(user, acl)] = rules(grants)
    return result
