"""AMQP messages <-> the core's publications, sans I/O.

An AMQP publisher's *bare message* (properties, application-properties and body
sections) is kept verbatim in ``Publication.amqp``: AMQP receivers get it as it was
sent, every AMQP type and section kind included, with ``to`` set to the topic. For
WAMP and MQTT receivers the same message is mapped once, at publish time:

* body: a data section is bytes (the realm's payload mapping, as for MQTT); an
  amqp-value string is ``args=[text]`` and its UTF-8 bytes (payload format indicator
  1); an amqp-value binary ``args=[bytes]`` and those bytes; null or no body is empty;
  a map with string keys is ``kwargs``; a list, an array or an amqp-sequence is
  ``args`` (a JSON array for byte receivers), like a JSON array from MQTT; any other
  amqp-value ``x`` is ``args=[x]`` (its JSON for byte receivers). symbol, char and
  uuid become strings, timestamps milliseconds since the epoch. Decimal and described
  values have no mapping: the message is rejected (:class:`UnsupportedBody`).
* properties: content-type, correlation-id, reply-to and application-properties are
  MQTT 5's content type, correlation data, response topic and user properties; the
  header's ttl and absolute-expiry-time are the message expiry.

WAMP and MQTT publications get native AMQP bodies: bytes (one binary arg, an MQTT
payload) a data section, or an amqp-value string where an MQTT 5 publisher declared
them UTF-8; one other arg its amqp-value; only kwargs an amqp-value map; several
args an amqp-value list; args and kwargs the map ``{"args": [...], "kwargs": {...}}``;
nothing an amqp-value null. MQTT 5 properties map back as above.

A publication from WAMP or MQTT is built into a bare message once, the first time
an AMQP receiver needs it (see :func:`bare_message`), and shared by all of them;
each delivery only adds its own header and annotations (:func:`delivery_prefix`).
"""

from __future__ import annotations

import functools
import time
import uuid

from cproton import pn_message_get_content_type
from proton import (Array, Described, Message, decimal32, decimal64, decimal128, symbol,
                    timestamp, uint)

from router.amqp.encoding import compound, encode, list_fields, section, sections, skip
from router.core.errors import Unencodable
from router.core.model import LONGEST_EXPIRY, Publication
from router.core.payload import from_bytes, json_bytes, opaque_refusal

HEADER, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, SEQUENCE, VALUE = 0x74, 0x75, 0x76, 0x77
_BARE = (PROPERTIES, APPLICATION_PROPERTIES, DATA, SEQUENCE, VALUE)
_TO, _REPLY_TO, _CORRELATION_ID, _CONTENT_TYPE, _ABSOLUTE_EXPIRY = 2, 4, 5, 6, 8

X_OPT_QOS = symbol("x-opt-qos")
X_OPT_RETAIN = symbol("x-opt-retain")
_CACHE_KEY = "amqp-bare"


class UnsupportedBody(ValueError):
    """A message the router cannot carry to every protocol (a decimal or described value)."""


class Inbound:
    """What one AMQP message becomes in the core."""

    __slots__ = ("args", "kwargs", "payload", "properties", "expires_at", "empty", "bare")

    def __init__(self, message: Message, encoded: bytes, mapping: str) -> None:
        self.bare = _bare_sections(encoded)
        self.args: list | None = None
        self.kwargs: dict | None = None
        self.payload: bytes | None = None
        properties: dict = {}
        body = message.body
        if body is None:
            self.payload = b""
        elif isinstance(body, (bytes, memoryview, bytearray)):
            self.payload = bytes(body)  # a data section or an amqp-value binary
            if message.inferred:
                self.args, self.kwargs = from_bytes(self.payload, mapping)
            else:
                self.args = [self.payload]
        elif isinstance(body, (list, Array)):  # a sequence, a list or an array: the args
            self.args = plain(body)
            self.payload = json_bytes(self.args)  # a JSON array even of one element
        elif type(body) is str:
            self.args = [body]
            self.payload = body.encode("utf-8")
            properties["payload_format_indicator"] = 1
        else:
            value = plain(body)
            if isinstance(value, dict) and all(type(key) is str for key in value):
                self.kwargs = value
            else:
                self.args = [value]
        # what clears a retained event: no body, null or an empty data section
        self.empty = body is None or (message.inferred and self.payload == b"")
        content_type = pn_message_get_content_type(message._msg)
        if content_type:
            # (not ``message.content_type``: proton makes an absent one the symbol 'None',
            # which every MQTT 5 receiver got as the ContentType of every such message)
            properties["content_type"] = content_type
        correlation = message.correlation_id
        if correlation is not None:
            properties["correlation_data"] = (
                bytes(correlation) if isinstance(correlation, (bytes, memoryview))
                else str(correlation).encode("utf-8"))
        if message.reply_to:
            properties["response_topic"] = message.reply_to
        if message.properties:
            properties["user_property"] = [(str(key), _text(value))
                                           for key, value in message.properties.items()]
        self.properties = properties or None
        ttl, expiry_time = message.ttl, message.expiry_time
        self.expires_at = None
        if ttl or expiry_time:
            now = time.time()
            expiries = [now + ttl] if ttl else []
            if expiry_time:
                # a timestamp may name any millisecond of +-292 million years: one further
                # off than the longest expiry a wire carries is that far, one before 1970
                # is 1970 (a retained event expiring in the year 31,690,708 made `router
                # retained list` fail for the whole realm)
                expiries.append(min(max(float(expiry_time), 0.0), now + LONGEST_EXPIRY))
            self.expires_at = min(expiries)


def _text(value) -> str:
    """An application property as an MQTT user property's value: text as is, else JSON."""
    value = plain(value)
    return value if type(value) is str else json_bytes(value).decode("utf-8")


