"""The MQTT 5 tables: which property may travel in which packet with which type, which
reason codes each packet type may carry, packet type numbers and fixed-header flags, who may
send what, and how 3.1.1 CONNACK return codes map to 5.0 reason codes.

Data first, with the few functions that read and check a packet's properties, reason code
and packet identifier against it; :mod:`router.mqtt.codec` lays the packets out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.mqtt.packets import (Auth, Connack, Connect, Disconnect, Pingreq, Pingresp,
                                 Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel,
                                 ReasonCode, Suback, Subscribe, Unsuback, Unsubscribe, Will)
from router.mqtt.primitives import (MQTT_3_1_1, PROPERTY_READERS, PROPERTY_WRITERS,
                                    MqttProtocolError, PropertyType, Reader,
                                    encode_variable_byte_integer, malformed, packet_name,
                                    protocol_error)


@dataclass(frozen=True, slots=True)
class PropertyDefinition:
    """One row of the spec's property table; ``packets`` may include :class:`Will`."""

    identifier: int
    name: str
    type: PropertyType
    packets: frozenset[type]


ACKS = (Puback, Pubrec, Pubrel, Pubcomp)
_MESSAGE = (Publish, Will)
_WITH_REASON_STRING = (Connack, *ACKS, Suback, Unsuback, Disconnect, Auth)


def _property(identifier: int, name: str, type_: PropertyType,
              *packets: type) -> PropertyDefinition:
    return PropertyDefinition(identifier, name, type_, frozenset(packets))


PROPERTIES = (
    _property(0x01, "payload_format_indicator", PropertyType.BYTE, *_MESSAGE),
    _property(0x02, "message_expiry_interval", PropertyType.FOUR_BYTE_INTEGER, *_MESSAGE),
    _property(0x03, "content_type", PropertyType.UTF8_STRING, *_MESSAGE),
    _property(0x08, "response_topic", PropertyType.UTF8_STRING, *_MESSAGE),
    _property(0x09, "correlation_data", PropertyType.BINARY_DATA, *_MESSAGE),
    _property(0x0B, "subscription_identifier", PropertyType.VARIABLE_BYTE_INTEGER,
              Publish, Subscribe),
    _property(0x11, "session_expiry_interval", PropertyType.FOUR_BYTE_INTEGER,
              Connect, Connack, Disconnect),
    _property(0x12, "assigned_client_identifier", PropertyType.UTF8_STRING, Connack),
    _property(0x13, "server_keep_alive", PropertyType.TWO_BYTE_INTEGER, Connack),
    _property(0x15, "authentication_method", PropertyType.UTF8_STRING, Connect, Connack, Auth),
    _property(0x16, "authentication_data", PropertyType.BINARY_DATA, Connect, Connack, Auth),
    _property(0x17, "request_problem_information", PropertyType.BYTE, Connect),
    _property(0x18, "will_delay_interval", PropertyType.FOUR_BYTE_INTEGER, Will),
    _property(0x19, "request_response_information", PropertyType.BYTE, Connect),
    _property(0x1A, "response_information", PropertyType.UTF8_STRING, Connack),
    _property(0x1C, "server_reference", PropertyType.UTF8_STRING, Connack, Disconnect),
    _property(0x1F, "reason_string", PropertyType.UTF8_STRING, *_WITH_REASON_STRING),
    _property(0x21, "receive_maximum", PropertyType.TWO_BYTE_INTEGER, Connect, Connack),
    _property(0x22, "topic_alias_maximum", PropertyType.TWO_BYTE_INTEGER, Connect, Connack),
    _property(0x23, "topic_alias", PropertyType.TWO_BYTE_INTEGER, Publish),
    _property(0x24, "maximum_qos", PropertyType.BYTE, Connack),
    _property(0x25, "retain_available", PropertyType.BYTE, Connack),
    _property(0x26, "user_property", PropertyType.UTF8_STRING_PAIR, Connect, Will,
              *_WITH_REASON_STRING, Publish, Subscribe, Unsubscribe),
    _property(0x27, "maximum_packet_size", PropertyType.FOUR_BYTE_INTEGER, Connect, Connack),
    _property(0x28, "wildcard_subscription_available", PropertyType.BYTE, Connack),
    _property(0x29, "subscription_identifier_available", PropertyType.BYTE, Connack),
    _property(0x2A, "shared_subscription_available", PropertyType.BYTE, Connack),
)
"""Every MQTT 5 property with its identifier, type and the packets that may carry it."""

