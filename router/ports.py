"""Listener ports as an operator reads about them: which listener of which file, and whether
its port can be opened now (``check-config`` tries, the node says which one failed)."""

from __future__ import annotations

import socket

from router.config import ListenerConfig, NodeConfig


def describe(config: NodeConfig, index: int) -> str:
    """``config.json: listeners[1] (rawsocket on 127.0.0.1:8081)``: the file, the key, the
    listener."""
    listener = config.listeners[index]
    return (f"{config.source}: listeners[{index}] ({listener.type} on "
            f"{listener.host or '*'}:{listener.port})")


def unavailable(config: NodeConfig) -> list[str]:
    """One line per listener whose port cannot be opened now (in use, or privileged), by
    binding it for a moment; a port of 0 (any free one) is never unavailable."""
    problems = []
    for index, listener in enumerate(config.listeners):
        if listener.port == 0:
            continue
        problem = _bind_problem(listener)
        if problem is not None:
            problems.append(f"{describe(config, index)}: cannot listen now: {problem}")
    return problems


def _bind_problem(listener: ListenerConfig) -> str | None:
    host = listener.host or None  # "" is every interface, as Twisted reads it
    try:
        addresses = socket.getaddrinfo(host, listener.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"unknown host {listener.host!r} ({exc.strerror})"
    family, kind, proto, _, address = addresses[0]
    with socket.socket(family, kind, proto) as probe:
        # as Twisted binds: an address left in TIME_WAIT by a stopped router is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None
