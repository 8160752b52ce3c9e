"""``python -m router retained list|purge``: operator commands against a running router.

They join the realm over the node's first WebSocket listener as a WAMP client and
call ``wamp.retained.list`` / ``wamp.retained.purge``, so the realm's permissions
apply (give the operator's principal ``call`` on ``wamp.retained.``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from router.config import NodeConfig


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
        raise SystemExit(f"{procedure} failed: {outcome['error']}")
    if "result" not in outcome:
        raise SystemExit(f"could not reach the router at {url}")
    return outcome["result"]


def retained_command(args, config: NodeConfig) -> int:
    url = args.url or default_url(config)
    if args.action == "list":
        result = call_procedure(url, args.realm, args.authid, "wamp.retained.list",
                                [args.prefix or ""], {"limit": args.limit})
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        if (args.topic is None) == (args.prefix is None):
            raise SystemExit("purge needs exactly one of --topic or --prefix")
        kwargs = {"topic": args.topic} if args.topic is not None else {"prefix": args.prefix}
        count = call_procedure(url, args.realm, args.authid, "wamp.retained.purge", [], kwargs)
        print(f"purged {count} topic(s)")
    return 0
