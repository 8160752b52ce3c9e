"""``python -m router status``: a terminal summary of a running router, from its metrics
listener (or, when the configuration has none, the same figures over the admin socket).

Two scrapes ``--interval`` seconds apart give the rates; everything else is the second
scrape's values. The listener is found in the configuration (its token or basic credentials
too), or named with ``--url``.
"""

from __future__ import annotations

import argparse
import base64
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Callable

from prometheus_client.parser import text_string_to_metric_families

from router.config import ListenerConfig, NodeConfig

PROTOCOLS = ("wamp", "mqtt", "amqp", "http")
"""The protocol families the summary names, in order (the metrics' ``protocol`` label)."""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_url(listener: ListenerConfig) -> str:
    """Where a metrics listener answers (a wildcard bind is reached on loopback)."""
    host = "127.0.0.1" if listener.host in ("", "0.0.0.0", "::") else listener.host
    scheme = "https" if listener.tls is not None else "http"
    return f"{scheme}://{host}:{listener.port}{listener.path}"


def auth_header(listener: ListenerConfig | None) -> dict[str, str]:
    if listener is None or listener.auth is None:
        return {}
    auth = listener.auth
    if auth.bearer_token is not None:
        return {"Authorization": f"Bearer {auth.bearer_token}"}
    pair = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


def scrape(url: str, headers: dict[str, str], timeout: float = 5.0) -> Samples:
    """Every sample of one scrape, keyed by (name, sorted labels)."""
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return samples(response.read().decode())


def samples(text: str) -> Samples:
    """The samples of a Prometheus text exposition, keyed by (name, sorted labels)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _by(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """Sum of ``name``'s samples grouped by the values of labels ``keys``."""
    sums: dict[tuple[str, ...], float] = defaultdict(float)
    for (sample, labels), value in samples.items():
        if sample == name:
            as_dict = dict(labels)
            sums[tuple(as_dict.get(key, "") for key in keys)] += value
    return sums


def _per_protocol(values: dict[tuple[str, ...], float], realm: str) -> str:
    return ", ".join(f"{protocol} {values.get((realm, protocol), 0):g}"
                     for protocol in PROTOCOLS)


def duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``3 h 05 min``, ``2 d 4 h``: as precise as a glance needs."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if hours == 0:
        return f"{minutes} min"
    if days == 0:
        return f"{hours} h {minutes % 60:02d} min"
    return f"{days} d {hours % 24} h"


AMQP_SESSIONS = "an AMQP connection is one session, and one more per receiving link"


def summary(before: Samples, after: Samples, seconds: float, url: str,
            listeners: list[str]) -> str:
    """The status text for two scrapes ``seconds`` apart."""
    lines = [f"router at {url}: up {duration(_by(after, 'router_uptime_seconds')[()])}"]
    if listeners:
        lines.append("listeners: " + ", ".join(listeners))
    connections = _by(after, "router_connections", "protocol")
    lines.append("connections (network, all realms): " + ", ".join(
        f"{protocol} {connections.get((protocol,), 0):g}" for protocol in PROTOCOLS))
    sessions = _by(after, "router_sessions", "realm", "protocol")
    received = [_by(s, "router_messages_received_total", "realm") for s in (before, after)]
    delivered = [_by(s, "router_messages_delivered_total", "realm") for s in (before, after)]
    queued = _by(after, "router_queued_messages", "realm", "protocol")
    retained = _by(after, "router_retained_topics", "realm")
    router_owned = _by(after, "router_retained_sys_topics", "realm")
    bridges = {name: _by(after, f"router_bridge_{name}", "realm", "bridge")
               for name in ("running", "connected", "queued_messages", "sent_messages_total",
                            "received_messages_total")}
    for (realm,) in sorted(retained):
        rate_in = (received[1].get((realm,), 0) - received[0].get((realm,), 0)) / seconds
        rate_out = (delivered[1].get((realm,), 0) - delivered[0].get((realm,), 0)) / seconds
        lines.append(f"realm {realm}:")
        amqp = sessions.get((realm, "amqp"), 0)
        lines.append(f"  sessions: {_per_protocol(sessions, realm)}"
                     + (f" ({AMQP_SESSIONS})" if amqp else ""))
        lines.append(f"  messages/s: in {rate_in:.1f}, out {rate_out:.1f} "
                     f"(over the last {seconds:.1f} s)")
        lines.append(f"  queued: {_per_protocol(queued, realm)}")
        own = router_owned.get((realm,), 0)
        lines.append(f"  retained topics: {retained[(realm,)] - own:g}"
                     + (f" (and {own:g} of the router's own $SYS topics)" if own else ""))
        lines += _webhook_lines(after, realm)
        for key in sorted(key for key in bridges["connected"] if key[0] == realm):
            if not bridges["running"][key]:
                lines.append(f"  bridge {key[1]}: runs on another node")
                continue
            lines.append(f"  bridge {key[1]}: "
                         f"{'connected' if bridges['connected'][key] else 'not connected'}, "
                         f"{bridges['queued_messages'][key]:g} queued, "
                         f"{bridges['sent_messages_total'][key]:g} sent, "
                         f"{bridges['received_messages_total'][key]:g} received")
    drops = _by(after, "router_messages_dropped_total", "realm", "protocol", "reason")
    lines.append("drops since start:" + ("" if any(drops.values()) else " none"))
    for (realm, protocol, reason), n in sorted(drops.items()):
        if n:
            lines.append(f"  {realm or '-'} {protocol} {reason}: {n:g}")
    return "\n".join(lines)


