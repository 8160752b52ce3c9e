"""The router's figures as Prometheus metric families, read from its own counters at scrape time.

Nothing here runs per message: the hot path bumps plain ints (:mod:`router.core.stats`,
:class:`router.limits.ConnectionLimits`, :class:`router.core.incidents.Incidents`) and a
scrape walks them once. Labels are bounded by configuration: realm (configured realms),
protocol (``wamp``, ``mqtt``, ``amqp``), QoS, and incident reason; never a topic or a client.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Iterator, Mapping

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector, CollectorRegistry

from router.amqp.subscriber import AmqpSubscriber
from router.core import incidents as why
from router.core.stats import Histogram, RealmStats, family
from router.core.topic import REST, SERVER_OWNED
from router.core.uri import MQTT
from router.figures import NodeFigures
from router.http.stream import EventStream
from router.mqtt.session import MqttSession
from router.webhooks.webhook import UP

PROTOCOLS = ("wamp", "mqtt", "amqp", "http")
DROP_PROTOCOLS = {why.EVENTLOG_DROPPED: ("eventlog",), why.BRIDGE_OFFLINE: ("bridge",)}
"""The protocol label of drop reasons that are not a client protocol's (docs/metrics.md)."""


def queued(peer: object) -> int:
    """Messages waiting in a receiver's own queue (MQTT outbound, AMQP link queue, an HTTP
    event stream's frames while its socket does not drain)."""
    if isinstance(peer, MqttSession):
        return len(peer.outbound)
    if isinstance(peer, (AmqpSubscriber, EventStream)):
        return len(peer.queue)
    return 0


