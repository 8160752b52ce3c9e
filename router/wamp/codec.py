"""Sans-I/O WAMP message codec: bytes in, validated messages out; raw lists out, bytes back.

Incoming messages are parsed (and validated) by autobahn's message classes; the
raw list is kept beside each message because autobahn drops option keys it does
not know, and implementation options such as ``_retain_ttl`` live there.
Outgoing messages are plain lists wrapped in :class:`WireMessage`, which caches
its bytes per serializer so a message shared by many receivers is encoded once.
"""

from __future__ import annotations

from autobahn.wamp import message
from autobahn.wamp.exception import InvalidUriError, ProtocolError
from autobahn.wamp.message import check_or_raise_uri
from autobahn.wamp.interfaces import IObjectSerializer
from autobahn.wamp.serializer import (CBORObjectSerializer, CBORSerializer,
                                      MsgPackObjectSerializer, MsgPackSerializer, Serializer)

import struct
from dataclasses import dataclass

import msgpack
from msgpack import unpackb as _unpackb

from router.core.errors import ProtocolViolation, Unencodable
from router.core.payload import as_text
from router.wamp.json_serializer import FastJsonSerializer

MESSAGE_CLASSES = Serializer.MESSAGE_TYPE_MAP


class _MsgPackObjectSerializer(MsgPackObjectSerializer):
    """autobahn's, with dates, UUIDs and decimals (from CBOR peers) as text: MessagePack
    receivers get the values JSON receivers get (:func:`router.core.payload.as_text`)."""

    def __init__(self) -> None:
        super().__init__()
        self._packer = msgpack.Packer(use_bin_type=True, default=as_text)
        """One packer for every message: ``msgpack.packb`` makes one (and its buffer) per
        call, 1.5 of its 2.5 us for an RPC result. Not for threads: the reactor's only (it
        resets itself after a value it cannot pack)."""
        self.serialize = self._packer.pack  # type: ignore[method-assign]
        """The packer's own method: no Python call around it per message."""

    def serialize(self, obj: object) -> bytes:
        """(Replaced in ``__init__`` by the packer's ``pack``, which does this.)"""
        return self._packer.pack(obj)

    def unserialize(self, payload: bytes) -> list:
        """The one message of ``payload`` (the router's serializers are not batched), without
        autobahn's lambda around ``unpackb``."""
        return [_unpackb(payload, raw=False)]


class RouterMsgPackSerializer(MsgPackSerializer):
    """The ``msgpack`` WAMP serializer (WebSocket ``wamp.2.msgpack``, RawSocket id 2)."""

    def __init__(self) -> None:
        self.object_serializer = _MsgPackObjectSerializer()
        Serializer.__init__(self, self.object_serializer)


class RouterCborSerializer(CBORSerializer):
    """The ``cbor`` WAMP serializer (WebSocket ``wamp.2.cbor``, RawSocket id 3)."""

    def __init__(self) -> None:
        self.object_serializer = CBORObjectSerializer()
        Serializer.__init__(self, self.object_serializer)


SERIALIZER_CLASSES = {"json": FastJsonSerializer, "msgpack": RouterMsgPackSerializer,
                      "cbor": RouterCborSerializer}
"""Each keeps its object serializer as ``object_serializer``: what the transports and
:func:`decode` use, so nothing reads autobahn's private attributes."""


def encode(object_serializer: IObjectSerializer, raw: list) -> bytes:
    """``raw``'s bytes in the serializer's format; :class:`Unencodable` if its values do
    not fit the format."""
    try:
        return object_serializer.serialize(raw)
    except Exception as exc:
        raise Unencodable(f"not representable in {object_serializer.NAME}: "
                          f"{type(exc).__name__}: {exc}") from None


RAWSOCKET_LENGTH = struct.Struct("!I")
"""A RawSocket frame's 4-octet length prefix (Twisted's Int32StringReceiver's)."""


def rawsocket_frame(payload: bytes) -> bytes:
    """The RawSocket frame of one message: its length, then its octets."""
    return RAWSOCKET_LENGTH.pack(len(payload)) + payload


