"""The one thing the core needs from a reactor: timers."""

from __future__ import annotations

from typing import Any, Callable, Protocol


class DelayedCall(Protocol):
    """A timer the core may cancel (Twisted's ``IDelayedCall``)."""

    def cancel(self) -> None:
        """The timer must not fire: what it was for is settled."""


class Scheduler(Protocol):
    """The one thing the core needs from a reactor: timers (``IReactorTime.callLater``)."""

    def callLater(self, delay: float, fn: Callable[..., Any], *args: Any) -> DelayedCall:
        """Run ``fn(*args)`` after ``delay`` seconds on the event loop."""