class RouterCollector(Collector):
    """Every metric of a running node (see docs/metrics.md)."""

    def __init__(self, node: NodeFigures) -> None:
        self.node = node
        self.started = time.time()

    def collect(self) -> Iterator[Metric]:
        yield from self._connections()
        yield from self._traffic()
        yield from self._incidents()
        yield from self._retained()
        yield from self._store()
        yield from self._logins()
        yield from self._rpc()
        yield from self._webhooks()
        yield from self._bridges()
        yield from self._memory()
        uptime = GaugeMetricFamily("router_uptime_seconds", "Seconds since the router started.")
        uptime.add_metric([], time.time() - self.started)
        yield uptime

    def _memory(self) -> Iterator[Metric]:
        reclaimer = self.node.reclaimer
        trims = CounterMetricFamily("router_memory_trims",
                                    "Heap trims (malloc_trim) done since start.")
        trims.add_metric([], reclaimer.trims)
        seconds = CounterMetricFamily("router_memory_trim_seconds",
                                      "Time spent in heap trims (in a thread, not the "
                                      "reactor's).")
        seconds.add_metric([], reclaimer.trim_seconds)
        given = CounterMetricFamily("router_memory_trimmed_bytes",
                                    "Resident memory the heap trims gave back.")
        given.add_metric([], reclaimer.trimmed_bytes)
        yield from (trims, seconds, given)

    def _connections(self) -> Iterator[Metric]:
        current = GaugeMetricFamily("router_connections", "Open client connections.",
                                    labels=["protocol"])
        opened = CounterMetricFamily("router_connections_opened",
                                     "Client connections admitted since start.",
                                     labels=["protocol"])
        bytes_in = CounterMetricFamily("router_received_bytes",
                                       "Bytes read from client connections.", labels=["protocol"])
        bytes_out = CounterMetricFamily("router_sent_bytes",
                                        "Bytes written to client connections.",
                                        labels=["protocol"])
        totals: dict[str, list[int]] = {protocol: [0, 0, 0, 0] for protocol in PROTOCOLS}
        for limits in self.node.listener_limits:
            row = totals[limits.protocol]
            row[0] += limits.open
            row[1] += limits.opened
            row[2] += limits.bytes_in
            row[3] += limits.bytes_out
        for protocol, (now, ever, read, written) in totals.items():
            current.add_metric([protocol], now)
            opened.add_metric([protocol], ever)
            bytes_in.add_metric([protocol], read)
            bytes_out.add_metric([protocol], written)
        yield from (current, opened, bytes_in, bytes_out)

    def _traffic(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily("router_sessions", "Sessions attached to a realm.",
                                     labels=["realm", "protocol"])
        sessions_opened = CounterMetricFamily("router_sessions_opened",
                                              "Sessions that joined a realm since start.",
                                              labels=["realm", "protocol"])
        received = CounterMetricFamily("router_messages_received",
                                       "Publications accepted from clients.",
                                       labels=["realm", "protocol", "qos"])
        delivered = CounterMetricFamily("router_messages_delivered",
                                        "Publications handed to a receiving session, by the "
                                        "publication's QoS.", labels=["realm", "protocol", "qos"])
        queue = GaugeMetricFamily("router_queued_messages",
                                  "Messages waiting in receivers' queues (QoS >= 1, credit).",
                                  labels=["realm", "protocol"])
        redelivered = CounterMetricFamily("router_messages_redelivered",
                                          "QoS >= 1 messages sent again to a receiver.",
                                          labels=["realm", "protocol"])
        latency = HistogramMetricFamily("router_delivery_latency_seconds",
                                        "From a publication entering the router to its first "
                                        "receiver's write.", labels=["realm"])
        for realm in self.node.router.realms.values():
            stats = realm.stats
            name = realm.name
            live: Counter[str] = Counter()
            depth: Counter[str] = Counter()
            for peer in realm.sessions.values():
                protocol = family(peer.info.protocol)
                live[protocol] += 1
                depth[protocol] += queued(peer)
            mqtt = self.node.mqtt.get(name)
            if mqtt is not None:  # sessions kept while their client is away queue too
                depth["mqtt"] += sum(len(s.outbound) for s in mqtt.sessions.values()
                                     if s.info.session_id not in realm.sessions)
            _add_by_protocol(sessions, name, live)
            _add_by_protocol(sessions_opened, name, _fold(stats.sessions_opened))
            _add_by_protocol(queue, name, depth)
            _add_by_protocol(redelivered, name, stats.redelivered)
            for qos in range(3):
                _add_by_protocol(received, name, _fold(stats.received[qos]), str(qos))
                _add_by_protocol(delivered, name, _fold(stats.delivered[qos]), str(qos))
            _add_histogram(latency, [name], stats.delivery_latency)
        yield from (sessions, sessions_opened, received, delivered, queue, redelivered, latency)

    def _incidents(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily("router_messages_dropped",
                                      "Messages not delivered, by reason.",
                                      labels=["realm", "protocol", "reason"])
        refused = CounterMetricFamily("router_connections_refused",
                                      "Connections refused by a limit or closed for not "
                                      "completing their handshake in time.",
                                      labels=["protocol"])
        other = CounterMetricFamily("router_incidents",
                                    "Other incidents: store failures, clients disconnected "
                                    "for staying over a bound.", labels=["realm", "protocol",
                                                                          "reason"])
        refusals: Counter[str] = Counter({protocol: 0 for protocol in PROTOCOLS})
        totals = self.node.router.incidents.totals
        # every drop reason from start, at 0 until it happens: a dashboard's rate() then reads
        # 0 on a healthy router, not "No data"
        drops: Counter[tuple[str, str, str]] = Counter({(realm, protocol, reason): 0
                                  for realm in self.node.router.realms
                                  for reason in why.DROP_REASONS
                                  for protocol in DROP_PROTOCOLS.get(reason, PROTOCOLS)})
        for (realm, protocol, reason), n in sorted(totals.items()):
            if reason in why.DROP_REASONS:
                drops[realm, protocol, reason] = n
            elif reason == why.REFUSED:
                refusals[protocol] += n
            elif reason != why.LOGIN_FAILED:  # router_login_failures_total has those
                other.add_metric([realm, protocol, reason], n)
        for labels, n in sorted(drops.items()):
            dropped.add_metric(list(labels), n)
        for protocol, n in refusals.items():
            refused.add_metric([protocol], n)
        yield from (dropped, refused, other)

    def _retained(self) -> Iterator[Metric]:
        topics = GaugeMetricFamily("router_retained_topics", "Topics with retained events.",
                                   labels=["realm"])
        sys_topics = GaugeMetricFamily("router_retained_sys_topics",
                                       "Of router_retained_topics, the router's own $SYS "
                                       "topics.", labels=["realm"])
        size = GaugeMetricFamily("router_retained_bytes",
                                 "Encoded size of the retained events.", labels=["realm"])
        evictions = CounterMetricFamily("router_retained_evictions",
                                        "Retained topics evicted at the realm's bounds.",
                                        labels=["realm"])
        expiries = CounterMetricFamily("router_retained_expiries",
                                       "Retained events dropped when their TTL or expiry passed.",
                                       labels=["realm"])
        history = GaugeMetricFamily("router_event_history_events",
                                    "Events kept for the event history procedures.",
                                    labels=["realm"])
        for realm in self.node.router.realms.values():
            labels = [realm.name]
            retention = realm.retention
            topics.add_metric(labels, len(retention) if retention is not None else 0)
            # a walk of the $SYS branch only: a few dozen topics, however many clients keep
            sys_topics.add_metric(labels, sum(1 for _ in retention.topics(
                (SERVER_OWNED, REST), MQTT)) if retention is not None else 0)
            size.add_metric(labels, retention.bytes if retention is not None else 0)
            evictions.add_metric(labels, realm.stats.retained_evictions)
            expiries.add_metric(labels, realm.stats.retained_expiries)
            history.add_metric(labels, realm.history.size() if realm.history else 0)
        yield from (topics, sys_topics, size, evictions, expiries, history)

    def _store(self) -> Iterator[Metric]:
        store = self.node.store
        commit = HistogramMetricFamily("router_store_commit_seconds",
                                       "Time to commit one batch of writes to SQLite.")
        _add_histogram(commit, [], store.commit_seconds)
        batch = HistogramMetricFamily("router_store_batch_writes",
                                      "Writes committed together in one SQLite transaction.")
        _add_histogram(batch, [], store.batch_writes)
        lag = GaugeMetricFamily("router_eventlog_backlog_records",
                                "Event log records not yet written by the writer thread.")
        lag.add_metric([], self.node.eventlog.backlog)
        yield from (commit, batch, lag)

    def _logins(self) -> Iterator[Metric]:
        guard = self.node.router.login_guard
        failures = CounterMetricFamily("router_login_failures", "Failed logins.",
                                       labels=["protocol"])
        holds = CounterMetricFamily("router_login_holds",
                                    "Failed logins whose refusal the back-off delayed.",
                                    labels=["protocol"])
        checks = CounterMetricFamily("router_password_checks",
                                     "Password (ticket) checks run, each one a PBKDF2 hash.",
                                     labels=["protocol"])
        verifier = self.node.router.verifier
        for protocol in PROTOCOLS:
            failures.add_metric([protocol], guard.failures[protocol])
            holds.add_metric([protocol], guard.holds[protocol])
            checks.add_metric([protocol], verifier.checks.get(protocol, 0) if verifier else 0)
        yield from (failures, holds, checks)

    def _rpc(self) -> Iterator[Metric]:
        families = {name: CounterMetricFamily(f"router_rpc_{name}", doc, labels=["realm"])
                    for name, doc in (("calls", "Calls routed (router procedures included)."),
                                      ("errors", "Calls answered with an error: no such "
                                       "procedure, or the callee's ERROR."),
                                      ("timeouts", "Calls ended by their timeout."),
                                      ("cancels", "Calls canceled by their caller."))}
        for realm in self.node.router.realms.values():
            stats = realm.stats
            labels = [realm.name]
            families["calls"].add_metric(labels, stats.calls)
            families["errors"].add_metric(labels, stats.call_errors)
            families["timeouts"].add_metric(labels, stats.call_timeouts)
            families["cancels"].add_metric(labels, stats.call_cancels)
        yield from families.values()

    def _webhooks(self) -> Iterator[Metric]:
        labels = ["realm", "webhook"]
        up = GaugeMetricFamily("router_webhook_up", "1 while a webhook's target takes its "
                               "events (its last request succeeded), 0 while it backs off or "
                               "is stopped.", labels=labels)
        queued_events = GaugeMetricFamily("router_webhook_queued_events",
                                          "Events waiting for a webhook's target.",
                                          labels=labels)
        queued_bytes = GaugeMetricFamily("router_webhook_queued_bytes",
                                         "Request bodies waiting for a webhook's target.",
                                         labels=labels)
        delivered = CounterMetricFamily("router_webhook_delivered",
                                        "Events a webhook's target answered 2xx.", labels=labels)
        failed = CounterMetricFamily("router_webhook_failed_requests",
                                     "Requests that failed (not 2xx, no connection, timeout); "
                                     "each is retried.", labels=labels)
        dropped = CounterMetricFamily("router_webhook_dropped",
                                      "Events a webhook gave up (queue at its bound, expired, "
                                      "max_attempts reached).", labels=labels)
        for hook in self.node.webhooks:
            names = [hook.realm.name, hook.settings.name]
            up.add_metric(names, 1 if hook.state == UP else 0)
            queued_events.add_metric(names, len(hook.queue))
            queued_bytes.add_metric(names, hook.queued_bytes)
            delivered.add_metric(names, hook.delivered)
            failed.add_metric(names, hook.failed)
            dropped.add_metric(names, hook.dropped)
        yield from (up, queued_events, queued_bytes, delivered, failed, dropped)

    def _bridges(self) -> Iterator[Metric]:
        labels = ["realm", "bridge"]
        running = GaugeMetricFamily("router_bridge_running", "1 on the node that runs the "
                                    "bridge (with the Redis engine, the one holding its lock), "
                                    "else 0.", labels=labels)
        connected = GaugeMetricFamily("router_bridge_connected", "1 while the bridge's remote "
                                      "broker accepted its connection, else 0.", labels=labels)
        queued = GaugeMetricFamily("router_bridge_queued_messages", "Messages waiting for the "
                                   "remote broker (sent and not yet acknowledged included).",
                                   labels=labels)
        sent = CounterMetricFamily("router_bridge_sent_messages", "Messages the remote broker "
                                   "took (QoS 0 written, QoS >= 1 acknowledged).", labels=labels)
        received = CounterMetricFamily("router_bridge_received_messages", "Messages from the "
                                       "remote broker published in the realm.", labels=labels)
        connects = CounterMetricFamily("router_bridge_connects", "Connections the remote "
                                       "broker accepted.", labels=labels)
        for bridge in self.node.bridges:
            names = [bridge.realm.name, bridge.config.name]
            running.add_metric(names, int(bridge.running))
            connected.add_metric(names, int(bridge.online))
            queued.add_metric(names, len(bridge.queue))
            sent.add_metric(names, bridge.forwarded_out)
            received.add_metric(names, bridge.forwarded_in)
            connects.add_metric(names, bridge.connects)
        yield from (running, connected, queued, sent, received, connects)


def _fold(counts: Mapping[str, int]) -> Counter[str]:
    """Counts keyed by a session's protocol name -> keyed by protocol family."""
    folded: Counter[str] = Counter()
    for protocol, n in counts.items():
        folded[family(protocol)] += n
    return folded


def _add_by_protocol(metric: Metric, realm: str, counts: Mapping[str, int],
                     *extra: str) -> None:
    """One sample per protocol (zeros included, so a rate() sees the series from the start)."""
    for protocol in PROTOCOLS:
        metric.add_metric([realm, protocol, *extra], counts.get(protocol, 0))


def _add_histogram(metric: HistogramMetricFamily, labels: list[str],
                   histogram: Histogram) -> None:
    metric.add_metric(labels, histogram.cumulative(), histogram.sum)


def registry_for(node: NodeFigures) -> CollectorRegistry:
    """A registry of the node's own (not prometheus_client's global one, shared by the process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(node))
    return registry