_PROPERTY_BY_IDENTIFIER = {definition.identifier: definition for definition in PROPERTIES}
_PROPERTY_BY_NAME = {definition.name: definition for definition in PROPERTIES}

_LIST_PROPERTIES = frozenset({"user_property", "subscription_identifier"})
"""Properties whose value is a list because a packet may carry them more than once."""

_BOOLEAN_PROPERTIES = frozenset({
    "payload_format_indicator", "request_problem_information", "request_response_information",
    "maximum_qos", "retain_available", "wildcard_subscription_available",
    "subscription_identifier_available", "shared_subscription_available"})
"""Byte properties whose only legal values are 0 and 1."""

_NON_ZERO_PROPERTIES = frozenset({"receive_maximum", "maximum_packet_size",
                                  "subscription_identifier"})


def read_properties(reader: Reader, packet_class: type) -> Properties:
    """Decode a packet's property section, refusing what its table row forbids."""
    section = Reader(reader.take(reader.variable_byte_integer()))
    properties: Properties = {}
    while not section.at_end():
        identifier = section.variable_byte_integer()
        definition = _PROPERTY_BY_IDENTIFIER.get(identifier)
        if definition is None or packet_class not in definition.packets:
            raise malformed(f"property 0x{identifier:02X} is not allowed in "
                             f"{packet_name(packet_class)}")
        name = definition.name
        value = PROPERTY_READERS[definition.type](section)
        _check_property_value(name, value)
        repeatable = name == "user_property" or (name == "subscription_identifier"
                                                 and packet_class is Publish)
        if name in properties and not repeatable:
            raise protocol_error(f"{name} appears more than once")
        if name in _LIST_PROPERTIES:
            properties.setdefault(name, []).append(value)
        else:
            properties[name] = value
    if "authentication_data" in properties and "authentication_method" not in properties:
        raise protocol_error("authentication_data without authentication_method")
    return properties


def _check_property_value(name: str, value: Any) -> None:
    if name in _BOOLEAN_PROPERTIES and value not in (0, 1):
        raise protocol_error(f"{name} must be 0 or 1, not {value}")
    if name in _NON_ZERO_PROPERTIES and value == 0:
        raise protocol_error(f"{name} must not be 0")
    if name == "topic_alias" and value == 0:
        raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, "topic_alias must not be 0")


def encode_properties(properties: Properties, packet_class: type) -> bytes:
    """A packet's property section; refuses a property its packet may not carry."""
    encoded = bytearray()
    for name, value in properties.items():
        definition = _PROPERTY_BY_NAME.get(name)
        if definition is None or packet_class not in definition.packets:
            raise ValueError(f"property {name!r} is not allowed in {packet_name(packet_class)}")
        write = PROPERTY_WRITERS[definition.type]
        for item in (value if name in _LIST_PROPERTIES else [value]):
            encoded.append(definition.identifier)
            encoded += write(item)
    return encode_variable_byte_integer(len(encoded)) + encoded


# --- packet types, directions and reason codes --------------------------------------------

PACKET_CLASSES: dict[int, type] = {
    1: Connect, 2: Connack, 3: Publish, 4: Puback, 5: Pubrec, 6: Pubrel, 7: Pubcomp,
    8: Subscribe, 9: Suback, 10: Unsubscribe, 11: Unsuback, 12: Pingreq, 13: Pingresp,
    14: Disconnect, 15: Auth,
}
PACKET_TYPE_NUMBERS = {packet_class: number for number, packet_class in PACKET_CLASSES.items()}

