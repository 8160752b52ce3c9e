"""The persisted form of a retained event (MessagePack, so binary payloads survive)."""

from __future__ import annotations

import msgpack

from router.core.model import Eligibility, Publication, SessionInfo
from router.core.retention import RetainedEvent, earliest
from router.core.topic import from_uri


def encode_retained(publication: Publication, expires_at: float | None) -> bytes:
    """One retained entry as bytes; raises TypeError for payloads MessagePack cannot hold."""
    publisher = publication.publisher
    return msgpack.packb({
        "id": publication.publication_id,
        "topic": publication.topic,
        "args": publication.args,
        "kwargs": publication.kwargs,
        "publisher": ([publisher.session_id, publisher.authid, publisher.authrole]
                      if publisher is not None else None),
        "disclose": publication.disclose,
        "eligibility": publication.eligibility.to_json() if publication.eligibility else None,
        "exclude_me": publication.exclude_me,
        "ts": publication.timestamp,
        "expires": expires_at,
        "qos": publication.qos,
        "payload": publication.payload,
        "properties": publication.properties,
        "amqp": publication.amqp,
        "message_expires": publication.expires_at,
    }, use_bin_type=True)


def decode_retained(blob: bytes, realm: str) -> RetainedEvent:
    data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
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
                              expires_at=data.get("message_expires"))
    # entries stored before the retained expiry took the message expiry into account
    return RetainedEvent(publication, earliest(data["expires"], publication.expires_at), len(blob))


def pack_topic(entries: list[RetainedEvent]) -> bytes:
    """A topic's row: its entries' encodings (made again where the store dropped them)."""
    return msgpack.packb([entry.blob if entry.blob is not None
                          else encode_retained(entry.publication, entry.expires_at)
                          for entry in entries], use_bin_type=True)


def unpack_topic(blob: bytes) -> list[bytes]:
    return msgpack.unpackb(blob, raw=False)
