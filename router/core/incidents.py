"""Incidents an operator must see (drops, refusals, store failures), counted and logged sparingly.

A flood of one kind of incident (a stopped reader dropping 50,000 QoS 0 events a second,
a full disk failing every commit) must not become a flood of log lines: per cause
(realm, protocol, reason) the first occurrence is logged at once, later ones only as a
count, at most once per ``interval`` seconds. ``totals`` keeps every count since start
for operators' tools.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import Any, Callable

log = logging.getLogger("router.incidents")

# reasons (stable names: operators' tools and the docs use them)
SLOW_CONSUMER = "slow_consumer"
"""A QoS 0 message dropped because its receiver's outbound buffer was full."""
QUEUE_FULL = "queue_full"
"""A QoS >= 1 message dropped because its receiver's queue was at its bound."""
EXPIRED = "expired"
"""A message whose expiry passed before it could be delivered."""
UNENCODABLE = "unencodable"
"""A payload that cannot be represented in the receiver's wire format."""
UNSUPPORTED = "unsupported"
"""A published message refused for a value the router cannot carry (an AMQP decimal or
described value)."""
PASSTHRU_SKIPPED = "passthru_skipped"
"""A Payload Passthru Mode payload not sent to a receiver that cannot take it unchanged (a
WAMP session that did not announce the feature or its dialect; an MQTT or AMQP receiver
and a scheme other than ``mqtt``), or a passthru call or result refused for that reason."""
TOO_LARGE = "too_large"
"""A message over the receiver's maximum message or packet size."""
DELIVERY_FAILED = "delivery_failed"
"""An unexpected error in one receiver's delivery path (a router bug, contained)."""
NOT_AUTHORIZED = "not_authorized"
"""A publish or subscribe the client's role may not do."""
INVALID_TOPIC = "invalid_topic"
"""A publish or subscribe refused for a topic or filter the realm does not accept."""
STORE_FAILED = "store_failed"
"""A write to the store that failed (disk full, I/O error)."""
UNACKNOWLEDGED = "unacknowledged"
"""A QoS >= 1 delivery given up after its redeliveries, or over its in-flight bound."""
DISCONNECTED = "disconnected"
"""A client disconnected by the router for staying over a bound."""
LOGIN_FAILED = "login_failed"
"""A failed login from a host already over the login back-off's free failures."""
REFUSED = "refused"
"""A connection refused by a limit, or closed for not completing its handshake in time."""
EVENTLOG_DROPPED = "eventlog_dropped"
"""An event log record dropped because the log's writer thread was too far behind."""
UNREPRESENTABLE = "unrepresentable"
"""A message not delivered to a pattern subscriber whose protocol cannot name its topic
(a WAMP or dotted AMQP receiver and a topic that is no URI of the realm, an MQTT or "/"
AMQP receiver and a topic with "/" or a wildcard character inside a level)."""
RETAINED_QUOTA = "retained_quota"
"""A retained topic evicted because its owner (principal, or anonymous clients together)
went over ``retention.max_topics_per_principal`` / ``max_bytes_per_principal``: the
owner's own topic set longest ago."""
RETAINED_REALM_LIMIT = "retained_realm_limit"
"""A retained topic evicted because the realm went over ``retention.max_topics`` /
``max_bytes``: the oldest topic of the owner holding the most."""
RETAINED_REFUSED = "retained_refused"
"""A retained publish refused whole: its one event is larger than the byte bounds."""
OVER_LIMIT = "over_limit"
"""A subscription, registration or link refused for a per-session (per-connection) bound
(``max_subscriptions``, ``max_registrations``, ``amqp.max_links``)."""
REVOKED = "revoked"
"""A subscription or registration a reload took away (its role no longer covers it), or a
session closed because its login no longer holds (see ``router.core.policy``)."""

ENGINE_UNAVAILABLE = "engine_unavailable"
"""A publication not sent to the other nodes, or a retained change not stored, because the
node's engine (Redis) could not be reached, or had ``cluster.max_pending_commands`` commands
unanswered (Redis slow or stopped)."""
ENGINE_BEHIND = "engine_behind"
"""Reading from publishing connections paused because Redis answers slower than the node
sends (half of ``cluster.max_pending_commands`` commands unanswered)."""

