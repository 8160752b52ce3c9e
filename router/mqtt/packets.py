"""MQTT control packets as plain immutable values, shared by MQTT 3.1.1 and 5.0.

One dataclass per packet type holds the union of both versions' fields; the
codec leaves out what the connection's version cannot carry (properties and
most reason codes in 3.1.1). Reason codes are always MQTT 5 reason codes so
that broker logic never branches on the version; the codec translates them to
3.1.1 CONNACK and SUBACK return codes on the wire.

Properties are a dict keyed by property name (see ``tables.PROPERTIES``):
integers for byte/two-byte/four-byte/variable byte integers, ``str`` for UTF-8
strings, ``bytes`` for binary data, a list of ``(key, value)`` pairs for
``user_property`` and a list of integers for ``subscription_identifier``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterator, Union

Properties = dict[str, Any]


class ReasonCode(IntEnum):
    """MQTT 5 reason codes (section 2.4); several names share a value, as in the spec."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


@dataclass(frozen=True, slots=True)
class Will:
    """The message the server publishes for the client when the connection is lost."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Connect:
    """Client -> server, first packet; ``protocol_version`` 4 is MQTT 3.1.1, 5 is MQTT 5.0."""

    protocol_name: str = "MQTT"
    protocol_version: int = 4
    clean_start: bool = True
    keep_alive: int = 0
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Connack:
    """Server -> client answer to CONNECT; ``reason_code`` is an MQTT 5 code in both versions."""

    session_present: bool = False
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Publish:
    """An application message; ``packet_id`` is set exactly when ``qos`` is 1 or 2."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Puback:
    """QoS 1 acknowledgement."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pubrec:
    """QoS 2, step 1: publish received."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pubrel:
    """QoS 2, step 2: publish release."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pubcomp:
    """QoS 2, step 3: publish complete."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """Per-filter SUBSCRIBE options; MQTT 3.1.1 carries only ``qos``."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


_OPTIONS: dict[tuple[int, bool, bool, int], SubscriptionOptions] = {}


def shared_options(qos: int, no_local: bool, retain_as_published: bool,
                   retain_handling: int) -> SubscriptionOptions:
    """The one :class:`SubscriptionOptions` of these values (frozen; 36 value sets pass
    the codec's checks): one object per value set, not one per subscription."""
    key = (qos, no_local, retain_as_published, retain_handling)
    options = _OPTIONS.get(key)
    if options is None:
        options = SubscriptionOptions(*key)
        if len(_OPTIONS) < 64:  # (restored ones come from the store, unchecked)
            _OPTIONS[key] = options
    return options


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Client -> server: ``subscriptions`` is a list of (topic filter, options) pairs (an
    iterator where the router decodes them as it goes, see ``MqttCodec``)."""

    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]] | Iterator[tuple[str,
                                                                            SubscriptionOptions]]
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Suback:
    """One reason code per subscription, in SUBSCRIBE order (0, 1, 2 = granted QoS)."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Client -> server: the topic filters to remove (a list, or an iterator as for
    :class:`Subscribe`)."""

    packet_id: int
    topic_filters: list[str] | Iterator[str]
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unsuback:
    """One reason code per filter in MQTT 5; MQTT 3.1.1 has none, so it decodes to ``[]``."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pingreq:
    """Client -> server keep-alive probe."""


@dataclass(frozen=True, slots=True)
class Pingresp:
    """Server -> client keep-alive answer."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Orderly close; server -> client only exists in MQTT 5."""

    reason_code: int = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Auth:
    """MQTT 5 enhanced authentication exchange."""

    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


Packet = Union[Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback,
               Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth]
