"""Retained backlogs: the retained events a new subscription owes its subscriber, paced
by that subscriber.

A prefix or ``#`` subscription can cover 100,000 retained topics. Written in one loop
they would cross the connection's outbound bound (and be dropped as a slow consumer's
QoS 0) and hold the reactor for seconds. Instead each new subscription's retained events
are a lazy walk of the retained store (:meth:`RetainedStore.for_subscriber`) that writes
while the subscriber can take them (:meth:`Peer.backlog_room`: transport not paused, room
in its in-flight window, nothing queued) for at most :data:`TURN_SECONDS` per reactor
turn, in batches of at most :data:`BATCH` events: a peer that offers a
:class:`~router.core.peer.RetainedWriter` (MQTT) writes each batch in one pass and one
transport write, the others get ``send_event`` per event. The frontend calls
:meth:`Backlogs.resume` when the peer can take more (its transport drained, an
acknowledgement freed a slot, credit came). None is dropped for being many. A client that
stops reading leaves its transport paused: the frontend starts the slow-consumer clock
then, and the connection is closed at its timeout.

Live events on that subscription for that subscriber wait behind the backlog (retained
before live, the spec's order), held in publication order, at most ``bound`` of them
(the listener's ``flow.max_buffered_messages``): past it a live event is dropped and
counted (``queue_full``). A live event that is also the retained event the walk has yet
to reach is sent once, live, in its place. When the backlog ends early (the connection
goes, the subscription is removed) the held events still go through the peer's usual
path, so a persistent session queues its QoS >= 1 ones as it would have.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator, cast

from router.core.model import Publication
from router.core.peer import Peer, RetainedWriter, Subscription
from router.core.scheduler import DelayedCall, Scheduler

if TYPE_CHECKING:
    from router.core.broker import Broker

TURN_SECONDS = 0.002
"""How long one backlog pump writes before it lets the reactor serve other connections
(checked between batches: a turn is at most this plus one batch)."""
BATCH = 256
"""Retained events written in one pass (one ``retained_writer`` batch, one transport
write) before the pump looks at the clock and the peer's room again."""

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
        deadline = time.monotonic() + TURN_SECONDS
        while queue and peer.backlog_room():
            if time.monotonic() > deadline:
                self._due[peer] = None
                if self._call is None:
                    self._call = self._scheduler.callLater(0, self._next_turn)
                return
            backlog = queue[0]
            if backlog.events is not None:
                self._write_retained(peer, backlog)
            elif backlog.held:
                broker.deliver(peer, backlog.subscription, backlog.held.popleft(), counted=True)
            else:
                queue.popleft()
                self._finish(backlog)
        if not queue and self._by_peer.get(peer) is queue:
            del self._by_peer[peer]

    def _write_retained(self, peer: Peer, backlog: RetainedBacklog) -> None:
        """Write one batch of ``backlog``'s retained events while ``peer`` has room; the
        walk is over (``events`` None) when it runs out."""
        events, held_ids = backlog.events, backlog.held_ids
        assert events is not None
        subscription = backlog.subscription
        broker = self._broker
        taken = 0
        batch = (cast(RetainedWriter, peer).retained_writer(subscription)
                 if hasattr(peer, "retained_writer") else None)
        if batch is None:
            for publication in events:
                if held_ids and publication.publication_id in held_ids:
                    continue  # sent live, in its place
                broker.deliver(peer, subscription, publication, retained=True)
                publication.wire_cache = None  # one receiver: the stored event keeps no bytes
                taken += 1
                if taken >= BATCH or not peer.backlog_room():
                    return
        else:
            write, written = batch
            delivered = [0, 0, 0]  # per QoS, added to the realm's counts once per batch
            try:
                for publication in events:
                    if held_ids and publication.publication_id in held_ids:
                        continue
                    try:
                        room = write(publication)
                    except Exception as exc:  # this event alone is missed, as in a dispatch
                        broker.delivery_failed(peer, publication, exc)
                        room = peer.backlog_room()
                    else:
                        delivered[publication.qos] += 1
                    publication.wire_cache = None
                    taken += 1
                    if taken >= BATCH or not room:
                        return
            finally:
                written()
                protocol = peer.info.protocol
                for qos, count in enumerate(delivered):
                    if count:
                        broker.stats.delivered[qos][protocol] += count
        backlog.events = None
        backlog.held_ids = set()

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
