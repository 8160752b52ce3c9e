"""A webhook: a subscriber of its realm whose events go to a URL, one request at a time.

Each event is turned into its request body when it arrives and waits in the webhook's queue
(bounded by ``max_queue`` events and ``max_queue_bytes``; one more is dropped and counted as
``queue_full``, or ``slow_consumer`` at QoS 0). A QoS 1 event is also written to the
engine's :class:`router.core.engine.OutboxStore` and deleted from it only once the target
answered 2xx, so a restart, even after ``kill -9``, sends it again. The oldest event is sent;
until it is taken nothing behind it is, so the target sees the publication order. A failure
(an answer other than 2xx, a refused connection, ``timeout`` seconds without an answer) waits
``min_backoff`` seconds, doubled at each further failure up to ``max_backoff``, and sends
the same event again.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure

from router.core.credentials import Principal
from router.core.engine import OutboxRecord, OutboxStore
from router.core.errors import Unencodable
from router.core.ids import random_id
from router.core.incidents import EXPIRED, QUEUE_FULL, SLOW_CONSUMER, UNACKNOWLEDGED
from router.core.model import Publication, SessionInfo
from router.core.options import SubscribeOptions
from router.core.ownership import anonymous_authid
from router.core.peer import Invocation, Registration, Subscription
from router.core.qos import delivered_qos
from router.core.realm import Realm
from router.core.topic import from_mqtt, from_uri
from router.core.uri import MQTT
from router.settings import WebhookSettings
from router.webhooks.event import event_body, event_id, request_headers

log = logging.getLogger(__name__)

PROTOCOL = "webhook"
"""The protocol a webhook's session, metrics and incidents are counted under."""
UP, BACKING_OFF, STOPPED = "up", "backing_off", "stopped"
"""A webhook's states: its last request succeeded (or none failed yet); its target is
failing and the next attempt waits; it no longer takes events (the node is stopping, or its
session was killed)."""
MAX_DOUBLINGS = 30
"""Failures after which the back-off stops doubling (it is at ``max_backoff`` long before)."""


class Client(Protocol):
    """How a webhook reaches its URL (:class:`router.webhooks.client.WebhookClient`)."""

    def post(self, headers: dict[str, str], body: bytes) -> "defer.Deferred[int]":
        """Send one request; fires with the answer's status or fails."""

    def close(self) -> "defer.Deferred[None]":
        """Close the idle connection (at shutdown)."""


@dataclass(slots=True)
class Pending:
    """One event waiting for its target."""

    record: OutboxRecord
    event: str
    """Its ``X-Webhook-Id``."""
    durable: bool
    """Kept in the outbox store until taken (QoS 1)."""