def plain(value):
    """An AMQP-decoded value as plain Python (JSON-friendly where it can be)."""
    if isinstance(value, (decimal32, decimal64, decimal128)):
        raise UnsupportedBody(f"{type(value).__name__} values are not carried by this router")
    if isinstance(value, Described):
        raise UnsupportedBody("described values are not carried by this router")
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, Array):
        return [plain(item) for item in value.elements]
    if isinstance(value, (memoryview, bytearray)):
        return bytes(value)
    if isinstance(value, (str, uuid.UUID)):
        return str(value)  # string, symbol, char, uuid
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # every integer type; a timestamp in milliseconds
    if isinstance(value, float):
        return float(value)
    return value


# sections ----------------------------------------------------------------------------

def _bare_sections(encoded: bytes) -> bytes:
    """The bare message of an encoded message, verbatim (header, annotations and footer
    belong to the transfer, not to the message)."""
    return b"".join(part for code, part in sections(encoded) if code in _BARE)


def _with_address(bare: bytes, address: str) -> bytes:
    """A verbatim bare message with its properties' ``to`` set to ``address``."""
    parts = []
    fields: list[bytes] = []
    for code, part in sections(bare):
        if code == PROPERTIES:
            fields = list_fields(part[skip(part, 1):])  # after the descriptor
        else:
            parts.append(part)
    fields.extend([b"\x40"] * (_TO + 1 - len(fields)))
    fields[_TO] = encode(address)
    return section(PROPERTIES, compound(0xC0, 0xD0, fields)) + b"".join(parts)


# publications -> AMQP ------------------------------------------------------------------

def bare_message(publication: Publication, address: str) -> bytes:
    """The bare message AMQP receivers get for a publication, made once per address form
    and shared; ``address`` (the publication's topic as the receiver's kind of AMQP
    address: dotted or MQTT form) is its ``to``."""
    cache = publication.encodings()
    key = (_CACHE_KEY, address)
    cached = cache.get(key)
    if cached is None:
        if publication.amqp is not None:
            cached = _with_address(publication.amqp, address)
        elif publication.passthru is not None and publication.payload is None:
            cached = opaque_refusal(publication)
        else:
            try:
                cached = _build(publication, address)
            except (OverflowError, TypeError, KeyError) as exc:
                cached = Unencodable(f"not representable in AMQP: {exc}")
        cache[key] = cached
    if not isinstance(cached, bytes):
        raise cached.with_traceback(None)  # every AMQP receiver learns it at once
    return cached


def bytes_message(address: str, payload: bytes) -> bytes:
    """The bare message of a byte payload without properties (a data section)."""
    return (section(PROPERTIES, encode([None, None, address]))
            + section(DATA, encode(bytes(payload))))


def _build(publication: Publication, address: str) -> bytes:
    mqtt = publication.properties or {}
    fields: list = [None] * 9
    fields[_TO] = address
    if "response_topic" in mqtt:
        fields[_REPLY_TO] = mqtt["response_topic"]
    if "correlation_data" in mqtt:
        fields[_CORRELATION_ID] = bytes(mqtt["correlation_data"])
    if "content_type" in mqtt:
        fields[_CONTENT_TYPE] = symbol(mqtt["content_type"])
    if publication.expires_at is not None:
        fields[_ABSOLUTE_EXPIRY] = timestamp(int(publication.expires_at * 1000))
    while fields[-1] is None:
        fields.pop()
    parts = [section(PROPERTIES, encode(fields))]
    if mqtt.get("user_property"):
        parts.append(section(APPLICATION_PROPERTIES,
                             encode({name: value for name, value in mqtt["user_property"]})))
    parts.append(_body(publication, mqtt.get("payload_format_indicator") == 1))
    return b"".join(parts)


def _body(publication: Publication, utf8: bool) -> bytes:
    """Bytes are a data section (an amqp-value string where the publisher declared them
    UTF-8); args/kwargs native AMQP values (see docs)."""
    payload = publication.payload
    if payload is not None:
        if utf8:
            try:
                return section(VALUE, encode(payload.decode("utf-8")))
            except UnicodeDecodeError:
                pass
        return section(DATA, encode(bytes(payload)))
    args, kwargs = publication.args, publication.kwargs
    if kwargs:
        value = {"args": args, "kwargs": kwargs} if args else kwargs
    elif not args:
        value = None
    elif len(args) == 1:
        value = args[0]
        if isinstance(value, (bytes, bytearray)):
            return section(DATA, encode(value))
    else:
        value = args
    return section(VALUE, encode(value))


def delivery_prefix(durable: bool, delivery_count: int, published_qos: int, retained: bool,
                    ttl_ms: int | None) -> bytes:
    """One delivery's header and message annotations, which go before the shared bare
    message (made once per kind of delivery unless it carries a ttl)."""
    if ttl_ms is None:
        return _cached_prefix(durable, delivery_count, published_qos, retained)
    return _prefix(durable, delivery_count, published_qos, retained, ttl_ms)


def _prefix(durable: bool, delivery_count: int, published_qos: int, retained: bool,
            ttl_ms: int | None) -> bytes:
    annotations = {X_OPT_QOS: published_qos}
    if retained:
        annotations[X_OPT_RETAIN] = True
    header = [durable, None, uint(ttl_ms) if ttl_ms is not None else None, None,
              uint(delivery_count)]
    return section(HEADER, encode(header)) + section(MESSAGE_ANNOTATIONS, encode(annotations))


_cached_prefix = functools.lru_cache(maxsize=256)(
    lambda durable, count, qos, retained: _prefix(durable, count, qos, retained, None))