BRIDGE_OFFLINE = "bridge_offline"
"""A QoS 0 message for a bridge whose remote broker was not connected (QoS >= 1 ones wait in
the bridge's queue instead, up to ``max_queued``: past it they count as ``queue_full``)."""
DROP_REASONS = (SLOW_CONSUMER, QUEUE_FULL, EXPIRED, UNENCODABLE, PASSTHRU_SKIPPED, TOO_LARGE,
                NOT_AUTHORIZED, INVALID_TOPIC, DELIVERY_FAILED, UNACKNOWLEDGED, EVENTLOG_DROPPED,
                BRIDGE_OFFLINE)
"""Incident reasons that cost a message; the others are refusals or failures of their own
(the metrics' dropped counts and ``$SYS`` read this one list)."""

Key = tuple[str, str, str]

RECENT_INCIDENTS = 100
"""Incidents kept for ``GET /incidents`` unless an ``http`` listener asks for more or fewer."""


class Incidents:
    """Counts incidents per (realm, protocol, reason); logs each cause at most once per interval."""

    def __init__(self, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self.totals: Counter[Key] = Counter()
        self._last_logged: dict[Key, float] = {}
        self._unlogged: Counter[Key] = Counter()
        self._example: dict[Key, str] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_INCIDENTS)
        """The latest incidents, newest last (bounded: older ones fall off; ``totals`` keeps
        their counts)."""
        self.listener: Callable[[str, str, str, int], None] | None = None
        """Told every count (realm, protocol, reason, n): the event log keeps them for the
        analytics. Called on the caller's thread; must only add to a counter."""

    def count(self, realm: str, protocol: str, reason: str, detail: str = "",
              n: int = 1, level: int = logging.WARNING,
              exc_info: BaseException | None = None) -> None:
        """Record ``n`` incidents of one cause; ``detail`` describes this one (peer, topic).

        ``exc_info`` (a router bug) is logged with its traceback when the line is logged."""
        key = (realm, protocol, reason)
        self.totals[key] += n
        self.recent.append({"time": time.time(), "realm": realm, "protocol": protocol,
                            "reason": reason, "count": n, "detail": detail})
        if self.listener is not None:
            self.listener(realm, protocol, reason, n)
        now = self._clock()
        last = self._last_logged.get(key)
        if last is not None and now - last < self.interval:
            self._unlogged[key] += n
            self._example[key] = detail
            return
        self._last_logged[key] = now
        earlier = self._unlogged.pop(key, 0)
        self._example.pop(key, None)
        context = {"realm": realm, "protocol": protocol}
        log.log(level, "realm %s, %s: %s%s%s", realm or "-", protocol, reason,
                f" x{n}" if n > 1 else "", f": {detail}" if detail else "", exc_info=exc_info,
                extra=context)
        if earlier:
            log.log(level, "realm %s, %s: %s x%d more in the last %gs", realm or "-", protocol,
                    reason, earlier, self.interval, extra=context)

    def keep_recent(self, bound: int) -> None:
        """Keep the latest ``bound`` incidents from now on."""
        self.recent = deque(self.recent, maxlen=bound)

    def flush(self) -> None:
        """Log the counts held back since each cause's last line (run every ``interval``)."""
        now = self._clock()
        for key, n in list(self._unlogged.items()):
            if now - self._last_logged.get(key, 0.0) < self.interval:
                continue
            realm, protocol, reason = key
            example = self._example.pop(key, "")
            del self._unlogged[key]
            self._last_logged[key] = now
            log.warning("realm %s, %s: %s x%d in the last %gs%s", realm or "-", protocol,
                        reason, n, self.interval, f" (latest: {example})" if example else "",
                        extra={"realm": realm, "protocol": protocol})

    def total(self, reason: str, protocol: str | None = None, realm: str | None = None) -> int:
        """All incidents of ``reason`` so far, optionally of one protocol or realm."""
        return sum(n for (r, p, why), n in self.totals.items()
                   if why == reason and (protocol is None or p == protocol)
                   and (realm is None or r == realm))
