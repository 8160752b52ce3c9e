"""What the core needs from durable storage; ``router.store`` implements it."""

from __future__ import annotations

from typing import Callable, Protocol

from router.core.retention import RetainedEvent
from router.core.topic import Topic


class RetainedPersistence(Protocol):
    """Write-behind storage of retained events, with group commit."""

    def save_retained(self, realm: str, topic: Topic, entries: list[RetainedEvent]) -> None:
        """Queue the new state of a topic (an empty list deletes it)."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(ok)`` on the event loop once everything queued so far is written;
        ``ok`` is False if the write failed."""
