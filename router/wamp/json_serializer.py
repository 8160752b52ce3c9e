"""WAMP's JSON serializer at C speed, with autobahn's wire conventions kept exactly.

Autobahn decodes JSON with CPython's pure-Python scanner, because it hooks string parsing to
turn ``"\\u0000"``-prefixed base64 strings into bytes (the WAMP binary convention). That
scanner was the largest single cost of a WebSocket+JSON router. orjson decodes in C; its
result is taken whenever the input cannot show a difference: no escaped NUL (so no binary
value) and no run of 19 digits (orjson turns integers beyond 64 bits into floats, the
standard library keeps them exact). Anything else, and anything orjson refuses (NaN,
big integers on the way out), goes through autobahn's own code, so a message decodes and
encodes to the same values either way; except a lone surrogate escape (``"\\ud800"``), which
autobahn would decode and which is refused as undecodable.

One deliberate difference: a non-finite float (from a MsgPack or CBOR peer) is written as
``null``, as JSON has no such value; autobahn would write the invalid token ``NaN``.
"""

from __future__ import annotations

import re

import orjson
from autobahn.wamp.serializer import JsonObjectSerializer, JsonSerializer, Serializer

from router.core.payload import json_default

_NEEDS_AUTOBAHN = re.compile(rb"\\u0000|[0-9]{19}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""An escaped UTF-16 surrogate, maybe lone: only then can autobahn's decoder give one."""
_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
"""Dates go to :func:`json_default`, as for every other receiver without a date type."""


class FastJsonObjectSerializer(JsonObjectSerializer):
    """autobahn's JSON object serializer interface, orjson inside (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(batched=False)

    def serialize(self, obj: object) -> bytes:
        try:
            return orjson.dumps(obj, default=json_default, option=_DUMPS_OPTIONS)
        except TypeError:
            return super().serialize(obj)

    def unserialize(self, payload: bytes) -> list:
        if not _NEEDS_AUTOBAHN.search(payload):
            try:
                return [orjson.loads(payload)]
            except orjson.JSONDecodeError:
                pass  # autobahn decides: it accepts a few things orjson does not (NaN)
        decoded = super().unserialize(payload)
        if _SURROGATE_ESCAPE.search(payload):
            _refuse_lone_surrogates(decoded)
        return decoded


def _refuse_lone_surrogates(decoded: list) -> None:
    """Raise UnicodeEncodeError for a lone surrogate (``"\\ud800"``) in any string or key:
    orjson refuses one, autobahn's decoder does not, and it is no Unicode text: no
    serializer, store or log can write it (an ABORT naming such a realm raised in the
    reactor), so it is undecodable as invalid UTF-8 is in MessagePack and CBOR."""
    stack: list = [decoded]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if not item.isascii():
                item.encode("utf-8")
        elif kind is list:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item)
            stack.extend(item.values())


class FastJsonSerializer(JsonSerializer):
    """The ``json`` WAMP serializer (WebSocket ``wamp.2.json``, RawSocket id 1)."""

    def __init__(self) -> None:
        self.object_serializer = FastJsonObjectSerializer()
        Serializer.__init__(self, self.object_serializer)
