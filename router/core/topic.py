"""Topics as the core sees them: a sequence of levels (``tuple[str, ...]``).

A level may be empty and may hold any character but U+0000. Every protocol names
topics its own way and converts at its edge: the WAMP URI ``a.b.c``, the MQTT
topic ``a/b/c`` and the AMQP address ``a.b.c`` are all ``("a", "b", "c")``.

Patterns are level tuples too, read per match policy:

* ``exact``: the topic itself;
* ``prefix`` (WAMP): every level but the last equal, the last a string prefix of
  the topic's level at that position: ``("a", "b")`` matches ``a.b``, ``a.bc``
  and ``a.b.c``. On topics whose levels hold no ``.`` this is exactly WAMP's
  string prefix on the dotted URI; a topic with a ``.`` inside a level is matched
  level by level, never by its dotted text (``a.b.`` does not match the one-level
  MQTT topic ``a.b.c``);
* ``wildcard`` (WAMP): an empty level matches any one level;
* ``mqtt``: a level ``+`` matches any one level, a last ``#`` this level and
  everything below (``a/#`` matches ``a``), and a topic whose first level starts
  with ``$`` is not matched by a leading wildcard.
"""

from __future__ import annotations

import json

from router.core.uri import EXACT, MQTT, PREFIX, is_valid_uri

Topic = tuple[str, ...]

SERVER_OWNED = "$SYS"
"""First level of the topics only the router publishes on (MQTT's convention); the
figures there are this node's own, so no engine stores or shares them."""

RESERVED = "wamp"
"""First level of the router's own namespace (meta API, retained admin): see
:func:`is_reserved`."""

ONE, REST = "+", "#"
"""The MQTT wildcards of an ``mqtt`` pattern's levels."""


def from_uri(uri: str) -> Topic:
    """The levels of a WAMP URI (or URI pattern)."""
    return tuple(uri.split("."))


def to_uri(topic: Topic) -> str:
    """The dotted text of a topic (a WAMP URI if :func:`wamp_uri` says it is one)."""
    return ".".join(topic)


def from_mqtt(name: str) -> Topic:
    """The levels of an MQTT topic name or filter."""
    return tuple(name.split("/"))


def to_mqtt(topic: Topic) -> str:
    """The MQTT topic name (or filter) of a level tuple."""
    return "/".join(topic)


def wamp_uri(topic: Topic, uri_check: str) -> str | None:
    """The topic as a WAMP URI of a realm with ``uri_check``; ``None`` if it has none
    (an empty level, a level holding ``.``, or a level the check refuses)."""
    if any("." in level for level in topic):
        return None
    uri = ".".join(topic)
    return uri if is_valid_uri(uri, uri_check) else None


def mqtt_name(topic: Topic) -> str | None:
    """The topic as an MQTT topic name; ``None`` if it has none (a level holding ``/``,
    a wildcard character or U+0000, or over 65535 bytes of UTF-8)."""
    if any(char in level for level in topic for char in _NOT_IN_MQTT_LEVELS):
        return None
    name = "/".join(topic)
    return name if len(name.encode("utf-8", "surrogatepass")) <= 65535 else None


_NOT_IN_MQTT_LEVELS = ("/", ONE, REST, "\x00")


def dotted_form(topic: Topic) -> bool:
    """Does the dotted text name this topic unambiguously (no empty level, no ``.``)?"""
    return "" not in topic and not any("." in level for level in topic)


def display(topic: Topic) -> str:
    """A readable, unambiguous name (logs, incidents, event log, meta API): the dotted form
    when it splits back to the same levels, else the MQTT form when it has a ``/`` to tell
    it from a dotted one, else a JSON list (the one-level MQTT topic ``sensor.1`` is
    ``["sensor.1"]``: as ``sensor.1`` it read back as the two levels of the URI, and the
    console's Delete of it purged that other topic). A name with a ``/`` in a level, or one
    that would begin with ``[``, is a JSON list too: those are how the MQTT form and a JSON
    list are told from the others."""
    dotted = dotted_name(topic)
    if dotted is not None:
        return dotted
    if len(topic) > 1 and not topic[0].startswith("[") and not any("/" in t for t in topic):
        return "/".join(topic)
    return json.dumps(list(topic), ensure_ascii=False)


