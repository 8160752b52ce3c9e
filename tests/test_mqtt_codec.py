"""The sans-I/O MQTT codec: round trips, spec byte vectors, validation errors, topic matching.

The property table, reason code sets and byte layouts below are written out
from the MQTT 3.1.1 and 5.0 specifications on purpose: they are the oracle the
codec's own tables are checked against.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from router.core.topic import filter_matches, from_mqtt, valid_topic_filter, valid_topic_name
from router.mqtt import codec as codec_module
from router.mqtt.codec import MqttCodec
from router.mqtt.primitives import MqttProtocolError
from router.mqtt.packets import (Auth, Connack, Connect, Disconnect, Packet, Pingreq, Pingresp,
                                 Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Suback,
                                 Subscribe, SubscriptionOptions, Unsuback, Unsubscribe, Will)

MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
UNSUPPORTED_PROTOCOL_VERSION = 0x84
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95

# --- helpers ----------------------------------------------------------------------------


def connected_pair(version: int) -> tuple[MqttCodec, MqttCodec]:
    """A client codec and a server codec that has accepted the client's CONNECT."""
    client, server = MqttCodec(client_side=True), MqttCodec()
    server.receive_data(client.encode(Connect(protocol_version=version, client_id="c")))
    assert isinstance(server.next_packet(), Connect)
    return client, server


def decode_in_chunks(codec: MqttCodec, stream: bytes, cuts: list[int]) -> list[Packet]:
    """Feed ``stream`` split at ``cuts`` and collect every packet, as a transport would."""
    packets = []
    bounds = [0, *sorted(cuts), len(stream)]
    for start, end in zip(bounds, bounds[1:]):
        codec.receive_data(stream[start:end])
        while (packet := codec.next_packet()) is not None:
            packets.append(packet)
    return packets


def frame(first_byte: int, body: bytes) -> bytes:
    """A packet with a one-byte remaining length (bodies under 128 bytes)."""
    assert len(body) < 128
    return bytes((first_byte, len(body))) + body


def string(text: bytes) -> bytes:
    return len(text).to_bytes(2, "big") + text


def properties_section(raw: bytes) -> bytes:
    assert len(raw) < 128
    return bytes((len(raw),)) + raw


def error_from(codec: MqttCodec, data: bytes) -> MqttProtocolError:
    codec.receive_data(data)
    with pytest.raises(MqttProtocolError) as caught:
        codec.next_packet()
    return caught.value


def server_error(data: bytes, version: int | None = None) -> MqttProtocolError:
    """The error a server codec raises for ``data`` (sent after a CONNECT of ``version``)."""
    server = connected_pair(version)[1] if version else MqttCodec()
    return error_from(server, data)


def client_error(data: bytes, version: int) -> MqttProtocolError:
    """The error a client codec that sent a CONNECT of ``version`` raises for ``data``."""
    return error_from(connected_pair(version)[0], data)


def connect_bytes(version: int = 4, flags: int = 0x02, rest: bytes = b"\x00\x01c",
                  name: bytes = b"MQTT") -> bytes:
    """A CONNECT with keep alive 10; ``rest`` follows it (in MQTT 5: the properties first)."""
    return frame(0x10, string(name) + bytes((version, flags)) + b"\x00\x0a" + rest)


# --- the spec's property table (MQTT 5 section 2.2.2.2), as test oracle --------------------

ACKS = (Puback, Pubrec, Pubrel, Pubcomp)
WITH_REASON_STRING = (Connack, *ACKS, Suback, Unsuback, Disconnect, Auth)

SPEC_PROPERTIES = {
    "payload_format_indicator": (0x01, "byte", (Publish, Will)),
    "message_expiry_interval": (0x02, "four", (Publish, Will)),
    "content_type": (0x03, "string", (Publish, Will)),
    "response_topic": (0x08, "string", (Publish, Will)),
    "correlation_data": (0x09, "binary", (Publish, Will)),
    "subscription_identifier": (0x0B, "varint", (Publish, Subscribe)),
    "session_expiry_interval": (0x11, "four", (Connect, Connack, Disconnect)),
    "assigned_client_identifier": (0x12, "string", (Connack,)),
    "server_keep_alive": (0x13, "two", (Connack,)),
    "authentication_method": (0x15, "string", (Connect, Connack, Auth)),
    "authentication_data": (0x16, "binary", (Connect, Connack, Auth)),
    "request_problem_information": (0x17, "byte", (Connect,)),
    "will_delay_interval": (0x18, "four", (Will,)),
    "request_response_information": (0x19, "byte", (Connect,)),
    "response_information": (0x1A, "string", (Connack,)),
    "server_reference": (0x1C, "string", (Connack, Disconnect)),
    "reason_string": (0x1F, "string", WITH_REASON_STRING),
    "receive_maximum": (0x21, "two", (Connect, Connack)),
    "topic_alias_maximum": (0x22, "two", (Connect, Connack)),
    "topic_alias": (0x23, "two", (Publish,)),
    "maximum_qos": (0x24, "byte", (Connack,)),
    "retain_available": (0x25, "byte", (Connack,)),
    "user_property": (0x26, "pair", (Connect, Will, Publish, Subscribe, Unsubscribe,
                                     *WITH_REASON_STRING)),
    "maximum_packet_size": (0x27, "four", (Connect, Connack)),
    "wildcard_subscription_available": (0x28, "byte", (Connack,)),
    "subscription_identifier_available": (0x29, "byte", (Connack,)),
    "shared_subscription_available": (0x2A, "byte", (Connack,)),
}

SPEC_REASON_CODES = {
    Connack: [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
              0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F],
    Puback: [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99],
    Pubrec: [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99],
    Pubrel: [0x00, 0x92],
    Pubcomp: [0x00, 0x92],
    Suback: [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2],
    Unsuback: [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91],
    Disconnect: [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90,
                 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F,
                 0xA0, 0xA1, 0xA2],
    Auth: [0x00, 0x18, 0x19],
}

