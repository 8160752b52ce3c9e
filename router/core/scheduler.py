"""The one thing the core needs from a reactor: timers."""

from __future__ import annotations

from typing import Any, Callable, Protocol


class DelayedCall(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """The one thing the core needs from a reactor: timers (``IReactorTime.callLater``)."""

    def callLater(self, delay: float, fn: Callable[..., Any], *args: Any) -> DelayedCall: ...
