"""MQTT topic names and filters <-> canonical WAMP URIs.

``a/b/c`` is ``a.b.c``. A filter's ``+`` is a one-component wildcard and its
``#`` keeps MQTT's own meaning (this level and every level below), so filters
with wildcards subscribe with the core's ``mqtt`` match policy and filters
without wildcards share the exact subscriptions of WAMP clients. A level that
is not a valid URI component in the realm (empty, containing ``.``, or outside
``[0-9a-z_]`` in a strict realm) cannot be mapped: the client gets its protocol's
error, the topic is never altered.
"""

from __future__ import annotations

from router.core.options import valid_group_name
from router.core.uri import EXACT, MQTT, is_valid_uri


class UnmappableTopic(ValueError):
    """An MQTT topic that has no canonical URI in this realm."""


def _check_level(level: str, uri_check: str, topic: str) -> None:
    if not is_valid_uri(level, uri_check) or "." in level:
        raise UnmappableTopic(f"topic level {level!r} of {topic!r} is not a valid "
                              f"{uri_check} URI component")


def topic_to_uri(topic: str, uri_check: str) -> str:
    """The canonical URI of an MQTT topic name."""
    levels = topic.split("/")
    for level in levels:
        _check_level(level, uri_check, topic)
    return ".".join(levels)


def filter_to_pattern(topic_filter: str, uri_check: str) -> tuple[str, str]:
    """(canonical pattern, match policy) of an MQTT topic filter."""
    levels = topic_filter.split("/")
    wildcard = False
    parts = []
    for level in levels:
        if level == "+":
            parts.append("")
            wildcard = True
        elif level == "#":
            parts.append("#")
            wildcard = True
        else:
            _check_level(level, uri_check, topic_filter)
            parts.append(level)
    return ".".join(parts), (MQTT if wildcard else EXACT)


SHARE_PREFIX = "$share/"


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """(share name, filter) of ``$share/{ShareName}/{filter}``; (None, filter) otherwise.

    The ShareName is at least one character without ``/``, ``+`` or ``#`` and the
    filter is not empty (MQTT 5.0, 4.8.2); anything else is an invalid filter."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    name, slash, rest = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not slash or not rest or not valid_group_name(name):
        raise UnmappableTopic(f"{topic_filter!r} is not $share/{{ShareName}}/{{filter}} with "
                              "a ShareName without '/', '+', '#' and a non-empty filter")
    return name, rest


def uri_to_topic(uri: str) -> str:
    """The MQTT topic name of a canonical URI."""
    return uri.replace(".", "/")
