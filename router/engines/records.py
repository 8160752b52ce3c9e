"""Records both engines share: the persisted form of a retained event, the form a
publication travels in between nodes and sits in the Redis history (MessagePack, so binary
payloads survive), and the key a topic is stored under (a SQLite row, a Redis hash field)."""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any, Callable

import msgpack

from router.core.model import Eligibility, Passthru, Publication, SessionInfo
from router.core.payload import UNMAPPED, JsonPayloadPublication, as_text
from router.core.retention import Owner, RetainedEvent, earliest
from router.core.topic import Topic, from_uri


_pack = msgpack.Packer(use_bin_type=True).pack
"""MessagePack of the retained records, by one packer (not one made per call). Reactor
thread only: a Packer is not shared between threads."""

_ARGS_ARE_PAYLOAD = True
"""Stored in place of ``args`` when they are ``[payload]`` itself (an MQTT or AMQP payload
that is not JSON): the bytes once, not twice. Args are otherwise a list or None..."""

_ARGS_MAP_PAYLOAD = False
"""... or this, for a :class:`JsonPayloadPublication`: args and kwargs are the ``json``
mapping of the payload, mapped again when read (the publish did not map them)."""


def _stored_arguments(publication: Publication) -> tuple[object, Any]:
    """``args`` and ``kwargs`` as stored or sent to another node: a marker where the payload
    already says what they are (:data:`_ARGS_ARE_PAYLOAD`, :data:`_ARGS_MAP_PAYLOAD`)."""
    if type(publication) is JsonPayloadPublication:
        return _ARGS_MAP_PAYLOAD, None
    args = publication.args
    payload = publication.payload
    if payload is not None and args is not None and len(args) == 1 and args[0] is payload:
        return _ARGS_ARE_PAYLOAD, publication.kwargs
    return args, publication.kwargs


def _restored_arguments(args: Any, kwargs: Any, payload: bytes | None
                        ) -> tuple[type[Publication], Any, Any]:
    """The inverse of :func:`_stored_arguments`: the class to rebuild, its args and kwargs."""
    if args is _ARGS_MAP_PAYLOAD:
        return JsonPayloadPublication, UNMAPPED, UNMAPPED
    if args is _ARGS_ARE_PAYLOAD:
        return Publication, [payload], kwargs
    return Publication, args, kwargs


def encode_retained(publication: Publication, expires_at: float | None,
                    owner: Owner | None) -> bytes:
    """One retained entry as bytes; raises TypeError for payloads MessagePack cannot hold.
    The owner travels with the entry, so SQLite rows and Redis hashes (one format) keep
    each principal's retained quota across restarts and among nodes. Positional (a list:
    entries written before were maps of named fields, which :func:`decode_retained` still
    reads), about half the bytes to commit per retained publish."""
    publisher = publication.publisher
    args, kwargs = _stored_arguments(publication)
    blob: bytes = _pack([
        publication.publication_id,
        publication.topic,
        args,
        kwargs,
        (publisher.session_id, publisher.authid, publisher.authrole)
        if publisher is not None else None,
        publication.disclose,
        publication.eligibility.to_json() if publication.eligibility else None,
        publication.exclude_me,
        publication.timestamp,
        expires_at,
        publication.qos,
        publication.payload,
        publication.properties,
        publication.amqp,
        publication.expires_at,
        owner,
        publication.passthru.to_json() if publication.passthru else None,
    ])
    return blob


def decode_retained(blob: bytes, realm: str) -> RetainedEvent:
    """A retained entry back from :func:`encode_retained`'s bytes, also reading entries stored by
    older versions (maps of named fields, dotted topics, no owner)."""
    data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    if type(data) is dict:
        return _decode_named(data, realm, len(blob))
    (publication_id, topic, args, kwargs, publisher, disclose, eligibility, exclude_me,
     timestamp, expires, qos, payload, properties, amqp, message_expires, owner,
     passthru) = data
    info = (SessionInfo(publisher[0], realm, publisher[1], publisher[2])
            if publisher is not None else None)
    kind, args, kwargs = _restored_arguments(args, kwargs, payload)
    publication = kind(publication_id, tuple(topic), args, kwargs, info, disclose,
                       Eligibility.from_json(eligibility) if eligibility else None,
                       exclude_me, retain=True, timestamp=timestamp, qos=qos,
                       payload=payload, properties=properties, amqp=amqp,
                       expires_at=message_expires, passthru=Passthru.from_json(passthru))
    return RetainedEvent(publication, expires, len(blob),
                         owner=Owner(*owner) if owner is not None else None)


