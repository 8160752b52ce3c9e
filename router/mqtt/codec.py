"""Sans-I/O MQTT 3.1.1 / 5.0 codec: bytes in, validated packets out; packets in, bytes out.

One :class:`MqttCodec` per connection. It never touches a socket: the caller
feeds received bytes to :meth:`MqttCodec.receive_data`, pulls packets with
:meth:`MqttCodec.next_packet` and writes what :meth:`MqttCodec.encode` returns.

The protocol version is unknown until CONNECT arrives, so a server-side codec
accepts nothing but CONNECT first and then applies that version's rules to
every later packet. Anything the spec forbids raises :class:`MqttProtocolError`
with the MQTT 5 reason code that describes it; the connection is then unusable
for input, but :meth:`MqttCodec.encode` still works so the caller can send the
CONNACK (``send_connack``) or, in MQTT 5, a DISCONNECT before closing.

Encoding trusts its input more than decoding: it refuses what the connection's
version cannot express at all (a 3.1.1 CONNACK code with no 3.1.1 equivalent, a
packet the side may not send) and silently leaves out what the version has no
field for (properties, subscription options and acknowledgement reason codes
in 3.1.1), so one packet value can be sent to peers of either version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator

from router.core.topic import valid_topic_filter, valid_topic_name
from router.mqtt.packets import (Auth, Connack, Connect, Disconnect, Packet, Pingreq, Pingresp,
                                 Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel,
                                 ReasonCode, Suback, Subscribe, SubscriptionOptions, Unsuback,
                                 Unsubscribe, Will)

MQTT_3_1_1 = 4
MQTT_5 = 5

MAX_VARIABLE_BYTE_INTEGER = 268_435_455
"""Largest value of a variable byte integer, hence of a remaining length."""


class MqttProtocolError(Exception):
    """The peer broke the protocol: the connection must be closed.

    ``reason_code`` is the MQTT 5 reason code for the CONNACK or DISCONNECT an
    MQTT 5 peer may be told; ``send_connack`` means the error concerns CONNECT
    and the spec wants (or allows) a ``Connack(reason_code=...)`` sent before
    closing -- the codec translates the code for 3.1.1 peers.
    """

    def __init__(self, reason_code: int, message: str, *, send_connack: bool = False) -> None:
        super().__init__(f"{message} (reason code 0x{reason_code:02X})")
        self.reason_code = reason_code
        self.message = message
        self.send_connack = send_connack


def _malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def _protocol_error(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.PROTOCOL_ERROR, message)


# --- topics -------------------------------------------------------------------------------


def topic_matches(topic_filter: str, topic_name: str) -> bool:
    """Whether a valid filter matches a valid topic name (MQTT section 4.7).

    ``+`` matches exactly one level (possibly empty), ``#`` the parent level and
    everything below it (``a/#`` matches ``a``), and topics starting with ``$``
    are hidden from filters starting with a wildcard.
    """
    if topic_name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    name_levels = topic_name.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(name_levels):
            return False
        if level != "+" and level != name_levels[index]:
            return False
    return len(filter_levels) == len(name_levels)


def _topic_filters(reader: "_Reader") -> Iterator[str]:
    while not reader.at_end():
        yield _checked_filter(reader.string())


def _checked_filter(topic_filter: str) -> str:
    if not valid_topic_filter(topic_filter):
        raise MqttProtocolError(ReasonCode.TOPIC_FILTER_INVALID,
                                f"invalid topic filter {topic_filter!r}")
    return topic_filter


def _is_shared_subscription(topic_filter: str) -> bool:
    return topic_filter.startswith("$share/")


# --- primitive data types (MQTT section 1.5) ----------------------------------------------


def _decode_variable_byte_integer(data: bytes | bytearray, offset: int) -> tuple[int, int] | None:
    """(value, offset after it), or None when ``data`` ends first; rejects non-canonical forms."""
    value = 0
    for index in range(4):
        position = offset + index
        if position >= len(data):
            return None
        byte = data[position]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if byte == 0 and index > 0:
                raise _malformed("variable byte integer is not minimally encoded")
            return value, position + 1
    raise _malformed("variable byte integer is longer than 4 bytes")


def _encode_variable_byte_integer(value: int) -> bytes:
    if not 0 <= value <= MAX_VARIABLE_BYTE_INTEGER:
        raise ValueError(f"{value} does not fit a variable byte integer")
    encoded = bytearray()
    while True:
        value, digit = divmod(value, 128)
        if value:
            encoded.append(digit | 0x80)
        else:
            encoded.append(digit)
            return bytes(encoded)


def _encode_uint16(value: int) -> bytes:
    return struct.pack(">H", value)


def _encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("binary data and strings are limited to 65535 bytes")
    return _encode_uint16(len(data)) + data


def _encode_string(text: str) -> bytes:
    return _encode_binary(text.encode("utf-8"))


class _Reader:
    """Cursor over one packet body; reading past its end means the packet is malformed."""

    __slots__ = ("_data", "_position")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0

    def at_end(self) -> bool:
        return self._position == len(self._data)

    def take(self, count: int) -> bytes:
        end = self._position + count
        if end > len(self._data):
            raise _malformed("packet is shorter than its fields")
        chunk = self._data[self._position:end]
        self._position = end
        return chunk

    def rest(self) -> bytes:
        return self.take(len(self._data) - self._position)

    def byte(self) -> int:
        return self.take(1)[0]

    def uint16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def uint32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def variable_byte_integer(self) -> int:
        decoded = _decode_variable_byte_integer(self._data, self._position)
        if decoded is None:
            raise _malformed("packet is shorter than its fields")
        value, self._position = decoded
        return value

    def binary(self) -> bytes:
        return self.take(self.uint16())

    def string(self) -> str:
        try:
            text = self.binary().decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("string is not well-formed UTF-8") from None
        if "\x00" in text:
            raise _malformed("string contains U+0000")
        return text

    def expect_end(self, packet_class: type) -> None:
        if not self.at_end():
            raise _malformed(f"unexpected bytes at the end of {_packet_name(packet_class)}")


# --- properties (MQTT 5 section 2.2.2) ----------------------------------------------------


class PropertyType(Enum):
    """The wire data types a property value can have."""

    BYTE = "byte"
    TWO_BYTE_INTEGER = "two-byte integer"
    FOUR_BYTE_INTEGER = "four-byte integer"
    VARIABLE_BYTE_INTEGER = "variable byte integer"
    UTF8_STRING = "UTF-8 string"
    BINARY_DATA = "binary data"
    UTF8_STRING_PAIR = "UTF-8 string pair"


@dataclass(frozen=True, slots=True)
class PropertyDefinition:
    """One row of the spec's property table; ``packets`` may include :class:`Will`."""

    identifier: int
    name: str
    type: PropertyType
    packets: frozenset[type]


_ACKS = (Puback, Pubrec, Pubrel, Pubcomp)
_MESSAGE = (Publish, Will)
_WITH_REASON_STRING = (Connack, *_ACKS, Suback, Unsuback, Disconnect, Auth)


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

_PROPERTY_READERS: dict[PropertyType, Callable[[_Reader], Any]] = {
    PropertyType.BYTE: _Reader.byte,
    PropertyType.TWO_BYTE_INTEGER: _Reader.uint16,
    PropertyType.FOUR_BYTE_INTEGER: _Reader.uint32,
    PropertyType.VARIABLE_BYTE_INTEGER: _Reader.variable_byte_integer,
    PropertyType.UTF8_STRING: _Reader.string,
    PropertyType.BINARY_DATA: _Reader.binary,
    PropertyType.UTF8_STRING_PAIR: lambda reader: (reader.string(), reader.string()),
}

_PROPERTY_WRITERS: dict[PropertyType, Callable[[Any], bytes]] = {
    PropertyType.BYTE: lambda value: bytes((value,)),
    PropertyType.TWO_BYTE_INTEGER: _encode_uint16,
    PropertyType.FOUR_BYTE_INTEGER: lambda value: struct.pack(">I", value),
    PropertyType.VARIABLE_BYTE_INTEGER: _encode_variable_byte_integer,
    PropertyType.UTF8_STRING: _encode_string,
    PropertyType.BINARY_DATA: _encode_binary,
    PropertyType.UTF8_STRING_PAIR: lambda pair: _encode_string(pair[0]) + _encode_string(pair[1]),
}


def _packet_name(packet_class: type) -> str:
    return "will properties" if packet_class is Will else packet_class.__name__.upper()


def _read_properties(reader: _Reader, packet_class: type) -> Properties:
    section = _Reader(reader.take(reader.variable_byte_integer()))
    properties: Properties = {}
    while not section.at_end():
        identifier = section.variable_byte_integer()
        definition = _PROPERTY_BY_IDENTIFIER.get(identifier)
        if definition is None or packet_class not in definition.packets:
            raise _malformed(f"property 0x{identifier:02X} is not allowed in "
                             f"{_packet_name(packet_class)}")
        name = definition.name
        value = _PROPERTY_READERS[definition.type](section)
        _check_property_value(name, value)
        repeatable = name == "user_property" or (name == "subscription_identifier"
                                                 and packet_class is Publish)
        if name in properties and not repeatable:
            raise _protocol_error(f"{name} appears more than once")
        if name in _LIST_PROPERTIES:
            properties.setdefault(name, []).append(value)
        else:
            properties[name] = value
    if "authentication_data" in properties and "authentication_method" not in properties:
        raise _protocol_error("authentication_data without authentication_method")
    return properties


def _check_property_value(name: str, value: Any) -> None:
    if name in _BOOLEAN_PROPERTIES and value not in (0, 1):
        raise _protocol_error(f"{name} must be 0 or 1, not {value}")
    if name in _NON_ZERO_PROPERTIES and value == 0:
        raise _protocol_error(f"{name} must not be 0")
    if name == "topic_alias" and value == 0:
        raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, "topic_alias must not be 0")