class WireMessage:
    """An outgoing WAMP message as a raw list, serialized at most once per serializer
    (a message with one receiver, such as a call's, the transport encodes without one:
    ``Outlet.send_once``)."""

    __slots__ = ("raw", "_cache")

    def __init__(self, raw: list) -> None:
        self.raw = raw
        self._cache: dict = {}

    def serialize(self, object_serializer) -> bytes:
        """The message's bytes; :class:`Unencodable` if its values do not fit the format
        (remembered, so the next receiver on that format fails at once)."""
        data = self._cache.get(object_serializer)
        if data is None:
            try:
                data = encode(object_serializer, self.raw)
            except Unencodable as exc:
                data = exc
            self._cache[object_serializer] = data
        if type(data) is Unencodable:
            raise data.with_traceback(None)
        return data

    def websocket_frame(self, object_serializer) -> bytes:
        """The whole unmasked server-to-client WebSocket frame, shared by every receiver."""
        key = (object_serializer, "ws")
        frame = self._cache.get(key)
        if frame is None:
            payload = self.serialize(object_serializer)
            frame = self._cache[key] = websocket_frame(payload, object_serializer.BINARY)
        return frame

    def rawsocket_frame(self, object_serializer) -> bytes:
        """The RawSocket frame (4-octet prefix + message), shared by every receiver."""
        key = (object_serializer, "rs")
        frame = self._cache.get(key)
        if frame is None:
            frame = self._cache[key] = rawsocket_frame(self.serialize(object_serializer))
        return frame

    def __repr__(self) -> str:
        return f"WireMessage({self.raw!r})"


@dataclass(frozen=True, slots=True)
class InvalidUriRequest:
    """A request whose URI autobahn's parser rejected: answer ERROR invalid_uri, not ABORT."""

    request_type: int
    request: int
    options: dict
    reason: str


_URI_REQUESTS = (message.Publish.MESSAGE_TYPE, message.Subscribe.MESSAGE_TYPE,
                 message.Call.MESSAGE_TYPE, message.Register.MESSAGE_TYPE)


def _invalid_uri_request(raw: list, reason: str) -> InvalidUriRequest:
    if (raw[0] in _URI_REQUESTS and len(raw) >= 4 and type(raw[1]) is int
            and type(raw[2]) is dict):
        return InvalidUriRequest(raw[0], raw[1], raw[2], reason)
    raise ProtocolViolation(reason)


def websocket_frame(payload: bytes, binary: bool) -> bytes:
    """A single-frame, unmasked WebSocket data message (RFC 6455 section 5.2)."""
    first = 0x82 if binary else 0x81
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", first, length)
    elif length < 65536:
        header = struct.pack("!BBH", first, 126, length)
    else:
        header = struct.pack("!BBQ", first, 127, length)
    return header + payload


def make_serializers(names: tuple[str, ...]) -> list[Serializer]:
    """One serializer instance per format; share them across listeners so caches are shared."""
    return [SERIALIZER_CLASSES[name]() for name in names]


MAX_ID = 2**53
"""The largest WAMP ID (autobahn's ``check_or_raise_id`` bound)."""


class Call:
    """A CALL in its common shape (see :func:`_plain_call`): what the session reads of
    autobahn's ``message.Call``, without its constructor's checks of a dozen options."""

    __slots__ = ("request", "procedure", "args", "kwargs")
    payload = None
    """(A payload passthru CALL has options: it takes autobahn's parse.)"""

    def __init__(self, request: int, procedure: str, args: list | None,
                 kwargs: dict | None) -> None:
        self.request = request
        self.procedure = procedure
        self.args = args
        self.kwargs = kwargs


class Yield:
    """A YIELD in its common shape (see :func:`_plain_yield`), like :class:`Call`."""

    __slots__ = ("request", "args", "kwargs", "progress")
    payload = None

    def __init__(self, request: int, args: list | None, kwargs: dict | None,
                 progress: bool | None) -> None:
        self.request = request
        self.args = args
        self.kwargs = kwargs
        self.progress = progress