# --- strategies ---------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
levels = st.text(st.characters(codec="utf-8", exclude_characters="\x00/+#"), max_size=6)
topic_names = st.lists(levels, min_size=1, max_size=4).map("/".join).filter(bool)
topic_filters = st.builds(
    lambda parts, multi_level: "/".join(parts + ["#"] * multi_level),
    st.lists(st.one_of(levels, st.just("+")), max_size=4), st.booleans(),
).filter(lambda topic_filter: topic_filter and not topic_filter.startswith("$share/"))
packet_ids = st.integers(1, 0xFFFF)

PROPERTY_VALUES = {
    "byte": st.integers(0, 1),
    "two": st.integers(1, 0xFFFF),
    "four": st.integers(1, 0xFFFFFFFF),
    "varint": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    "string": texts,
    "binary": st.binary(max_size=12),
    "pair": st.lists(st.tuples(texts, texts), min_size=1, max_size=3),
}


@st.composite
def properties(draw, version: int, packet_class: type) -> dict:
    if version == 4:
        return {}
    allowed = [name for name, (_, _, packets) in SPEC_PROPERTIES.items()
               if packet_class in packets]
    chosen = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=5))
    values = {name: draw(PROPERTY_VALUES[SPEC_PROPERTIES[name][1]]) for name in chosen}
    if packet_class is Subscribe and "subscription_identifier" in values:
        values["subscription_identifier"] = values["subscription_identifier"][:1]
    if "authentication_data" in values:
        values.setdefault("authentication_method", draw(texts))
    return values


def reason_codes_for(version: int, packet_class: type) -> st.SearchStrategy[int]:
    return st.sampled_from(SPEC_REASON_CODES[packet_class]) if version == 5 else st.just(0)


@st.composite
def connects(draw, version: int) -> Connect:
    will = draw(st.none() | st.builds(Will, topic_names, st.binary(max_size=12),
                                      st.integers(0, 2), st.booleans(), properties(version, Will)))
    username = draw(st.none() | texts)
    password = draw(st.none() | st.binary(max_size=12))
    client_id = draw(texts)
    clean_start = draw(st.booleans())
    if version == 4:
        if username is None:
            password = None
        clean_start = clean_start or not client_id
    return Connect("MQTT", version, clean_start, draw(st.integers(0, 0xFFFF)), client_id, will,
                   username, password, draw(properties(version, Connect)))


@st.composite
def connacks(draw, version: int) -> Connack:
    if version == 5:
        reason_code = draw(st.sampled_from(SPEC_REASON_CODES[Connack]))
    else:
        reason_code = draw(st.sampled_from([0x00, 0x84, 0x85, 0x88, 0x86, 0x87]))
    session_present = reason_code == 0 and draw(st.booleans())
    return Connack(session_present, reason_code, draw(properties(version, Connack)))


@st.composite
def publishes(draw, version: int) -> Publish:
    qos = draw(st.integers(0, 2))
    packet_properties = draw(properties(version, Publish))
    topic = draw(topic_names | st.just("")) if version == 5 else draw(topic_names)
    if not topic:
        packet_properties["topic_alias"] = draw(st.integers(1, 0xFFFF))
    return Publish(topic, draw(st.binary(max_size=40)), qos, draw(st.booleans()),
                   qos > 0 and draw(st.booleans()), draw(packet_ids) if qos else None,
                   packet_properties)


def acks(version: int, packet_class: type) -> st.SearchStrategy:
    return st.builds(packet_class, packet_ids, reason_codes_for(version, packet_class),
                     properties(version, packet_class))


def subscribes(version: int) -> st.SearchStrategy[Subscribe]:
    if version == 5:
        options = st.builds(SubscriptionOptions, st.integers(0, 2), st.booleans(), st.booleans(),
                            st.integers(0, 2))
    else:
        options = st.builds(SubscriptionOptions, st.integers(0, 2))
    return st.builds(Subscribe, packet_ids,
                     st.lists(st.tuples(topic_filters, options), min_size=1, max_size=4),
                     properties(version, Subscribe))


def subacks(version: int) -> st.SearchStrategy[Suback]:
    codes = st.sampled_from(SPEC_REASON_CODES[Suback] if version == 5 else [0, 1, 2, 0x80])
    return st.builds(Suback, packet_ids, st.lists(codes, min_size=1, max_size=4),
                     properties(version, Suback))


def unsubscribes(version: int) -> st.SearchStrategy[Unsubscribe]:
    return st.builds(Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=4),
                     properties(version, Unsubscribe))


def unsubacks(version: int) -> st.SearchStrategy[Unsuback]:
    if version == 4:
        return st.builds(Unsuback, packet_ids)
    return st.builds(Unsuback, packet_ids,
                     st.lists(st.sampled_from(SPEC_REASON_CODES[Unsuback]), min_size=1,
                              max_size=4), properties(version, Unsuback))


def reason_only(version: int, packet_class: type) -> st.SearchStrategy:
    return st.builds(packet_class, reason_codes_for(version, packet_class),
                     properties(version, packet_class))


def client_packets(version: int) -> st.SearchStrategy[Packet]:
    choices = [publishes(version), *(acks(version, ack) for ack in ACKS), subscribes(version),
               unsubscribes(version), st.just(Pingreq()), reason_only(version, Disconnect)]
    if version == 5:
        choices.append(reason_only(version, Auth))
    return st.one_of(choices)


def server_packets(version: int) -> st.SearchStrategy[Packet]:
    choices = [connacks(version), publishes(version), *(acks(version, ack) for ack in ACKS),
               subacks(version), unsubacks(version), st.just(Pingresp())]
    if version == 5:
        choices += [reason_only(version, Disconnect), reason_only(version, Auth)]
    return st.one_of(choices)


def cuts_for(stream: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(stream)), max_size=12)


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
@given(data=st.data())
def test_connect_round_trips_in_any_chunking(version, data):
    connect = data.draw(connects(version))
    client, server = MqttCodec(client_side=True), MqttCodec()
    stream = client.encode(connect)
    assert decode_in_chunks(server, stream, data.draw(cuts_for(stream))) == [connect]
    assert server.protocol_version == client.protocol_version == version


