"""Payload mapping between byte-oriented protocols (MQTT, AMQP) and WAMP args/kwargs.

Configured per realm (``payload_mapping``):

``json`` (default)
    bytes -> WAMP: a UTF-8 JSON array becomes ``args``, an object ``kwargs``, any
    other JSON value ``args=[value]``; bytes that are not UTF-8 JSON become
    ``args=[bytes]`` (a binary argument).
    WAMP -> bytes: a single binary argument is sent as is; ``args=[x]`` as JSON of
    ``x``; only ``kwargs`` as JSON of ``kwargs``; several args as a JSON array; args
    and kwargs as ``{"args": [...], "kwargs": {...}}``; nothing as empty bytes.
    Binary values inside JSON follow WAMP's convention: ``"\u0000" + base64``.
    Values JSON has no type for follow :func:`as_text`.
``binary``
    bytes -> WAMP: always ``args=[bytes]``. WAMP -> bytes: as for ``json``.

A publication from a byte-oriented publisher keeps its original bytes, which
byte-oriented receivers get unchanged.

A WAMP Payload Passthru Mode publication (``Publication.passthru``) is never mapped: with
``ppt_scheme: "mqtt"`` its payload is the original bytes above; with any other scheme
(end-to-end encryption) byte receivers cannot take it (:func:`opaque_refusal`).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import re
import uuid
from enum import Enum
from typing import Any, Callable

from router.core.errors import PassthruRefused, Unencodable
from router.core.model import Args, Kwargs, Publication

MAPPINGS = ("json", "binary")

_JSON_FIRST_BYTES = frozenset(b' \t\n\r[{"-0123456789tfnNI')
"""The bytes a JSON text can start with (whitespace, a value; ``NaN`` and ``Infinity``,
which Python's json reads): bytes starting otherwise are binary without trying to decode
them (a failed decode raises and catches an exception, the dearest part of a binary
MQTT publish's mapping). A byte order mark is not among them: ``json.loads`` refuses it."""

_scan: Callable[[str, int], tuple[object, int]] = (
    json.JSONDecoder().scan_once)  # type: ignore[attr-defined]
_WHITESPACE = " \t\n\r"
_whitespace = re.compile(f"[{_WHITESPACE}]*").match
"""What ``json`` skips around a value (its own ``WHITESPACE``)."""
_NOT_JSON = object()


def _json_value(text: str) -> object:
    """What ``json.loads(text)`` gives, or ``_NOT_JSON`` where it raises: the same scanner,
    without the JSONDecodeError (its message, line and column) a payload that is not JSON
    would cost, as sensor readings like ``21.5C`` are."""
    try:
        value, end = _scan(text, _after_whitespace(text, 0))
    except StopIteration:
        return _NOT_JSON
    return value if _after_whitespace(text, end) == len(text) else _NOT_JSON


def _after_whitespace(text: str, at: int) -> int:
    """Where the whitespace from ``at`` ends (no regular expression run where there is none,
    the commonest case: a payload's value starts and ends it)."""
    if at == len(text) or text[at] not in _WHITESPACE:
        return at
    skipped = _whitespace(text, at)
    return skipped.end() if skipped is not None else at


def from_bytes(data: bytes, mapping: str) -> tuple[Args | None, Kwargs | None]:
    """(args, kwargs) for a byte payload."""
    if not data:
        return None, None
    if mapping == "json" and data[0] in _JSON_FIRST_BYTES:
        try:
            value = _json_value(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            # a malformed value inside, or nesting deeper than the decoder recurses
            return [data], None
        if value is _NOT_JSON:
            return [data], None
        if isinstance(value, list):
            return value, None
        if isinstance(value, dict):
            return None, value
        return [value], None
    return [data], None


class _Unmapped(Enum):
    """Where :class:`JsonPayloadPublication` has not mapped its payload yet."""

    UNMAPPED = "unmapped"


UNMAPPED: Any = _Unmapped.UNMAPPED
"""``args`` and ``kwargs`` to :meth:`Realm.publish <router.core.realm.Realm.publish>` of a
byte payload under the ``json`` mapping: mapped when a receiver first reads them."""

_ARGS: Any = Publication.__dict__["args"]
_KWARGS: Any = Publication.__dict__["kwargs"]
"""The slots under the properties of :class:`JsonPayloadPublication`."""


class JsonPayloadPublication(Publication):
    """A byte publisher's publication under the ``json`` mapping, whose ``args`` and
    ``kwargs`` are mapped from its payload (:func:`from_bytes`) when first read, once: most
    MQTT publications reach no WAMP receiver, and a retained one is stored without them
    (its payload says what they are). Until then it holds no list of arguments either."""

    __slots__ = ()

    def _mapped_args(self) -> Args | None:
        args = _ARGS.__get__(self)
        if args is UNMAPPED:
            args, kwargs = from_bytes(self.payload, "json")  # type: ignore[arg-type]
            _ARGS.__set__(self, args)
            _KWARGS.__set__(self, kwargs)
        return args  # type: ignore[no-any-return]

    def _mapped_kwargs(self) -> Kwargs | None:
        if _KWARGS.__get__(self) is UNMAPPED:
            self._mapped_args()  # maps both
        return _KWARGS.__get__(self)  # type: ignore[no-any-return]

    # set straight into the slots (no Python-level setter: the construction sets both)
    args = property(_mapped_args, _ARGS.__set__,
                    doc="The payload's mapped arguments.")
    kwargs = property(_mapped_kwargs, _KWARGS.__set__,
                      doc="The payload's mapped keyword arguments.")


def to_bytes(publication: Publication) -> bytes:
    """The byte payload of a publication, computed once per dispatch for all receivers."""
    if publication.payload is not None:
        return publication.payload
    cache = publication.encodings()
    cached: bytes | Unencodable | None = cache.get(_CACHE_KEY)
    if cached is None:
        if publication.passthru is not None:
            cached = opaque_refusal(publication)
        else:
            try:
                cached = _encode(publication)
            except (TypeError, ValueError) as exc:
                cached = Unencodable(f"not representable as JSON bytes: {exc}")
        cache[_CACHE_KEY] = cached
    if isinstance(cached, Unencodable):
        raise cached.with_traceback(None)  # every byte receiver learns it at once
    return cached


def opaque_refusal(publication: Publication) -> PassthruRefused:
    """Why a byte-oriented receiver does not get a passthru payload whose scheme is not
    ``mqtt`` (those carry ``payload``, sent as they are): it would get ciphertext or a
    format it cannot know, as if it were the message."""
    scheme = publication.passthru.scheme  # type: ignore[union-attr]
    return PassthruRefused(f"payload passthru scheme '{scheme}' is only for WAMP receivers "
                           "that announced it")


_CACHE_KEY = "payload-bytes"


def _encode(publication: Publication) -> bytes:
    args, kwargs = publication.args, publication.kwargs
    if not kwargs:
        if not args:
            return b""
        if len(args) == 1:
            if isinstance(args[0], (bytes, bytearray)):
                return bytes(args[0])
            return json_bytes(args[0])
        return json_bytes(args)
    if not args:
        return json_bytes(kwargs)
    return json_bytes({"args": args, "kwargs": kwargs})


def json_bytes(value: object) -> bytes:
    """Compact UTF-8 JSON, binary values as WAMP's ``"\\u0000" + base64`` strings."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      default=json_default).encode("utf-8")


def json_default(value: object) -> str:
    """What JSON writers (MQTT payloads here, WAMP's JSON serializer) make of a value JSON
    has no type for: binary as WAMP's convention (a NUL character, then base64), the rest
    as :func:`as_text` says."""
    if isinstance(value, (bytes, bytearray)):
        return "\x00" + base64.b64encode(bytes(value)).decode("ascii")
    return as_text(value)


def as_text(value: object) -> str:
    """The one rule for values a CBOR publisher can send that JSON has no type for, used by
    every receiver whose format lacks them too (WAMP JSON and MessagePack, MQTT payloads,
    AMQP bodies): a date or time is its ISO 8601 text, a UUID and a decimal their usual
    text. Anything else (other CBOR tags, sets, ...) raises TypeError: unencodable."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no JSON, MessagePack or AMQP form")
