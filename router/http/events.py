"""Events as the HTTP API shows them (retained, history, Server-Sent Events): one JSON
object per publication, the same shape everywhere.

Binary values follow WAMP's JSON convention (a NUL character, then base64), as the WAMP
JSON serializer and MQTT payloads do (:func:`router.core.payload.json_default`).
"""

from __future__ import annotations

import json

from router.core.history import rfc3339
from router.core.model import Publication
from router.core.payload import json_default
from router.core.topic import name_fields


def event_json(publication: Publication) -> dict:
    """The JSON object of one event."""
    topic = publication.topic
    event: dict = {**name_fields(topic), "publication": publication.publication_id,
                   "timestamp": rfc3339(publication.timestamp)}
    if publication.args:
        event["args"] = publication.args
    if publication.kwargs:
        event["kwargs"] = publication.kwargs
    content_type = (publication.properties or {}).get("content_type")
    if content_type is not None:
        event["content_type"] = content_type
    event.update(publication.publisher_details())
    return event


def dumps(value: object) -> bytes:
    """Compact UTF-8 JSON with the router's rule for binary and other non-JSON values."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      default=json_default).encode("utf-8")


def event_id(publication: Publication) -> str:
    """The SSE ``id``: microseconds since the epoch and the publication id, so a
    ``Last-Event-ID`` says where in the history to resume even if that event is gone."""
    return f"{int(publication.timestamp * 1_000_000)}-{publication.publication_id}"


def parse_event_id(text: str) -> tuple[float, int] | None:
    """(timestamp, publication id) of an SSE event id; None if it is not one of ours."""
    micros, sep, publication = text.strip().partition("-")
    if not sep or not micros.isdigit() or not publication.isdigit():
        return None
    return int(micros) / 1_000_000, int(publication)