@pytest.mark.parametrize("version", [4, 5])
@given(data=st.data())
def test_client_packets_round_trip_in_any_chunking(version, data):
    client, server = connected_pair(version)
    packets = data.draw(st.lists(client_packets(version), min_size=1, max_size=4))
    stream = b"".join(map(client.encode, packets))
    assert decode_in_chunks(server, stream, data.draw(cuts_for(stream))) == packets


@pytest.mark.parametrize("version", [4, 5])
@given(data=st.data())
def test_server_packets_round_trip_in_any_chunking(version, data):
    client, server = connected_pair(version)
    packets = data.draw(st.lists(server_packets(version), min_size=1, max_size=4))
    stream = b"".join(map(server.encode, packets))
    assert decode_in_chunks(client, stream, data.draw(cuts_for(stream))) == packets


@pytest.mark.parametrize("version", [4, 5])
@given(data=st.data())
def test_a_publish_template_takes_any_packet_id(version, data):
    client, server = connected_pair(version)
    packet = data.draw(publishes(version).filter(lambda p: p.qos > 0))
    head, tail = server.encode_publish_template(packet.topic, packet.payload, packet.qos,
                                                packet.retain, packet.dup, packet.properties)
    packet_id = data.draw(packet_ids)
    stream = head + packet_id.to_bytes(2, "big") + tail
    assert decode_in_chunks(client, stream, []) == [replace(packet, packet_id=packet_id)]


@pytest.mark.parametrize("version", [4, 5])
def test_the_read_loop_gets_plain_publishes_and_bare_acks_without_packet_objects(version):
    client, server = connected_pair(version)
    with_properties = Publish("a", b"z", 0, properties={"content_type": "t"})
    packets = [Publish("a/b", b"x" * 200, 1, True, packet_id=7), Publish("a", b"", 0),
               Puback(7), Pubrec(8), Pubrel(9), Pubcomp(10),
               Publish("a", b"y", 1, dup=True, packet_id=3), Puback(7, 0x10), with_properties]
    server.receive_data(b"".join(map(client.encode, packets)))
    items = []
    while (item := server.next_item()) is not None:
        items.append(item)
    assert items == [("a/b", b"x" * 200, 1, True, 7), ("a", b"", 0, False, None),
                     0x40 << 16 | 7, 0x50 << 16 | 8, 0x62 << 16 | 9, 0x70 << 16 | 10,
                     Publish("a", b"y", 1, dup=True, packet_id=3),
                     Puback(7, 0x10) if version == 5 else 0x40 << 16 | 7,  # 3.1.1: no code
                     with_properties if version == 5 else ("a", b"z", 0, False, None)]


@pytest.mark.parametrize("version", [4, 5])
def test_a_run_of_bare_acks_of_one_kind_is_taken_as_one_batch(version):
    client, server = connected_pair(version)
    packets = [Puback(1), Puback(2), Puback(3), Pubrec(4), Puback(5), Puback(6), Puback(7, 0x10),
               Pubcomp(8)]
    stream = b"".join(map(client.encode, packets))
    server.receive_data(stream + client.encode(Pubcomp(9))[:3])  # PUBCOMP 9 incomplete
    assert server.next_item() == 0x40 << 16 | 1
    assert server.more_bare_acks(0x40, 1) == [1, 2, 3]  # a PUBREC ends the run
    assert server.next_item() == 0x50 << 16 | 4
    assert server.more_bare_acks(0x50, 4) == [4]
    assert server.next_item() == 0x40 << 16 | 5
    # MQTT 5: a reason code makes PUBACK 7 a packet of its own; 3.1.1 has none to send
    assert server.more_bare_acks(0x40, 5) == ([5, 6] if version == 5 else [5, 6, 7])
    if version == 5:
        assert server.next_item() == Puback(7, 0x10)
    assert server.next_item() == 0x70 << 16 | 8
    assert server.more_bare_acks(0x70, 8) == [8]  # not the incomplete one after it
    assert server.next_item() is None
    server.receive_data(client.encode(Pubcomp(9))[3:])
    assert server.next_item() == Pubcomp(9)  # (one that spans reads: the general path)


def test_a_packet_id_0_ends_a_run_of_bare_acks_and_is_refused():
    client, server = connected_pair(4)
    server.receive_data(client.encode(Puback(1)) + b"\x40\x02\x00\x00")
    assert server.next_item() == 0x40 << 16 | 1
    assert server.more_bare_acks(0x40, 1) == [1]
    with pytest.raises(MqttProtocolError):
        server.next_item()


def test_the_read_loop_decodes_a_topic_name_once_and_keeps_a_bounded_few():
    """A topic name the fast path took before comes back as the same string (not decoded
    and checked again); the names kept are bounded; a name the fast path refuses is still
    refused by the general path, whatever was kept before."""
    client, server = connected_pair(4)
    stream = b"".join(client.encode(Publish("a/b", bytes([n]), 0)) for n in range(2))
    server.receive_data(stream)
    first, second = server.next_item(), server.next_item()
    assert first == ("a/b", b"\0", 0, False, None) and first[0] is second[0]
    for n in range(codec_module.TOPIC_NAMES_KEPT + 10):
        server.receive_data(client.encode(Publish(f"t/{n}", b"", 0)))
        assert server.next_item()[0] == f"t/{n}"
    assert 0 < len(codec_module._TOPIC_NAMES) <= codec_module.TOPIC_NAMES_KEPT
    server.receive_data(b"\x30\x05\x00\x03a/+")  # a wildcard in a topic name
    with pytest.raises(MqttProtocolError):
        server.next_item()


def test_byte_by_byte_feeding_yields_each_packet_once_complete():
    client, server = connected_pair(5)
    packets = [Publish("a/b", b"x" * 300, 1, packet_id=7), Pingreq(), Disconnect()]
    stream = b"".join(map(client.encode, packets))
    decoded = []
    for index in range(len(stream)):
        server.receive_data(stream[index:index + 1])
        while (packet := server.next_packet()) is not None:
            decoded.append(packet)
    assert decoded == packets


