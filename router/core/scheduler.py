"""The one thing the core needs from a reactor: timers."""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol


class DelayedCall(Protocol):
    """A timer the core may cancel (Twisted's ``IDelayedCall``)."""

    def cancel(self) -> None:
        """The timer must not fire: what it was for is settled."""


class Scheduler(Protocol):
    """The one thing the core needs from a reactor: timers (``IReactorTime.callLater``)."""

    def callLater(self, delay: float, fn: Callable[..., Any], *args: Any) -> DelayedCall:
        """Run ``fn(*args)`` after ``delay`` seconds on the event loop."""

    def seconds(self) -> float:
        """The event loop's clock (what ``callLater`` delays are counted on)."""


def turn_clock(scheduler: Scheduler) -> Callable[[], float]:
    """The wall-clock time of the reactor turn being handled: the router's reactor's
    ``turn_began`` (when the turn's poll returned: one float a turn, shared by what the
    turn creates, not a float of each), else ``time.time``."""
    if hasattr(scheduler, "turn_began"):
        return lambda: scheduler.turn_began
    return time.time


class Watched(Protocol):
    """What :class:`Deadlines` keeps: an owner whose deadline moves (a read that resets a
    keep-alive) by setting ``due`` alone; ``deadline_next`` and ``deadline_prev`` are the
    wheel's own links (None, both, while it is not kept)."""

    due: float
    deadline_next: "Watched | _Ring | None"
    deadline_prev: "Watched | _Ring | None"

    def deadline_passed(self) -> None:
        """Its ``due`` has come and gone without moving: act on the lapse."""


class _Ring:
    """The owners filed under one slot of :class:`Deadlines`: the head of a ring through
    their own links, and the slot's number. A set of owners cost its table, 40 to 76 bytes
    an owner (sets keep a quarter to a half of their table free); the links are 16."""

    __slots__ = ("slot", "deadline_next", "deadline_prev")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.deadline_next: Watched | _Ring = self
        self.deadline_prev: Watched | _Ring = self


class Deadlines:
    """Many deadlines on one timer: a wheel of one-second slots, ticking while any is kept.

    A per-connection timer is an object of about 500 bytes in the reactor's heap, reset on
    every read. Here an owner is filed once under the slot of its deadline; a read moves
    only ``owner.due``; when the slot comes, owners whose ``due`` moved on are filed again
    and the others are told (``deadline_passed``), at most one ``resolution`` late."""

    def __init__(self, scheduler: Scheduler, resolution: float = 1.0) -> None:
        self._scheduler = scheduler
        self._resolution = resolution
        self._slots: dict[int, _Ring] = {}
        self._timer: DelayedCall | None = None

    def watch(self, owner: Watched) -> None:
        """Keep ``owner`` until its ``due`` (filed again if it moved) or :meth:`forget`."""
        if owner.deadline_next is not None:
            self.forget(owner)
        slot = int(owner.due // self._resolution) + 1
        ring = self._slots.get(slot)
        if ring is None:
            ring = self._slots[slot] = _Ring(slot)
        last = ring.deadline_prev
        assert last is not None
        owner.deadline_prev, owner.deadline_next = last, ring
        last.deadline_next = ring.deadline_prev = owner
        if self._timer is None:
            self._timer = self._scheduler.callLater(self._resolution, self._tick)

    def forget(self, owner: Watched) -> None:
        """Stop keeping ``owner`` (it closed): the wheel holds nothing of a gone owner."""
        after, before = owner.deadline_next, owner.deadline_prev
        if after is None or before is None:
            return
        before.deadline_next, after.deadline_prev = after, before
        owner.deadline_next = owner.deadline_prev = None
        if after is before:  # the ring's head alone is left
            assert type(after) is _Ring
            del self._slots[after.slot]

    def _tick(self) -> None:
        now = self._scheduler.seconds()
        current = int(now // self._resolution)
        for slot in sorted(slot for slot in self._slots if slot <= current):
            ring = self._slots.pop(slot, None)
            if ring is None:  # its owners were forgotten by an owner told before them
                continue
            owners: list[Watched] = []
            linked: Watched | _Ring | None = ring.deadline_next
            while linked is not ring:  # taken out first: a told owner may forget another
                assert linked is not None and not isinstance(linked, _Ring)
                owners.append(linked)
                after = linked.deadline_next
                linked.deadline_next = linked.deadline_prev = None
                linked = after
            for owner in owners:
                if owner.due > now:
                    self.watch(owner)
                else:
                    owner.deadline_passed()
        self._timer = (self._scheduler.callLater(self._resolution, self._tick)
                       if self._slots else None)