class Webhook:
    """One configured webhook of a realm (see the module docstring)."""

    def __init__(self, realm: Realm, settings: WebhookSettings, role: str,
                 store: OutboxStore | None, client: Client, clock: Any) -> None:
        """``role``: the role of ``settings.authid`` (the realm's anonymous role without);
        ``client``: the webhook's own connection to its URL;
        ``store``: where QoS 1 events wait (None: in memory only)."""
        self.realm = realm
        self.settings = settings
        self._store = store
        self.client = client
        self._clock = clock
        session_id = random_id()
        authid = settings.authid
        self.info = SessionInfo(
            session_id, realm.name,
            authid if authid is not None else anonymous_authid(session_id),
            role, "webhook" if authid is not None else "anonymous",
            "router", PROTOCOL, {"type": PROTOCOL, "url": settings.url})
        self.queue: deque[Pending] = deque()
        self.queued_bytes = 0
        self.state = UP
        self.delivered = 0
        """Events the target took (2xx)."""
        self.failed = 0
        """Requests that failed (they are retried)."""
        self.dropped = 0
        """Events given up: the queue at its bound, expired, or ``max_attempts`` reached."""
        self._attempts = 0
        """Failed attempts of the event at the head of the queue."""
        self._sending = False
        self._retry: Any = None
        self._next_seq = 1

    # start and stop ------------------------------------------------------------------

    def start(self) -> None:
        """Queue what an earlier run left, join the realm and subscribe."""
        if self._store is not None:
            for record in self._store.load(self.settings.name):
                self._push(Pending(record, json.loads(record.body)["id"], True))
                self._next_seq = record.seq + 1
            if self.queue:
                log.info("realm %s: webhook %s: %d event(s) restored", self.realm.name,
                         self.settings.name, len(self.queue))
        self.realm.attach(self)
        settings = self.settings
        topic = from_mqtt(settings.topic) if settings.match == MQTT else from_uri(settings.topic)
        self.realm.subscribe(self, topic, SubscribeOptions(match=settings.match))
        self._send_next()

    def stop(self) -> None:
        """Take no more events and send nothing more (shutdown, or a reload revoked it);
        what is queued at QoS 1 stays stored for the next start."""
        self.state = STOPPED
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        self.realm.detach(self)

    # what the realm delivers ---------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        """Queue one event (its body made now); at the queue's bound, drop it (counted)."""
        if self.state == STOPPED:
            return
        settings = self.settings
        qos = min(1, delivered_qos(publication.qos, settings.qos, settings.qos_policy))
        if len(self.queue) >= settings.max_queue:
            self._drop(QUEUE_FULL if qos else SLOW_CONSUMER,
                       f"topic {publication.name}: {settings.max_queue} events queued, the "
                       "maximum")
            return
        try:
            body = event_body(publication, self.realm.name, settings.name, self.realm.uri_check,
                              qos)
        except (TypeError, ValueError) as exc:
            raise Unencodable(f"webhook {settings.name}: not representable as JSON: {exc}") \
                from None
        if self.queued_bytes + len(body) > settings.max_queue_bytes:
            self._drop(QUEUE_FULL if qos else SLOW_CONSUMER,
                       f"topic {publication.name}: {self.queued_bytes} bytes queued, "
                       f"{len(body)} more would pass max_queue_bytes "
                       f"({settings.max_queue_bytes})")
            return
        record = OutboxRecord(self._next_seq, body, publication.expires_at)
        self._next_seq += 1
        durable = bool(qos) and self._store is not None
        if durable:
            self._store.append(settings.name, record)  # type: ignore[union-attr]
        self._push(Pending(record, event_id(publication), durable))
        self._send_next()

    def _push(self, pending: Pending) -> None:
        self.queue.append(pending)
        self.queued_bytes += len(pending.record.body)

    def _pop(self) -> None:
        pending = self.queue.popleft()
        self.queued_bytes -= len(pending.record.body)
        if pending.durable:
            self._store.remove(self.settings.name, pending.record.seq)  # type: ignore[union-attr]
        self._attempts = 0

    def _drop(self, reason: str, detail: str) -> None:
        """Count one event given up (incident ``reason``, protocol ``webhook``)."""
        self.dropped += 1
        self.realm.incidents.count(self.realm.name, PROTOCOL, reason,
                                   f"webhook {self.settings.name}: {detail}")

    # sending ---------------------------------------------------------------------------

    def _send_next(self) -> None:
        """Send the oldest event unless a request is under way or a retry is waiting."""
        if self._sending or self._retry is not None or self.state == STOPPED:
            return
        while self.queue and _expired(self.queue[0].record):
            self._drop(EXPIRED, f"event {self.queue[0].event}: its message expiry passed "
                       "while it was queued")
            self._pop()
        if not self.queue:
            return
        pending = self.queue[0]
        self._sending = True
        settings = self.settings
        headers = request_headers(pending.record.body, pending.event, self._attempts + 1,
                                  time.time(), settings.secret, settings.headers)
        try:
            request = self.client.post(headers, pending.record.body)
        except Exception:  # a URL the client cannot use: a failure like any other
            request = defer.fail()
        request.addCallbacks(self._answered, self._failed)

    def _answered(self, status: int) -> None:
        self._sending = False
        if self.state == STOPPED:
            return  # the node is closing its store: the event stays queued for the next start
        if not 200 <= status < 300:
            self._failed(Failure(RuntimeError(f"answered {status}")))
            return
        self.delivered += 1
        if self.state == BACKING_OFF:
            log.info("realm %s: webhook %s: %s answers again", self.realm.name,
                     self.settings.name, self.settings.url)
            self.state = UP
        self._pop()
        self._send_next()

    def _failed(self, failure: Failure) -> None:
        self._sending = False
        self.failed += 1
        self._attempts += 1
        settings = self.settings
        if self.state == STOPPED:
            return
        reason = failure.getErrorMessage() or failure.type.__name__
        if settings.max_attempts is not None and self._attempts >= settings.max_attempts:
            self._drop(UNACKNOWLEDGED, f"event {self.queue[0].event} given up after "
                       f"{self._attempts} attempt(s), the last: {reason}")
            self._pop()
            self._send_next()
            return
        doublings = min(self._attempts - 1, MAX_DOUBLINGS)
        delay = min(settings.max_backoff, settings.min_backoff * 2 ** doublings)
        if self.state != BACKING_OFF:
            log.warning("realm %s: webhook %s: %s failed: %s; retrying every %g s at most",
                        self.realm.name, settings.name, settings.url, reason,
                        settings.max_backoff)
        self.state = BACKING_OFF
        self._retry = self._clock.callLater(delay, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        self._send_next()

    # the rest of a Peer: a webhook only subscribes -----------------------------------

    def ready(self) -> bool:
        return self.state != STOPPED

    def backlog_room(self) -> bool:
        return True

    def send_invocation(self, invocation: Invocation) -> None:
        raise NotImplementedError("a webhook registers no procedure")

    def send_interrupt(self, invocation: Invocation, mode: str, reason: str) -> None:
        raise NotImplementedError("a webhook registers no procedure")

    def send_result(self, call_request: int, args: list | None, kwargs: dict | None,
                    progress: bool) -> None:
        raise NotImplementedError("a webhook calls no procedure")

    def send_call_error(self, call_request: int, error: str, args: list | None,
                        kwargs: dict | None) -> None:
        raise NotImplementedError("a webhook calls no procedure")

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        """Closed by the router (a reload gave its principal another role)."""
        log.warning("realm %s: webhook %s stopped: %s", self.realm.name, self.settings.name,
                    message or reason)
        self.stop()

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        self.kill("revoked", reason)

    def registration_revoked(self, registration: Registration, reason: str) -> None:
        """Never: a webhook registers nothing."""


def _expired(record: OutboxRecord) -> bool:
    return record.expires_at is not None and record.expires_at <= time.time()


def open_webhooks(realm: Realm, configured: tuple[WebhookSettings, ...],
                  principals: dict[str, Principal], store: OutboxStore | None,
                  reactor: Any, node: str | None = None) -> list[Webhook]:
    """The realm's webhooks this node runs (``node``: its name on the Redis engine, where
    each webhook names its node), each with its own client, not started yet; queues the
    store holds for webhooks no longer configured are deleted (logged)."""
    if store is not None:
        gone = store.forget_others({settings.name for settings in configured})
        if gone:
            log.warning("realm %s: %d queued webhook event(s) deleted: their webhook is no "
                        "longer configured", realm.name, gone)
    hooks = []
    for settings in configured:
        if settings.node is not None and settings.node != node:
            continue
        role = (principals[settings.authid].role if settings.authid is not None
                else realm.anonymous_role)
        # the HTTP client (twisted.web) is loaded by a router with webhooks only
        from router.webhooks.client import WebhookClient
        hooks.append(Webhook(realm, settings, role or "", store,
                             WebhookClient(reactor, settings.url, settings.timeout,
                                           settings.ca), reactor))
    return hooks
