"""URI validation per the WAMP spec (strict or loose, per realm)."""

from __future__ import annotations

import re

EXACT, PREFIX, WILDCARD = "exact", "prefix", "wildcard"
MATCH_POLICIES = (EXACT, PREFIX, WILDCARD)
MQTT = "mqtt"
"""Match policy of MQTT topic filters over levels: '+' is one level, a last '#' the rest."""

_STRICT = re.compile(r"^([0-9a-z_]+\.)*([0-9a-z_]+)$")
_STRICT_LAST_EMPTY = re.compile(r"^([0-9a-z_]+\.)*([0-9a-z_]*)$")
_STRICT_EMPTY = re.compile(r"^(([0-9a-z_]+\.)|\.)*([0-9a-z_]+)?$")
# a loose component is anything but white space, '.', '#' and a UTF-16 surrogate (JSON's
# "\ud800" gives one: no UTF-8, so no MQTT topic, store or log, can hold it)
_LOOSE = re.compile(r"^([^\s\.#\ud800-\udfff]+\.)*([^\s\.#\ud800-\udfff]+)$")
_LOOSE_LAST_EMPTY = re.compile(r"^([^\s\.#\ud800-\udfff]+\.)*([^\s\.#\ud800-\udfff]*)$")
_LOOSE_EMPTY = re.compile(r"^(([^\s\.#\ud800-\udfff]+\.)|\.)*([^\s\.#\ud800-\udfff]+)?$")

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
    return isinstance(uri, str) and _PATTERNS[(check, match)].match(uri) is not None


def is_reserved(uri: str) -> bool:
    """The ``wamp.`` namespace belongs to the router; clients may not publish or register there."""
    return uri.startswith("wamp.") or uri == "wamp"
