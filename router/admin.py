"""``python -m router retained list|purge``: operator commands against a running router.

On the router's machine they go through its admin socket (:mod:`router.admin_socket`): no
user, no secret, and only who may read the data dir may use it. With ``--url`` or
``--authid`` they join the realm as a WAMP client instead (a remote router) and call
``wamp.retained.list`` / ``wamp.retained.purge``, so the realm's permissions apply (give the
operator's principal ``call`` on ``wamp.retained.``). Both reach the same procedures
(:func:`router.core.meta.install_retention_admin`); the filtering by MQTT topic filter,
the hiding of ``$SYS`` and the table are this module's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from typing import Any, Callable

from router.admin_socket import NotRunning, ask
from router.config import NodeConfig
from router.core.errors import NOT_AUTHORIZED, RouterError
from router.core.topic import (ONE, REST, SERVER_OWNED, Topic, filter_matches, from_mqtt,
                               from_uri, valid_topic_filter)

ALL = 2 ** 31 - 1
"""``limit`` of the list a filtered purge reads (every matching topic)."""

Call = Callable[[str, list, dict], Any]
"""(procedure, args, kwargs) -> result, over the admin socket or WAMP."""


def default_url(config: NodeConfig) -> str:
    for listener in config.listeners:
        if listener.type == "websocket":
            host = "127.0.0.1" if listener.host in ("0.0.0.0", "") else listener.host
            return f"ws://{host}:{listener.port}{listener.path}"
    raise SystemExit("no WebSocket listener in the configuration: pass --url")


def call_procedure(url: str, realm: str, authid: str | None, procedure: str,
                   args: list, kwargs: dict) -> Any:
    """Join ``realm`` at ``url``, call ``procedure`` once and return its result."""
    import txaio
    txaio.use_asyncio()
    from autobahn.asyncio.component import Component, run

    authentication = {}
    if authid:
        ticket = os.environ.get("ROUTER_TICKET")
        if ticket is None:
            import getpass
            ticket = getpass.getpass(f"ticket for {authid}: ")
        authentication = {"ticket": {"authid": authid, "ticket": ticket}}
    outcome: dict[str, Any] = {}
    component = Component(transports=[{"url": url, "max_retries": 0}], realm=realm,
                          authentication=authentication)

    @component.on_join
    async def joined(session, details):
        try:
            outcome["result"] = await session.call(procedure, *args, **kwargs)
        except Exception as exc:  # reported below, with the error URI
            outcome["error"] = getattr(exc, "error", None) or str(exc)
        session.leave()

    @component.on_leave
    async def left(session, details):
        if "result" not in outcome and "error" not in outcome:
            outcome["error"] = f"{details.reason}: {details.message or ''}".strip()

    run([component], log_level=None)
    if "error" in outcome:
        hint = ""
        if outcome["error"] == NOT_AUTHORIZED:
            hint = (f" (give {authid or 'the anonymous role'} 'call' on wamp.retained. in the "
                    "realm file, or run the command on the router's machine without --url "
                    "and --authid: it then uses the admin socket)")
        raise SystemExit(f"{procedure} failed: {outcome['error']}{hint}")
    if "result" not in outcome:
        raise SystemExit(f"could not reach the router at {url}")
    return outcome["result"]


def caller(args: argparse.Namespace, config: NodeConfig) -> Call:
    """How this command reaches the router: WAMP with ``--url`` / ``--authid``, else the
    admin socket of ``--config``'s data dir."""
    if args.url or args.authid:
        url = args.url or default_url(config)
        return lambda procedure, a, kw: call_procedure(url, args.realm, args.authid,
                                                       procedure, a, kw)
    path = config.admin_socket
    if path is None:
        raise SystemExit(f"{args.config}: 'admin_socket' is off: pass --url (and --authid) to "
                         "use the router's WebSocket listener")

    def over_socket(procedure: str, a: list, kw: dict) -> Any:
        try:
            return ask(path, {"realm": args.realm, "call": procedure, "args": a, "kwargs": kw})
        except NotRunning as exc:
            raise SystemExit(f"no router is running with data dir {config.data_dir} ({exc}); "
                             f"is it started with this --config ({args.config})? For a router "
                             "on another machine pass --url and --authid") from exc
        except RouterError as exc:
            raise SystemExit(f"{procedure} failed: {exc.uri}: {exc.message}") from exc
    return over_socket


