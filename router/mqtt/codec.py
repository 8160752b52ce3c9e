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

Three layers, read bottom up: :mod:`router.mqtt.primitives` (integers, strings, property
data types), :mod:`router.mqtt.tables` (the spec's property and reason-code tables) and
this module (packet layouts, framing and the per-connection state).
"""

from __future__ import annotations

import struct
from typing import Iterator

from router.core.topic import valid_topic_filter, valid_topic_name
from router.mqtt.packets import (Auth, Connack, Connect, Disconnect, Packet, Properties,
                                 Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Suback,
                                 Subscribe, SubscriptionOptions, Unsuback, Unsubscribe, Will)
from router.mqtt.primitives import (MAX_VARIABLE_BYTE_INTEGER, MQTT_3_1_1, MQTT_5,
                                    MqttProtocolError, Reader, decode_variable_byte_integer,
                                    encode_binary, encode_string, encode_uint16,
                                    encode_variable_byte_integer, malformed, protocol_error)
from router.mqtt.tables import (ACKS, BARE_ACK_FIRST_BYTES, BARE_ACKS, CONNACK_RETURN_CODE_FOR,
                                CONNACK_RETURN_CODES, PACKET_CLASSES, PACKET_TYPE_NUMBERS,
                                REQUIRED_FLAGS, SUBACK_3_1_1_CODES, check_reason_code,
                                encode_properties, may_send, packet_name, read_packet_id,
                                read_properties, read_reason_code)


# --- topic filters ---------------------------------------------------------------------


def _topic_filters(reader: Reader) -> Iterator[str]:
    while not reader.at_end():
        yield _checked_filter(reader.string())


def _checked_filter(topic_filter: str) -> str:
    if not valid_topic_filter(topic_filter):
        raise MqttProtocolError(ReasonCode.TOPIC_FILTER_INVALID,
                                f"invalid topic filter {topic_filter!r}")
    return topic_filter


def _is_shared_subscription(topic_filter: str) -> bool:
    return topic_filter.startswith("$share/")


# --- the codec ------------------------------------------------------------------------------


PublishParts = tuple[str, bytes, int, bool, "int | None"]
"""(topic, payload, QoS, RETAIN, packet id) of a PUBLISH without properties and DUP, as
:meth:`MqttCodec.next_item` gives it."""

PUBACK, PUBREC, PUBREL, PUBCOMP = (BARE_ACK_FIRST_BYTES[ack][0]
                                   for ack in (Puback, Pubrec, Pubrel, Pubcomp))
"""First bytes of the acknowledgements (a bare one is these, 2, and the packet id)."""

BARE_ACK = struct.Struct(">BBH").pack
"""A bare acknowledgement's bytes: ``BARE_ACK(PUBACK, 2, packet_id)``."""

_PLAIN_PUBLISH_FIRST_BYTES = (b"\x30", b"\x31")
"""PUBLISH, QoS 0, DUP 0, by RETAIN."""
_SMALL_PUBLISH_HEAD = struct.Struct(">BBH").pack
"""First byte, one-byte remaining length and topic name length of a small PUBLISH."""

_TOPIC_NAMES: dict[bytes, str] = {}
"""Topic names a fast-path PUBLISH carried, by their bytes, once decoded and checked: a
publisher names the same few topics again and again, so most PUBLISHes decode and check
none, and their topic is one string object (its hash kept), whose levels the frontend
finds by it. Emptied when it reaches :data:`TOPIC_NAMES_KEPT`; only names of up to
:data:`TOPIC_NAME_KEPT_BYTES` are kept (a client naming 4,096 long topics must not make the
router hold them: at 16 KB each, 130 MB)."""

TOPIC_NAMES_KEPT = 4096
TOPIC_NAME_KEPT_BYTES = 256


def _plain_topic_name(name: bytes) -> str | None:
    """The topic name in ``name`` if the fast path may take it (UTF-8, not empty, no NUL
    and no wildcard), remembered in :data:`_TOPIC_NAMES`; else None (the general path
    decodes the packet, and raises for what is wrong with it)."""
    try:
        topic = name.decode()
    except UnicodeDecodeError:
        return None
    if not valid_topic_name(topic):
        return None
    if len(name) <= TOPIC_NAME_KEPT_BYTES:
        if len(_TOPIC_NAMES) >= TOPIC_NAMES_KEPT:
            _TOPIC_NAMES.clear()
        _TOPIC_NAMES[name] = topic
    return topic


class ServerCodec:
    """Framing, validation and serialization for one MQTT connection, server side (what a
    server's connection is, :class:`router.mqtt.connection.MqttConnection`): decodes what
    clients send and encodes what servers send. ``max_packet_size`` bounds an incoming
    packet's total size, checked as soon as its fixed header is complete so an oversized
    body is never waited for. The filters of a SUBSCRIBE or UNSUBSCRIBE are an iterator,
    each decoded and checked as it is taken, so that the handler of a packet with 20,000 of
    them can spread that work over reactor turns (see :mod:`router.mqtt.spread`).

    Slotted, and between packets it holds no buffer of its own (a server keeps one codec
    per connection: an instance dict and an empty bytearray were ~100 bytes of each); the
    side and the filters' decoding are its class's (:class:`MqttCodec` chooses them per
    codec), not two slots of every connection.
    """

    __slots__ = ("max_packet_size", "protocol_version", "_encoding_version", "_buffer",
                 "_offset", "_fixed_header", "_error")
    _client_side = False
    _lazy_filters = True

    def __init__(self, *, max_packet_size: int | None = None) -> None:
        self.max_packet_size = max_packet_size
        self.protocol_version: int | None = None
        """4 (MQTT 3.1.1) or 5 once CONNECT has been accepted (decoded or, client side, sent)."""
        self._encoding_version: int | None = None
        self._buffer: bytes | bytearray = b""
        """What was received and not decoded yet (from ``_offset`` on): the shared empty
        bytes when nothing is, a read's own bytes while packets are decoded from it, a
        bytearray of its own once a packet spans reads."""
        self._offset = 0  # where the next packet starts in _buffer
        self._fixed_header: tuple[int, int, int] | None = None
        self._error: MqttProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the transport; then call :meth:`next_packet` until None."""
        buffer = self._buffer
        if not buffer:  # all decoded before (the common case): this read is the buffer
            self._buffer = data if type(data) is bytes else bytes(data)
            return
        if type(buffer) is bytes:  # the rest of an earlier read: copied once, from here on
            with memoryview(buffer) as view:
                buffer = self._buffer = bytearray(view[self._offset:])
            self._offset = 0
        elif self._offset:  # drop the packets already decoded: one move per read, not per packet
            del buffer[:self._offset]
            self._offset = 0
        buffer += data  # type: ignore[operator]

    def buffered(self) -> int:
        """Bytes received but not yet decoded into packets."""
        return len(self._buffer) - self._offset

    def next_packet(self) -> Packet | None:
        """The next complete packet, or None until more data arrives.

        Raises :class:`MqttProtocolError` for a packet the spec forbids, and
        again on every later call: a broken stream cannot be resynchronized.
        """
        item = self.next_item()
        if type(item) is int:
            return BARE_ACKS[item >> 16](item & 0xFFFF)
        if type(item) is tuple:
            topic, payload, qos, retain, packet_id = item
            return Publish(topic, payload, qos, retain, False, packet_id)
        return item  # type: ignore[return-value]

    def next_item(self) -> Packet | PublishParts | int | None:
        """:meth:`next_packet` as a router's read loop takes it: the two commonest packets
        come without a packet object. A bare acknowledgement (a packet id and nothing
        else) is the int ``first byte << 16 | packet id`` (first bytes :data:`PUBACK`,
        :data:`PUBREC`, :data:`PUBREL`, :data:`PUBCOMP`); a PUBLISH without properties
        and without DUP is its :data:`PublishParts`. Same checks, same errors."""
        if self._error is not None:
            raise self._error
        buffer, start = self._buffer, self._offset
        if (len(buffer) - start >= 4 and self._fixed_header is None
                and self.protocol_version is not None):
            # the commonest packets, decoded here without the general path (which validates
            # them the same way, and raises for what is wrong with them)
            first_byte = buffer[start]
            length = buffer[start + 1]
            if length == 2:  # a bare PUBACK/PUBREC/PUBREL/PUBCOMP?
                packet_id = buffer[start + 2] << 8 | buffer[start + 3]
                if first_byte in BARE_ACKS and packet_id:
                    self._offset = start + 4
                    return first_byte << 16 | packet_id
            elif first_byte & 0xF8 == 0x30 and first_byte & 0x06 != 0x06:
                parts = self._plain_publish(first_byte, length)
                if parts is not None:
                    return parts
        try:
            item = self._next_packet()
        except MqttProtocolError as error:
            self._error = error
            raise
        if item is None and self._offset == len(self._buffer) and self._offset:
            # all of it decoded: its bytes go now, not at the next read (an idle connection
            # keeps none of what it last read)
            self._buffer = b""
            self._offset = 0
        return item

    def more_bare_acks(self, first_byte: int, packet_id: int) -> list[int]:
        """``packet_id``, of the bare acknowledgement :meth:`next_item` just gave, and the
        packet ids of the bare acknowledgements with the same ``first_byte`` right after it
        in the buffer, taken: a client's run of PUBACKs (or PUBRECs, PUBCOMPs) is handled
        as one batch. A packet id 0 ends the run (:meth:`next_item` raises for it)."""
        packet_ids = [packet_id]
        buffer, start = self._buffer, self._offset
        last = len(buffer) - 4
        while start <= last and buffer[start] == first_byte and buffer[start + 1] == 2:
            packet_id = buffer[start + 2] << 8 | buffer[start + 3]
            if not packet_id:
                break
            packet_ids.append(packet_id)
            start += 4
        self._offset = start
        return packet_ids

    def encode(self, packet: Packet) -> bytes:
        """The packet's bytes under this connection's protocol version.

        Raises ValueError for a packet this side may not send in this version,
        or before the version is known (no CONNECT yet).
        """
        packet_class = type(packet)
        if (packet_class in BARE_ACK_FIRST_BYTES and self._encoding_version is not None
                and packet.reason_code == ReasonCode.SUCCESS and not packet.properties):
            # a successful acknowledgement is its packet id in either version (MQTT 5 3.4.2.1)
            return BARE_ACK_FIRST_BYTES[packet_class] + encode_uint16(packet.packet_id)
        if self._client_side and isinstance(packet, Connect):
            if packet.protocol_version not in (MQTT_3_1_1, MQTT_5):
                raise ValueError(f"cannot speak protocol version {packet.protocol_version}")
            self.protocol_version = self._encoding_version = packet.protocol_version
        version = self._encoding_version
        if version is None:
            raise ValueError("the protocol version is unknown until CONNECT")
        if not may_send(packet_class, self._client_side, version):
            side = "client" if self._client_side else "server"
            raise ValueError(f"a {side} cannot send {packet_name(packet_class)} "
                             f"in protocol version {version}")
        flags, body = self._encode_body(packet)
        if len(body) > MAX_VARIABLE_BYTE_INTEGER:
            raise ValueError("packet exceeds the maximum MQTT packet size")
        first_byte = PACKET_TYPE_NUMBERS[packet_class] << 4 | flags
        return bytes((first_byte,)) + encode_variable_byte_integer(len(body)) + body

    def encode_plain_publish(self, topic: str, payload: bytes, retain: bool) -> bytes:
        """A QoS 0 PUBLISH without properties, joined straight from its parts: the packet
        a router sends most (a fan-out's shared bytes, each event of a retained backlog),
        without building a :class:`Publish` and its body."""
        name = topic.encode("utf-8")
        size = len(name)
        properties = b"\0" if self._encoding_version == MQTT_5 else b""
        length = 2 + size + len(properties) + len(payload)
        if length < 128:  # a one-byte remaining length: the commonest small message
            return _SMALL_PUBLISH_HEAD(0x31 if retain else 0x30, length, size) + name \
                + properties + payload
        if size > 0xFFFF or length > MAX_VARIABLE_BYTE_INTEGER:
            raise ValueError("packet exceeds the maximum MQTT packet size")
        return b"".join((_PLAIN_PUBLISH_FIRST_BYTES[retain], encode_variable_byte_integer(length),
                         size.to_bytes(2, "big"), name, properties, payload))

    def encode_publish_template(self, topic: str, payload: bytes, qos: int, retain: bool,
                                dup: bool, properties: Properties) -> tuple[bytes, bytes]:
        """A QoS 1/2 PUBLISH split around its packet identifier: the packet with id ``n`` is
        ``head + n.to_bytes(2, "big") + tail``, so one encoding serves every receiver.
        Without properties (or in MQTT 3.1.1) joined straight from the parts."""
        if properties and self._encoding_version == MQTT_5:
            data = self.encode(Publish(topic, payload, qos, retain, dup, 1, properties))
            _, body_start = decode_variable_byte_integer(data, 1)
            cut = body_start + 2 + len(topic.encode("utf-8"))
            return data[:cut], data[cut + 2:]
        if qos not in (1, 2):
            raise ValueError("a PUBLISH has a packet identifier exactly when its QoS is 1 or 2")
        name = topic.encode("utf-8")
        size = len(name)
        tail = b"\0" + payload if self._encoding_version == MQTT_5 else payload
        length = 4 + size + len(tail)
        if size > 0xFFFF or length > MAX_VARIABLE_BYTE_INTEGER:
            raise ValueError("packet exceeds the maximum MQTT packet size")
        first_byte = 0x30 | dup << 3 | qos << 1 | retain
        return (b"".join((bytes((first_byte,)), encode_variable_byte_integer(length),
                          size.to_bytes(2, "big"), name)), tail)

    # --- framing --------------------------------------------------------------------------

    def _next_packet(self) -> Packet | None:
        buffer, start = self._buffer, self._offset
        if self._fixed_header is None:
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
        return self._decode_body(PACKET_CLASSES[first_byte >> 4], first_byte & 0x0F,
                                 Reader(body))

    def _plain_publish(self, first_byte: int, length: int) -> PublishParts | None:
        """A whole PUBLISH without DUP and properties, with a remaining length of one or
        two bytes, taken straight from the buffer; None for any other (the general path
        decodes it, or raises for what is wrong with it)."""
        buffer, start = self._buffer, self._offset
        position = start + 2
        if length & 0x80:
            second = buffer[position]
            if second & 0x80:
                return None
            length = length & 0x7F | second << 7
            position += 1
        end = position + length
        if end > len(buffer) or length < 2 or (self.max_packet_size is not None
                                               and end - start > self.max_packet_size):
            return None
        topic_end = position + 2 + (buffer[position] << 8 | buffer[position + 1])
        qos = first_byte >> 1 & 0b11
        body = topic_end + 2 if qos else topic_end
        if self.protocol_version == MQTT_5:
            if body >= end or buffer[body]:  # property length 0, or properties
                return None
            body += 1
        elif body > end:
            return None
        packet_id = None
        if qos:
            packet_id = buffer[topic_end] << 8 | buffer[topic_end + 1]
            if not packet_id:
                return None
        name = buffer[position + 2:topic_end]
        if type(name) is not bytes:  # (a bytearray buffer: a packet spanned reads)
            name = bytes(name)
        topic = _TOPIC_NAMES.get(name)
        if topic is None:
            topic = _plain_topic_name(name)
            if topic is None:
                return None
        self._offset = end
        payload = buffer[body:end]
        if type(payload) is not bytes:  # (not bytes(): ~200 ns even when it is bytes)
            payload = bytes(payload)
        return topic, payload, qos, first_byte & 1 == 1, packet_id

    def _read_fixed_header(self) -> tuple[int, int, int] | None:
        """(first byte, header length, body length) once complete; rejects bad headers early."""
        buffer, start = self._buffer, self._offset
        if len(buffer) <= start:
            return None
        first_byte = buffer[start]
        self._check_packet_type_and_flags(first_byte >> 4, first_byte & 0x0F)
        decoded = decode_variable_byte_integer(buffer, start + 1)
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
        packet_class = PACKET_CLASSES.get(type_number)
        version = self.protocol_version
        if packet_class is None or (packet_class is Auth and version == MQTT_3_1_1):
            raise malformed(f"reserved packet type {type_number}")
        client_side = self._client_side  # (a class attribute: read once)
        if client_side:
            if version is None:
                raise protocol_error("the server spoke before CONNECT was sent")
        elif version is None and packet_class is not Connect:
            raise protocol_error("the first packet must be CONNECT")
        elif version is not None and packet_class is Connect:
            raise protocol_error("CONNECT sent twice")
        if not may_send(packet_class, not client_side, version):
            raise protocol_error(f"{packet_name(packet_class)} may not be sent by the "
                                  f"{'server' if client_side else 'client'}")
        if packet_class is Publish:
            qos = flags >> 1 & 0b11
            if qos == 3:
                raise malformed("PUBLISH with QoS 3")
            if qos == 0 and flags & 0b1000:
                raise malformed("PUBLISH with QoS 0 has the DUP flag set")
        elif flags != REQUIRED_FLAGS.get(packet_class, 0):
            raise malformed(f"invalid fixed header flags {flags:#06b} for "
                             f"{packet_name(packet_class)}")

    # --- decoding -------------------------------------------------------------------------

    def _decode_body(self, packet_class: type, flags: int, reader: Reader) -> Packet:
        if packet_class is Publish:
            return self._decode_publish(flags, reader)
        if packet_class in ACKS:
            packet_id = read_packet_id(reader)
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

    def _properties(self, reader: Reader, packet_class: type) -> Properties:
        return read_properties(reader, packet_class) if self.protocol_version == MQTT_5 else {}

    def _read_reason_and_properties(self, reader: Reader,
                                    packet_class: type) -> tuple[int, Properties]:
        """MQTT 5 may omit a trailing property length (no properties) and reason code (0)."""
        reason_code: int = ReasonCode.SUCCESS
        properties: Properties = {}
        if self.protocol_version == MQTT_5:
            if not reader.at_end():
                reason_code = read_reason_code(reader, packet_class)
            if not reader.at_end():
                properties = read_properties(reader, packet_class)
        reader.expect_end(packet_class)
        return reason_code, properties

    def _decode_connect(self, reader: Reader) -> Connect:
        protocol_name = reader.string()
        version = reader.byte()
        if protocol_name not in ("MQTT", "MQIsdp"):
            raise protocol_error(f"unknown protocol name {protocol_name!r}")
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
                               reader: Reader) -> Connect:
        connect_flags = reader.byte()
        if connect_flags & 0x01:
            raise malformed("reserved CONNECT flag is set")
        has_will = bool(connect_flags & 0x04)
        will_qos = connect_flags >> 3 & 0b11
        will_retain = bool(connect_flags & 0x20)
        has_password = bool(connect_flags & 0x40)
        has_username = bool(connect_flags & 0x80)
        if will_qos == 3:
            raise malformed("will QoS 3")
        if not has_will and (will_qos or will_retain):
            raise malformed("will QoS or will retain set without the will flag")
        if version == MQTT_3_1_1 and has_password and not has_username:
            raise malformed("password without user name in MQTT 3.1.1")
        keep_alive = reader.uint16()
        properties = read_properties(reader, Connect) if version == MQTT_5 else {}
        client_id = reader.string()
        will = None
        if has_will:
            will_properties = read_properties(reader, Will) if version == MQTT_5 else {}
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

    def _decode_connack(self, reader: Reader) -> Connack:
        acknowledge_flags = reader.byte()
        if acknowledge_flags & 0xFE:
            raise malformed("reserved CONNACK flags are set")
        session_present = bool(acknowledge_flags)
        if self.protocol_version == MQTT_5:
            reason_code = read_reason_code(reader, Connack)
        else:
            return_code = reader.byte()
            if return_code not in CONNACK_RETURN_CODES:
                raise malformed(f"reserved CONNACK return code {return_code}")
            reason_code = CONNACK_RETURN_CODES[return_code]
        properties = self._properties(reader, Connack)
        reader.expect_end(Connack)
        if session_present and reason_code != ReasonCode.SUCCESS:
            raise protocol_error("session present on a refused connection")
        return Connack(session_present, reason_code, properties)

    def _decode_publish(self, flags: int, reader: Reader) -> Publish:
        qos = flags >> 1 & 0b11
        topic = reader.string()
        packet_id = read_packet_id(reader) if qos else None
        properties = self._properties(reader, Publish)
        if "+" in topic or "#" in topic:
            raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID,
                                    f"wildcard in topic name {topic!r}")
        if not topic and "topic_alias" not in properties:
            raise protocol_error("empty topic name without a topic alias")
        return Publish(topic, reader.rest(), qos, bool(flags & 0b0001), bool(flags & 0b1000),
                       packet_id, properties)

    def _decode_subscribe(self, reader: Reader) -> Subscribe:
        packet_id = read_packet_id(reader)
        properties = self._properties(reader, Subscribe)
        if reader.at_end():
            raise protocol_error("SUBSCRIBE without topic filters")
        subscriptions = self._subscriptions(reader)
        return Subscribe(packet_id, subscriptions if self._lazy_filters else list(subscriptions),
                         properties)

    def _subscriptions(self, reader: Reader) -> Iterator[tuple[str, SubscriptionOptions]]:
        while not reader.at_end():
            topic_filter = reader.string()
            options = self._decode_subscription_options(reader.byte(), topic_filter)
            yield _checked_filter(topic_filter), options

    def _decode_subscription_options(self, options: int, topic_filter: str) -> SubscriptionOptions:
        reserved_bits = 0b11000000 if self.protocol_version == MQTT_5 else 0b11111100
        if options & reserved_bits:
            raise malformed("reserved subscription option bits are set")
        qos = options & 0b11
        no_local = bool(options & 0b100)
        retain_handling = options >> 4 & 0b11
        if qos == 3:
            raise protocol_error("subscription with maximum QoS 3")
        if retain_handling == 3:
            raise protocol_error("retain handling 3")
        if no_local and _is_shared_subscription(topic_filter):
            raise protocol_error("no local on a shared subscription")
        return SubscriptionOptions(qos, no_local, bool(options & 0b1000), retain_handling)

    def _decode_suback(self, reader: Reader) -> Suback:
        packet_id = read_packet_id(reader)
        properties = self._properties(reader, Suback)
        if self.protocol_version == MQTT_5:
            reason_codes = []
            while not reader.at_end():
                reason_codes.append(read_reason_code(reader, Suback))
        else:
            reason_codes = list(reader.rest())
            if not SUBACK_3_1_1_CODES.issuperset(reason_codes):
                raise malformed("SUBACK return codes must be 0, 1, 2 or 0x80")
        return Suback(packet_id, reason_codes, properties)

    def _decode_unsubscribe(self, reader: Reader) -> Unsubscribe:
        packet_id = read_packet_id(reader)
        properties = self._properties(reader, Unsubscribe)
        if reader.at_end():
            raise protocol_error("UNSUBSCRIBE without topic filters")
        topic_filters = _topic_filters(reader)
        return Unsubscribe(packet_id, topic_filters if self._lazy_filters else list(topic_filters),
                           properties)

    def _decode_unsuback(self, reader: Reader) -> Unsuback:
        packet_id = read_packet_id(reader)
        properties = self._properties(reader, Unsuback)
        reason_codes = []
        if self.protocol_version == MQTT_5:  # MQTT 3.1.1 UNSUBACK has no payload
            while not reader.at_end():
                reason_codes.append(read_reason_code(reader, Unsuback))
        reader.expect_end(Unsuback)
        return Unsuback(packet_id, reason_codes, properties)

    # --- encoding -------------------------------------------------------------------------

    def _encode_body(self, packet: Packet) -> tuple[int, bytes]:
        """(fixed header flags, variable header + payload)."""
        if isinstance(packet, Publish):
            return self._encode_publish(packet)
        if isinstance(packet, ACKS):
            flags = REQUIRED_FLAGS.get(type(packet), 0)
            return flags, encode_uint16(packet.packet_id) + self._encode_reason_and_properties(
                packet.reason_code, packet.properties, type(packet))
        if isinstance(packet, Subscribe):
            return 0b0010, self._encode_subscribe(packet)
        if isinstance(packet, Suback):
            return 0, self._encode_suback(packet)
        if isinstance(packet, Unsubscribe):
            return 0b0010, (encode_uint16(packet.packet_id)
                            + self._encode_properties(packet.properties, Unsubscribe)
                            + b"".join(map(encode_string, packet.topic_filters)))
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
            return encode_properties(properties, packet_class)
        return b""

    def _encode_reason_and_properties(self, reason_code: int, properties: Properties,
                                      packet_class: type) -> bytes:
        """The shortest MQTT 5 form: trailing defaults (no properties, code 0) are omitted."""
        if self._encoding_version != MQTT_5:
            return b""
        check_reason_code(reason_code, packet_class)
        if properties:
            return bytes((reason_code,)) + encode_properties(properties, packet_class)
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
        body = bytearray(encode_string(packet.protocol_name))
        body += bytes((packet.protocol_version, connect_flags))
        body += encode_uint16(packet.keep_alive)
        body += self._encode_properties(packet.properties, Connect)
        body += encode_string(packet.client_id)
        if will is not None:
            body += self._encode_properties(will.properties, Will)
            body += encode_string(will.topic) + encode_binary(will.payload)
        if packet.username is not None:
            body += encode_string(packet.username)
        if packet.password is not None:
            body += encode_binary(packet.password)
        return bytes(body)

    def _encode_connack(self, packet: Connack) -> bytes:
        if self._encoding_version == MQTT_5:
            check_reason_code(packet.reason_code, Connack)
            code = packet.reason_code
        else:
            code = CONNACK_RETURN_CODE_FOR.get(packet.reason_code)
            if code is None:
                raise ValueError(f"MQTT 3.1.1 has no CONNACK return code for "
                                 f"0x{packet.reason_code:02X}: close without CONNACK")
        return (bytes((int(packet.session_present), code))
                + self._encode_properties(packet.properties, Connack))

    def _encode_publish(self, packet: Publish) -> tuple[int, bytes]:
        if (packet.qos > 0) != (packet.packet_id is not None):
            raise ValueError("a PUBLISH has a packet identifier exactly when its QoS is 1 or 2")
        flags = packet.dup << 3 | packet.qos << 1 | packet.retain
        body = bytearray(encode_string(packet.topic))
        if packet.packet_id is not None:
            body += encode_uint16(packet.packet_id)
        body += self._encode_properties(packet.properties, Publish)
        body += packet.payload
        return flags, bytes(body)

    def _encode_subscribe(self, packet: Subscribe) -> bytes:
        body = bytearray(encode_uint16(packet.packet_id))
        body += self._encode_properties(packet.properties, Subscribe)
        for topic_filter, options in packet.subscriptions:
            options_byte = options.qos
            if self._encoding_version == MQTT_5:
                options_byte |= (options.no_local << 2 | options.retain_as_published << 3
                                 | options.retain_handling << 4)
            body += encode_string(topic_filter) + bytes((options_byte,))
        return bytes(body)

    def _encode_suback(self, packet: Suback) -> bytes:
        if self._encoding_version == MQTT_5:
            for reason_code in packet.reason_codes:
                check_reason_code(reason_code, Suback)
            codes = packet.reason_codes
        else:  # every MQTT 5 failure code is 3.1.1's single failure code 0x80
            codes = [code if code < 0x80 else 0x80 for code in packet.reason_codes]
        return (encode_uint16(packet.packet_id)
                + self._encode_properties(packet.properties, Suback) + bytes(codes))

    def _encode_unsuback(self, packet: Unsuback) -> bytes:
        body = encode_uint16(packet.packet_id)
        if self._encoding_version != MQTT_5:
            return body
        for reason_code in packet.reason_codes:
            check_reason_code(reason_code, Unsuback)
        return (body + encode_properties(packet.properties, Unsuback)
                + bytes(packet.reason_codes))


class MqttCodec(ServerCodec):
    """The codec of either side: server side by default; ``client_side=True`` swaps the
    directions (for tests and clients), the version then taken from the CONNECT it encodes.
    ``lazy_filters``: the filters of a SUBSCRIBE or UNSUBSCRIBE are an iterator (as a
    :class:`ServerCodec`'s); else they are decoded at once, a list."""

    __slots__ = ("_client_side", "_lazy_filters")

    def __init__(self, *, client_side: bool = False, max_packet_size: int | None = None,
                 lazy_filters: bool = False) -> None:
        super().__init__(max_packet_size=max_packet_size)
        self._client_side = client_side
        self._lazy_filters = lazy_filters