def _encode_properties(properties: Properties, packet_class: type) -> bytes:
    encoded = bytearray()
    for name, value in properties.items():
        definition = _PROPERTY_BY_NAME.get(name)
        if definition is None or packet_class not in definition.packets:
            raise ValueError(f"property {name!r} is not allowed in {_packet_name(packet_class)}")
        write = _PROPERTY_WRITERS[definition.type]
        for item in (value if name in _LIST_PROPERTIES else [value]):
            encoded.append(definition.identifier)
            encoded += write(item)
    return _encode_variable_byte_integer(len(encoded)) + encoded


# --- packet types, directions and reason codes --------------------------------------------

_PACKET_CLASSES: dict[int, type] = {
    1: Connect, 2: Connack, 3: Publish, 4: Puback, 5: Pubrec, 6: Pubrel, 7: Pubcomp,
    8: Subscribe, 9: Suback, 10: Unsubscribe, 11: Unsuback, 12: Pingreq, 13: Pingresp,
    14: Disconnect, 15: Auth,
}
_PACKET_TYPE_NUMBERS = {packet_class: number for number, packet_class in _PACKET_CLASSES.items()}

_REQUIRED_FLAGS = {Pubrel: 0b0010, Subscribe: 0b0010, Unsubscribe: 0b0010}
"""Fixed-header flags other than PUBLISH's; packet types not listed need 0."""

