"""The broker: subscriptions, topic matching and event dispatch.

Matching never scans all subscriptions: exact topics are a dict lookup, prefix
subscriptions are probed once per distinct prefix length, and wildcard
subscriptions are walked in a component trie. A subscription is shared by every
session on the same (topic, match), so a frontend can encode an event once per
subscription and serializer and send the same bytes to all its receivers.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from time import time
from typing import Callable, Iterator

from router.core.ids import router_scope_ids
from router.core.model import Publication
from router.core.peer import Peer
from router.core.stats import RealmStats
from router.core.trie import TopicTrie
from router.core.uri import EXACT, MQTT, PREFIX, is_reserved


class Subscription:
    """One (topic, match) pair and the sessions subscribed to it."""

    __slots__ = ("id", "uri", "match", "created", "subscribers", "is_meta", "protocols")

    def __init__(self, subscription_id: int, uri: str, match: str) -> None:
        self.id = subscription_id
        self.uri = uri
        self.match = match
        self.created = datetime.now(timezone.utc).isoformat()
        self.subscribers: dict[int, Peer] = {}
        self.is_meta = is_reserved(uri)
        self.protocols: Counter[str] = Counter()
        """Subscribers per protocol name: a dispatch counts its deliveries per subscription
        from this, not per receiver (see :meth:`Broker.dispatch`)."""

    def details(self) -> dict:
        return {"id": self.id, "created": self.created, "uri": self.uri, "match": self.match}


class SubscriptionIndex:
    """Finds the subscriptions matching a concrete topic without scanning them all."""

    def __init__(self) -> None:
        self.exact: dict[str, Subscription] = {}
        self.prefix: dict[str, Subscription] = {}
        self._prefix_lengths: list[int] = []
        self.wildcard: TopicTrie[Subscription] = TopicTrie()
        self.filters: TopicTrie[Subscription] = TopicTrie()
        self.by_id: dict[int, Subscription] = {}

    def _trie(self, match: str) -> TopicTrie[Subscription]:
        return self.filters if match == MQTT else self.wildcard

    def lookup(self, uri: str, match: str) -> Subscription | None:
        if match == EXACT:
            return self.exact.get(uri)
        if match == PREFIX:
            return self.prefix.get(uri)
        return self._trie(match).get(uri)

    def add(self, subscription: Subscription) -> None:
        self.by_id[subscription.id] = subscription
        if subscription.match == EXACT:
            self.exact[subscription.uri] = subscription
        elif subscription.match == PREFIX:
            self.prefix[subscription.uri] = subscription
            self._refresh_prefix_lengths()
        else:
            self._trie(subscription.match).set(subscription.uri, subscription)

    def remove(self, subscription: Subscription) -> None:
        del self.by_id[subscription.id]
        if subscription.match == EXACT:
            del self.exact[subscription.uri]
        elif subscription.match == PREFIX:
            del self.prefix[subscription.uri]
            self._refresh_prefix_lengths()
        else:
            self._trie(subscription.match).pop(subscription.uri)

    def _refresh_prefix_lengths(self) -> None:
        self._prefix_lengths = sorted({len(uri) for uri in self.prefix})

    def matching(self, topic: str) -> Iterator[Subscription]:
        """Every subscription whose (uri, match) matches ``topic``."""
        subscription = self.exact.get(topic)
        if subscription is not None:
            yield subscription
        if self._prefix_lengths:
            prefixes = self.prefix
            for length in self._prefix_lengths:
                if length > len(topic):
                    break
                subscription = prefixes.get(topic[:length])
                if subscription is not None:
                    yield subscription
        if len(self.wildcard):
            yield from self.wildcard.match_patterns(topic.split("."))
        if len(self.filters):
            yield from self.filters.match_filters(topic.split("."))


MetaPublisher = Callable[[str, list], None]
DeliveryFailure = Callable[[Peer, Publication, Exception], None]
"""Told about a receiver that could not take a publication (the others still get it)."""


class Broker:
    """Subscriptions and dispatch for one realm."""

    def __init__(self, meta_publish: MetaPublisher | None = None,
                 delivery_failed: DeliveryFailure | None = None,
                 stats: RealmStats | None = None) -> None:
        self.index = SubscriptionIndex()
        self.stats = stats if stats is not None else RealmStats()
        self._ids = router_scope_ids()
        self._by_session: dict[int, set[Subscription]] = {}
        self._meta_publish = meta_publish
        self._delivery_failed = delivery_failed

    def subscribe(self, peer: Peer, uri: str, match: str) -> Subscription:
        """Add ``peer`` to the shared subscription for (uri, match); idempotent per session."""
        subscription = self.index.lookup(uri, match)
        created = subscription is None
        if subscription is None:
            subscription = Subscription(next(self._ids), uri, match)
            self.index.add(subscription)
        session_id = peer.info.session_id
        already = session_id in subscription.subscribers
        subscription.subscribers[session_id] = peer
        if not already:
            subscription.protocols[peer.info.protocol] += 1
        self._by_session.setdefault(session_id, set()).add(subscription)
        if not already and not subscription.is_meta:
            if created:
                self._meta("wamp.subscription.on_create", [session_id, subscription.details()])
            self._meta("wamp.subscription.on_subscribe", [session_id, subscription.id])
        return subscription

    def unsubscribe(self, peer: Peer, subscription_id: int) -> Subscription | None:
        """Remove ``peer`` from a subscription; ``None`` if it was not subscribed."""
        subscription = self.index.by_id.get(subscription_id)
        session_id = peer.info.session_id
        if subscription is None or session_id not in subscription.subscribers:
            return None
        self._drop(session_id, subscription)
        self._by_session.get(session_id, set()).discard(subscription)
        return subscription

    def remove_session(self, session_id: int) -> None:
        """Drop every subscription of a leaving session."""
        for subscription in self._by_session.pop(session_id, ()):
            self._drop(session_id, subscription)

    def _drop(self, session_id: int, subscription: Subscription) -> None:
        peer = subscription.subscribers.pop(session_id)
        subscription.protocols[peer.info.protocol] -= 1
        if not subscription.is_meta:
            self._meta("wamp.subscription.on_unsubscribe", [session_id, subscription.id])
        if not subscription.subscribers:
            self.index.remove(subscription)
            if not subscription.is_meta:
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
        stats = self.stats
        counts = stats.delivered[publication.qos]
        for subscription in self.index.matching(publication.topic):
            if meta_only and not subscription.is_meta:
                continue
            # counted per subscription, then each receiver skipped is taken back: no
            # per-delivery work for the metrics on the common path
            for protocol, n in subscription.protocols.items():
                counts[protocol] += n
            for session_id, peer in list(subscription.subscribers.items()):
                if session_id == publisher_id or (eligibility is not None
                                                  and not eligibility.admits(peer.info)):
                    counts[peer.info.protocol] -= 1
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
        publication.wire_cache = None  # retained/history copies must not pin encodings
        return delivered

    def deliver(self, peer: Peer, subscription: Subscription, publication: Publication,
                retained: bool = False) -> bool:
        """One delivery outside a dispatch (retained events), contained like a dispatch's."""
        try:
            peer.send_event(subscription, publication, retained)
        except Exception as exc:
            self.delivery_failed(peer, publication, exc)
            return False
        self.stats.delivered[publication.qos][peer.info.protocol] += 1
        return True

    def delivery_failed(self, peer: Peer, publication: Publication, exc: Exception) -> None:
        if self._delivery_failed is not None:
            self._delivery_failed(peer, publication, exc)

    def _meta(self, topic: str, args: list) -> None:
        if self._meta_publish is not None:
            self._meta_publish(topic, args)
