"""The hand-written AMQP encoder and section splitter agree with python-qpid-proton."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Data, Message, symbol, timestamp, uint

from router.amqp.encoding import encode, list_fields, sections
from router.amqp.persistence import Outgoing
from tests.amqp_clients import materialized

SCALARS = (st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 63 - 1)
           | st.floats(allow_nan=False) | st.text() | st.binary(max_size=300))
# lists long enough for the 32-bit forms (over 255 items or bytes)
PLAIN = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=300)
                     | st.dictionaries(st.text(), inner, max_size=40), max_leaves=400)
SMALL = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.text(), inner, max_size=5), max_leaves=20)


def proton_decode(encoded: bytes):
    data = Data()
    assert data.decode(encoded) == len(encoded)
    data.rewind()
    data.next()
    return materialized(data.get_object())  # binary views die with the Data


@settings(max_examples=60)
@given(PLAIN)
def test_plain_values_decode_to_themselves(value):
    assert proton_decode(encode(value)) == value


def test_symbols_timestamps_and_uints_keep_their_types():
    decoded = proton_decode(encode([symbol("s"), timestamp(-5), uint(2 ** 32 - 1)]))
    assert [type(item) for item in decoded] == [symbol, timestamp, uint]
    assert decoded == [symbol("s"), timestamp(-5), uint(2 ** 32 - 1)]


@given(st.lists(st.text() | st.integers(0, 2 ** 40) | st.none(), max_size=13),
       st.dictionaries(st.text(max_size=5), st.text() | st.integers(-10, 10), max_size=30),
       SMALL, st.booleans())
def test_sections_split_a_proton_message(properties, application, body, with_header):
    msg = Message(body=body)
    msg.address = properties[0] if properties and isinstance(properties[0], str) else None
    msg.subject = "s" * len(properties)
    msg.properties = application or None
    msg.annotations = {symbol("x-a"): 1} if with_header else None
    msg.durable = with_header
    encoded = bytes(msg.encode())
    parts = list(sections(encoded))
    assert b"".join(part for _code, part in parts) == encoded
    codes = [code for code, _part in parts]
    assert codes == sorted(codes) and 0x73 in codes
    assert (codes[-1] == 0x77) == (body is not None)  # proton writes no body for None
    properties_part = dict(parts)[0x73]
    assert len(list_fields(properties_part[3:])) == len(proton_decode(properties_part).value)


def test_queued_messages_stored_before_bare_messages_load_as_data_sections():
    """A durable link's queue written by an older router (payload bytes) still loads."""
    old = msgpack.packb(["com.t", b"old", 1, 1, False, None], use_bin_type=True)
    item = Outgoing.unpack(3, old, 2)
    msg = Message()
    msg.decode(item.bare)
    assert (bytes(msg.body), msg.inferred, msg.address) == (b"old", True, "com.t")
    assert Outgoing.unpack(3, item.pack(), 2) == item