def _webhook_lines(after: Samples, realm: str) -> list[str]:
    """One line per webhook of ``realm``: up or down (backing off, stopped), its counts."""
    figures = {name: _by(after, f"router_webhook_{name}", "realm", "webhook")
               for name in ("up", "queued_events", "delivered_total", "failed_requests_total",
                            "dropped_total")}
    return [f"  webhook {hook}: {'up' if figures['up'][(name, hook)] else 'down'}, "
            f"queued {figures['queued_events'].get((name, hook), 0):g}, delivered "
            f"{figures['delivered_total'].get((name, hook), 0):g}, failed requests "
            f"{figures['failed_requests_total'].get((name, hook), 0):g}, dropped "
            f"{figures['dropped_total'].get((name, hook), 0):g}"
            for name, hook in sorted(figures["up"]) if name == realm]


def _listener_names(config: NodeConfig | None) -> list[str]:
    if config is None:
        return []
    return [f"{listener.type} {listener.host}:{listener.port}"
            + (f" realm {listener.realm}" if listener.realm else "")
            for listener in config.listeners]


def status_command(args: argparse.Namespace, config: NodeConfig | None) -> int:
    """Print the summary; 1 (with the reason) when the router cannot be reached. Without a
    metrics listener (and no ``--url``) the figures come over the admin socket."""
    listener = next((item for item in config.listeners if item.type == "metrics"),
                    None) if config is not None else None
    if args.url is None and listener is None:
        return _status_over_socket(args, config)  # type: ignore[arg-type]
    url = args.url or metrics_url(listener)  # type: ignore[arg-type]
    headers = auth_header(listener)
    if args.token:
        headers = {"Authorization": f"Bearer {args.token}"}
    try:
        before, after, seconds = _twice(lambda: scrape(url, headers), args.interval)
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot read {url}: {exc}" + ("" if args.url else
                                             f" (is the router started with {args.config}?)"))
        return 1
    print(summary(before, after, seconds, url, _listener_names(config)))
    return 0


def _twice(read: Callable[[], Samples], interval: float) -> tuple[Samples, Samples, float]:
    """Two readings ``interval`` seconds apart, and the seconds between them."""
    before = read()
    started = time.monotonic()
    time.sleep(interval)  # the rate's interval, not a wait for an event
    after = read()
    return before, after, time.monotonic() - started


def _status_over_socket(args: argparse.Namespace, config: NodeConfig) -> int:
    from router.admin_socket import NotRunning, ask

    if config.admin_socket is None:
        print(f"{args.config}: no metrics listener and 'admin_socket' is off: add a metrics "
              "listener (see docs/configuration.md) or name one with --url")
        return 2
    path = config.admin_socket
    try:
        before, after, seconds = _twice(lambda: samples(ask(path, {"metrics": True})),
                                        args.interval)
    except NotRunning as exc:
        print(f"no router is running with data dir {config.data_dir} ({exc}); is it started "
              f"with this --config ({args.config})? ({args.config} has no metrics listener, so "
              "status reads the admin socket)")
        return 1
    print(summary(before, after, seconds, f"{path} (admin socket)", _listener_names(config)))
    return 0
