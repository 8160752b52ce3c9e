"""The broker: subscriptions and event dispatch.

Topics and patterns are level tuples (:mod:`router.core.topic`). Matching never
scans all subscriptions (:mod:`router.core.subscriptions`). A subscription is shared by every
session on the same (topic, match), so a frontend can encode an event once per
subscription and serializer and send the same bytes to all its receivers.
"""

from __future__ import annotations

from time import time
from typing import TYPE_CHECKING, Any, Callable

from router.core import errors
from router.core.errors import RouterError
from router.core.ids import router_scope_ids
from router.core.model import Args, Publication
from router.core.peer import Peer, Subscription, counted
from router.core.shared import SharedGroup, SharedGroups
from router.core.stats import RealmStats
from router.core.subscriptions import SubscriptionIndex
from router.core.topic import Topic

if TYPE_CHECKING:
    from router.core.engine import Interest


MetaPublisher = Callable[[str, Args], None]
"""Publishes a router meta event on a ``wamp.`` URI."""
DeliveryFailure = Callable[[Peer, Publication, Exception], None]
"""Told about a receiver that could not take a publication (the others still get it)."""


class Broker:
    """Subscriptions and dispatch for one realm."""

    def __init__(self, shared: "SharedGroups", meta_publish: MetaPublisher | None = None,
                 delivery_failed: DeliveryFailure | None = None,
                 interest: "Interest | None" = None,
                 stats: RealmStats | None = None, now: Callable[[], float] = time) -> None:
        """``interest``: told when a subscription or shared group on a client pattern is
        created or deleted (the engine tells other nodes what to send here); ``now``: the
        time a new subscription is created at (the realm's :func:`turn_clock`)."""
        self.index: SubscriptionIndex[Subscription] = SubscriptionIndex()
        self.stats = stats if stats is not None else RealmStats()
        self.shared = shared
        """Shared groups (see :mod:`router.core.shared`): one member per publication."""
        self._ids = router_scope_ids()
        self._now = now
        self._by_session: dict[int, Subscription | set[Subscription]] = {}
        """A session's subscriptions: the one it holds, or a set once it holds more (a
        set is 216 bytes, most sessions hold one)."""
        self.meta_subscriptions = 0
        """Subscriptions and groups in the ``wamp.`` namespace: while there are none, a
        meta event has no receiver and is not even made."""
        self._meta_publish = meta_publish
        self._delivery_failed = delivery_failed
        self._interest = interest

    def tables(self) -> tuple[dict[Any, Any], ...]:
        """The tables that grow with the subscriptions (for :func:`router.memory.compact`)."""
        return self.index.tables() + (self._by_session,)

    def subscribe(self, peer: Peer, topic: Topic, match: str, group: str | None = None,
                  limit: int | None = None) -> Subscription:
        """Add ``peer`` to the subscription for (topic, match), or to the shared ``group`` on
        it (each publication to one member); idempotent per session. ``limit``: how many
        the session may hold; a new one past it raises ``limit_exceeded``."""
        if group is None:
            subscription = self.index.lookup(topic, match)
        else:
            subscription = self.shared.lookup(topic, match, group)
        if (limit is not None and self._held_by(peer.info.session_id) >= limit
                and (subscription is None
                     or not subscription.has(peer.info.session_id))):
            raise RouterError(errors.LIMIT_EXCEEDED,
                              f"the session holds {limit} subscriptions, the maximum")
        created = subscription is None
        if subscription is None:
            if group is None:
                subscription = Subscription(next(self._ids), topic, match, self._now())
                self.index.add(subscription)
            else:
                subscription = self.shared.create(next(self._ids), topic, match, group)
            if subscription.is_meta:
                self.meta_subscriptions += 1
            elif self._interest is not None:
                self._interest(subscription, True)
        session_id = peer.info.session_id
        already = not subscription.add(session_id, peer)
        if not already:
            subscription.protocols = counted(subscription.protocols, peer.info.protocol, 1)
        held = self._by_session.get(session_id)
        if held is None or held is subscription:
            self._by_session[session_id] = subscription
        elif isinstance(held, set):
            held.add(subscription)
        else:
            self._by_session[session_id] = {held, subscription}
        if not already and not subscription.is_meta and self.meta_subscriptions:
            # (a meta event nobody can receive is not made: on_create's details hold a
            # time and its text, made for every new subscription otherwise)
            if created:
                self._meta("wamp.subscription.on_create", [session_id, subscription.details()])
            self._meta("wamp.subscription.on_subscribe", [session_id, subscription.id])
        return subscription

    def unsubscribe(self, peer: Peer, subscription_id: int) -> Subscription | None:
        """Remove ``peer`` from a subscription; ``None`` if it was not subscribed."""
        subscription = self.find(subscription_id)
        session_id = peer.info.session_id
        if subscription is None or not subscription.has(session_id):
            return None
        self._drop(session_id, subscription)
        held = self._by_session.get(session_id)
        if held is subscription:
            del self._by_session[session_id]
        elif isinstance(held, set):
            held.discard(subscription)
        return subscription

    def _held_by(self, session_id: int) -> int:
        held = self._by_session.get(session_id)
        return 0 if held is None else len(held) if isinstance(held, set) else 1

    def subscriptions_of(self, session_id: int) -> list[Subscription]:
        """The subscriptions and shared groups a session holds."""
        held = self._by_session.get(session_id)
        return [] if held is None else list(held) if isinstance(held, set) else [held]

    def remove_session(self, session_id: int) -> None:
        """Drop every subscription of a leaving session."""
        held = self._by_session.pop(session_id, None)
        for subscription in (() if held is None else held if isinstance(held, set) else (held,)):
            self._drop(session_id, subscription)

    def _drop(self, session_id: int, subscription: Subscription) -> None:
        peer = subscription.remove(session_id)
        subscription.protocols = counted(subscription.protocols, peer.info.protocol, -1)
        if not subscription.is_meta:
            self._meta("wamp.subscription.on_unsubscribe", [session_id, subscription.id])
        if not subscription.subscribers:
            if isinstance(subscription, SharedGroup):
                self.shared.remove(subscription)
            else:
                self.index.remove(subscription)
            if subscription.is_meta:
                self.meta_subscriptions -= 1
            else:
                if self._interest is not None:
                    self._interest(subscription, False)
                self._meta("wamp.subscription.on_delete", [session_id, subscription.id])

    def dispatch(self, publication: Publication, meta_only: bool = False) -> int:
        """Deliver ``publication`` to every eligible subscriber; returns the number of deliveries.

        ``meta_only``: deliver only on subscriptions inside the ``wamp.`` namespace, so a
        catch-all pattern subscription does not receive the router's meta events.
        """
        delivered = 0
        publisher_id = (publication.publisher.session_id
                        if publication.exclude_me and publication.publisher is not None else None)
        eligibility = publication.eligibility
        # (most publications screen no receiver out: then one test of a local per receiver)
        screened = publisher_id is not None or eligibility is not None
        stats = self.stats
        counts = stats.delivered[publication.qos]
        for subscription in self.index.matching(publication.topic):
            if meta_only and not subscription.is_meta:
                continue
            # counted per subscription, then each receiver skipped is taken back: no
            # per-delivery work for the metrics on the common path
            for protocol, n in subscription.protocols:
                counts[protocol] += n
            held = subscription.held
            for session_id, peer in subscription.pairs():
                if screened and (session_id == publisher_id or (
                        eligibility is not None and not eligibility.admits(peer.info))):
                    counts[peer.info.protocol] -= 1
                    continue
                if held is not None and session_id in held:
                    held[session_id].hold(publication)  # behind its retained events
                    continue
                try:
                    peer.send_event(subscription, publication)
                except Exception as exc:  # this receiver alone misses it
                    counts[peer.info.protocol] -= 1
                    self.delivery_failed(peer, publication, exc)
                    continue
                if not delivered:
                    stats.delivery_latency.observe(time() - publication.timestamp)
                delivered += 1
        if self.shared.by_id:  # one dict check for publications when no group exists
            for peer in self.shared.dispatch(publication, meta_only, self.delivery_failed):
                if not delivered:
                    stats.delivery_latency.observe(time() - publication.timestamp)
                counts[peer.info.protocol] += 1
                delivered += 1
        publication.wire_cache = None  # retained/history copies must not pin encodings
        return delivered

    def find(self, subscription_id: int) -> Subscription | None:
        """A subscription or shared group by id."""
        found = self.index.by_id.get(subscription_id)
        return found if found is not None else self.shared.by_id.get(subscription_id)

    def hand_over(self, group: Subscription, publication: Publication, leaving: int) -> bool:
        """Give a publication that member ``leaving`` will not complete to another member
        of its shared group; False if the group has no other member that took it."""
        peer = self.shared.hand_over(group, publication, leaving, self.delivery_failed)
        publication.wire_cache = None
        if peer is None:
            return False
        self.stats.delivered[publication.qos][peer.info.protocol] += 1
        return True

    def deliver(self, peer: Peer, subscription: Subscription, publication: Publication,
                retained: bool = False, counted: bool = False) -> bool:
        """One delivery outside a dispatch (retained events, live events held behind them),
        contained like a dispatch's; ``counted``: the dispatch already counted it."""
        try:
            peer.send_event(subscription, publication, retained)
        except Exception as exc:
            if counted:
                self.stats.delivered[publication.qos][peer.info.protocol] -= 1
            self.delivery_failed(peer, publication, exc)
            return False
        if not counted:
            self.stats.delivered[publication.qos][peer.info.protocol] += 1
        return True

    def delivery_failed(self, peer: Peer, publication: Publication, exc: Exception) -> None:
        """A delivery to ``peer`` raised: counted and reported by the realm, so one broken
        receiver costs the others nothing."""
        if self._delivery_failed is not None:
            self._delivery_failed(peer, publication, exc)

    def _meta(self, topic: str, args: Args) -> None:
        if self._meta_publish is not None:
            self._meta_publish(topic, args)
