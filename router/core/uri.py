"""URI validation per the WAMP spec (strict or loose, per realm)."""

from __future__ import annotations

import re

EXACT, PREFIX, WILDCARD = "exact", "prefix", "wildcard"
MATCH_POLICIES = (EXACT, PREFIX, WILDCARD)
MQTT = "mqtt"
"""Match policy of MQTT topic filters in canonical form: '' is one level, a last '#' the rest."""

_STRICT = re.compile(r"^([0-9a-z_]+\.)*([0-9a-z_]+)$")
_STRICT_LAST_EMPTY = re.compile(r"^([0-9a-z_]+\.)*([0-9a-z_]*)$")
_STRICT_EMPTY = re.compile(r"^(([0-9a-z_]+\.)|\.)*([0-9a-z_]+)?$")
_LOOSE = re.compile(r"^([^\s\.#]+\.)*([^\s\.#]+)$")
_LOOSE_LAST_EMPTY = re.compile(r"^([^\s\.#]+\.)*([^\s\.#]*)$")
_LOOSE_EMPTY = re.compile(r"^(([^\s\.#]+\.)|\.)*([^\s\.#]+)?$")

_PATTERNS = {
    ("strict", EXACT): _STRICT,
    ("strict", PREFIX): _STRICT_LAST_EMPTY,
    ("strict", WILDCARD): _STRICT_EMPTY,
    ("loose", EXACT): _LOOSE,
    ("loose", PREFIX): _LOOSE_LAST_EMPTY,
    ("loose", WILDCARD): _LOOSE_EMPTY,
}


def is_valid_uri(uri: object, check: str = "strict", match: str = EXACT) -> bool:
    """True if ``uri`` is acceptable for ``match`` under the realm's ``check`` mode."""
    if match == MQTT:
        return isinstance(uri, str) and _valid_filter(uri.split("."), check)
    return isinstance(uri, str) and _PATTERNS[(check, match)].match(uri) is not None


def _valid_filter(parts: list[str], check: str) -> bool:
    """A canonical MQTT filter: URI components, '' (one level), and '#' only at the end."""
    last = len(parts) - 1
    return all(part == "" or (part == "#" and index == last)
               or _PATTERNS[(check, EXACT)].match(part) is not None
               for index, part in enumerate(parts))


def is_reserved(uri: str) -> bool:
    """The ``wamp.`` namespace belongs to the router; clients may not publish or register there."""
    return uri.startswith("wamp.") or uri == "wamp"


def wildcard_matches(pattern_components: list[str] | tuple[str, ...], topic: str) -> bool:
    """True if the wildcard pattern (empty component = any one component) matches ``topic``."""
    parts = topic.split(".")
    if len(parts) != len(pattern_components):
        return False
    return all(p == "" or p == t for p, t in zip(pattern_components, parts))


def uri_matches(pattern: str, match: str, uri: str) -> bool:
    """True if a concrete ``uri`` is matched by ``pattern`` under ``match``."""
    if match == EXACT:
        return uri == pattern
    if match == PREFIX:
        return uri.startswith(pattern)
    if match == MQTT:
        return filter_matches(pattern.split("."), uri)
    return wildcard_matches(pattern.split("."), uri)


def filter_matches(filter_parts: list[str], topic: str) -> bool:
    """MQTT semantics on canonical topics (see :data:`MQTT`)."""
    parts = topic.split(".")
    if parts[0].startswith("$") and filter_parts[0] in ("", "#"):
        return False
    for index, part in enumerate(filter_parts):
        if part == "#":
            return True
        if index >= len(parts) or (part != "" and part != parts[index]):
            return False
    return len(parts) == len(filter_parts)
