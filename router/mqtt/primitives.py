"""MQTT wire primitives (MQTT section 1.5 and the data types of 2.2.2.2): the layer under
:mod:`router.mqtt.tables` and :mod:`router.mqtt.codec`.

Variable byte integers, length-prefixed binary data and UTF-8 strings, a cursor that turns
reading past a packet's end into a malformed-packet error, and the readers and writers of
each property data type. It knows no packet layout; the tables say which property and
reason code goes where, the codec lays packets out.
"""

from __future__ import annotations

import struct
from enum import Enum
from typing import Any, Callable, Container

from router.mqtt.packets import ReasonCode, Will

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


def malformed(message: str) -> MqttProtocolError:
    """A MALFORMED_PACKET error: the bytes cannot be a packet of this protocol."""
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def protocol_error(message: str) -> MqttProtocolError:
    """A PROTOCOL_ERROR: well-formed bytes the spec still forbids."""
    return MqttProtocolError(ReasonCode.PROTOCOL_ERROR, message)


def packet_name(packet_class: type) -> str:
    """The packet's name as error messages show it (will properties are not a packet)."""
    return "will properties" if packet_class is Will else packet_class.__name__.upper()


# --- primitive data types (MQTT section 1.5) ----------------------------------------------


def decode_variable_byte_integer(data: bytes | bytearray, offset: int) -> tuple[int, int] | None:
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
                raise malformed("variable byte integer is not minimally encoded")
            return value, position + 1
    raise malformed("variable byte integer is longer than 4 bytes")


def encode_variable_byte_integer(value: int) -> bytes:
    """The shortest (canonical) encoding, as the spec requires."""
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


def encode_uint16(value: int) -> bytes:
    """A big-endian two-byte integer."""
    return struct.pack(">H", value)


def encode_binary(data: bytes) -> bytes:
    """Two-byte length then the bytes; refuses what the length cannot say."""
    if len(data) > 0xFFFF:
        raise ValueError("binary data and strings are limited to 65535 bytes")
    return encode_uint16(len(data)) + data


def encode_string(text: str) -> bytes:
    """A UTF-8 string as binary data."""
    return encode_binary(text.encode("utf-8"))


class Reader:
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
            raise malformed("packet is shorter than its fields")
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
        decoded = decode_variable_byte_integer(self._data, self._position)
        if decoded is None:
            raise malformed("packet is shorter than its fields")
        value, self._position = decoded
        return value

    def binary(self) -> bytes:
        return self.take(self.uint16())

    def string(self) -> str:
        try:
            text = self.binary().decode("utf-8")
        except UnicodeDecodeError:
            raise malformed("string is not well-formed UTF-8") from None
        if "\x00" in text:
            raise malformed("string contains U+0000")
        return text

    def expect_end(self, packet_class: type) -> None:
        if not self.at_end():
            raise malformed(f"unexpected bytes at the end of {packet_name(packet_class)}")


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


PROPERTY_READERS: dict[PropertyType, Callable[[Reader], Any]] = {
    PropertyType.BYTE: Reader.byte,
    PropertyType.TWO_BYTE_INTEGER: Reader.uint16,
    PropertyType.FOUR_BYTE_INTEGER: Reader.uint32,
    PropertyType.VARIABLE_BYTE_INTEGER: Reader.variable_byte_integer,
    PropertyType.UTF8_STRING: Reader.string,
    PropertyType.BINARY_DATA: Reader.binary,
    PropertyType.UTF8_STRING_PAIR: lambda reader: (reader.string(), reader.string()),
}

PROPERTY_WRITERS: dict[PropertyType, Callable[[Any], bytes]] = {
    PropertyType.BYTE: lambda value: bytes((value,)),
    PropertyType.TWO_BYTE_INTEGER: encode_uint16,
    PropertyType.FOUR_BYTE_INTEGER: lambda value: struct.pack(">I", value),
    PropertyType.VARIABLE_BYTE_INTEGER: encode_variable_byte_integer,
    PropertyType.UTF8_STRING: encode_string,
    PropertyType.BINARY_DATA: encode_binary,
    PropertyType.UTF8_STRING_PAIR: lambda pair: encode_string(pair[0]) + encode_string(pair[1]),
}


def free_packet_id(start: int, in_use: Container[int]) -> int:
    """The first packet identifier from ``start`` on (1 to 65535, wrapping round) that is not
    ``in_use``; the caller's next ``start`` is ``id % 65535 + 1``."""
    packet_id = start
    while packet_id in in_use:
        packet_id = packet_id % 65535 + 1
    return packet_id
