"""A small AMQP 1.0 type encoder and section splitter, for the outbound hot path.

proton's ``Data`` costs tens of microseconds per object; the router only needs to
write a few shapes (a header, annotations, properties, a body of plain values) and
to find section boundaries, which the constructor bytes alone tell (spec 1.6:
the high nibble of a constructor gives its width class).
"""

from __future__ import annotations

import struct

from proton import symbol, timestamp, uint

from router.core.payload import as_text

_LONG = struct.Struct(">q")
_DOUBLE = struct.Struct(">d")
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SECTION_NAMES = {
    "amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71,
    "amqp:message-annotations:map": 0x72, "amqp:properties:list": 0x73,
    "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76, "amqp:amqp-value:*": 0x77, "amqp:footer:map": 0x78,
}


def skip(buffer: bytes, offset: int) -> int:
    """The offset just after the encoded value that starts at ``offset``."""
    code = buffer[offset]
    if code == 0x00:  # described: a descriptor, then the value
        return skip(buffer, skip(buffer, offset + 1))
    width = code >> 4
    fixed = _FIXED_WIDTH.get(width)
    if fixed is not None:
        end = offset + 1 + fixed
    elif width in (0xA, 0xC, 0xE):
        end = offset + 2 + buffer[offset + 1]
    elif width in (0xB, 0xD, 0xF):
        end = offset + 5 + int.from_bytes(buffer[offset + 1:offset + 5], "big")
    else:
        raise ValueError(f"not an AMQP value: constructor 0x{code:02x} at {offset}")
    if end > len(buffer):
        raise ValueError("truncated AMQP value")
    return end


def sections(encoded: bytes):
    """(descriptor code, bytes) of each section of an encoded message, in order."""
    offset = 0
    while offset < len(encoded):
        if encoded[offset] != 0x00:
            raise ValueError(f"not a message section at {offset}")
        end = skip(encoded, offset)
        descriptor = encoded[offset + 1]
        if descriptor == 0x53:  # smallulong
            code = encoded[offset + 2]
        elif descriptor == 0x80:  # ulong
            code = int.from_bytes(encoded[offset + 2:offset + 10], "big")
        else:  # a symbolic descriptor: sym8 or sym32
            start = offset + 2 + (1 if descriptor == 0xA3 else 4)
            name = encoded[start:skip(encoded, offset + 1)]
            code = _SECTION_NAMES.get(name.decode("utf-8", "replace"), -1)
        yield code, encoded[offset:end]
        offset = end


def list_fields(encoded_list: bytes) -> list[bytes]:
    """The encoded items of an encoded list (list0, list8 or list32)."""
    code = encoded_list[0]
    if code == 0x45:
        return []
    if code == 0xC0:
        count, offset = encoded_list[2], 3
    elif code == 0xD0:
        count, offset = int.from_bytes(encoded_list[5:9], "big"), 9
    else:
        raise ValueError(f"not an AMQP list: constructor 0x{code:02x}")
    fields = []
    for _ in range(count):
        end = skip(encoded_list, offset)
        fields.append(encoded_list[offset:end])
        offset = end
    return fields


def compound(small: int, large: int, items: list[bytes]) -> bytes:
    """A list (0xc0/0xd0) or map (0xc1/0xd1) of encoded items."""
    body = b"".join(items)
    count = len(items)
    if len(body) < 255 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return (bytes((large,)) + (len(body) + 4).to_bytes(4, "big") + count.to_bytes(4, "big")
            + body)


def section(code: int, encoded_value: bytes) -> bytes:
    """A message section: the described value with descriptor ``code``."""
    return bytes((0x00, 0x53, code)) + encoded_value


def _variable(small: int, large: int, data: bytes) -> bytes:
    if len(data) < 256:
        return bytes((small, len(data))) + data
    return bytes((large,)) + len(data).to_bytes(4, "big") + data


def encode(value) -> bytes:
    """One plain value (as WAMP and MQTT give them, plus symbol, uint and timestamp)
    in its AMQP encoding; OverflowError / TypeError for what AMQP cannot hold (a date
    from a CBOR peer is a string, see :func:`router.core.payload.as_text`)."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, symbol):
        return _variable(0xA3, 0xB3, value.encode("ascii"))
    if isinstance(value, str):
        return _variable(0xA1, 0xB1, value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _variable(0xA0, 0xB0, bytes(value))
    if isinstance(value, timestamp):
        return b"\x83" + _LONG.pack(value)
    if isinstance(value, uint):
        return b"\x70" + int(value).to_bytes(4, "big")
    if isinstance(value, int):
        if -128 <= value <= 127:
            return bytes((0x55, value & 0xFF))
        try:
            return b"\x81" + _LONG.pack(value)
        except struct.error:
            raise OverflowError(f"integer {value} does not fit an AMQP long") from None
    if isinstance(value, float):
        return b"\x82" + _DOUBLE.pack(value)
    if isinstance(value, (list, tuple)):
        return compound(0xC0, 0xD0, [encode(item) for item in value])
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            items.append(encode(key))
            items.append(encode(item))
        return compound(0xC1, 0xD1, items)
    # dates, UUIDs and decimals (from CBOR peers) as text, as for every JSON receiver;
    # anything else: TypeError
    return _variable(0xA1, 0xB1, as_text(value).encode("utf-8"))