_CHECKED_URIS: dict[str, None] = {}
"""Procedures that passed autobahn's URI check (bounded: cleared past 10,000)."""


def _plain_call(raw: list) -> Call | None:
    """A CALL in its common shape (no options, no payload passthru, a valid URI) without
    autobahn's full parse, which checks a dozen options the shape rules out (about half of
    the router's decode time per call); None for any other shape, which takes the full parse
    and so gets exactly autobahn's checks and errors."""
    length = len(raw)
    if not 4 <= length <= 6 or raw[2] or type(raw[2]) is not dict:
        return None
    request, procedure = raw[1], raw[3]
    if type(request) is not int or not 0 <= request <= MAX_ID or type(procedure) is not str:
        return None
    args = raw[4] if length > 4 else None
    kwargs = raw[5] if length > 5 else None
    if (args is not None and type(args) is not list) or (length > 5 and type(kwargs) is not dict):
        return None
    if procedure not in _CHECKED_URIS:
        try:
            check_or_raise_uri(procedure)
        except InvalidUriError:
            return None
        if len(_CHECKED_URIS) >= 10_000:
            _CHECKED_URIS.clear()
        _CHECKED_URIS[procedure] = None
    return Call(request, procedure, args, kwargs)


def _plain_yield(raw: list) -> Yield | None:
    """A YIELD in its common shape (no options but ``progress``, no payload passthru); see
    :func:`_plain_call`."""
    length = len(raw)
    options = raw[2]
    if not 3 <= length <= 5 or type(options) is not dict:
        return None
    progress = options.get("progress") if options else None
    if options and (len(options) > (progress is not None)
                    or (progress is not None and type(progress) is not bool)):
        return None
    request = raw[1]
    if type(request) is not int or not 0 <= request <= MAX_ID:
        return None
    args = raw[3] if length > 3 else None
    kwargs = raw[4] if length > 4 else None
    if (args is not None and type(args) is not list) or (length > 4 and type(kwargs) is not dict):
        return None
    return Yield(request, args, kwargs, progress)


_PLAIN_PARSERS = {message.Call.MESSAGE_TYPE: _plain_call,
                  message.Yield.MESSAGE_TYPE: _plain_yield}
"""The messages of a call's round trip, parsed by hand in their common shape."""


def decode(object_serializer: IObjectSerializer, payload: bytes,
           is_binary: bool | None = None
           ) -> list[tuple[message.Message | Call | Yield | InvalidUriRequest, list]]:
    """Decode one transport message into (parsed message, raw list) pairs.

    Raises :class:`ProtocolViolation` for anything that is not valid WAMP; a
    well-formed request with a malformed URI decodes to :class:`InvalidUriRequest`.
    """
    if is_binary is not None and is_binary != object_serializer.BINARY:
        raise ProtocolViolation("wrong WebSocket frame type for the negotiated serializer")
    try:
        raws = object_serializer.unserialize(payload)
    except Exception as exc:
        raise ProtocolViolation(f"undecodable message: {type(exc).__name__}") from exc
    decoded = []
    for raw in raws:
        if type(raw) is not list or not raw:
            raise ProtocolViolation("a WAMP message must be a non-empty array")
        kind = raw[0]
        plain = _PLAIN_PARSERS.get(kind) if type(kind) is int else None
        if plain is not None:
            parsed = plain(raw)
            if parsed is not None:
                decoded.append((parsed, raw))
                continue
        klass = MESSAGE_CLASSES.get(kind) if type(kind) is int else None
        if klass is None:
            raise ProtocolViolation(f"unknown WAMP message type {kind!r}")
        try:
            decoded.append((klass.parse(raw), raw))
        except InvalidUriError as exc:
            decoded.append((_invalid_uri_request(raw, str(exc)), raw))
        except ProtocolError as exc:
            raise ProtocolViolation(str(exc)) from exc
        except (TypeError, ValueError, KeyError, IndexError, AssertionError) as exc:
            raise ProtocolViolation(f"malformed {klass.__name__.upper()}: {exc}") from exc
    return decoded
