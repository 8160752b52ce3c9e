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

    def published(self, publication: Publication, receivers: int) -> None: ...

    def retained(self, topic: Topic, action: str, publication: Publication | None) -> None: ...

    def subscribed(self, session: SessionInfo, subscription: "Subscription",
                   get_retained: bool) -> None: ...

    def unsubscribed(self, session: SessionInfo, subscription: "Subscription") -> None: ...

    def acknowledged(self, session: SessionInfo, topic: Topic, qos: int,
                     latency_ms: float) -> None: ...

    def refused(self, session: SessionInfo, operation: str, topic: Topic, match: str,
                reason: str) -> None: ...

    def incident(self, protocol: str, reason: str, n: int) -> None: ...

    def joined(self, session: SessionInfo) -> None: ...

    def left(self, session: SessionInfo) -> None: ...
