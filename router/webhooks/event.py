"""What a webhook sends: one JSON body per event and the headers that sign it.

The body is made once, when the event is queued, and kept (in the durable queue for QoS 1):
a request sent again after a failure or a restart carries the same bytes and the same
``X-Webhook-Id``, so the target can drop a copy it already took. The signature covers the
timestamp of each attempt and the body: ``HMAC-SHA256(secret, "<timestamp>." + body)``, so
a captured request cannot be replayed later with a fresh timestamp.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from router.core.model import Publication
from router.core.payload import json_bytes

ID_HEADER = "X-Webhook-Id"
TIMESTAMP_HEADER = "X-Webhook-Timestamp"
SIGNATURE_HEADER = "X-Webhook-Signature"
ATTEMPT_HEADER = "X-Webhook-Attempt"
USER_AGENT = "router-webhook/1"
ROUTER_HEADERS = {name.lower() for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER,
                                            ATTEMPT_HEADER, "Content-Type", "User-Agent")}
"""Headers the router sets on every request; a configured one of these names is ignored."""


def event_body(publication: Publication, realm: str, webhook: str, uri_check: str,
               qos: int) -> bytes:
    """The JSON body of one event, the payload as a WAMP subscriber of the realm sees it
    (an MQTT or AMQP publisher's bytes mapped by the realm's ``payload_mapping``; binary
    values as WAMP's ``"\\u0000" + base64`` strings). Raises TypeError or ValueError for a
    value JSON cannot carry."""
    event: dict[str, Any] = {
        "id": event_id(publication),
        "webhook": webhook,
        "realm": realm,
        "topic": publication.uri(uri_check),
        "mqtt_topic": publication.mqtt_topic(),
        "publication": publication.publication_id,
        "timestamp": publication.timestamp,
        "retain": publication.retain,
        "qos": qos,
        "args": publication.args or [],
        "kwargs": publication.kwargs or {},
    }
    event.update(publication.publisher_details())
    return json_bytes(event)


def event_id(publication: Publication) -> str:
    """The id a target deduplicates on: the same for every attempt of one event."""
    return f"{publication.publication_id}-{int(publication.timestamp * 1000)}"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Webhook-Signature`` value: ``sha256=`` and the hex HMAC of ``timestamp.body``."""
    digest = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body,
                      hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def request_headers(body: bytes, event: str, attempt: int, timestamp: float,
                    secret: str | None, extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The headers of one attempt: the configured ones, then the router's (which win)."""
    stamp = str(int(timestamp))
    headers = {name: value for name, value in extra if name.lower() not in ROUTER_HEADERS}
    headers.update({"Content-Type": "application/json", "User-Agent": USER_AGENT,
                    ID_HEADER: event, TIMESTAMP_HEADER: stamp, ATTEMPT_HEADER: str(attempt)})
    if secret is not None:
        headers[SIGNATURE_HEADER] = signature(secret, stamp, body)
    return headers