PROPERTY_CARRIERS = {
    Connect: lambda properties: Connect(protocol_version=5, properties=properties),
    Will: lambda properties: Connect(protocol_version=5,
                                     will=Will("t", b"", properties=properties)),
    Connack: lambda properties: Connack(properties=properties),
    Publish: lambda properties: Publish("t", properties=properties),
    Subscribe: lambda properties: Subscribe(1, [("t", SubscriptionOptions())], properties),
    Unsubscribe: lambda properties: Unsubscribe(1, ["t"], properties),
    Suback: lambda properties: Suback(1, [0], properties),
    Unsuback: lambda properties: Unsuback(1, [0], properties),
    Disconnect: lambda properties: Disconnect(properties=properties),
    Auth: lambda properties: Auth(properties=properties),
    **{ack: (lambda properties, ack=ack: ack(1, properties=properties)) for ack in ACKS},
}
"""A packet of each type that carries the given properties (a CONNECT for will properties)."""

EXAMPLE_VALUES = {
    "byte": (1, b"\x01"),
    "two": (0x0102, b"\x01\x02"),
    "four": (0x01020304, b"\x01\x02\x03\x04"),
    "varint": ([200], b"\xc8\x01"),
    "string": ("ab", b"\x00\x02ab"),
    "binary": (b"ab", b"\x00\x02ab"),
    "pair": ([("k", "v")], b"\x00\x01k\x00\x01v"),
}
"""A value of each wire type and its encoding (MQTT 5 section 1.5)."""


def sender_and_receiver(packet_class: type) -> tuple[MqttCodec, MqttCodec]:
    if packet_class in (Connect, Will):
        return MqttCodec(client_side=True), MqttCodec()
    client, server = connected_pair(5)
    return (client, server) if packet_class in (Subscribe, Unsubscribe) else (server, client)


@pytest.mark.parametrize("name, packet_class", [
    (name, packet_class) for name, (_, _, packets) in SPEC_PROPERTIES.items()
    for packet_class in packets])
def test_property_identifier_and_wire_type_follow_the_spec(name, packet_class):
    identifier, wire_type, _ = SPEC_PROPERTIES[name]
    value, encoded_value = EXAMPLE_VALUES[wire_type]
    packet_properties = {name: value}
    if name == "authentication_data":
        packet_properties["authentication_method"] = "m"
    packet = PROPERTY_CARRIERS[packet_class](packet_properties)
    sender, receiver = sender_and_receiver(packet_class)
    stream = sender.encode(packet)
    assert bytes((identifier,)) + encoded_value in stream
    assert decode_in_chunks(receiver, stream, []) == [packet]


def test_properties_outside_their_packet_types_are_refused():
    for name, (_, wire_type, packets) in SPEC_PROPERTIES.items():
        for packet_class in PROPERTY_CARRIERS.keys() - set(packets):
            packet = PROPERTY_CARRIERS[packet_class]({name: EXAMPLE_VALUES[wire_type][0]})
            with pytest.raises(ValueError, match="not allowed"):
                sender_and_receiver(packet_class)[0].encode(packet)


# --- known byte vectors -----------------------------------------------------------------------