REQUIRED_FLAGS = {Pubrel: 0b0010, Subscribe: 0b0010, Unsubscribe: 0b0010}
"""Fixed-header flags other than PUBLISH's; packet types not listed need 0."""

BARE_ACKS = {PACKET_TYPE_NUMBERS[ack] << 4 | REQUIRED_FLAGS.get(ack, 0): ack for ack in ACKS}
"""First byte of an acknowledgement -> its class; with a remaining length of 2 it is just
the packet id (both directions, both versions: MQTT 5 omits a success code and properties)."""
BARE_ACK_FIRST_BYTES = {ack: bytes((first_byte, 2)) for first_byte, ack in BARE_ACKS.items()}

_SENT_BY_CLIENT = frozenset({Connect, Publish, *ACKS, Subscribe, Unsubscribe, Pingreq,
                             Disconnect, Auth})
_SENT_BY_SERVER = frozenset({Connack, Publish, *ACKS, Suback, Unsuback, Pingresp,
                             Disconnect, Auth})


def may_send(packet_class: type, by_client: bool, version: int | None) -> bool:
    """MQTT 3.1.1 has no AUTH and only clients send DISCONNECT there."""
    if version == MQTT_3_1_1 and (packet_class is Auth
                                  or (packet_class is Disconnect and not by_client)):
        return False
    return packet_class in (_SENT_BY_CLIENT if by_client else _SENT_BY_SERVER)


_PUBLISH_ACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
_PUBLISH_RELEASE_CODES = frozenset({0x00, 0x92})
_REASON_CODES: dict[type, frozenset[int]] = {
    Connack: frozenset({0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
                        0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}),
    Puback: _PUBLISH_ACK_CODES,
    Pubrec: _PUBLISH_ACK_CODES,
    Pubrel: _PUBLISH_RELEASE_CODES,
    Pubcomp: _PUBLISH_RELEASE_CODES,
    Suback: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    Unsuback: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    Disconnect: frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E,
                           0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B,
                           0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2}),
    Auth: frozenset({0x00, 0x18, 0x19}),
}
"""The MQTT 5 reason codes each packet type may carry."""

CONNACK_RETURN_CODES = {
    0x00: ReasonCode.SUCCESS,
    0x01: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    0x02: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    0x03: ReasonCode.SERVER_UNAVAILABLE,
    0x04: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    0x05: ReasonCode.NOT_AUTHORIZED,
}
"""MQTT 3.1.1 CONNACK return code -> the MQTT 5 reason code with the same meaning."""

CONNACK_RETURN_CODE_FOR = {
    **{reason: return_code for return_code, reason in CONNACK_RETURN_CODES.items()},
    ReasonCode.SERVER_BUSY: 0x03,
    ReasonCode.QUOTA_EXCEEDED: 0x03,
    ReasonCode.BANNED: 0x05,
}
"""MQTT 5 CONNACK reason code -> 3.1.1 return code; codes missing here have no 3.1.1 form."""

SUBACK_3_1_1_CODES = frozenset({0x00, 0x01, 0x02, 0x80})


def read_reason_code(reader: Reader, packet_class: type) -> int:
    """A reason code, refused when the packet type may not carry it."""
    code = reader.byte()
    if code not in _REASON_CODES[packet_class]:
        raise malformed(f"0x{code:02X} is not a {packet_name(packet_class)} reason code")
    return ReasonCode(code)


def read_packet_id(reader: Reader) -> int:
    """A packet identifier, which is never 0."""
    packet_id = reader.uint16()
    if packet_id == 0:
        raise protocol_error("packet identifier must not be 0")
    return packet_id


def check_reason_code(reason_code: int, packet_class: type) -> None:
    """Refuse (ValueError) to encode a reason code the packet type may not carry."""
    if reason_code not in _REASON_CODES[packet_class]:
        raise ValueError(f"0x{reason_code:02X} is not a {packet_name(packet_class)} reason code")
