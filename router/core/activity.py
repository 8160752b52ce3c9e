"""What the core reports about a realm's activity (the event log implements it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from router.core.model import Publication, SessionInfo
from router.core.topic import Topic

if TYPE_CHECKING:
    from router.core.peer import Subscription

RETAINED_ACTIONS = ("set", "clear", "expire", "evict")


class ActivityLog(Protocol):
    """Called on the event loop thread; implementations must only buffer, never block."""

    def published(self, publication: Publication, receivers: int) -> None:
        """A publication was routed to ``receivers`` sessions: the event log keeps who published
        what, and how widely."""

    def retained(self, topic: Topic, action: str, publication: Publication | None) -> None:
        """A topic's retained event was set, cleared, expired or evicted (``action``, one of
        RETAINED_ACTIONS): the log shows why a retained value changed."""

    def subscribed(self, session: SessionInfo, subscription: "Subscription",
                   get_retained: bool) -> None:
        """A session subscribed (asking for retained events or not): the log can answer who
        listened to what from when."""

    def unsubscribed(self, session: SessionInfo, subscription: "Subscription") -> None:
        """The session stopped listening on ``subscription``."""

    def acknowledged(self, session: SessionInfo, topic: Topic, qos: int,
                     latency_ms: float) -> None:
        """A receiver acknowledged a QoS >= 1 delivery after ``latency_ms``: the log shows slow
        receivers."""

    def refused(self, session: SessionInfo, operation: str, topic: Topic, match: str,
                reason: str) -> None:
        """A request was refused (``reason``): an operator sees denied access without reading the
        client's side."""

    def incident(self, protocol: str, reason: str, n: int) -> None:
        """``n`` more incidents of ``reason`` (see :mod:`router.core.incidents`) on this realm."""

    def joined(self, session: SessionInfo) -> None:
        """A session joined the realm."""

    def left(self, session: SessionInfo) -> None:
        """A session left the realm."""
