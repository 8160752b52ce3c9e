"""A realm: the sessions, broker, dealer and authorizer behind one realm name.

Every frontend calls these methods; they authorize and route. Topics are level
tuples (:mod:`router.core.topic`); each frontend validates its own names (the WAMP
frontend checks URIs with :meth:`Realm.check_uri`) before converting them.
Errors come back as :class:`RouterError` for the frontend to translate.
"""

from __future__ import annotations

import logging
from typing import Callable

from router.core import errors
from router.core.activity import ActivityLog
from router.core.authorization import Authorizer
from router.core.backlog import Backlogs
from router.core.broker import Broker, Subscription
from router.core.dealer import Dealer, Registration, Scheduler
from router.core.engine import RealmEngine
from router.core.errors import RouterError, Unencodable
from router.core.ids import random_id
from router.core.incidents import (DELIVERY_FAILED, EXPIRED, NOT_AUTHORIZED, QUEUE_FULL,
                                   UNENCODABLE, Incidents)
from router.core.model import Publication, SessionInfo
from router.core.options import CallOptions, PublishOptions, SubscribeOptions
from router.core.peer import Peer
from router.core.shared import SharedGroup, SharedGroups
from router.core.stats import RealmStats
from router.core.topic import SERVER_OWNED, Topic, display, from_uri, is_reserved
from router.core.uri import EXACT, is_valid_uri


log = logging.getLogger(__name__)


def durable_callback(on_durable: Callable[[bool], None] | None
                     ) -> Callable[[Publication, bool], None] | None:
    """Adapt a frontend's ``on_durable(ok)`` to :meth:`Realm.publish`'s callback."""
    if on_durable is None:
        return None
    return lambda publication, ok: on_durable(ok)


