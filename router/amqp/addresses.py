"""AMQP link addresses <-> canonical WAMP topics.

The rule (a client's source or target address):

* an optional ``topic://`` prefix is stripped (``topic://com.example.x`` is
  ``com.example.x``);
* ``com.example.x`` is the exact topic ``com.example.x``;
* ``prefix:com.example.`` subscribes to every topic starting with
  ``com.example.`` (a WAMP prefix match: a string prefix, so ``prefix:com.ex``
  also matches ``com.example``);
* ``wildcard:com..x`` subscribes with a WAMP wildcard pattern (an empty
  component matches any one component).

The topic must be a valid URI of the realm (strict or loose, as its
``uri_check`` says) for its match policy; a publisher's target must be an exact
topic. An address that breaks the rule is refused (the link is closed with
``amqp:invalid-field``); it is never altered.
"""

from __future__ import annotations

from router.core.uri import EXACT, PREFIX, WILDCARD, is_valid_uri

SCHEME = "topic://"
_MATCH_PREFIXES = ((f"{PREFIX}:", PREFIX), (f"{WILDCARD}:", WILDCARD))


class InvalidAddress(ValueError):
    """An address that does not map to a topic (pattern) of the realm."""


def address_to_pattern(address: str | None, uri_check: str) -> tuple[str, str]:
    """(canonical topic or pattern, match policy) of a receiver's source address."""
    if not address:
        raise InvalidAddress("a subscription needs a source address")
    rest = address[len(SCHEME):] if address.startswith(SCHEME) else address
    match = EXACT
    for marker, policy in _MATCH_PREFIXES:
        if rest.startswith(marker):
            rest, match = rest[len(marker):], policy
            break
    if not is_valid_uri(rest, uri_check, match):
        raise InvalidAddress(f"address {address!r} is not a valid {uri_check} {match} topic")
    return rest, match


def address_to_topic(address: str | None, uri_check: str) -> str:
    """The canonical topic a publisher's target address (or message ``to``) names."""
    uri, match = address_to_pattern(address, uri_check)
    if match != EXACT:
        raise InvalidAddress(f"cannot publish to the pattern {address!r}")
    return uri


def topic_to_address(topic: str) -> str:
    """The address of a topic, as put in the ``to`` field of outgoing messages."""
    return topic