def dotted_name(topic: Topic) -> str | None:
    """The dotted form, when :func:`display` names the topic by it; else None."""
    if dotted_form(topic):
        text = ".".join(topic)
        if "/" not in text and not text.startswith("["):
            return text
    return None


def name_fields(topic: Topic) -> dict[str, object]:
    """``topic``, its :func:`display` name, and ``levels`` when that is not the dotted form
    (the fields the event log, the HTTP events and the retained listing give a topic)."""
    dotted = dotted_name(topic)
    if dotted is not None:
        return {"topic": dotted}
    return {"topic": display(topic), "levels": list(topic)}


def is_reserved(topic: Topic) -> bool:
    """The ``wamp`` first level belongs to the router (meta API, retained admin)."""
    return topic[0] == RESERVED


def prefix_matches(prefix: Topic, topic: Topic) -> bool:
    """WAMP prefix matching over levels (see the module docstring)."""
    last = len(prefix) - 1
    return (len(topic) > last and topic[last].startswith(prefix[last])
            and topic[:last] == prefix[:last])


def wildcard_matches(pattern: Topic, topic: Topic) -> bool:
    """WAMP wildcard matching: an empty pattern level matches any one level."""
    return len(pattern) == len(topic) and all(p == "" or p == t for p, t in zip(pattern, topic))


def filter_matches(topic_filter: Topic, topic: Topic) -> bool:
    """MQTT matching of a filter's levels against a topic's."""
    if topic[0].startswith("$") and topic_filter[0] in (ONE, REST):
        return False
    for index, level in enumerate(topic_filter):
        if level == REST:
            return True
        if index >= len(topic) or (level != ONE and level != topic[index]):
            return False
    return len(topic) == len(topic_filter)


def mqtt_pattern(topic_filter: str) -> tuple[Topic, str]:
    """(levels, match policy) of a valid MQTT topic filter: ``mqtt`` with a wildcard,
    else ``exact`` (shared with WAMP and AMQP subscribers of the same topic)."""
    levels = from_mqtt(topic_filter)
    return levels, (MQTT if ONE in levels or levels[-1] == REST else EXACT)


def topic_matches(pattern: Topic, match: str, topic: Topic) -> bool:
    """True if a concrete ``topic`` is matched by ``pattern`` under ``match``."""
    if match == EXACT:
        return topic == pattern
    if match == PREFIX:
        return prefix_matches(pattern, topic)
    if match == MQTT:
        return filter_matches(pattern, topic)
    return wildcard_matches(pattern, topic)


def pattern_text(pattern: Topic, match: str) -> str:
    """How a pattern is shown (meta API, logs): MQTT filters in ``/`` form, the rest dotted."""
    return to_mqtt(pattern) if match == MQTT else to_uri(pattern)


def valid_topic_name(topic_name: str) -> bool:
    """An MQTT topic a message is published to: non-empty, no wildcards, no U+0000."""
    # three ``in`` tests: a generator over the characters cost ~0.6 us more a new topic
    return (bool(topic_name) and "+" not in topic_name and "#" not in topic_name
            and "\x00" not in topic_name)


def valid_topic_filter(topic_filter: str) -> bool:
    """An MQTT subscription pattern: ``+`` fills a whole level, ``#`` a whole and last level."""
    if not topic_filter or "\x00" in topic_filter:
        return False
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == REST:
            if index != len(levels) - 1:
                return False
        elif level != ONE and (ONE in level or REST in level):
            return False
    return True


SHARE_PREFIX = "$share/"


class InvalidSharedFilter(ValueError):
    """A ``$share/...`` filter without a valid ShareName or with an empty filter."""


def valid_group_name(name: object) -> bool:
    """A shared group name every protocol can carry (MQTT's ShareName rules)."""
    return (type(name) is str and name != "" and "/" not in name and "+" not in name
            and "#" not in name and "\0" not in name)


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """(share name, filter) of ``$share/{ShareName}/{filter}``; (None, filter) otherwise.

    The ShareName is at least one character without ``/``, ``+`` or ``#`` and the
    filter is not empty (MQTT 5.0, 4.8.2); anything else raises InvalidSharedFilter."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    name, slash, rest = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not slash or not rest or not valid_group_name(name):
        raise InvalidSharedFilter(f"{topic_filter!r} is not $share/{{ShareName}}/{{filter}} "
                                  "with a ShareName without '/', '+', '#' and a non-empty filter")
    return name, rest