def _decode_named(data: dict[str, Any], realm: str, size: int) -> RetainedEvent:
    """An entry stored as a map of named fields (before entries were positional)."""
    publisher = None
    if data["publisher"] is not None:
        session_id, authid, authrole = data["publisher"]
        publisher = SessionInfo(session_id, realm, authid, authrole)
    eligibility = Eligibility.from_json(data["eligibility"]) if data["eligibility"] else None
    topic = data["topic"]  # a dotted URI in entries stored before topics were levels
    publication = Publication(data["id"], from_uri(topic) if type(topic) is str else tuple(topic),
                              data["args"], data["kwargs"], publisher,
                              data["disclose"], eligibility, data["exclude_me"], retain=True,
                              timestamp=data["ts"], qos=data.get("qos", 0),
                              payload=data.get("payload"), properties=data.get("properties"), amqp=data.get("amqp"),
                              expires_at=data.get("message_expires"),
                              passthru=Passthru.from_json(data.get("passthru")))
    owner = data.get("owner")
    if owner is not None:
        owner = Owner(*owner)
    elif publisher is not None:  # stored before owners were: charged to its authid
        owner = Owner("authid", publisher.authid)
    # entries stored before the retained expiry took the message expiry into account
    return RetainedEvent(publication, earliest(data["expires"], publication.expires_at), size,
                         owner=owner)


def pack_topic(entries: list[RetainedEvent]) -> bytes:
    """A topic's row: its entries' encodings (made again where the store dropped them)."""
    if len(entries) == 1 and entries[0].blob is not None:
        single: bytes = _pack([entries[0].blob])  # the commonest row: a topic set just now
        return single
    row: bytes = _pack([
        entry.blob if entry.blob is not None
        else encode_retained(entry.publication, entry.expires_at, entry.owner)
        for entry in entries])
    return row


def unpack_topic(blob: bytes) -> list[bytes]:
    """A topic's row read back: its entries' encodings (see :func:`decode_retained`)."""
    blobs: list[bytes] = msgpack.unpackb(blob, raw=False)
    return blobs


def pack_publication(realm: str, publication: Publication) -> bytes:
    """A publication as another node needs it to run its own fan-out; dates, UUIDs and
    decimals (from CBOR publishers) go as the text every receiver but CBOR gets anyway.
    Arguments the payload says go as a marker (the bytes once, mapped where read)."""
    publisher = publication.publisher
    eligibility = publication.eligibility
    args, kwargs = _stored_arguments(publication)
    packed: bytes = msgpack.packb([
        realm, publication.publication_id, publication.topic, args, kwargs,
        (publisher.session_id, publisher.authid, publisher.authrole, publisher.protocol)
        if publisher is not None else None,
        publication.disclose, eligibility.to_json() if eligibility is not None else None,
        publication.qos, publication.payload, publication.properties, publication.expires_at,
        publication.amqp, publication.timestamp, publication.payload_bytes,
        publication.passthru.to_json() if publication.passthru is not None else None,
    ], use_bin_type=True, default=as_text)
    return packed


def unpack_publication(data: bytes, exclude_me: bool = False) -> tuple[str, Publication]:
    """The inverse of :func:`pack_publication`. A forwarded publication is not excluded from
    anyone (the publisher's session is on the sending node); one read back from the history
    is excluded from its publisher's session if it was when published."""
    (realm, publication_id, topic, args, kwargs, publisher, disclose, eligibility, qos,
     payload, properties, expires_at, amqp, timestamp,
     payload_bytes, *passthru) = msgpack.unpackb(data, raw=False, strict_map_key=False)
    info = SessionInfo(publisher[0], realm, publisher[1], publisher[2],
                       protocol=publisher[3]) if publisher is not None else None
    kind, args, kwargs = _restored_arguments(args, kwargs, payload)
    return realm, kind(
        publication_id, tuple(topic), args, kwargs, info, disclose,
        Eligibility.from_json(eligibility) if eligibility is not None else None,
        exclude_me=exclude_me,
        payload_bytes=payload_bytes, qos=qos, payload=payload, properties=properties,
        expires_at=expires_at, amqp=amqp, timestamp=timestamp,
        passthru=Passthru.from_json(passthru[0] if passthru else None))


def topic_key(topic: Topic) -> str:
    """A topic's key in storage (the ``retained`` table, the Redis retained hash and history
    keys): the JSON array of its levels, so no level separator can be confused. What
    ``json.dumps(topic, ensure_ascii=False, separators=(",", ":"))`` gives, joined from the
    levels' JSON strings: a third of the encoder's cost (which builds its scanner per call),
    paid per retained row by the SQLite writer."""
    return "[" + ",".join(map(_json_string, topic)) + "]"


_json_string: Callable[[str], str] = encode_basestring
"""A level as a JSON string, non-ASCII kept (the C function ``json`` itself uses)."""


def live_entries(blobs: list[bytes], realm: str, now: float) -> list[RetainedEvent]:
    """A stored topic's entries that still apply: not expired, none older than the newest
    general event (those served only its publisher's session, which is gone)."""
    entries = [decode_retained(blob, realm) for blob in blobs]
    newest_general = max((i for i, e in enumerate(entries) if e.general), default=0)
    return [e for e in entries[newest_general:] if e.expires_at is None or e.expires_at > now]
