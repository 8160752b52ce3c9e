"""The router's orjson-backed WAMP JSON serializer decodes and encodes exactly the values
autobahn's own JSON serializer does: binary strings, big integers, NaN and escapes included."""

from __future__ import annotations

import json
import math

import pytest
from autobahn.wamp.serializer import JsonObjectSerializer
from hypothesis import given, settings
from hypothesis import strategies as st

from router.wamp.json_serializer import FastJsonObjectSerializer

AUTOBAHN = JsonObjectSerializer()
FAST = FastJsonObjectSerializer()


def outcome(function, argument):
    """What ``function(argument)`` gives, as a repr so that 2**70 and 2.0**70 differ, or
    "error" when it raises (autobahn refuses a NUL-prefixed string that is not base64)."""
    try:
        return repr(function(argument))
    except Exception:
        return "error"

scalars = (st.none() | st.booleans()
           | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text() | st.text().map(lambda t: "\x00" + t)
           | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: (st.lists(inner, max_size=5)
                                              | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5)),
                      max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(st.lists(values, max_size=6))
def test_encoding_decodes_to_what_autobahn_encodes(message):
    assert outcome(AUTOBAHN.unserialize, FAST.serialize(message)) == \
        outcome(AUTOBAHN.unserialize, AUTOBAHN.serialize(message))


@settings(max_examples=200, deadline=None)
@given(st.lists(values, max_size=6), st.booleans())
def test_decoding_matches_autobahn_on_any_text(message, ascii_only):
    # autobahn writes non-ASCII as UTF-8; other peers escape it, so decode both spellings
    text = AUTOBAHN.serialize(message)
    if ascii_only:
        text = json.dumps(json.loads(text.decode("utf-8")), ensure_ascii=True).encode()
    assert outcome(FAST.unserialize, text) == outcome(AUTOBAHN.unserialize, text)


@pytest.mark.parametrize("text", [b'[16, 1, {}, "t", [NaN]]', b'[16, 1, {}, "t", [Infinity]]'])
def test_non_standard_numbers_are_read_as_autobahn_reads_them(text):
    decoded = FAST.unserialize(text)[0][4][0]
    assert math.isnan(decoded) or math.isinf(decoded)


@pytest.mark.parametrize("value", [b"\x00\xffbinary", 2**64 + 1, -2**63 - 1])
def test_binary_and_big_integers_survive_both_ways(value):
    wire = FAST.serialize([36, 1, 2, {}, [value]])
    assert wire == AUTOBAHN.serialize([36, 1, 2, {}, [value]])
    assert repr(FAST.unserialize(wire)[0][4][0]) == repr(value)


@pytest.mark.parametrize("text", [b"[1,", b"\xff\xfe[]", b"", b"[1] [2]"])
def test_malformed_json_is_refused(text):
    with pytest.raises(Exception):
        FAST.unserialize(text)


@pytest.mark.parametrize("text", [b'[16, 1, {}, "t", ["\\ud800"]]', b'[1, "r\\uDC00", {}]',
                                  b'[16, 1, {}, "t", [], {"\\ud83d": 1}]',
                                  b'[16, 1, {}, "t", ["\\u0000QUJD", "\\udbff"]]'])
def test_a_lone_surrogate_is_refused(text):
    """No UTF-8 (so no receiver, store or log) can hold it; orjson refuses it, autobahn's
    decoder did not."""
    with pytest.raises(ValueError):
        FAST.unserialize(text)


def test_an_escaped_surrogate_pair_and_an_escaped_backslash_are_text():
    assert FAST.unserialize(b'["\\ud83d\\ude00", "\\\\ud800", "\\u0000QUJD"]') == \
        [["\U0001F600", "\\ud800", b"ABC"]]