_BARE_ACKS = {_PACKET_TYPE_NUMBERS[ack] << 4 | _REQUIRED_FLAGS.get(ack, 0): ack for ack in _ACKS}
"""First byte of an acknowledgement -> its class; with a remaining length of 2 it is just
the packet id (both directions, both versions: MQTT 5 omits a success code and properties)."""
_BARE_ACK_FIRST_BYTES = {ack: bytes((first_byte, 2)) for first_byte, ack in _BARE_ACKS.items()}

_SENT_BY_CLIENT = frozenset({Connect, Publish, *_ACKS, Subscribe, Unsubscribe, Pingreq,
                             Disconnect, Auth})
_SENT_BY_SERVER = frozenset({Connack, Publish, *_ACKS, Suback, Unsuback, Pingresp,
                             Disconnect, Auth})


def _may_send(packet_class: type, by_client: bool, version: int | None) -> bool:
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

_CONNACK_RETURN_CODES = {
    0x00: ReasonCode.SUCCESS,
    0x01: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    0x02: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    0x03: ReasonCode.SERVER_UNAVAILABLE,
    0x04: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    0x05: ReasonCode.NOT_AUTHORIZED,
}
"""MQTT 3.1.1 CONNACK return code -> the MQTT 5 reason code with the same meaning."""

_CONNACK_RETURN_CODE_FOR = {
    **{reason: return_code for return_code, reason in _CONNACK_RETURN_CODES.items()},
    ReasonCode.SERVER_BUSY: 0x03,
    ReasonCode.QUOTA_EXCEEDED: 0x03,
    ReasonCode.BANNED: 0x05,
}
"""MQTT 5 CONNACK reason code -> 3.1.1 return code; codes missing here have no 3.1.1 form."""

_SUBACK_3_1_1_CODES = frozenset({0x00, 0x01, 0x02, 0x80})


def _read_reason_code(reader: _Reader, packet_class: type) -> int:
    code = reader.byte()
    if code not in _REASON_CODES[packet_class]:
        raise _malformed(f"0x{code:02X} is not a {_packet_name(packet_class)} reason code")
    return ReasonCode(code)


