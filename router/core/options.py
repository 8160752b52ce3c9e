"""Publish and subscribe options as the core understands them.

WAMP PUBLISH options are also used verbatim by testaments, so they are parsed
here, once, from a plain dict. A wrong type for a known key is a protocol
violation (as the WAMP test vectors expect); unknown keys are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from router.core.errors import ProtocolViolation
from router.core.model import LONGEST_EXPIRY, Details, Eligibility
from router.core.qos import POLICIES, QOS_LEVELS
from router.core.topic import valid_group_name
from router.core.uri import EXACT, MATCH_POLICIES


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """A PUBLISH's options as the core uses them, checked once by :func:`parse_publish_options`
    (MQTT and AMQP build them directly)."""
    acknowledge: bool = False
    exclude_me: bool = True
    disclose_me: bool = False
    retain: bool = False
    retain_ttl: float | None = None
    retain_clear: bool = False
    eligibility: Eligibility | None = None
    qos: int = 0


@dataclass(frozen=True, slots=True)
class SubscribeOptions:
    """A SUBSCRIBE's options as the core uses them, checked once by
    :func:`parse_subscribe_options`."""
    match: str = EXACT
    get_retained: bool = False
    qos: int | None = None
    """Requested QoS (WAMP ``_qos``); None = the realm's default for the frontend."""
    qos_policy: str | None = None
    """Requested QoS policy (WAMP ``_qos_policy``); None = the realm's default."""
    shared_group: str | None = None
    """Join this shared group (each publication to one member) instead of subscribing
    alone (WAMP ``x_shared_group``, MQTT ``$share/{group}/``, AMQP ``x-shared-group``)."""


_NO_LISTS = Eligibility()

Id = TypeVar("Id", int, str)
"""The kind of id an eligibility list holds: session ids or authids/authroles."""


def _bool(options: Details, key: str, default: bool) -> bool:
    value = options.get(key, default)
    if type(value) is not bool:
        raise ProtocolViolation(f"option '{key}' must be a bool, got {type(value).__name__}")
    return value


def _id_list(options: Details, key: str, kind: type[Id]) -> frozenset[Id] | None:
    if key not in options:
        return None
    value = options[key]
    if type(value) is not list or any(type(item) is not kind for item in value):
        raise ProtocolViolation(f"option '{key}' must be a list of {kind.__name__}")
    return frozenset(value)


def parse_publish_options(options: Details) -> PublishOptions:
    """Validate and normalise a WAMP-style publish options dict."""
    if type(options) is not dict:
        raise ProtocolViolation("publish options must be a dict")
    eligibility = Eligibility(
        exclude=_id_list(options, "exclude", int),
        exclude_authid=_id_list(options, "exclude_authid", str),
        exclude_authrole=_id_list(options, "exclude_authrole", str),
        eligible=_id_list(options, "eligible", int),
        eligible_authid=_id_list(options, "eligible_authid", str),
        eligible_authrole=_id_list(options, "eligible_authrole", str))
    ttl = options.get("_retain_ttl")
    if ttl is not None and (type(ttl) not in (int, float) or not 0 < ttl <= LONGEST_EXPIRY):
        # (not NaN: a NaN deadline at the top of the realm's expiry heap compares false with
        # every time, so no retained event of anyone would expire again; not an integer no
        # float can hold)
        raise ProtocolViolation(f"option '_retain_ttl' must be a positive number of seconds, "
                                f"at most {LONGEST_EXPIRY}")
    qos = options.get("_qos", 0)
    if type(qos) is not int or qos not in QOS_LEVELS:
        raise ProtocolViolation("option '_qos' must be 0, 1 or 2")
    return PublishOptions(
        qos=qos,
        acknowledge=_bool(options, "acknowledge", False),
        exclude_me=_bool(options, "exclude_me", True),
        disclose_me=_bool(options, "disclose_me", False),
        retain=_bool(options, "retain", False),
        retain_ttl=float(ttl) if ttl is not None else None,
        retain_clear=_bool(options, "_retain_clear", False),
        eligibility=eligibility if eligibility != _NO_LISTS else None,
    )


def parse_subscribe_options(options: Details) -> SubscribeOptions:
    """Validate and normalise a WAMP-style subscribe options dict."""
    if type(options) is not dict:
        raise ProtocolViolation("subscribe options must be a dict")
    match = options.get("match", EXACT)
    if match not in MATCH_POLICIES:
        raise ProtocolViolation(f"option 'match' must be one of {', '.join(MATCH_POLICIES)}")
    qos = options.get("_qos")
    if qos is not None and (type(qos) is not int or qos not in QOS_LEVELS):
        raise ProtocolViolation("option '_qos' must be 0, 1 or 2")
    policy = options.get("_qos_policy")
    if policy is not None and policy not in POLICIES:
        raise ProtocolViolation(f"option '_qos_policy' must be one of {', '.join(POLICIES)}")
    group = options.get("x_shared_group")
    if group is not None and not valid_group_name(group):
        raise ProtocolViolation("option 'x_shared_group' must be a non-empty string "
                                "without '/', '+' or '#'")
    return SubscribeOptions(match=match, get_retained=_bool(options, "get_retained", False),
                            qos=qos, qos_policy=policy, shared_group=group)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """A CALL's options as the core uses them, checked once by :func:`parse_call_options`."""
    receive_progress: bool = False
    timeout_ms: int = 0
    disclose_me: bool = False


NO_CALL_OPTIONS = CallOptions()
"""A CALL without options (most of them): one shared, frozen value."""


def parse_call_options(options: Details) -> CallOptions:
    """Validate and normalise a WAMP-style call options dict."""
    if type(options) is not dict:
        raise ProtocolViolation("call options must be a dict")
    if not options:
        return NO_CALL_OPTIONS
    timeout = options.get("timeout", 0)
    if type(timeout) is not int or not 0 <= timeout <= LONGEST_EXPIRY * 1000:
        raise ProtocolViolation(f"option 'timeout' must be a non-negative integer (ms), at "
                                f"most {LONGEST_EXPIRY * 1000}")
    return CallOptions(_bool(options, "receive_progress", False), timeout,
                       _bool(options, "disclose_me", False))
