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

    def seconds(self) -> float:
        """The event loop's clock (what ``callLater`` delays are counted on)."""


class Watched(Protocol):
    """What :class:`Deadlines` keeps: an owner whose deadline moves (a read that resets a
    keep-alive) by setting ``due`` alone; ``deadline_slot`` is the wheel's own mark."""

    due: float
    deadline_slot: int

    def deadline_passed(self) -> None:
        """Its ``due`` has come and gone without moving: act on the lapse."""


class _Owners(set[Watched]):
    """The owners filed under one slot of :class:`Deadlines`, and that slot's number: one
    int object the owners share as their ``deadline_slot`` (an int of their own was 36
    bytes of each)."""

    __slots__ = ("slot",)
    slot: int


class Deadlines:
    """Many deadlines on one timer: a wheel of one-second slots, ticking while any is kept.

    A per-connection timer is an object of about 500 bytes in the reactor's heap, reset on
    every read. Here an owner is filed once under the slot of its deadline; a read moves
    only ``owner.due``; when the slot comes, owners whose ``due`` moved on are filed again
    and the others are told (``deadline_passed``), at most one ``resolution`` late."""

    def __init__(self, scheduler: Scheduler, resolution: float = 1.0) -> None:
        self._scheduler = scheduler
        self._resolution = resolution
        self._slots: dict[int, _Owners] = {}
        self._timer: DelayedCall | None = None

    def watch(self, owner: Watched) -> None:
        """Keep ``owner`` until its ``due`` (filed again if it moved) or :meth:`forget`."""
        slot = int(owner.due // self._resolution) + 1
        owners = self._slots.get(slot)
        if owners is None:
            owners = self._slots[slot] = _Owners()
            owners.slot = slot
        owner.deadline_slot = owners.slot
        owners.add(owner)
        if self._timer is None:
            self._timer = self._scheduler.callLater(self._resolution, self._tick)

    def forget(self, owner: Watched) -> None:
        """Stop keeping ``owner`` (it closed): the wheel holds nothing of a gone owner."""
        owners = self._slots.get(owner.deadline_slot)
        if owners is not None:
            owners.discard(owner)
            if not owners:
                del self._slots[owner.deadline_slot]

    def _tick(self) -> None:
        now = self._scheduler.seconds()
        current = int(now // self._resolution)
        for slot in sorted(slot for slot in self._slots if slot <= current):
            for owner in self._slots.pop(slot):
                if owner.due > now:
                    self.watch(owner)
                else:
                    owner.deadline_passed()
        self._timer = (self._scheduler.callLater(self._resolution, self._tick)
                       if self._slots else None)