def _read_packet_id(reader: _Reader) -> int:
    packet_id = reader.uint16()
    if packet_id == 0:
        raise _protocol_error("packet identifier must not be 0")
    return packet_id


def _check_reason_code(reason_code: int, packet_class: type) -> None:
    if reason_code not in _REASON_CODES[packet_class]:
        raise ValueError(f"0x{reason_code:02X} is not a {_packet_name(packet_class)} reason code")


# --- the codec ------------------------------------------------------------------------------


class MqttCodec:
    """Framing, validation and serialization for one MQTT connection.

    Server side by default: decodes what clients send and encodes what servers
    send. ``client_side=True`` swaps the directions (for tests and clients);
    the version is then taken from the CONNECT it encodes. ``max_packet_size``
    bounds an incoming packet's total size, checked as soon as its fixed header
    is complete so an oversized body is never waited for. ``lazy_filters``: the filters
    of a SUBSCRIBE or UNSUBSCRIBE are an iterator, each decoded and checked as it is
    taken, so that the handler of a packet with 20,000 of them can spread that work over
    reactor turns (see :mod:`router.mqtt.spread`); else they are decoded at once, a list.
    """

    def __init__(self, *, client_side: bool = False, max_packet_size: int | None = None,
                 lazy_filters: bool = False) -> None:
        self.max_packet_size = max_packet_size
        self._lazy_filters = lazy_filters
        self.protocol_version: int | None = None
        """4 (MQTT 3.1.1) or 5 once CONNECT has been accepted (decoded or, client side, sent)."""
        self._client_side = client_side
        self._encoding_version: int | None = None
        self._buffer = bytearray()
        self._offset = 0  # where the next packet starts in _buffer
        self._fixed_header: tuple[int, int, int] | None = None
        self._error: MqttProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the transport; then call :meth:`next_packet` until None."""
        if self._offset:  # drop the packets already decoded: one move per read, not per packet
            del self._buffer[:self._offset]
            self._offset = 0
        self._buffer += data

    def buffered(self) -> int:
        """Bytes received but not yet decoded into packets."""
        return len(self._buffer) - self._offset

    def next_packet(self) -> Packet | None:
        """The next complete packet, or None until more data arrives.

        Raises :class:`MqttProtocolError` for a packet the spec forbids, and
        again on every later call: a broken stream cannot be resynchronized.
        """
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except MqttProtocolError as error:
            self._error = error
            raise

    def encode(self, packet: Packet) -> bytes:
        """The packet's bytes under this connection's protocol version.

        Raises ValueError for a packet this side may not send in this version,
        or before the version is known (no CONNECT yet).
        """
        packet_class = type(packet)
        if (packet_class in _BARE_ACK_FIRST_BYTES and self._encoding_version is not None
                and packet.reason_code == ReasonCode.SUCCESS and not packet.properties):
            # a successful acknowledgement is its packet id in either version (MQTT 5 3.4.2.1)
            return _BARE_ACK_FIRST_BYTES[packet_class] + _encode_uint16(packet.packet_id)
        if self._client_side and isinstance(packet, Connect):
            if packet.protocol_version not in (MQTT_3_1_1, MQTT_5):
                raise ValueError(f"cannot speak protocol version {packet.protocol_version}")
            self.protocol_version = self._encoding_version = packet.protocol_version
        version = self._encoding_version
        if version is None:
            raise ValueError("the protocol version is unknown until CONNECT")
        if not _may_send(packet_class, self._client_side, version):
            side = "client" if self._client_side else "server"
            raise ValueError(f"a {side} cannot send {_packet_name(packet_class)} "
                             f"in protocol version {version}")
        flags, body = self._encode_body(packet)
        if len(body) > MAX_VARIABLE_BYTE_INTEGER:
            raise ValueError("packet exceeds the maximum MQTT packet size")
        first_byte = _PACKET_TYPE_NUMBERS[packet_class] << 4 | flags
        return bytes((first_byte,)) + _encode_variable_byte_integer(len(body)) + body

    def encode_publish_template(self, packet: Publish) -> tuple[bytes, bytes]:
        """A QoS 1/2 PUBLISH split around its packet identifier (whatever ``packet`` has):
        the packet with id ``n`` is ``head + n.to_bytes(2, "big") + tail``, so one encoding
        serves every receiver."""
        data = self.encode(packet)
        _, body_start = _decode_variable_byte_integer(data, 1)
        cut = body_start + 2 + len(packet.topic.encode("utf-8"))
        return data[:cut], data[cut + 2:]

    # --- framing --------------------------------------------------------------------------

    def _next_packet(self) -> Packet | None:
        buffer, start = self._buffer, self._offset
        if self._fixed_header is None:
            if (len(buffer) - start >= 4 and buffer[start + 1] == 2
                    and self.protocol_version is not None):
                # the commonest packets, a bare PUBACK/PUBREC/PUBREL/PUBCOMP: decoded here
                # without the general path (which validates them the same way)
                ack_class = _BARE_ACKS.get(buffer[start])
                packet_id = buffer[start + 2] << 8 | buffer[start + 3]
                if ack_class is not None and packet_id:
                    self._offset = start + 4
                    return ack_class(packet_id)
            self._fixed_header = self._read_fixed_header()
            if self._fixed_header is None:
                return None
        first_byte, header_length, body_length = self._fixed_header
        body_start = start + header_length
        body_end = body_start + body_length
        if len(buffer) < body_end:
            return None
        with memoryview(buffer) as view:  # one copy of the body, not two
            body = bytes(view[body_start:body_end])
        self._offset = body_end
        self._fixed_header = None
        return self._decode_body(_PACKET_CLASSES[first_byte >> 4], first_byte & 0x0F,
                                 _Reader(body))

    def _read_fixed_header(self) -> tuple[int, int, int] | None:
        """(first byte, header length, body length) once complete; rejects bad headers early."""
        buffer, start = self._buffer, self._offset
        if len(buffer) <= start:
            return None
        first_byte = buffer[start]
        self._check_packet_type_and_flags(first_byte >> 4, first_byte & 0x0F)
        decoded = _decode_variable_byte_integer(buffer, start + 1)
        if decoded is None:
            return None
        body_length, body_start = decoded
        header_length = body_start - start
        if (self.max_packet_size is not None
                and header_length + body_length > self.max_packet_size):
            raise MqttProtocolError(
                ReasonCode.PACKET_TOO_LARGE,
                f"packet of {header_length + body_length} bytes exceeds {self.max_packet_size}")
        return first_byte, header_length, body_length

    def _check_packet_type_and_flags(self, type_number: int, flags: int) -> None:
        packet_class = _PACKET_CLASSES.get(type_number)
        version = self.protocol_version
        if packet_class is None or (packet_class is Auth and version == MQTT_3_1_1):
            raise _malformed(f"reserved packet type {type_number}")
        if self._client_side:
            if version is None:
                raise _protocol_error("the server spoke before CONNECT was sent")
        elif version is None and packet_class is not Connect:
            raise _protocol_error("the first packet must be CONNECT")
        elif version is not None and packet_class is Connect:
            raise _protocol_error("CONNECT sent twice")
        if not _may_send(packet_class, not self._client_side, version):
            raise _protocol_error(f"{_packet_name(packet_class)} may not be sent by the "
                                  f"{'server' if self._client_side else 'client'}")
        if packet_class is Publish:
            qos = flags >> 1 & 0b11
            if qos == 3:
                raise _malformed("PUBLISH with QoS 3")
            if qos == 0 and flags & 0b1000:
                raise _malformed("PUBLISH with QoS 0 has the DUP flag set")
        elif flags != _REQUIRED_FLAGS.get(packet_class, 0):
            raise _malformed(f"invalid fixed header flags {flags:#06b} for "
                             f"{_packet_name(packet_class)}")

    # --- decoding -------------------------------------------------------------------------

    def _decode_body(self, packet_class: type, flags: int, reader: _Reader) -> Packet:
        if packet_class is Publish:
            return self._decode_publish(flags, reader)
        if packet_class in _ACKS:
            packet_id = _read_packet_id(reader)
            return packet_class(packet_id, *self._read_reason_and_properties(reader, packet_class))
        if packet_class is Subscribe:
            return self._decode_subscribe(reader)
        if packet_class is Suback:
            return self._decode_suback(reader)
        if packet_class is Unsubscribe:
            return self._decode_unsubscribe(reader)
        if packet_class is Unsuback:
            return self._decode_unsuback(reader)
        if packet_class in (Disconnect, Auth):
            return packet_class(*self._read_reason_and_properties(reader, packet_class))
        if packet_class is Connect:
            return self._decode_connect(reader)
        if packet_class is Connack:
            return self._decode_connack(reader)
        reader.expect_end(packet_class)
        return packet_class()

    def _properties(self, reader: _Reader, packet_class: type) -> Properties:
        return _read_properties(reader, packet_class) if self.protocol_version == MQTT_5 else {}

    def _read_reason_and_properties(self, reader: _Reader,
                                    packet_class: type) -> tuple[int, Properties]:
        """MQTT 5 may omit a trailing property length (no properties) and reason code (0)."""
        reason_code: int = ReasonCode.SUCCESS
        properties: Properties = {}
        if self.protocol_version == MQTT_5:
            if not reader.at_end():
                reason_code = _read_reason_code(reader, packet_class)
            if not reader.at_end():
                properties = _read_properties(reader, packet_class)
        reader.expect_end(packet_class)
        return reason_code, properties

    def _decode_connect(self, reader: _Reader) -> Connect:
        protocol_name = reader.string()
        version = reader.byte()
        if protocol_name not in ("MQTT", "MQIsdp"):
            raise _protocol_error(f"unknown protocol name {protocol_name!r}")
        if protocol_name != "MQTT" or version not in (MQTT_3_1_1, MQTT_5):
            # Refuse in the CONNACK layout the client most likely parses.
            self._encoding_version = MQTT_5 if version > MQTT_5 else MQTT_3_1_1
            raise MqttProtocolError(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                                    f"unsupported protocol {protocol_name} level {version}",
                                    send_connack=True)
        self._encoding_version = version
        try:
            connect = self._decode_connect_fields(protocol_name, version, reader)
        except MqttProtocolError as error:
            if version == MQTT_5 and not error.send_connack:
                # MQTT 5 section 4.13.1: a CONNECT error may be reported in CONNACK.
                raise MqttProtocolError(error.reason_code, error.message,
                                        send_connack=True) from None
            raise
        self.protocol_version = version
        return connect

    def _decode_connect_fields(self, protocol_name: str, version: int,
                               reader: _Reader) -> Connect:
        connect_flags = reader.byte()
        if connect_flags & 0x01:
            raise _malformed("reserved CONNECT flag is set")
        has_will = bool(connect_flags & 0x04)
        will_qos = connect_flags >> 3 & 0b11
        will_retain = bool(connect_flags & 0x20)
        has_password = bool(connect_flags & 0x40)
        has_username = bool(connect_flags & 0x80)
        if will_qos == 3:
            raise _malformed("will QoS 3")
        if not has_will and (will_qos or will_retain):
            raise _malformed("will QoS or will retain set without the will flag")
        if version == MQTT_3_1_1 and has_password and not has_username:
            raise _malformed("password without user name in MQTT 3.1.1")
        keep_alive = reader.uint16()
        properties = _read_properties(reader, Connect) if version == MQTT_5 else {}
        client_id = reader.string()
        will = None
        if has_will:
            will_properties = _read_properties(reader, Will) if version == MQTT_5 else {}
            will_topic = reader.string()
            if not valid_topic_name(will_topic):
                raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID,
                                        f"invalid will topic {will_topic!r}")
            will = Will(will_topic, reader.binary(), will_qos, will_retain, will_properties)
        username = reader.string() if has_username else None
        password = reader.binary() if has_password else None
        reader.expect_end(Connect)
        clean_start = bool(connect_flags & 0x02)
        if version == MQTT_3_1_1 and not client_id and not clean_start:
            raise MqttProtocolError(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                                    "empty client identifier needs a clean session",
                                    send_connack=True)
        return Connect(protocol_name, version, clean_start, keep_alive, client_id, will,
                       username, password, properties)

    def _decode_connack(self, reader: _Reader) -> Connack:
        acknowledge_flags = reader.byte()
        if acknowledge_flags & 0xFE:
            raise _malformed("reserved CONNACK flags are set")
        session_present = bool(acknowledge_flags)
        if self.protocol_version == MQTT_5:
            reason_code = _read_reason_code(reader, Connack)
        else:
            return_code = reader.byte()
            if return_code not in _CONNACK_RETURN_CODES:
                raise _malformed(f"reserved CONNACK return code {return_code}")
            reason_code = _CONNACK_RETURN_CODES[return_code]
        properties = self._properties(reader, Connack)
        reader.expect_end(Connack)
        if session_present and reason_code != ReasonCode.SUCCESS:
            raise _protocol_error("session present on a refused connection")
        return Connack(session_present, reason_code, properties)

    def _decode_publish(self, flags: int, reader: _Reader) -> Publish:
        qos = flags >> 1 & 0b11
        topic = reader.string()
        packet_id = _read_packet_id(reader) if qos else None
        properties = self._properties(reader, Publish)
        if "+" in topic or "#" in topic:
            raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID,
                                    f"wildcard in topic name {topic!r}")
        if not topic and "topic_alias" not in properties:
            raise _protocol_error("empty topic name without a topic alias")
        return Publish(topic, reader.rest(), qos, bool(flags & 0b0001), bool(flags & 0b1000),
                       packet_id, properties)

    def _decode_subscribe(self, reader: _Reader) -> Subscribe:
        packet_id = _read_packet_id(reader)
        properties = self._properties(reader, Subscribe)
        if reader.at_end():
            raise _protocol_error("SUBSCRIBE without topic filters")
        subscriptions = self._subscriptions(reader)
        return Subscribe(packet_id, subscriptions if self._lazy_filters else list(subscriptions),
                         properties)

    def _subscriptions(self, reader: _Reader) -> Iterator[tuple[str, SubscriptionOptions]]:
        while not reader.at_end():
            topic_filter = reader.string()
            options = self._decode_subscription_options(reader.byte(), topic_filter)
            yield _checked_filter(topic_filter), options

    def _decode_subscription_options(self, options: int, topic_filter: str) -> SubscriptionOptions:
        reserved_bits = 0b11000000 if self.protocol_version == MQTT_5 else 0b11111100
        if options & reserved_bits:
            raise _malformed("reserved subscription option bits are set")
        qos = options & 0b11
        no_local = bool(options & 0b100)
        retain_handling = options >> 4 & 0b11
        if qos == 3:
            raise _protocol_error("subscription with maximum QoS 3")
        if retain_handling == 3:
            raise _protocol_error("retain handling 3")
        if no_local and _is_shared_subscription(topic_filter):
            raise _protocol_error("no local on a shared subscription")
        return SubscriptionOptions(qos, no_local, bool(options & 0b1000), retain_handling)

    def _decode_suback(self, reader: _Reader) -> Suback:
        packet_id = _read_packet_id(reader)
        properties = self._properties(reader, Suback)
        if self.protocol_version == MQTT_5:
            reason_codes = []
            while not reader.at_end():
                reason_codes.append(_read_reason_code(reader, Suback))
        else:
            reason_codes = list(reader.rest())
            if not _SUBACK_3_1_1_CODES.issuperset(reason_codes):
                raise _malformed("SUBACK return codes must be 0, 1, 2 or 0x80")
        return Suback(packet_id, reason_codes, properties)

    def _decode_unsubscribe(self, reader: _Reader) -> Unsubscribe:
        packet_id = _read_packet_id(reader)
        properties = self._properties(reader, Unsubscribe)
        if reader.at_end():
            raise _protocol_error("UNSUBSCRIBE without topic filters")
        topic_filters = _topic_filters(reader)
        return Unsubscribe(packet_id, topic_filters if self._lazy_filters else list(topic_filters),
                           properties)

    def _decode_unsuback(self, reader: _Reader) -> Unsuback:
        packet_id = _read_packet_id(reader)
        properties = self._properties(reader, Unsuback)
        reason_codes = []
        if self.protocol_version == MQTT_5:  # MQTT 3.1.1 UNSUBACK has no payload
            while not reader.at_end():
                reason_codes.append(_read_reason_code(reader, Unsuback))
        reader.expect_end(Unsuback)
        return Unsuback(packet_id, reason_codes, properties)

    # --- encoding -------------------------------------------------------------------------

    def _encode_body(self, packet: Packet) -> tuple[int, bytes]:
        """(fixed header flags, variable header + payload)."""
        if isinstance(packet, Publish):
            return self._encode_publish(packet)
        if isinstance(packet, _ACKS):
            flags = _REQUIRED_FLAGS.get(type(packet), 0)
            return flags, _encode_uint16(packet.packet_id) + self._encode_reason_and_properties(
                packet.reason_code, packet.properties, type(packet))
        if isinstance(packet, Subscribe):
            return 0b0010, self._encode_subscribe(packet)
        if isinstance(packet, Suback):
            return 0, self._encode_suback(packet)
        if isinstance(packet, Unsubscribe):
            return 0b0010, (_encode_uint16(packet.packet_id)
                            + self._encode_properties(packet.properties, Unsubscribe)
                            + b"".join(map(_encode_string, packet.topic_filters)))
        if isinstance(packet, Unsuback):
            return 0, self._encode_unsuback(packet)
        if isinstance(packet, (Disconnect, Auth)):
            return 0, self._encode_reason_and_properties(packet.reason_code, packet.properties,
                                                         type(packet))
        if isinstance(packet, Connect):
            return 0, self._encode_connect(packet)
        if isinstance(packet, Connack):
            return 0, self._encode_connack(packet)
        return 0, b""

    def _encode_properties(self, properties: Properties, packet_class: type) -> bytes:
        if self._encoding_version == MQTT_5:
            return _encode_properties(properties, packet_class)
        return b""

    def _encode_reason_and_properties(self, reason_code: int, properties: Properties,
                                      packet_class: type) -> bytes:
        """The shortest MQTT 5 form: trailing defaults (no properties, code 0) are omitted."""
        if self._encoding_version != MQTT_5:
            return b""
        _check_reason_code(reason_code, packet_class)
        if properties:
            return bytes((reason_code,)) + _encode_properties(properties, packet_class)
        return bytes((reason_code,)) if reason_code else b""

    def _encode_connect(self, packet: Connect) -> bytes:
        will = packet.will
        connect_flags = 0x02 if packet.clean_start else 0
        if will is not None:
            connect_flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
        if packet.password is not None:
            connect_flags |= 0x40
        if packet.username is not None:
            connect_flags |= 0x80
        body = bytearray(_encode_string(packet.protocol_name))
        body += bytes((packet.protocol_version, connect_flags))
        body += _encode_uint16(packet.keep_alive)
        body += self._encode_properties(packet.properties, Connect)
        body += _encode_string(packet.client_id)
        if will is not None:
            body += self._encode_properties(will.properties, Will)
            body += _encode_string(will.topic) + _encode_binary(will.payload)
        if packet.username is not None:
            body += _encode_string(packet.username)
        if packet.password is not None:
            body += _encode_binary(packet.password)
        return bytes(body)

    def _encode_connack(self, packet: Connack) -> bytes:
        if self._encoding_version == MQTT_5:
            _check_reason_code(packet.reason_code, Connack)
            code = packet.reason_code
        else:
            code = _CONNACK_RETURN_CODE_FOR.get(packet.reason_code)
            if code is None:
                raise ValueError(f"MQTT 3.1.1 has no CONNACK return code for "
                                 f"0x{packet.reason_code:02X}: close without CONNACK")
        return (bytes((int(packet.session_present), code))
                + self._encode_properties(packet.properties, Connack))

    def _encode_publish(self, packet: Publish) -> tuple[int, bytes]:
        if (packet.qos > 0) != (packet.packet_id is not None):
            raise ValueError("a PUBLISH has a packet identifier exactly when its QoS is 1 or 2")
        flags = packet.dup << 3 | packet.qos << 1 | packet.retain
        body = bytearray(_encode_string(packet.topic))
        if packet.packet_id is not None:
            body += _encode_uint16(packet.packet_id)
        body += self._encode_properties(packet.properties, Publish)
        body += packet.payload
        return flags, bytes(body)

    def _encode_subscribe(self, packet: Subscribe) -> bytes:
        body = bytearray(_encode_uint16(packet.packet_id))
        body += self._encode_properties(packet.properties, Subscribe)
        for topic_filter, options in packet.subscriptions:
            options_byte = options.qos
            if self._encoding_version == MQTT_5:
                options_byte |= (options.no_local << 2 | options.retain_as_published << 3
                                 | options.retain_handling << 4)
            body += _encode_string(topic_filter) + bytes((options_byte,))
        return bytes(body)

    def _encode_suback(self, packet: Suback) -> bytes:
        if self._encoding_version == MQTT_5:
            for reason_code in packet.reason_codes:
                _check_reason_code(reason_code, Suback)
            codes = packet.reason_codes
        else:  # every MQTT 5 failure code is 3.1.1's single failure code 0x80
            codes = [code if code < 0x80 else 0x80 for code in packet.reason_codes]
        return (_encode_uint16(packet.packet_id)
                + self._encode_properties(packet.properties, Suback) + bytes(codes))

    def _encode_unsuback(self, packet: Unsuback) -> bytes:
        body = _encode_uint16(packet.packet_id)
        if self._encoding_version != MQTT_5:
            return body
        for reason_code in packet.reason_codes:
            _check_reason_code(reason_code, Unsuback)
        return (body + _encode_properties(packet.properties, Unsuback)
                + bytes(packet.reason_codes))
