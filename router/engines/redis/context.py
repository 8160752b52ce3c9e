"""What the Redis engine's parts ask of the engine and of their realm's share, as Protocols.

The stores, the dealer, the membership and the history are built by
:class:`router.engines.redis.engine.RedisEngine` and :class:`router.engines.redis.realm.
RedisRealm` and hold a back-pointer to them; typing that pointer with these Protocols
instead of the classes keeps the imports one way (the classes import their parts, never
the reverse) and says what each part really uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from twisted.internet import defer

from router.core.engine import ClusterLimits
from router.core.incidents import Incidents

if TYPE_CHECKING:
    from router.engines.redis.resp import Reply, RespProtocol


class EngineContext(Protocol):
    """The node's side of the engine: its name, its Redis connection, its bounds."""

    node: str
    node_bytes: bytes
    address: tuple[str, int, int]
    """(host, port, database) of Redis, for a blocking connection at start-up."""
    reactor: Any
    limits: ClusterLimits
    incidents: Incidents
    commands: "RespProtocol | None"
    """The commands connection; None while Redis is not connected."""

    def send(self, data: bytes, replies: int, realm: str = "", what: str = "") -> None:
        """Fire and forget; counted as an incident when Redis cannot take it."""

    def request(self, data: bytes, skipped: int = 0) -> "defer.Deferred[Reply]":
        """A Deferred of the last reply; failed when Redis is not connected."""

    def adopting(self, started: bool) -> None:
        """A realm began (True) or finished (False) adopting a dead node's clients:
        publishers pause meanwhile, so a local publication does not miss them."""


class RealmContext(Protocol):
    """One realm's share of the engine, as its stores use it: one batch of writes per
    reactor turn and the durability of that batch."""

    name: str
    engine: EngineContext

    def write(self, data: bytes) -> None:
        """Queue one command for this turn's batch."""

    def flush(self) -> None:
        """Send this turn's batch now."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once Redis answered every write queued so far."""
