"""A realm: the sessions, broker, dealer and authorizer behind one realm name.

Every frontend calls these methods; they authorize and route. Topics are level
tuples (:mod:`router.core.topic`); each frontend validates its own names (the WAMP
frontend checks URIs with :meth:`Realm.check_uri`) before converting them.
Errors come back as :class:`RouterError` for the frontend to translate.
"""

from __future__ import annotations

import logging
from functools import partial
from time import time
from typing import Any, Callable

from router.core import errors
from router.core.activity import ActivityLog
from router.core.authorization import Authorizer
from router.core.backlog import Backlogs
from router.core.broker import Broker
from router.core.dealer import Dealer
from router.core.engine import RealmEngine
from router.core.errors import PassthruRefused, RouterError, Unencodable
from router.core.ids import random_id
from router.core.incidents import (DELIVERY_FAILED, EXPIRED, NOT_AUTHORIZED, OVER_LIMIT,
                                   PASSTHRU_SKIPPED, QUEUE_FULL, RETAINED_QUOTA, RETAINED_REALM_LIMIT,
                                   RETAINED_REFUSED,
                                   UNENCODABLE, Incidents)
from router.core.model import Args, Details, Kwargs, Passthru, Publication, SessionInfo
from router.core.options import CallOptions, PublishOptions, SubscribeOptions
from router.core.payload import UNMAPPED, JsonPayloadPublication
from router.core.peer import Peer, Registration, Subscription
from router.core.retention import QUOTA, Owner, RetainedStore, RetainRefused
from router.core.scheduler import Scheduler, turn_clock
from router.core.shared import SharedGroup, SharedGroups
from router.core.stats import RealmStats, family
from router.core.topic import (RESERVED, SERVER_OWNED, Topic, display, from_uri, is_reserved,
                               pattern_text)