class Realm:
    """The routing state of one realm."""

    def __init__(self, name: str, authorizer: Authorizer, scheduler: Scheduler,
                 uri_check: str = "strict", anonymous_role: str | None = None,
                 engine: RealmEngine | None = None,
                 activity: ActivityLog | None = None) -> None:
        """``engine``: retained events, history and other nodes (see
        :mod:`router.core.engine`); none: one node that retains and records nothing."""
        self.name = name
        self.activity = activity
        engine = engine if engine is not None else RealmEngine()
        self.retention = engine.retention
        self.persistence = engine.persistence
        self.history = engine.history
        self._forward = engine.forward
        self.uri_check = uri_check
        self.anonymous_role = anonymous_role
        self.authorizer = authorizer
        self.incidents = Incidents()
        """Replaced by the router's own when the realm is added to a router."""
        self.sessions: dict[int, Peer] = {}
        self.stats = RealmStats()
        """Traffic counters for metrics and ``$SYS`` (plain increments, read at scrape)."""
        self.broker = Broker(SharedGroups(), meta_publish=self.publish_meta,
                             delivery_failed=self._delivery_failed, interest=engine.interest,
                             stats=self.stats)
        self.dealer = Dealer(scheduler, self.stats)
        self.backlogs = Backlogs(self.broker, scheduler, self._held_full)
        """Retained events owed to new subscriptions, paced by their subscribers."""
        self.dealer.cluster = engine.dealer
        self._membership = engine.membership
        self._leave_hooks: list[Callable[[Peer], None]] = []

    # sessions -------------------------------------------------------------

    def attach(self, peer: Peer) -> None:
        self.sessions[peer.info.session_id] = peer
        self.stats.sessions_opened[peer.info.protocol] += 1
        if self._membership is not None:
            self._membership.joined(peer.info)
        if self.activity is not None:
            self.activity.joined(peer.info)
        self.publish_meta("wamp.session.on_join", [peer.info.details()])

    def on_leave(self, hook: Callable[[Peer], None]) -> None:
        """Run ``hook`` when a session leaves, after its subscriptions and registrations are gone."""
        self._leave_hooks.append(hook)

    def detach(self, peer: Peer) -> None:
        info = peer.info
        if self.sessions.pop(info.session_id, None) is None:
            return
        self.backlogs.end(peer, release=False)
        self.broker.remove_session(info.session_id)
        self.dealer.remove_session(peer)
        if self._membership is not None:
            self._membership.left(info)
        for hook in self._leave_hooks:
            hook(peer)
        if self.activity is not None:
            self.activity.left(info)
        self.publish_meta("wamp.session.on_leave", [info.session_id, info.authid, info.authrole])

    # pub/sub --------------------------------------------------------------

    def check_uri(self, uri: str, match: str = EXACT) -> None:
        if not is_valid_uri(uri, self.uri_check, match):
            raise RouterError(errors.INVALID_URI, f"invalid URI '{uri}' for match '{match}'")

    def authorize(self, info: SessionInfo, action: str, topic: Topic,
                  match: str = EXACT) -> None:
        if not self.authorizer.allows(info.authrole, action, topic, match):
            raise self.refuse(info, action, topic, match,
                              f"role '{info.authrole}' may not {action} '{display(topic)}'")

    def refuse(self, info: SessionInfo, action: str, topic: Topic, match: str,
               message: str) -> RouterError:
        """The not-authorized error to raise, logged for the analytics on the way."""
        if self.activity is not None:
            self.activity.refused(info, action, topic, match, NOT_AUTHORIZED)
        return RouterError(errors.NOT_AUTHORIZED, message)

    def check_publish(self, info: SessionInfo, topic: Topic) -> None:
        """May ``info`` publish on ``topic``? The router's own namespaces (``wamp``, and
        ``$SYS`` as on MQTT brokers) are closed to every client."""
        if is_reserved(topic):
            raise self.refuse(info, "publish", topic, EXACT, "the 'wamp.' namespace is reserved")
        if topic[0] == SERVER_OWNED:
            raise self.refuse(info, "publish", topic, EXACT,
                              "the '$SYS' topics belong to the router")
        self.authorize(info, "publish", topic)

    def publish(self, info: SessionInfo, topic: Topic, args: list | None, kwargs: dict | None,
                options: PublishOptions,
                on_durable: Callable[[Publication, bool], None] | None = None,
                payload_bytes: int = 0, *, payload: bytes | None = None,
                properties: dict | None = None,
                expires_at: float | None = None, uri: str | None = None,
                mqtt_topic: str | None = None, amqp: bytes | None = None) -> Publication:
        """Authorize and dispatch a publication from a client session.

        ``topic`` was validated by the frontend; ``uri`` / ``mqtt_topic`` are its WAMP
        URI / MQTT topic name when the frontend already has them (a WAMP / MQTT
        publisher), so they are not built again.
        ``on_durable(publication, ok)`` runs once everything the publication made
        durable (retained state, QoS >= 1 copies queued for persistent sessions)
        is stored, at once when there is nothing to store: acknowledge then.
        """
        self.check_publish(info, topic)
        self.stats.received[options.qos][info.protocol] += 1
        disclose = options.disclose_me or self.authorizer.discloses(info.authrole, "publish", topic)
        publication = Publication(random_id(), topic, args, kwargs, info, disclose,
                                  options.eligibility, options.exclude_me, options.retain,
                                  options.retain_ttl, payload_bytes, options.qos, payload,
                                  properties, expires_at, amqp)
        if uri is not None:
            publication.uri_view = uri
        if mqtt_topic is not None:
            publication.mqtt_view = mqtt_topic
        changed = False
        if self.retention is not None:
            if options.retain_clear:
                changed = self.retention.clear(topic) > 0
            elif options.retain and not self.retention.declines(topic):
                self._retain(publication)
                changed = True
        if expires_at is not None and publication.expired():
            receivers = 0  # an expiry interval of 0: it is over before anyone can get it
            self.incidents.count(self.name, info.protocol.split(".", 1)[0], EXPIRED,
                                 f"topic {publication.name}: expired on arrival")
        else:
            receivers = self.broker.dispatch(publication)
            if self._forward is not None:
                self._forward(publication)
        if self.activity is not None:
            self.activity.published(publication, receivers)
        if self.history:
            self.history.record(publication)
        if on_durable is not None:
            if (changed or publication.qos) and self.persistence is not None:
                self.persistence.when_durable(lambda ok: on_durable(publication, ok))
            else:
                on_durable(publication, True)
        return publication

    def _retain(self, publication: Publication) -> None:
        """Retain before anything is delivered: a payload that cannot be stored refuses the
        whole publish, so the publisher's answer is true for every receiver."""
        try:
            self.retention.retain(publication)  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            raise RouterError(errors.INVALID_ARGUMENT,
                              "the payload cannot be stored as a retained event "
                              f"({type(exc).__name__}: {exc}); nothing was published") from None

    def _delivery_failed(self, peer: Peer, publication: Publication, exc: Exception) -> None:
        """One receiver could not take a publication: count it; every other receiver got it."""
        info = peer.info
        protocol = info.protocol.split(".", 1)[0]
        detail = f"session {info.session_id}, topic {publication.name}: {exc}"
        if isinstance(exc, Unencodable):
            self.incidents.count(self.name, protocol, UNENCODABLE, detail)
        else:
            self.incidents.count(self.name, protocol, DELIVERY_FAILED, detail,
                                 level=logging.ERROR, exc_info=exc)

    def _held_full(self, peer: Peer, publication: Publication) -> None:
        """A live event dropped: the retained backlog it waited behind held its bound."""
        protocol = peer.info.protocol
        self.stats.delivered[publication.qos][protocol] -= 1
        self.incidents.count(self.name, protocol.split(".", 1)[0], QUEUE_FULL,
                             f"session {peer.info.session_id}, topic {publication.name}: "
                             "live events held behind retained ones at their bound")

    def send_retained(self, peer: Peer, subscription: Subscription, bound: int) -> None:
        """Send ``peer`` the retained events its new subscription covers (call after
        SUBSCRIBED), as fast as it takes them (see :mod:`router.core.backlog`); until
        they are all sent, at most ``bound`` live events of the subscription wait.

        A shared group gets none (MQTT 5, 4.8.2: retained messages are not sent to a
        session when it establishes a shared subscription), whatever the protocol."""
        if self.retention is None or isinstance(subscription, SharedGroup):
            return
        self.retention.expire()  # what expired since the last sweep goes now, counted as expiry
        events = self.retention.for_subscriber(subscription.topic, subscription.match,
                                               peer.info)
        self.backlogs.start(peer, subscription, events, bound)

    def publish_meta(self, topic: str, args: list) -> None:
        """Publish a router-originated meta event (nobody to exclude, nothing to authorize)."""
        publication = Publication(random_id(), from_uri(topic), args, None, None)
        publication.uri_view = topic
        self.broker.dispatch(publication, meta_only=True)

    def publish_retained_figure(self, topic: Topic, payload: bytes) -> None:
        """Publish a router-originated retained message (``$SYS`` figures): retained like a
        client's, so a later subscriber gets the last value, and delivered to whoever the
        realm's rules let subscribe. Never fails for lack of a publisher's permission."""
        publication = Publication(random_id(), topic, None, None, None, retain=True,
                                  payload=payload)
        if self.retention is not None and not self.retention.declines(topic):
            self._retain(publication)
        self.broker.dispatch(publication)

    def subscribe(self, peer: Peer, topic: Topic, options: SubscribeOptions) -> Subscription:
        """Subscribe ``peer`` to a pattern its frontend validated and converted to levels."""
        self.authorize(peer.info, "subscribe", topic, options.match)
        subscription = self.broker.subscribe(peer, topic, options.match, options.shared_group)
        if self.activity is not None:
            self.activity.subscribed(peer.info, subscription, options.get_retained)
        return subscription

    def unsubscribe(self, peer: Peer, subscription_id: int) -> Subscription:
        subscription = self.broker.unsubscribe(peer, subscription_id)
        if subscription is None:
            raise RouterError(errors.NO_SUCH_SUBSCRIPTION,
                              f"no subscription {subscription_id} for this session")
        self.backlogs.end(peer, subscription)
        if self.activity is not None:
            self.activity.unsubscribed(peer.info, subscription)
        return subscription

    # rpc ------------------------------------------------------------------

    def register(self, peer: Peer, procedure: str, match: str, policy: str,
                 answer: Callable[[Registration, RouterError | None], None]) -> None:
        """Register ``peer``; ``answer(registration, None)`` once calls can reach it (at once
        on a single node, once the cluster accepted it on many), ``answer(registration,
        error)`` when the cluster refused it. Local refusals raise."""
        self.check_uri(procedure, match)
        levels = from_uri(procedure)
        if is_reserved(levels):
            raise RouterError(errors.NOT_AUTHORIZED, "the 'wamp.' namespace is reserved")
        self.authorize(peer.info, "register", levels, match)
        registration = self.dealer.register(peer, procedure, match, policy)
        cluster = self.dealer.cluster
        if cluster is None:
            answer(registration, None)
            return

        def claimed(error: RouterError | None) -> None:
            if error is not None and peer in registration.callees:
                self.dealer.drop_callee(registration, peer)
            answer(registration, error)

        cluster.register(peer, registration, claimed)

    def call(self, peer: Peer, request: int, procedure: str, args: list | None,
             kwargs: dict | None, options: CallOptions) -> None:
        self.check_uri(procedure)
        levels = from_uri(procedure)
        self.authorize(peer.info, "call", levels)
        disclose = (options.disclose_me
                    or self.authorizer.discloses(peer.info.authrole, "call", levels))
        self.dealer.call(peer, request, procedure, args, kwargs, options.receive_progress,
                         options.timeout_ms, disclose)
