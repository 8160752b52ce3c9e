"""Call timeouts, kept one way by every dealer.

A call waits for its answer against a deadline: the core's dealer for an invocation whose
caller gave a ``timeout``, the Redis engine's for a call it forwarded to the callee's node
(its own timeout, else ``cluster.call_timeout``). :class:`CallDeadlines` holds the timers
by call, so settling a call for any reason (answer, cancel, a session leaving) stops its
timer in one place, and :func:`answer_timed_out` is the one answer a caller gets when the
deadline passes.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

from router.core import errors
from router.core.peer import Caller
from router.core.scheduler import DelayedCall, Scheduler
from router.core.stats import RealmStats

Call = TypeVar("Call", bound=Hashable)
"""What a dealer tracks a pending call as (compared by identity)."""


class CallDeadlines(Generic[Call]):
    """The timers of one dealer's calls that have a deadline."""

    def __init__(self, scheduler: Scheduler, expired: Callable[[Call], None]) -> None:
        """``expired(call)`` runs when a call's deadline passes before it was settled."""
        self._scheduler = scheduler
        self._expired = expired
        self._timers: dict[Call, DelayedCall] = {}

    def start(self, call: Call, seconds: float) -> None:
        """``call`` must be settled within ``seconds``, or the dealer gives up on it."""
        self._timers[call] = self._scheduler.callLater(seconds, self._expire, call)

    def stop(self, call: Call) -> None:
        """``call`` is settled: its deadline no longer matters (nothing if it had none)."""
        timer = self._timers.pop(call, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, call: Call) -> None:
        del self._timers[call]
        self._expired(call)


def answer_timed_out(caller: Caller, call_request: int, stats: RealmStats | None) -> None:
    """The caller learns its call timed out (``wamp.error.timeout``), counted in the realm's
    figures when there are any."""
    if stats is not None:
        stats.call_timeouts += 1
    caller.send_call_error(call_request, errors.TIMEOUT, ["call timed out"], None)