def test_minimal_mqtt_3_1_1_connect():
    server = MqttCodec()
    server.receive_data(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a")
    assert server.next_packet() == Connect("MQTT", 4, True, 60, "a")
    assert server.protocol_version == 4
    assert server.encode(Connack()) == b"\x20\x02\x00\x00"


def test_minimal_mqtt_5_connect_and_connack():
    server = MqttCodec()
    server.receive_data(b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01a")
    assert server.next_packet() == Connect("MQTT", 5, True, 60, "a")
    assert server.encode(Connack(True)) == b"\x20\x03\x01\x00\x00"


@pytest.mark.parametrize("version", [4, 5])
def test_ping_packets(version):
    client, server = connected_pair(version)
    assert client.encode(Pingreq()) == b"\xc0\x00"
    assert server.encode(Pingresp()) == b"\xd0\x00"
    server.receive_data(b"\xc0\x00")
    assert server.next_packet() == Pingreq()


def test_mqtt_3_1_1_publish_subscribe_vectors():
    client, server = connected_pair(4)
    vectors = [
        (Publish("a/b", b"hi", 1, packet_id=1), b"\x32\x09\x00\x03a/b\x00\x01hi"),
        (Subscribe(1, [("a/b", SubscriptionOptions(1))]), b"\x82\x08\x00\x01\x00\x03a/b\x01"),
        (Unsubscribe(2, ["a/+"]), b"\xa2\x07\x00\x02\x00\x03a/+"),
        (Pubrel(3), b"\x62\x02\x00\x03"),
        (Disconnect(), b"\xe0\x00"),
    ]
    for packet, encoded in vectors:
        assert client.encode(packet) == encoded
        assert decode_in_chunks(server, encoded, []) == [packet]
    assert server.encode(Suback(1, [1])) == b"\x90\x03\x00\x01\x01"
    assert server.encode(Unsuback(2)) == b"\xb0\x02\x00\x02"


def test_mqtt_5_acks_use_the_shortest_form():
    client, server = connected_pair(5)
    assert server.encode(Puback(7)) == b"\x40\x02\x00\x07"
    assert server.encode(Puback(7, 0x10)) == b"\x40\x03\x00\x07\x10"
    assert server.encode(Puback(7, 0, {"reason_string": "r"})) == (
        b"\x40\x08\x00\x07\x00\x04\x1f\x00\x01r")
    assert server.encode(Disconnect()) == b"\xe0\x00"
    assert server.encode(Disconnect(0x8E)) == b"\xe0\x01\x8e"
    client.receive_data(b"\x40\x04\x00\x07\x10\x00")  # explicit empty property length
    assert client.next_packet() == Puback(7, 0x10)


def test_mqtt_3_1_1_encoding_leaves_out_what_the_version_cannot_carry():
    client, server = connected_pair(4)
    assert server.encode(Puback(7, 0x10, {"reason_string": "r"})) == b"\x40\x02\x00\x07"
    assert server.encode(Publish("t", b"", properties={"topic_alias": 3})) == b"\x30\x03\x00\x01t"
    options = SubscriptionOptions(2, no_local=True, retain_as_published=True, retain_handling=2)
    assert client.encode(Subscribe(1, [("t", options)])) == b"\x82\x06\x00\x01\x00\x01t\x02"
    assert server.encode(Unsuback(1, [0x11], {"reason_string": "r"})) == b"\xb0\x02\x00\x01"


@pytest.mark.parametrize("reason_code, return_code", [
    (ReasonCode.SUCCESS, 0), (ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, 1),
    (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, 2), (ReasonCode.SERVER_UNAVAILABLE, 3),
    (ReasonCode.SERVER_BUSY, 3), (ReasonCode.BAD_USER_NAME_OR_PASSWORD, 4),
    (ReasonCode.NOT_AUTHORIZED, 5), (ReasonCode.BANNED, 5)])
def test_connack_reason_codes_become_3_1_1_return_codes(reason_code, return_code):
    server = connected_pair(4)[1]
    assert server.encode(Connack(False, reason_code)) == bytes((0x20, 2, 0, return_code))


def test_connack_reason_without_3_1_1_return_code_is_refused():
    server = connected_pair(4)[1]
    with pytest.raises(ValueError, match="close without CONNACK"):
        server.encode(Connack(False, ReasonCode.MALFORMED_PACKET))


def test_suback_failures_become_the_3_1_1_failure_code():
    server = connected_pair(4)[1]
    assert server.encode(Suback(1, [0, 2, ReasonCode.NOT_AUTHORIZED])) == (
        b"\x90\x05\x00\x01\x00\x02\x80")


def test_several_user_properties_and_subscription_identifiers_keep_their_order():
    client, server = connected_pair(5)
    packet = Publish("t", properties={"user_property": [("a", "1"), ("a", "2")],
                                      "subscription_identifier": [5, 3]})
    assert decode_in_chunks(client, server.encode(packet), []) == [packet]


# --- remaining length ---------------------------------------------------------------------


@pytest.mark.parametrize("remaining_length, encoded", [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01")])
def test_remaining_length_encoding_boundaries(remaining_length, encoded):
    client, server = connected_pair(4)
    # Topic "t" takes 3 bytes of the body, the payload the rest.
    packet = Publish("t", b"p" * (remaining_length - 3)) if remaining_length else Pingreq()
    stream = client.encode(packet)
    assert stream[1:1 + len(encoded)] == encoded
    assert len(stream) == 1 + len(encoded) + remaining_length
    assert decode_in_chunks(server, stream, [len(stream) // 2]) == [packet]


def test_largest_remaining_length_is_decoded_exactly():
    header = b"\x30\xff\xff\xff\x7f"  # 268,435,455: a total of 268,435,460 bytes
    fits = connected_pair(4)[1]
    fits.max_packet_size = 268_435_460
    fits.receive_data(header)
    assert fits.next_packet() is None
    too_small = connected_pair(4)[1]
    too_small.max_packet_size = 268_435_459
    assert error_from(too_small, header).reason_code == PACKET_TOO_LARGE


def test_largest_variable_byte_integer_is_encoded_in_four_bytes():
    server = connected_pair(5)[1]
    stream = server.encode(Publish("t", properties={"subscription_identifier": [268_435_455]}))
    assert b"\x0b\xff\xff\xff\x7f" in stream
    with pytest.raises(ValueError):
        server.encode(Publish("t", properties={"subscription_identifier": [268_435_456]}))


@pytest.mark.parametrize("header", [b"\x30\xff\xff\xff\xff\x01", b"\x30\xff\xff\xff\xff"])
def test_fifth_remaining_length_byte_is_malformed(header):
    assert server_error(header, 4).reason_code == MALFORMED


def test_non_minimal_remaining_length_is_malformed():
    assert server_error(b"\xc0\x80\x00", 4).reason_code == MALFORMED


# --- maximum packet size --------------------------------------------------------------------


def test_oversized_packet_is_refused_from_its_fixed_header_alone():
    server = connected_pair(5)[1]
    server.max_packet_size = 100
    error = error_from(server, b"\x30\xe8\x07")  # announces 1000 body bytes, none sent
    assert error.reason_code == PACKET_TOO_LARGE
    assert not error.send_connack


def test_packet_of_exactly_the_maximum_size_is_accepted():
    client, server = connected_pair(4)
    stream = client.encode(Publish("t", b"x" * 10))
    server.max_packet_size = len(stream)
    assert decode_in_chunks(server, stream, []) == [Publish("t", b"x" * 10)]
    server.max_packet_size = len(stream) - 1
    assert error_from(server, stream).reason_code == PACKET_TOO_LARGE


def test_oversized_connect_is_refused_before_the_version_is_known():
    server = MqttCodec(max_packet_size=20)
    error = error_from(server, b"\x10\x7f")
    assert (error.reason_code, error.send_connack) == (PACKET_TOO_LARGE, False)


# --- packet order, types, directions and fixed-header flags -------------------------------


def test_first_packet_must_be_connect():
    assert server_error(b"\xc0\x00").reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("version", [4, 5])
def test_second_connect_is_a_protocol_error(version):
    assert server_error(connect_bytes(), version).reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("data, version", [(b"\x00\x00", 4), (b"\x00\x00", 5), (b"\xf0\x00", 4)])
def test_reserved_packet_types_are_malformed(data, version):
    assert server_error(data, version).reason_code == MALFORMED


@pytest.mark.parametrize("data", [b"\x20\x02\x00\x00", b"\x90\x03\x00\x01\x00", b"\xd0\x00",
                                  b"\xb0\x02\x00\x01"])
def test_server_refuses_packets_only_servers_send(data):
    assert server_error(data, 5).reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("data", [b"\xc0\x00", b"\x82\x06\x00\x01\x00\x01t\x00"])
def test_client_refuses_packets_only_clients_send(data):
    assert client_error(data, 5).reason_code == PROTOCOL_ERROR


def test_client_refuses_disconnect_in_3_1_1():
    assert client_error(b"\xe0\x00", 4).reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("data", [
    b"\xc1\x00",                          # PINGREQ flags must be 0
    b"\xe8\x00",                          # DISCONNECT flags must be 0
    b"\x42\x02\x00\x01",                  # PUBACK flags must be 0
    b"\x60\x02\x00\x01",                  # PUBREL flags must be 0b0010
    b"\x80\x06\x00\x01\x00\x01t\x00",     # SUBSCRIBE flags must be 0b0010
    b"\xa0\x05\x00\x01\x00\x01t",         # UNSUBSCRIBE flags must be 0b0010
    b"\x36\x05\x00\x01t\x00\x01",         # PUBLISH QoS 3
    b"\x38\x03\x00\x01t",                 # PUBLISH QoS 0 with DUP
])
def test_invalid_fixed_header_flags_are_malformed(data):
    assert server_error(data, 4).reason_code == MALFORMED


def test_header_errors_are_raised_before_the_body_arrives():
    assert server_error(b"\x36", 4).reason_code == MALFORMED


def test_errors_are_sticky():
    server = connected_pair(4)[1]
    first = error_from(server, frame(0x30, string(b"a/#")))  # whole packet consumed
    server.receive_data(b"\xc0\x00")
    with pytest.raises(MqttProtocolError) as again:
        server.next_packet()
    assert again.value is first


# --- strings, topics and packet identifiers ------------------------------------------------


@pytest.mark.parametrize("topic", [b"\xff", b"a\xed\xa0\x80", b"\xc0\xaf", b"a\x00b"])
def test_ill_formed_utf8_and_null_characters_are_malformed(topic):
    assert server_error(frame(0x30, string(topic)), 4).reason_code == MALFORMED


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("topic", [b"a/+", b"#", b"a/b#"])
def test_wildcards_in_publish_topic_are_an_invalid_topic_name(version, topic):
    body = string(topic) + (b"\x00" if version == 5 else b"")
    assert server_error(frame(0x30, body), version).reason_code == TOPIC_NAME_INVALID


def test_empty_topic_needs_a_topic_alias():
    assert server_error(frame(0x30, string(b"")), 4).reason_code == PROTOCOL_ERROR
    assert server_error(frame(0x30, string(b"") + b"\x00"), 5).reason_code == PROTOCOL_ERROR
    server = connected_pair(5)[1]
    server.receive_data(frame(0x30, string(b"") + properties_section(b"\x23\x00\x05") + b"x"))
    assert server.next_packet() == Publish("", b"x", properties={"topic_alias": 5})


@pytest.mark.parametrize("data", [
    frame(0x32, string(b"t") + b"\x00\x00"),           # PUBLISH QoS 1
    frame(0x40, b"\x00\x00"),                          # PUBACK
    frame(0x62, b"\x00\x00"),                          # PUBREL
    frame(0x82, b"\x00\x00" + string(b"t") + b"\x00"),  # SUBSCRIBE
    frame(0xA2, b"\x00\x00" + string(b"t")),           # UNSUBSCRIBE
])
def test_packet_identifier_zero_is_a_protocol_error(data):
    assert server_error(data, 4).reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("data", [
    frame(0xC0, b"\x00"),                  # PINGREQ with a body
    frame(0x40, b"\x00\x01\x00"),          # 3.1.1 PUBACK is exactly 2 bytes
    frame(0xE0, b"\x00"),                  # 3.1.1 DISCONNECT has no body
    frame(0x30, b"\x00\x05ab"),            # string longer than the packet
    frame(0x40, b"\x00"),                  # packet identifier cut short
])
def test_length_mismatches_are_malformed(data):
    assert server_error(data, 4).reason_code == MALFORMED


# --- MQTT 5 properties and reason codes ---------------------------------------------------


def publish_with_properties(raw_properties: bytes) -> bytes:
    return frame(0x30, string(b"t") + properties_section(raw_properties))


@pytest.mark.parametrize("raw_properties, reason_code", [
    (b"\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02", PROTOCOL_ERROR),  # message expiry twice
    (b"\x01\x00\x01\x01", PROTOCOL_ERROR),          # payload format indicator twice
    (b"\x01\x02", PROTOCOL_ERROR),                  # payload format indicator 2
    (b"\x23\x00\x00", TOPIC_ALIAS_INVALID),         # topic alias 0
    (b"\x0b\x00", PROTOCOL_ERROR),                  # subscription identifier 0
    (b"\x11\x00\x00\x00\x01", MALFORMED),           # session expiry is not a PUBLISH property
    (b"\x7f\x00", MALFORMED),                       # unknown property identifier
    (b"\x02\x00\x00", MALFORMED),                   # value cut short by the property length
])
def test_invalid_publish_properties(raw_properties, reason_code):
    assert server_error(publish_with_properties(raw_properties), 5).reason_code == reason_code


def test_property_length_beyond_the_packet_is_malformed():
    data = frame(0x30, string(b"t") + b"\x05\x01\x00")
    assert server_error(data, 5).reason_code == MALFORMED


def test_repeatable_properties_may_repeat():
    client, server = connected_pair(5)
    server.receive_data(publish_with_properties(b"\x26\x00\x01k\x00\x01a\x26\x00\x01k\x00\x01b"))
    assert server.next_packet().properties == {"user_property": [("k", "a"), ("k", "b")]}
    client.receive_data(publish_with_properties(b"\x0b\x01\x0b\x02"))
    assert client.next_packet().properties == {"subscription_identifier": [1, 2]}


def test_subscribe_carries_at_most_one_subscription_identifier():
    data = frame(0x82, b"\x00\x01" + properties_section(b"\x0b\x01\x0b\x02")
                 + string(b"t") + b"\x00")
    assert server_error(data, 5).reason_code == PROTOCOL_ERROR


@pytest.mark.parametrize("raw_properties", [
    b"\x21\x00\x00",              # receive maximum 0
    b"\x27\x00\x00\x00\x00",      # maximum packet size 0
    b"\x17\x02",                  # request problem information 2
    b"\x16\x00\x01x",             # authentication data without method
])
def test_invalid_connect_properties_are_protocol_errors(raw_properties):
    error = server_error(connect_bytes(5, rest=properties_section(raw_properties) + string(b"c")))
    assert (error.reason_code, error.send_connack) == (PROTOCOL_ERROR, True)


@pytest.mark.parametrize("data", [
    frame(0x40, b"\x00\x01\x05"),   # PUBACK reason 0x05
    frame(0x62, b"\x00\x01\x10"),   # PUBREL reason 0x10 (only 0x00 and 0x92)
    frame(0xE0, b"\x18"),           # DISCONNECT reason 0x18
    frame(0xF0, b"\x01"),           # AUTH reason 0x01
])
def test_reason_codes_outside_the_packet_types_set_are_malformed(data):
    assert server_error(data, 5).reason_code == MALFORMED


def test_encoding_refuses_reason_codes_outside_the_packet_types_set():
    server = connected_pair(5)[1]
    with pytest.raises(ValueError):
        server.encode(Pubcomp(1, 0x10))
    with pytest.raises(ValueError):
        server.encode(Suback(1, [0x04]))


def test_encoding_refuses_properties_the_packet_type_cannot_carry():
    server = connected_pair(5)[1]
    with pytest.raises(ValueError):
        server.encode(Puback(1, properties={"topic_alias": 1}))
    with pytest.raises(ValueError):
        server.encode(Puback(1, properties={"no_such_property": 1}))


# --- CONNECT --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, level, reply", [
    (b"MQIsdp", 3, b"\x20\x02\x00\x01"),
    (b"MQTT", 3, b"\x20\x02\x00\x01"),
    (b"MQTT", 6, b"\x20\x03\x00\x84\x00"),
])
def test_unsupported_protocol_version_is_answered_with_connack(name, level, reply):
    server = MqttCodec()
    error = error_from(server, connect_bytes(level, name=name))
    assert (error.reason_code, error.send_connack) == (UNSUPPORTED_PROTOCOL_VERSION, True)
    assert server.protocol_version is None
    assert server.encode(Connack(False, error.reason_code)) == reply


def test_unknown_protocol_name_is_closed_without_connack():
    error = server_error(connect_bytes(4, name=b"HTTP"))
    assert (error.reason_code, error.send_connack) == (PROTOCOL_ERROR, False)


@pytest.mark.parametrize("flags", [
    0x03,        # reserved bit
    0x0A,        # will QoS 1 without will flag
    0x22,        # will retain without will flag
    0x1E,        # will QoS 3
])
@pytest.mark.parametrize("version", [4, 5])
def test_inconsistent_connect_flags_are_malformed(flags, version):
    rest = (b"\x00" if version == 5 else b"") + string(b"c")
    error = server_error(connect_bytes(version, flags, rest))
    assert (error.reason_code, error.send_connack) == (MALFORMED, version == 5)


def test_password_without_user_name_is_an_error_only_in_3_1_1():
    error = server_error(connect_bytes(4, 0x42, string(b"c") + string(b"pw")))
    assert (error.reason_code, error.send_connack) == (MALFORMED, False)
    server = MqttCodec()
    server.receive_data(connect_bytes(5, 0x42, b"\x00" + string(b"c") + string(b"pw")))
    assert server.next_packet() == Connect("MQTT", 5, True, 10, "c", password=b"pw")


def test_empty_client_id_without_clean_session_is_rejected_in_3_1_1():
    server = MqttCodec()
    error = error_from(server, connect_bytes(4, 0x00, string(b"")))
    assert error.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert error.send_connack
    assert server.encode(Connack(False, error.reason_code)) == b"\x20\x02\x00\x02"


@pytest.mark.parametrize("version", [4, 5])
def test_will_topic_must_be_a_valid_topic_name(version):
    will_properties = b"\x00" if version == 5 else b""
    rest = will_properties + string(b"c") + will_properties + string(b"w/#") + string(b"bye")
    error = server_error(connect_bytes(version, 0x06, rest))
    assert (error.reason_code, error.send_connack) == (TOPIC_NAME_INVALID, version == 5)


def test_bytes_after_the_connect_payload_are_malformed():
    assert server_error(connect_bytes(4, rest=string(b"c") + b"!")).reason_code == MALFORMED


# --- CONNACK, SUBACK on the client side -----------------------------------------------------


@pytest.mark.parametrize("data, version, reason_code", [
    (b"\x20\x02\x02\x00", 4, MALFORMED),           # reserved acknowledge flag
    (b"\x20\x02\x00\x06", 4, MALFORMED),           # reserved 3.1.1 return code
    (b"\x20\x02\x01\x05", 4, PROTOCOL_ERROR),      # session present on a refusal
    (b"\x20\x03\x00\x10\x00", 5, MALFORMED),       # not a CONNACK reason code
    (b"\x90\x03\x00\x01\x03", 4, MALFORMED),       # 3.1.1 SUBACK return code 3
    (b"\xb0\x03\x00\x01\x00", 4, MALFORMED),       # 3.1.1 UNSUBACK has no payload
])
def test_client_side_validation(data, version, reason_code):
    assert client_error(data, version).reason_code == reason_code


def test_3_1_1_connack_return_codes_decode_to_reason_codes():
    client = connected_pair(4)[0]
    client.receive_data(b"\x20\x02\x00\x05")
    assert client.next_packet() == Connack(False, ReasonCode.NOT_AUTHORIZED)


# --- SUBSCRIBE and UNSUBSCRIBE --------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_subscribe_and_unsubscribe_need_a_topic_filter(version):
    properties = b"\x00" if version == 5 else b""
    assert server_error(frame(0x82, b"\x00\x01" + properties), version).reason_code == (
        PROTOCOL_ERROR)
    assert server_error(frame(0xA2, b"\x00\x01" + properties), version).reason_code == (
        PROTOCOL_ERROR)


@pytest.mark.parametrize("topic_filter", [b"a/#/b", b"a#", b"a/b+", b"+a", b""])
def test_invalid_topic_filters_are_refused(topic_filter):
    subscribe = frame(0x82, b"\x00\x01" + string(topic_filter) + b"\x00")
    unsubscribe = frame(0xA2, b"\x00\x01" + string(topic_filter))
    assert server_error(subscribe, 4).reason_code == TOPIC_FILTER_INVALID
    assert server_error(unsubscribe, 4).reason_code == TOPIC_FILTER_INVALID


@pytest.mark.parametrize("version, topic_filter, options, reason_code", [
    (4, b"t", 0x04, MALFORMED),            # 3.1.1: only the QoS bits exist
    (5, b"t", 0x40, MALFORMED),            # reserved bits 6-7
    (4, b"t", 0x03, PROTOCOL_ERROR),       # QoS 3
    (5, b"t", 0x03, PROTOCOL_ERROR),
    (5, b"t", 0x30, PROTOCOL_ERROR),       # retain handling 3
    (5, b"$share/g/t", 0x04, PROTOCOL_ERROR),  # no local on a shared subscription
])
def test_invalid_subscription_options(version, topic_filter, options, reason_code):
    properties = b"\x00" if version == 5 else b""
    data = frame(0x82, b"\x00\x01" + properties + string(topic_filter) + bytes((options,)))
    assert server_error(data, version).reason_code == reason_code


def test_mqtt_5_subscription_options_are_decoded():
    server = connected_pair(5)[1]
    server.receive_data(frame(0x82, b"\x00\x01\x00" + string(b"a/+") + b"\x2e"))
    assert server.next_packet() == Subscribe(1, [("a/+", SubscriptionOptions(2, True, True, 2))])


# --- encoding preconditions ---------------------------------------------------------------


def test_encoding_before_connect_needs_the_version():
    with pytest.raises(ValueError, match="unknown"):
        MqttCodec().encode(Connack())


@pytest.mark.parametrize("version, packet", [
    (4, Disconnect()), (4, Auth()), (5, Connect(protocol_version=5)), (5, Subscribe(1, []))])
def test_server_cannot_encode_what_only_clients_or_other_versions_send(version, packet):
    server = connected_pair(version)[1]
    with pytest.raises(ValueError):
        server.encode(packet)


def test_client_cannot_connect_with_an_unsupported_version():
    with pytest.raises(ValueError):
        MqttCodec(client_side=True).encode(Connect(protocol_version=3))


@pytest.mark.parametrize("packet", [Publish("t", qos=1), Publish("t", packet_id=1)])
def test_publish_packet_id_must_match_qos(packet):
    server = connected_pair(4)[1]
    with pytest.raises(ValueError):
        server.encode(packet)


# --- topics -----------------------------------------------------------------------------------


def topic_matches(topic_filter: str, topic_name: str) -> bool:
    """MQTT matching as the router does it: the core's matcher over the levels."""
    return filter_matches(from_mqtt(topic_filter), from_mqtt(topic_name))


@pytest.mark.parametrize("topic_filter, topic_name, expected", [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("/finance", "finance", False),
    ("ACCOUNTS", "Accounts", False),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("#", "$SYS/monitor/Clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
])
def test_topic_matches_spec_examples(topic_filter, topic_name, expected):
    assert topic_matches(topic_filter, topic_name) is expected


@pytest.mark.parametrize("topic_filter", [
    "sport/tennis/#", "#", "+", "+/tennis/#", "sport/+/player1", "/finance", "a//b",
    "$SYS/#", "Accounts payable", "/", "+/+", "$share/group/a/#"])
def test_valid_topic_filters(topic_filter):
    assert valid_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", [
    "sport/tennis#", "sport/tennis/#/ranking", "sport+", "+sport", "#/a", "a/##", "", "a\x00"])
def test_invalid_topic_filters(topic_filter):
    assert not valid_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_name, expected", [
    ("sport/tennis", True), ("/", True), ("a//b", True), ("$SYS/x", True), ("", False),
    ("a/+", False), ("a/#", False), ("a\x00", False)])
def test_valid_topic_name(topic_name, expected):
    assert valid_topic_name(topic_name) is expected


def reference_topic_matches(topic_filter: str, topic_name: str) -> bool:
    """The filter translated to a regular expression: an independent second implementation."""
    if topic_name.startswith("$") and topic_filter.startswith(("+", "#")):
        return False
    filter_levels = topic_filter.split("/")
    multi_level = filter_levels[-1] == "#"
    if multi_level:
        filter_levels.pop()
    pattern = "/".join("[^/]*" if level == "+" else re.escape(level) for level in filter_levels)
    if multi_level:
        pattern = f"{pattern}(?:/.*)?" if filter_levels else ".*"
    return re.fullmatch(pattern, topic_name, re.DOTALL) is not None


small_levels = st.sampled_from(["", "a", "b", "ab", "$SYS"])
small_topic_names = st.lists(small_levels, min_size=1, max_size=4).map("/".join).filter(bool)
small_topic_filters = st.builds(
    lambda parts, multi_level: "/".join(parts + ["#"] * multi_level),
    st.lists(small_levels | st.just("+"), max_size=4), st.booleans()).filter(bool)


@given(small_topic_filters, small_topic_names)
def test_topic_matches_agrees_with_the_reference(topic_filter, topic_name):
    assert valid_topic_filter(topic_filter) and valid_topic_name(topic_name)
    assert topic_matches(topic_filter, topic_name) == reference_topic_matches(topic_filter,
                                                                              topic_name)


@given(topic_names, st.data())
def test_every_generalization_of_a_topic_matches_it(topic_name, data):
    name_levels = topic_name.split("/")
    filter_levels = [data.draw(st.sampled_from([level, "+"])) for level in name_levels]
    cut = data.draw(st.integers(0, len(filter_levels)))
    if cut < len(filter_levels):
        filter_levels = filter_levels[:cut] + ["#"]
    topic_filter = "/".join(filter_levels)
    hidden = topic_name.startswith("$") and topic_filter[0] in "+#"
    assert topic_matches(topic_filter, topic_name) is not hidden
