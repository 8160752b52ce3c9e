"""Retained backlogs: the retained events a new subscription owes its subscriber, paced
by that subscriber.

A prefix or ``#`` subscription can cover 100,000 retained topics. Written in one loop
they would cross the connection's outbound bound (and be dropped as a slow consumer's
QoS 0) and hold the reactor for seconds. Instead each new subscription's retained events
are a lazy walk of the retained store (:meth:`RetainedStore.for_subscriber`) that writes
while the subscriber can take them (:meth:`Peer.backlog_room`: transport not paused, room
in its in-flight window, nothing queued) and at most :data:`TURN_BUDGET` events per
reactor turn; the frontend calls :meth:`Backlogs.resume` when the peer can take more (its
transport drained, an acknowledgement freed a slot, credit came). None is dropped for
being many. A client that stops reading leaves its transport paused: the frontend starts
the slow-consumer clock then, and the connection is closed at its timeout.

Live events on that subscription for that subscriber wait behind the backlog (retained
before live, the spec's order), held in publication order, at most ``bound`` of them
(the listener's ``flow.max_buffered_messages``): past it a live event is dropped and
counted (``queue_full``). A live event that is also the retained event the walk has yet
to reach is sent once, live, in its place. When the backlog ends early (the connection
goes, the subscription is removed) the held events still go through the peer's usual
path, so a persistent session queues its QoS >= 1 ones as it would have.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator

from router.core.model import Publication
from router.core.peer import Peer, Subscription
from router.core.scheduler import DelayedCall, Scheduler

if TYPE_CHECKING:
    from router.core.broker import Broker

TURN_BUDGET = 256
"""Events one backlog pump writes before it lets the reactor serve other connections."""

Dropped = Callable[[Peer, Publication], None]
"""Told about a live event dropped because the backlog it waits behind held ``bound``."""


class RetainedBacklog:
    """One subscriber's retained events on one new subscription, and the live events of
    that subscription held behind them."""

    __slots__ = ("peer", "subscription", "events", "held", "held_ids", "bound", "_dropped")

    def __init__(self, peer: Peer, subscription: "Subscription",
                 events: Iterator[Publication], bound: int, dropped: Dropped) -> None:
        self.peer = peer
        self.subscription = subscription
        self.events: Iterator[Publication] | None = events
        """The lazy walk of the retained store; None once it is exhausted."""
        self.held: deque[Publication] = deque()
        self.held_ids: set[int] = set()
        self.bound = bound
        self._dropped = dropped

    def hold(self, publication: Publication) -> None:
        """Keep a live event until the retained ones went (dropped and told at the bound)."""
        if len(self.held) >= self.bound:
            self._dropped(self.peer, publication)
            return
        self.held.append(publication)
        if self.events is not None:
            self.held_ids.add(publication.publication_id)

    def next(self) -> tuple[Publication, bool] | None:
        """(the next event to send, is it retained), or None when the backlog is done."""
        events = self.events
        if events is not None:
            for publication in events:
                if publication.publication_id not in self.held_ids:
                    return publication, True
            self.events = None
            self.held_ids = set()
        if self.held:
            return self.held.popleft(), False
        return None


class Backlogs:
    """A realm's retained backlogs, per peer in the order their subscriptions were made."""

    def __init__(self, broker: "Broker", scheduler: "Scheduler", dropped: Dropped) -> None:
        self._broker = broker
        self._scheduler = scheduler
        self._dropped = dropped
        self._by_peer: dict[Peer, deque[RetainedBacklog]] = {}
        self._due: dict[Peer, None] = {}
        """Peers that used their turn's budget and can take more: pumped next turn."""
        self._pumping: set[Peer] = set()
        self._call: DelayedCall | None = None

    def start(self, peer: Peer, subscription: "Subscription", events: Iterator[Publication],
              bound: int) -> None:
        """Send ``events`` (retained) on ``subscription`` as ``peer`` can take them; its
        live events on that subscription wait behind them."""
        backlog = RetainedBacklog(peer, subscription, events, bound, self._dropped)
        session_id = peer.info.session_id
        previous = subscription.held.get(session_id) if subscription.held else None
        if previous is not None:  # subscribed again (MQTT retain handling 0): one queue
            assert isinstance(previous, RetainedBacklog), "only a backlog holds live events"
            backlog.held, previous.held = previous.held, deque()
            backlog.held_ids = previous.held_ids
            self._finish(previous)
        if subscription.held is None:
            subscription.held = {}
        subscription.held[session_id] = backlog
        self._by_peer.setdefault(peer, deque()).append(backlog)
        self.resume(peer)

    def resume(self, peer: Peer) -> None:
        """``peer`` may take events again: write its backlogs while it can, for one turn."""
        queue = self._by_peer.get(peer)
        if not queue or peer in self._pumping:
            return  # nothing owed, or called back from a delivery of this very pump
        self._pumping.add(peer)
        try:
            self._pump(peer, queue)
        finally:
            self._pumping.discard(peer)

    def _pump(self, peer: Peer, queue: deque[RetainedBacklog]) -> None:
        broker = self._broker
        budget = TURN_BUDGET
        while queue and peer.backlog_room():
            if not budget:
                self._due[peer] = None
                if self._call is None:
                    self._call = self._scheduler.callLater(0, self._next_turn)
                return
            backlog = queue[0]
            item = backlog.next()
            if item is None:
                queue.popleft()
                self._finish(backlog)
                continue
            publication, retained = item
            if retained:
                broker.deliver(peer, backlog.subscription, publication, retained=True)
                publication.wire_cache = None  # one receiver: the stored event keeps no bytes
            else:
                broker.deliver(peer, backlog.subscription, publication, counted=True)
            budget -= 1
        if not queue and self._by_peer.get(peer) is queue:
            del self._by_peer[peer]

    def end(self, peer: Peer, subscription: "Subscription | None" = None,
            release: bool = True) -> None:
        """Stop ``peer``'s backlogs (all, or the one on ``subscription``): its connection
        or that subscription is gone. With ``release`` held live events go through the
        peer's usual path (a persistent session queues its QoS >= 1 ones); without, the
        session itself is gone and they go with it."""
        queue = self._by_peer.get(peer)
        if not queue:
            return
        nested = peer in self._pumping
        self._pumping.add(peer)  # what the deliveries wake must wait for the loop's end
        try:
            for backlog in list(queue):
                if subscription is None or backlog.subscription is subscription:
                    queue.remove(backlog)
                    held, backlog.held = backlog.held, deque()
                    for publication in held if release else ():  # still marked as held:
                        self._broker.deliver(peer, backlog.subscription, publication,
                                             counted=True)  # one copy of its own (MQTT)
                    self._finish(backlog)
        finally:
            if not nested:
                self._pumping.discard(peer)
        if not queue:
            self._by_peer.pop(peer, None)
            self._due.pop(peer, None)

    def _finish(self, backlog: RetainedBacklog) -> None:
        """Live events on the subscription go straight to the peer again."""
        held = backlog.subscription.held
        session_id = backlog.peer.info.session_id
        if held is not None and held.get(session_id) is backlog:
            del held[session_id]
            if not held:
                backlog.subscription.held = None
        backlog.events = None

    def _next_turn(self) -> None:
        self._call = None
        due, self._due = self._due, {}
        for peer in due:
            self.resume(peer)
