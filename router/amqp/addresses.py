"""AMQP link addresses <-> the core's topics (level tuples).

The rule (a client's source or target address, and a message's ``to``):

* an optional ``topic://`` prefix is stripped (``topic://com.example.x`` is
  ``com.example.x``);
* an address that starts with ``mqtt:`` or contains ``/`` is an **MQTT topic
  name or filter** (after ``mqtt:``), with MQTT's exact meaning: ``home/Living
  Room``, ``/TopicA``, ``p//x``, ``a.b/c``, ``mqtt:TopicA`` (one level),
  ``sensors/+/temp``, ``a/#``, ``mqtt:#``. It reaches every topic an MQTT client
  can name, whatever the realm's ``uri_check``; a filter with ``+`` or ``#``
  subscribes like an MQTT client's (``$`` topics are not matched by a leading
  wildcard);
* any other address is a **dotted WAMP URI** of the realm (strict or loose, as
  its ``uri_check`` says): ``com.example.x`` is the exact topic
  ``("com", "example", "x")``; ``prefix:com.example.`` subscribes to every topic
  starting with ``com.example.`` (WAMP prefix matching, level by level: see
  :mod:`router.core.topic`); ``wildcard:com..x`` subscribes with a WAMP wildcard
  pattern (an empty component matches any one component).

A publisher's target must name one topic (no pattern). An address that breaks
the rule is refused (the link is closed with ``amqp:invalid-field``); it is never
altered.

Outgoing messages carry their topic in ``to`` in the form the receiver
subscribed with: the dotted URI for a dotted address, the MQTT name for an MQTT
address (prefixed with ``mqtt:`` when it has a single level, so that ``to`` is
always an address naming that very topic). A topic the receiver's form cannot
name (a dotted receiver and a topic that is no URI of the realm, such as
``home/Living Room``; an MQTT receiver and a WAMP topic with ``/`` inside a
level) is not delivered to it and is counted (``unrepresentable``).
"""

from __future__ import annotations

from typing import NamedTuple

from router.core.model import Publication
from router.core.topic import (Topic, from_mqtt, from_uri, mqtt_pattern, valid_topic_filter,
                               valid_topic_name)
from router.core.uri import EXACT, PREFIX, WILDCARD, is_valid_uri

SCHEME = "topic://"
MQTT_MARKER = "mqtt:"
_MATCH_PREFIXES = ((f"{PREFIX}:", PREFIX), (f"{WILDCARD}:", WILDCARD))


class InvalidAddress(ValueError):
    """An address that does not map to a topic (pattern) of the realm."""


class AddressTopic(NamedTuple):
    """What an address names: the levels, the match policy, and its form."""

    levels: Topic
    match: str
    text: str
    """The URI or MQTT name/filter as written (without scheme and markers)."""
    mqtt: bool
    """Written as an MQTT topic (``/`` or ``mqtt:``), not as a dotted URI."""


def _mqtt_text(rest: str) -> str | None:
    """The MQTT name/filter of an MQTT-style address, ``None`` for a dotted one."""
    if rest.startswith(MQTT_MARKER):
        return rest[len(MQTT_MARKER):]
    return rest if "/" in rest else None


def address_to_pattern(address: str | None, uri_check: str) -> AddressTopic:
    """What a receiver's source address subscribes to."""
    if not address:
        raise InvalidAddress("a subscription needs a source address")
    rest = address[len(SCHEME):] if address.startswith(SCHEME) else address
    mqtt = _mqtt_text(rest)
    if mqtt is not None:
        if not valid_topic_filter(mqtt):
            raise InvalidAddress(f"address {address!r} is not a valid MQTT topic filter")
        levels, match = mqtt_pattern(mqtt)
        return AddressTopic(levels, match, mqtt, True)
    match = EXACT
    for marker, policy in _MATCH_PREFIXES:
        if rest.startswith(marker):
            rest, match = rest[len(marker):], policy
            break
    if not is_valid_uri(rest, uri_check, match):
        raise InvalidAddress(f"address {address!r} is not a valid {uri_check} {match} topic")
    return AddressTopic(from_uri(rest), match, rest, False)


def address_to_topic(address: str | None, uri_check: str) -> AddressTopic:
    """The topic a publisher's target address (or message ``to``) names."""
    if not address:  # (a link without a target: each message names where it goes)
        raise InvalidAddress("a message on a link without a target address needs a 'to' "
                             "address")
    named = address_to_pattern(address, uri_check)
    if named.match != EXACT or (named.mqtt and not valid_topic_name(named.text)):
        raise InvalidAddress(f"cannot publish to the pattern {address!r}")
    return named


def outgoing_address(publication: Publication, mqtt: bool, uri_check: str) -> str | None:
    """The ``to`` of a publication for a receiver subscribed in the MQTT form or not;
    ``None`` if that form cannot name the topic. Built once per publication and form."""
    if not mqtt:
        return publication.uri(uri_check)
    name = publication.mqtt_topic()
    if name is None or "/" in name:
        return name
    cache = publication.encodings()
    address = cache.get(MQTT_MARKER)
    if address is None:
        address = cache[MQTT_MARKER] = MQTT_MARKER + name
    return address


def address_levels(address: str) -> Topic:
    """The levels of an outgoing ``to`` (see :func:`outgoing_address`)."""
    mqtt = _mqtt_text(address)
    return from_mqtt(mqtt) if mqtt is not None else from_uri(address)