def topic_filter(text: str) -> Topic:
    """``--topic``: an MQTT topic or filter when it has ``/``, ``+`` or ``#``, else a WAMP
    URI (``a.b``); either way its levels."""
    if "/" in text or ONE in text or REST in text:
        if not valid_topic_filter(text):  # 'a/#/b' matched all of a/ (and purged it)
            raise SystemExit(f"--topic {text!r} is not an MQTT topic filter ('+' fills a "
                             "whole level, '#' a whole last level)")
        return from_mqtt(text)
    return from_uri(text)


def levels(item: dict) -> Topic:
    """A listed topic's levels (``levels`` when its name is not the dotted form)."""
    return tuple(item["levels"]) if "levels" in item else from_uri(item["topic"])


def _server_prefix(wanted: Topic | None, prefix: str | None) -> str:
    """The prefix the router narrows the list with: ``--prefix``, or a filter's literal
    leading levels (a WAMP prefix matches a superset of what they start; the filter then
    picks exactly). A level with a ``.`` or an empty one ends them: its dotted form would
    name other levels."""
    if prefix is not None or wanted is None:
        return prefix or ""
    literal = []
    for level in wanted:
        if level in (ONE, REST) or level == "" or "." in level:
            break
        literal.append(level)
    return ".".join(literal)


def listed(call: Call, args: argparse.Namespace, limit: int) -> tuple[list[dict], int, bool]:
    """(the retained topics the options select, how many ``$SYS`` ones were left out, whether
    the router stopped at ``limit``)."""
    wanted = topic_filter(args.topic) if args.topic is not None else None
    items = call("wamp.retained.list", [_server_prefix(wanted, args.prefix)], {"limit": limit})
    full = len(items) >= limit
    if wanted is not None:
        items = [item for item in items if filter_matches(wanted, levels(item))]
    show_sys = args.sys or (wanted is not None and wanted[0] == SERVER_OWNED)
    shown = [item for item in items if show_sys or levels(item)[0] != SERVER_OWNED]
    return shown, len(items) - len(shown), full


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def size(n: float) -> str:
    """``312 B``, ``4.2 KiB``, ``1.0 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(items: list[dict], now: float) -> list[str]:
    """The human-readable list: one row per topic (its newest event's age)."""
    from router.status import duration

    rows = [("TOPIC", "OWNER", "AGE", "SIZE", "EVENTS", "EXPIRES", "FLAGS")]
    for item in items:
        events = item["events"]
        newest = max(_seconds(event["timestamp"]) for event in events)
        expiries = [_seconds(event["expires"]) for event in events if event["expires"]]
        rows.append((
            item["topic"], item["owner"] or "-", duration(max(0.0, now - newest)),
            size(sum(event["bytes"] for event in events)), str(len(events)),
            f"in {duration(max(0.0, min(expiries) - now))}" if expiries else "never",
            "restricted" if any(event["restricted"] for event in events) else "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def retained_command(args: argparse.Namespace, config: NodeConfig) -> int:
    """``retained list`` (a table, or ``--json``) and ``retained purge`` (the count purged)."""
    if args.realm is None:
        if len(config.realms) != 1:
            raise SystemExit(f"{args.config} has {len(config.realms)} realms: say which with "
                             "--realm")
        args.realm = next(iter(config.realms))
    call = caller(args, config)
    if args.action == "list":
        items, hidden, full = listed(call, args, args.limit)
        if args.json:
            json.dump(items, sys.stdout, indent=2)
            print()
            return 0
        if items:
            print("\n".join(table(items, time.time())))
        note = f"{len(items)} retained topic(s) in realm {args.realm}"
        if hidden:
            note += f"; {hidden} of the router's own $SYS topics not shown (--sys shows them)"
        if full:
            note += f"; the router listed its first {args.limit} only (--limit)"
        print(note)
        return 0
    if (args.topic is None) == (args.prefix is None):
        raise SystemExit("purge needs exactly one of --topic or --prefix")
    if args.prefix is not None:
        count = call("wamp.retained.purge", [], {"prefix": args.prefix})
    else:
        wanted = topic_filter(args.topic)
        if ONE in wanted or REST in wanted:
            items, _, _ = listed(call, args, ALL)
            count = sum(call("wamp.retained.purge", [], {"levels": list(levels(item))})
                        for item in items)
        else:
            count = call("wamp.retained.purge", [], {"levels": list(wanted)})
    print(f"purged {count} retained topic(s) in realm {args.realm}")
    return 0
