"""A realm's view of the event log: turns core activity into schema records."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from router.core.incidents import EVENTLOG_DROPPED
from router.core.model import ELIGIBILITY_KEYS, Publication, SessionInfo
from router.core.peer import Subscription
from router.core.topic import Topic, name_fields, pattern_text
from router.core.uri import EXACT
from router.eventlog.schema import KINDS
from router.eventlog.writer import EventLogWriter


@dataclass(frozen=True)
class RealmLogSettings:
    """Per-realm event-log settings (``eventlog.realms.<name>`` in config.json)."""

    enabled: bool = True
    kinds: frozenset[str] = frozenset(KINDS)
    payloads: bool = False
    """Log payload contents (JSON of [args, kwargs]); off by default: sizes only."""


class RealmEventLog:
    """Implements :class:`router.core.activity.ActivityLog` for one realm."""

    def __init__(self, realm: str, writer: EventLogWriter, settings: RealmLogSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self._realm = realm
        self._clock = clock
        """Stamps records other than publishes (a bench replays simulated time with it)."""
        self._writer = writer
        self._kinds = settings.kinds
        self._payloads = settings.payloads
        self._incidents: Counter[tuple[str, str]] = Counter()
        """Incidents per (protocol, reason) since the last :meth:`flush_incidents`: a flood
        of drops becomes one record per cause and flush interval, not one per message."""

    def _append(self, record: dict) -> None:
        self._writer.append(self._realm, record)

    def published(self, publication: Publication, receivers: int) -> None:
        """Client publications only (the realm's own meta events are not logged)."""
        if "publish" not in self._kinds:
            return
        publisher = publication.publisher
        record = {"ts": publication.timestamp, "kind": "publish", **name_fields(publication.topic),
                  "publication": publication.publication_id, "session": publisher.session_id,
                  "authid": publisher.authid, "authrole": publisher.authrole,
                  "protocol": publisher.protocol, "qos": publication.qos,
                  "retain": publication.retain,
                  "payload_bytes": publication.payload_bytes, "receivers": receivers}
        if publication.eligibility is not None:
            record["eligibility"] = ",".join(
                key for key in ELIGIBILITY_KEYS if getattr(publication.eligibility, key) is not None)
        if self._payloads:
            record["payload"] = _payload_text(publication.args, publication.kwargs)
        self._append(record)

    def retained(self, topic: Topic, action: str, publication: Publication | None) -> None:
        kind = f"retained_{action}"
        if kind not in self._kinds:
            return
        record = {"ts": self._clock(), "kind": kind, **name_fields(topic)}
        if publication is not None:
            record["publication"] = publication.publication_id
        self._append(record)

    def subscribed(self, session: SessionInfo, subscription: Subscription,
                   get_retained: bool) -> None:
        if "subscribe" in self._kinds:
            self._append(dict(self._session_fields(session), kind="subscribe",
                              **_pattern(subscription.topic, subscription.match),
                              subscription=subscription.id, get_retained=get_retained))

    def unsubscribed(self, session: SessionInfo, subscription: Subscription) -> None:
        if "unsubscribe" in self._kinds:
            self._append(dict(self._session_fields(session), kind="unsubscribe",
                              **_pattern(subscription.topic, subscription.match),
                              subscription=subscription.id))

    def refused(self, session: SessionInfo, operation: str, topic: Topic, match: str,
                reason: str) -> None:
        if "refused" in self._kinds:
            self._append(dict(self._session_fields(session), kind="refused",
                              **_pattern(topic, match), operation=operation, reason=reason))

    def incident(self, protocol: str, reason: str, n: int) -> None:
        """Count an incident of this realm (written by :meth:`flush_incidents`)."""
        if reason != EVENTLOG_DROPPED and "incident" in self._kinds:
            self._incidents[protocol, reason] += n

    def flush_incidents(self) -> None:
        """One ``incident`` record per (protocol, reason) counted since the last call."""
        if self._incidents:
            now = self._clock()
            for (protocol, reason), n in self._incidents.items():
                self._append({"ts": now, "kind": "incident", "protocol": protocol,
                              "reason": reason, "count": n})
            self._incidents.clear()

    def acknowledged(self, session: SessionInfo, topic: Topic, qos: int,
                     latency_ms: float) -> None:
        if "ack" in self._kinds:
            self._append(dict(self._session_fields(session), kind="ack", **name_fields(topic),
                              qos=qos, latency_ms=latency_ms))

    def joined(self, session: SessionInfo) -> None:
        if "session_join" in self._kinds:
            self._append(dict(self._session_fields(session), kind="session_join",
                              authmethod=session.authmethod))

    def left(self, session: SessionInfo) -> None:
        if "session_leave" in self._kinds:
            now = self._clock()
            self._append(dict(self._session_fields(session, now), kind="session_leave",
                              authmethod=session.authmethod, duration=now - session.joined_at))

    def _session_fields(self, session: SessionInfo, now: float | None = None) -> dict:
        return {"ts": now if now is not None else self._clock(), "session": session.session_id,
                "authid": session.authid, "authrole": session.authrole,
                "protocol": session.protocol}


def _payload_text(args: object, kwargs: object) -> str:
    """The payload as JSON text (values JSON has not, such as bytes, as their repr); one JSON
    cannot hold at all (a map with a binary key, from MessagePack or CBOR) as its repr: the
    publish it records goes on either way."""
    try:
        return json.dumps([args, kwargs], default=repr)
    except (TypeError, ValueError):
        return repr([args, kwargs])


def _pattern(pattern: Topic, match: str) -> dict:
    """A pattern's fields: ``pattern`` and ``match``, and ``topic`` when it names one topic."""
    fields = {"pattern": pattern_text(pattern, match), "match": match}
    if match == EXACT:
        fields.update(name_fields(pattern))
    return fields