from router.core.uri import EXACT, MQTT, is_valid_uri


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
        if self.retention is not None:
            self.retention.evicted = self._retained_evicted
        self.persistence = engine.persistence
        self.history = engine.history
        self._recorded = self.history if self.history else None
        """The history when it has rules (they are fixed at start): asked once, not with a
        call to ``__bool__`` per publication."""
        self._forward = engine.forward
        self.uri_check = uri_check
        self._procedures: dict[str, Topic] = {}
        """Procedure URIs called that passed ``uri_check``, and their levels: checked and
        split once, not on every call (bounded: cleared past 10,000)."""
        self.anonymous_role = anonymous_role
        self.authorizer = authorizer
        self.incidents = Incidents()
        """Replaced by the router's own when the realm is added to a router."""
        self.sessions: dict[int, Peer] = {}
        self.stats = RealmStats()
        """Traffic counters for metrics and ``$SYS`` (plain increments, read at scrape)."""
        self.broker = Broker(SharedGroups(), meta_publish=self.publish_meta,
                             delivery_failed=self._delivery_failed, interest=engine.interest,
                             stats=self.stats, now=turn_clock(scheduler))
        self.dealer = Dealer(scheduler, self.stats)
        self.backlogs = Backlogs(self.broker, scheduler, self._held_full)
        """Retained events owed to new subscriptions, paced by their subscribers."""
        self.dealer.cluster = engine.dealer
        self._membership = engine.membership
        self._leave_hooks: list[Callable[[Peer], None]] = []

    # sessions -------------------------------------------------------------

    def tables(self) -> tuple[dict[Any, Any], ...]:
        """The tables that grow with the sessions and subscriptions (for
        :func:`router.memory.compact`)."""
        return (self.sessions,) + self.broker.tables()

    def attach(self, peer: Peer) -> None:
        """A session joined: it can be reached by id, is counted, and other nodes' meta calls
        list it."""
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
        """A session left: its subscriptions, registrations, calls and backlogs go with it, and
        its testaments are published."""
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

    def replace_policy(self, authorizer: Authorizer, anonymous_role: str | None) -> None:
        """New rules from a reload (see :mod:`router.core.policy`, which also brings the
        live sessions in line): every later request is checked against them."""
        self.authorizer = authorizer
        self.anonymous_role = anonymous_role

    # pub/sub --------------------------------------------------------------

    def check_uri(self, uri: str, match: str = EXACT) -> None:
        """Refuse a URI that the realm's ``uri_check`` (loose or strict) rejects for ``match``,
        before it reaches an index."""
        if not is_valid_uri(uri, self.uri_check, match):
            # (shown with a lone surrogate escaped: the answer must be writable in UTF-8)
            shown = uri.encode("utf-8", "backslashreplace").decode() if type(uri) is str else uri
            raise RouterError(errors.INVALID_URI, f"invalid URI '{shown}' for match '{match}'")

    def authorize(self, info: SessionInfo, action: str, topic: Topic,
                  match: str = EXACT) -> None:
        """Refuse (``not_authorized``, counted and logged) what the session's role does not
        allow; the message names the topic as the client wrote it."""
        if not self.authorizer.allows(info, action, topic, match):
            mqtt = match == MQTT or info.protocol.startswith("mqtt")  # as the client wrote it
            named = pattern_text(topic, MQTT) if mqtt else display(topic)
            raise self.refuse(info, action, topic, match,
                              f"role '{info.authrole}' may not {action} '{named}'",
                              f"checked realm '{self.name}' role '{info.authrole}': "
                              + self.authorizer.explain(info, action, topic, match))

    def refuse(self, info: SessionInfo, action: str, topic: Topic, match: str,
               message: str, explanation: str = "") -> RouterError:
        """The not-authorized error to raise (``message`` goes to the client), counted as an
        incident whose log line adds the operator's ``explanation``, and logged for the
        analytics on the way."""
        who = (f"client {info.client_id}" if info.client_id is not None
               else f"session {info.session_id}")
        self.incidents.count(self.name, info.protocol.split(".", 1)[0], NOT_AUTHORIZED,
                             f"{who} (authid {info.authid}): {message}"
                             + (f"; {explanation}" if explanation else ""), level=logging.INFO)
        if self.activity is not None:
            self.activity.refused(info, action, topic, match, NOT_AUTHORIZED)
        return RouterError(errors.NOT_AUTHORIZED, message)

    def check_publish(self, info: SessionInfo, topic: Topic) -> None:
        """May ``info`` publish on ``topic``? The router's own namespaces (``wamp``, and
        ``$SYS`` as on MQTT brokers) are closed to every client. (:meth:`publish` runs the
        same three checks inline and calls this only to refuse: change both together.)"""
        if is_reserved(topic):
            raise self.refuse(info, "publish", topic, EXACT, "the 'wamp.' namespace is reserved")
        if topic[0] == SERVER_OWNED:
            raise self.refuse(info, "publish", topic, EXACT,
                              "the '$SYS' topics belong to the router")
        self.authorize(info, "publish", topic)

    def publish(self, info: SessionInfo, topic: Topic, args: Args | None, kwargs: Kwargs | None,
                options: PublishOptions,
                on_durable: Callable[[Publication, bool], None] | None = None,
                payload_bytes: int = 0, payload: bytes | None = None,
                properties: Details | None = None,
                expires_at: float | None = None, uri: str | None = None,
                mqtt_topic: str | None = None, amqp: bytes | None = None,
                passthru: Passthru | None = None) -> Publication:
        """Authorize and dispatch a publication from a client session.

        (The parameters from ``payload`` on are passed by keyword; they are not
        keyword-only because CPython fills keyword-only defaults from a dict, ~100 ns more
        per call: the MQTT frontend, once per PUBLISH, passes them by position.)

        ``topic`` was validated by the frontend; ``uri`` / ``mqtt_topic`` are its WAMP
        URI / MQTT topic name when the frontend already has them (a WAMP / MQTT
        publisher), so they are not built again.
        ``on_durable(publication, ok)`` runs once everything the publication made
        durable (retained state, QoS >= 1 copies queued for persistent sessions)
        is stored, at once when there is nothing to store: acknowledge then.
        ``passthru``: a Payload Passthru Mode publication (``args=[opaque bytes]``).
        ``args`` and ``kwargs`` :data:`~router.core.payload.UNMAPPED`: the ``json`` mapping
        of ``payload``, made when a receiver first reads them.
        """
        authorizer = self.authorizer
        first = topic[0]
        if first == RESERVED or first == SERVER_OWNED or not authorizer.allows(info, "publish",
                                                                              topic):
            self.check_publish(info, topic)  # raises, counted (two calls less per publish)
        self.stats.received[options.qos][info.protocol] += 1
        disclose = options.disclose_me or (authorizer.disclosing
                                           and authorizer.discloses(info, "publish", topic))
        publication = (Publication if args is not UNMAPPED else JsonPayloadPublication)(
            random_id(), topic, args, kwargs, info, disclose, options.eligibility,
            options.exclude_me, options.retain, options.retain_ttl, payload_bytes, options.qos,
            payload, properties, expires_at, amqp, time(), passthru)
        if uri is not None:
            publication.uri_view = uri
        if mqtt_topic is not None:
            publication.mqtt_view = mqtt_topic
        changed = False
        if self.retention is not None:
            if options.retain_clear:
                changed = self.retention.clear(topic) > 0
            elif options.retain and not self.retention.declines(topic):
                self._retain(self.retention, publication)
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
        if self._recorded is not None:
            self._recorded.record(publication)
        if on_durable is not None:
            if (changed or publication.qos) and self.persistence is not None:
                self.persistence.when_durable(partial(on_durable, publication))
            else:
                on_durable(publication, True)
        return publication

    def _retain(self, retention: RetainedStore, publication: Publication) -> None:
        """Retain before anything is delivered: a payload that cannot be stored refuses the
        whole publish, so the publisher's answer is true for every receiver."""
        try:
            retention.retain(publication)
        except RetainRefused as exc:  # only a client's publication has a quota
            protocol = _protocol_of(publication)
            self.incidents.count(self.name, protocol, RETAINED_REFUSED,
                                 f"topic {publication.name}: {exc}")
            raise RouterError(errors.LIMIT_EXCEEDED, f"the retained event is too large ({exc}); "
                              "nothing was published") from None
        except (TypeError, ValueError) as exc:
            raise RouterError(errors.INVALID_ARGUMENT,
                              "the payload cannot be stored as a retained event "
                              f"({type(exc).__name__}: {exc}); nothing was published") from None

    def _retained_evicted(self, topic: Topic, owner: Owner, reason: str,
                          cause: Publication) -> None:
        """Count and log (sparingly) a retained topic evicted to make room for ``cause``,
        under the protocol of the client whose publish caused it."""
        retention = self.retention
        assert retention is not None, "only a realm's retained store evicts"
        protocol = _protocol_of(cause)
        policy = retention.policy
        if reason == QUOTA:
            self.incidents.count(self.name, protocol, RETAINED_QUOTA,
                                 f"topic {display(topic)} evicted: its owner ({owner}) is over "
                                 f"its quota of {policy.max_topics_per_principal} topics / "
                                 f"{policy.max_bytes_per_principal} bytes")
        else:
            self.incidents.count(self.name, protocol, RETAINED_REALM_LIMIT,
                                 f"topic {display(topic)} evicted: the realm is over "
                                 f"{policy.max_topics} topics / {policy.max_bytes} bytes and "
                                 f"its owner ({owner}) holds the most")

    def _delivery_failed(self, peer: Peer, publication: Publication, exc: Exception) -> None:
        """One receiver could not take a publication: count it; every other receiver got it."""
        info = peer.info
        protocol = info.protocol.split(".", 1)[0]
        detail = f"session {info.session_id}, topic {publication.name}: {exc}"
        if isinstance(exc, PassthruRefused):
            self.incidents.count(self.name, protocol, PASSTHRU_SKIPPED, detail)
        elif isinstance(exc, Unencodable):
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

    def publish_meta(self, topic: str, args: Args) -> None:
        """Publish a router-originated meta event (nobody to exclude, nothing to authorize)."""
        if not self.broker.meta_subscriptions:
            return  # nobody can receive it: not made (a big SUBSCRIBE makes thousands)
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
            self._retain(self.retention, publication)
        self.broker.dispatch(publication)

    def subscribe(self, peer: Peer, topic: Topic, options: SubscribeOptions,
                  limit: int | None = None) -> Subscription:
        """Subscribe ``peer`` to a pattern its frontend validated and converted to levels;
        ``limit``: the subscriptions a session of its protocol may hold (past it
        ``limit_exceeded``, counted as ``over_limit``)."""
        self.authorize(peer.info, "subscribe", topic, options.match)
        try:
            subscription = self.broker.subscribe(peer, topic, options.match,
                                                 options.shared_group, limit)
        except RouterError as exc:
            self._count_limit(peer.info, f"subscribe {display(topic)}", exc)
            raise
        if self.activity is not None:
            self.activity.subscribed(peer.info, subscription, options.get_retained)
        return subscription

    def unsubscribe(self, peer: Peer, subscription_id: int) -> Subscription:
        """The session's UNSUBSCRIBE: it stops receiving on the subscription (its retained
        backlog ends too)."""
        subscription = self.broker.unsubscribe(peer, subscription_id)
        if subscription is None:
            raise RouterError(errors.NO_SUCH_SUBSCRIPTION,
                              f"no subscription {subscription_id} for this session")
        self.backlogs.end(peer, subscription)
        if self.activity is not None:
            self.activity.unsubscribed(peer.info, subscription)
        return subscription

    def _count_limit(self, info: SessionInfo, what: str, exc: RouterError) -> None:
        """Count a request refused for a per-session bound (incident ``over_limit``)."""
        if exc.uri == errors.LIMIT_EXCEEDED:
            self.incidents.count(self.name, info.protocol.split(".", 1)[0], OVER_LIMIT,
                                 f"session {info.session_id}: {what}: {exc.message}",
                                 level=logging.INFO)

    # rpc ------------------------------------------------------------------

    def register(self, peer: Peer, procedure: str, match: str, policy: str,
                 answer: Callable[[Registration[Peer], RouterError | None], None],
                 limit: int | None = None) -> None:
        """Register ``peer``; ``answer(registration, None)`` once calls can reach it (at once
        on a single node, once the cluster accepted it on many), ``answer(registration,
        error)`` when the cluster refused it. Local refusals raise (``limit``: the
        registrations the session may hold; past it ``limit_exceeded``, counted)."""
        self.check_uri(procedure, match)
        levels = from_uri(procedure)
        if is_reserved(levels):
            raise RouterError(errors.NOT_AUTHORIZED, "the 'wamp.' namespace is reserved")
        self.authorize(peer.info, "register", levels, match)
        try:
            registration = self.dealer.register(peer, procedure, match, policy, limit)
        except RouterError as exc:
            self._count_limit(peer.info, f"register {procedure}", exc)
            raise
        cluster = self.dealer.cluster
        if cluster is None:
            answer(registration, None)
            return

        def claimed(error: RouterError | None) -> None:
            if error is not None and peer in registration.callees:
                self.dealer.drop_callee(registration, peer)
            answer(registration, error)

        cluster.register(peer, registration, claimed)

    def call(self, peer: Peer, request: int, procedure: str, args: Args | None,
             kwargs: Kwargs | None, options: CallOptions, passthru: Passthru | None = None,
             limit: int | None = None) -> None:
        """A CALL: checked and authorized, then answered by a router procedure or routed to a
        callee (on this node or, in a cluster, another); ``limit``: the calls a session of
        its protocol may have in progress (past it ``limit_exceeded``, counted as
        ``over_limit``)."""
        levels = self._procedures.get(procedure)
        if levels is None:
            self.check_uri(procedure)
            levels = from_uri(procedure)
            if len(self._procedures) >= 10_000:
                self._procedures.clear()
            self._procedures[procedure] = levels
        if not self.authorizer.allows(peer.info, "call", levels):
            self.authorize(peer.info, "call", levels)  # raises, counted (one call less per CALL)
        disclose = (options.disclose_me
                    or self.authorizer.discloses(peer.info, "call", levels))
        try:
            self.dealer.call(peer, request, procedure, args, kwargs, options.receive_progress,
                             options.timeout_ms, disclose, passthru, limit)
        except RouterError as exc:
            self._count_limit(peer.info, f"call {procedure}", exc)
            if exc.uri == errors.FEATURE_NOT_SUPPORTED:
                self.incidents.count(self.name, family(peer.info.protocol), PASSTHRU_SKIPPED,
                                     f"session {peer.info.session_id}, call {procedure}: "
                                     f"{exc.message}")
            raise


def _protocol_of(publication: Publication) -> str:
    """Whose protocol an incident about ``publication`` is counted under: its publisher's
    (``router`` for the router's own publications, which have none)."""
    publisher = publication.publisher
    return family(publisher.protocol) if publisher is not None else "router"
