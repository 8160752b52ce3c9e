"""The MQTT frontend of one realm: sessions by client id, and their translation to the core.

Authentication uses the realm's principals (username = authid, password = the
ticket secret) or its anonymous role; every subscribe and publish is authorized
by the core exactly as for WAMP clients.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Callable, Protocol

from router.core import errors
from router.core.credentials import Principal
from router.core.errors import RouterError
from router.core.incidents import INVALID_TOPIC, NOT_AUTHORIZED
from router.core.model import Publication, SessionInfo
from router.core.options import PublishOptions, SubscribeOptions
from router.core.ownership import AnonymousInfo, owner
from router.core.payload import UNMAPPED, from_bytes
from router.core.peer import Subscription
from router.core.realm import Realm
from router.core.router import Router
from router.core.scheduler import Deadlines, DelayedCall, Scheduler
from router.core.shared import SharedGroup
from router.core.topic import (InvalidSharedFilter, Topic, from_mqtt, mqtt_pattern,
                               split_shared)
from router.mqtt.codec import TOPIC_NAME_KEPT_BYTES
from router.mqtt.outlet import Outlet
from router.mqtt.packets import Connect, ReasonCode, SubscriptionOptions, Will, shared_options
from router.mqtt.persistence import (MqttSessionStore, SessionClaims, StoredMessage,
                                     StoredSession, StoredWill)
from router.mqtt.session import MESSAGE, SENT_AT, MqttSession, MqttSubscription, Outbound
from router.settings import MqttSettings
from router.tls import peer_common_name

log = logging.getLogger(__name__)

NEVER_EXPIRES = 0xFFFFFFFF

_PUBLISH_OPTIONS = {
    (qos, retain, empty): PublishOptions(qos=qos, retain=retain and not empty,
                                         retain_clear=retain and empty, exclude_me=False)
    for qos in (0, 1, 2) for retain in (False, True) for empty in (False, True)}
"""The core's options for an MQTT PUBLISH by (QoS, RETAIN, empty payload): built once,
not per publish. An empty retained payload clears the topic's retained message."""

LEVELS_KEPT = 4096

Identity = tuple[str | None, str, str]
"""(authid, or None for anonymous; authrole; authmethod) of an authenticated CONNECT."""


class TurnClock(Protocol):
    """Gives the time of the reads being handled (the router's reactor: of its turn)."""

    turn_began: float


class _EachRead:
    """A :class:`TurnClock` on a clock without turns: its ``seconds()`` when asked."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    @property
    def turn_began(self) -> float:
        """Now."""
        return self._scheduler.seconds()


class MqttFrontend:
    """MQTT sessions of one realm."""

    def __init__(self, router: Router, realm: Realm, settings: MqttSettings,
                 store: MqttSessionStore, scheduler: Scheduler) -> None:
        self.router = router
        self.realm = realm
        self.settings = settings
        self.store = store
        self.scheduler = scheduler
        self.deadlines = Deadlines(scheduler)
        """Its connections' keep-alives, on one timer."""
        self.clock: TurnClock = (scheduler if hasattr(scheduler, "turn_began")
                                 else _EachRead(scheduler))
        """The time of the reactor turn's reads (``turn_began``): the router's reactor's,
        one float a turn; another clock's ``seconds()`` per read."""
        self._unflushed: list[Outlet] = []
        self._flush_due = False
        self._at_turn_end: Callable[[Callable[[], None]], object] = getattr(
            scheduler, "at_turn_end", None) or partial(scheduler.callLater, 0)
        """The router's reactor's end of the turn (no timer object per turn), or a
        ``callLater(0)`` on another clock."""
        self.sessions: dict[str, MqttSession] = {}
        self._levels: dict[str, Topic] = {}
        """The levels of the topic names published to (at most :data:`LEVELS_KEPT`, then
        emptied; names of up to :data:`router.mqtt.codec.TOPIC_NAME_KEPT_BYTES` only): split
        once, and the same level strings (their hashes kept) for the core's lookups."""
        self._pending_wills: dict[str, DelayedCall] = {}
        self._expiry_timers: dict[MqttSession, DelayedCall] = {}
        """The timers of offline sessions that expire (each holds its session, and its
        queue, alive); kept here, not in every session."""
        """Client id -> the timer of its will, waiting for the will delay to pass."""
        self._principals: dict[str, Principal] = router.principals[realm.name]
        self.claims: SessionClaims | None = (store if isinstance(store, SessionClaims)
                                             else None)
        """Set when sessions follow their client among nodes (the Redis engine)."""
        if self.claims is not None:
            self.claims.release = self.release
            self.claims.adopt = self.adopt
            self.claims.lost_will = self.lost_will

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        self.store.when_durable(callback)

    def count_refusal(self, session: MqttSession, what: str, exc: Exception) -> None:
        """Count a refused publish or subscribe (logged once per cause and interval); the
        core counted a not-authorized one already, with the rules it checked."""
        if isinstance(exc, RouterError) and exc.uri == errors.NOT_AUTHORIZED:
            return
        reason = INVALID_TOPIC
        message = exc.message or exc.uri if isinstance(exc, RouterError) else str(exc)
        self.router.incidents.count(self.realm.name, "mqtt", reason,
                                    f"client {session.client_id}: {what}: {message}",
                                    level=logging.INFO)

    # connect / disconnect ---------------------------------------------------------------

    def authenticate(self, connection: Outlet, packet: Connect,
                     answer: Callable[[int | Identity], None]) -> None:
        """``answer`` a CONNACK failure reason or (authid or None for anonymous, authrole,
        method): at once, or on the reactor once the password is checked in a thread. A
        client id whose session belongs to another owner is refused here, before anything
        of that session is touched (see :mod:`router.core.ownership`)."""

        def owned(result: int | Identity) -> None:
            if not isinstance(result, int) and self._foreign(connection, packet.client_id,
                                                             result):
                result = ReasonCode.NOT_AUTHORIZED
            answer(result)

        self._authenticate(connection, packet, owned)

    def _foreign(self, connection: Outlet, client_id: str, identity: Identity) -> bool:
        """Whether the client id's session on this node belongs to another owner than
        ``identity`` (then the refusal is counted; the session is left alone)."""
        existing = self.sessions.get(client_id)
        authid, _, authmethod = identity
        if existing is None or (owner(existing.info.authid, existing.info.authmethod)
                                == owner(authid or "", authmethod)):
            return False
        self._count_foreign(connection, client_id, authid)
        return True

    def _count_foreign(self, connection: Outlet, client_id: str, authid: str | None) -> None:
        self.router.incidents.count(
            self.realm.name, "mqtt", NOT_AUTHORIZED,
            f"client {client_id} from {connection.peer} ({authid or 'anonymous'}) refused: "
            "the client id's session belongs to another principal", level=logging.INFO)

    def _authenticate(self, connection: Outlet, packet: Connect,
                      answer: Callable[[int | Identity], None]) -> None:
        if "authentication_method" in packet.properties:
            log.info("MQTT client %s asked for enhanced authentication (%s): not supported",
                     connection.peer, packet.properties["authentication_method"])
            answer(ReasonCode.BAD_AUTHENTICATION_METHOD)
            return
        if packet.username is None:
            answer(self._without_password(connection))
            return
        principal = self._principals.get(packet.username)
        if principal is None or principal.ticket_hash is None:
            answer(self._refused(connection, packet.username, "password",
                                 "no such principal" if principal is None else "wrong password",
                                 ReasonCode.BAD_USER_NAME_OR_PASSWORD))
            return

        def verified(ok: bool) -> None:
            answer((principal.authid, principal.role, "password") if ok else
                   self._refused(connection, packet.username, "password", "wrong password",
                                 ReasonCode.BAD_USER_NAME_OR_PASSWORD))

        password = (packet.password or b"").decode("utf-8", "replace")
        if not self.router.verifier.verify(password, principal.ticket_hash, verified,
                                           self.realm.name, "mqtt", connection.peer):
            answer(ReasonCode.SERVER_BUSY)

    def _without_password(self, connection: Outlet) -> int | Identity:
        """TLS client certificate or anonymous: decided at once."""
        transport = getattr(connection, "transport", None)
        client_cn = None if transport is None else peer_common_name(transport)
        if client_cn is not None:
            principal = self._principals.get(client_cn)
            if principal is not None:
                return principal.authid, principal.role, "tls"
            return self._refused(connection, client_cn, "tls",
                                 "no principal for the client certificate's CN")
        if self.realm.anonymous_role is None:
            return self._refused(connection, None, "anonymous", "anonymous access is off")
        return None, self.realm.anonymous_role, "anonymous"

    def connect(self, connection: Outlet, packet: Connect, identity: Identity,
                answer: Callable[[MqttSession | int, bool, str | None], None]) -> None:
        """``answer(session, session present, assigned client id)`` of an authenticated
        CONNECT: at once, or, when sessions follow their client among nodes, once this node
        owns the client id (the node that had it let go: its state is read from there); or
        ``answer(CONNACK refusal, False, None)`` when the client id's session belongs to
        another owner, found out only there (Redis keeps who holds each client id)."""
        client_id, assigned = packet.client_id, None
        if not client_id:
            client_id = assigned = f"auto-{self.router.new_session_id():x}"
        if self.claims is None:
            answer(*self._attach(connection, packet, identity, client_id), assigned)
            return

        def claimed(stored: StoredSession | None) -> None:
            if client_id not in self.sessions:
                if packet.clean_start:  # what another node left of it goes
                    self.store.delete_session(client_id)
                elif stored is not None:
                    self._restore_one(stored, time.time())
            existing = self.sessions.get(client_id)
            if existing is not None:  # the claim wrote the claimant: say whose it is
                self.claims.hold(client_id, owner(  # type: ignore[union-attr]
                    existing.info.authid, existing.info.authmethod))
            if self._foreign(connection, client_id, identity):  # stored without a holder
                answer(ReasonCode.NOT_AUTHORIZED, False, None)
                return
            session, present = self._attach(connection, packet, identity, client_id)
            self._keep_will(session, packet.will)
            answer(session, present, assigned)

        def refused() -> None:
            self._count_foreign(connection, client_id, identity[0])
            answer(ReasonCode.NOT_AUTHORIZED, False, None)

        self.claims.claim(client_id, owner(identity[0] or "", identity[2]),
                          not packet.clean_start, claimed, refused)

    def _attach(self, connection: Outlet, packet: Connect, identity: Identity,
                client_id: str) -> tuple[MqttSession, bool]:
        """(session, session present): the client's session on this node, taken over from
        its previous connection or new."""
        authid, authrole, authmethod = identity
        session_id = self.router.new_session_id()
        expiry = self._requested_expiry(connection, packet)
        self._cancel_will(client_id)  # a new connection for the client id (MQTT-3.1.2-8)
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            existing.connection.kill("takeover", None)  # its will is published when it is gone
            existing.connection = None
        # its owner's (checked before); a role changed by a reload starts afresh
        if existing is not None and (packet.clean_start or existing.info.authrole != authrole):
            self.destroy(existing, disown=False)
            existing = None
        session_present = existing is not None
        if existing is None:
            # an anonymous client's authid is made from its session id when asked, and
            # the peer text by the connection (see Outlet.info_peer); it joined at the
            # time of the turn's reads, a float the sessions of one turn share
            info = (SessionInfo if authid is not None else AnonymousInfo)(
                session_id, self.realm.name, authid, authrole,  # type: ignore[arg-type]
                authmethod, protocol=connection.transport_name,
                joined_at=self.clock.turn_began, peer=connection.info_peer,
                client_id=client_id)
            existing = self._open(client_id, info, expiry)
        else:
            self._set_persistence(existing, expiry)
        session = existing
        self._cancel_expiry(session)
        session.connection = connection
        self.router.connections.add(connection)
        if session.persistent:
            self._save(session, None)
        return session, session_present

    def release(self, client_id: str, done: Callable[[], None]) -> None:
        """Another node took the client over: close its connection here (a takeover), keep
        its state where it is stored, forget it, and call ``done`` once written."""
        session = self.sessions.get(client_id)
        if session is None:
            done()
            return
        connection = session.connection
        if connection is not None:
            session.connection = None
            connection.kill("takeover", None)
            if session.persistent:
                self._save(session, time.time())  # its expiry runs from now
        self._cancel_will(client_id)  # the node that took the client decides on it now
        self._forget(session)
        self._keep_will(session, None)  # the node that took the client keeps its will now
        self.store.when_durable(lambda ok: done())

    def adopt(self, client_id: str, stored: StoredSession | None,
              will: StoredWill | None) -> None:
        """The client's node died (or this node's previous run did): its persistent
        session, if any and not expired, lives here now, offline, queueing; its will is
        published as that node would have when the connection was lost (delay from now)."""
        now = time.time()
        session = self.sessions.get(client_id)
        if session is None and stored is not None:
            stored.expiry = self.capped_expiry(stored.expiry)
            if (stored.disconnected_at is not None
                    and stored.disconnected_at + stored.expiry <= now):
                self.store.delete_session(client_id)
            else:
                stored.disconnected_at = stored.disconnected_at or now
                self._restore_one(stored, now)
                session = self.sessions[client_id]
                self._save(session, stored.disconnected_at)
        if session is None:
            self.claims.disown(client_id)  # type: ignore[union-attr]  # adopt needs claims
            if will is not None:  # the session ended with its node: the will is due now
                self._send_stored_will(client_id, _as_will(will), will)
            return
        if will is not None and session.connection is None:
            due = _as_will(will)
            self._keep_will(session, due)  # this node publishes it now, or dies first
            self._publish_will(session, due)

    def lost_will(self, client_id: str, stored: StoredWill) -> None:
        """The will of a client whose node died after the client had connected to another
        node: its connection there was closed by the death, so a will without a delay is
        due now; one with a delay was cancelled by the new connection (MQTT-3.1.2-8)."""
        will = _as_will(stored)
        if not will.properties.get("will_delay_interval", 0):
            self._send_stored_will(client_id, will, stored)

    def _send_stored_will(self, client_id: str, will: Will, stored: StoredWill) -> None:
        """Publish a will of a connection of another node, as who connected."""
        info = SessionInfo(self.router.new_session_id(), self.realm.name, stored.authid,
                           stored.authrole, stored.authmethod, protocol="mqtt",
                           client_id=client_id)
        self._send_will(client_id, info, will)

    def _keep_will(self, session: MqttSession, will: Will | None) -> None:
        """Keep the store's copy of the will of the session's connection current (only
        where sessions follow their client among nodes)."""
        if self.claims is None:
            return
        info = session.info
        self.claims.keep_will(session.client_id, None if will is None else StoredWill(
            info.authid, info.authrole, info.authmethod, session.expiry,
            StoredMessage(will.topic, will.payload, will.qos, will.retain, will.properties)))

    def _refused(self, connection: Outlet, authid: str | None, method: str,
                 reason: str, code: int = ReasonCode.NOT_AUTHORIZED) -> int:
        """Log and count a failed login; hold the CONNACK back by the guard's delay."""
        delay = self.router.login_guard.failed("MQTT", connection.peer, authid, method, reason)
        hold_answers = getattr(connection, "hold_answers", None)
        if hold_answers is not None:
            hold_answers(delay)
        return code

    def _requested_expiry(self, connection: Outlet, packet: Connect) -> float:
        """Seconds the session outlives its connection (0 = not at all), capped."""
        if connection.version == 5:
            return self.capped_expiry(packet.properties.get("session_expiry_interval", 0))
        return 0.0 if packet.clean_start else self.capped_expiry(NEVER_EXPIRES)

    def capped_expiry(self, seconds: float | None) -> float:
        """A requested session expiry (``NEVER_EXPIRES`` or None: never) within the realm's
        ``max_session_expiry``."""
        cap = self.settings.max_session_expiry
        return float(cap if seconds is None or seconds > cap else seconds)

    def _open(self, client_id: str, info: SessionInfo, expiry: float) -> MqttSession:
        session = MqttSession(self, info, expiry)
        self.sessions[client_id] = session
        self.router.track(session)
        self.realm.attach(session)
        return session

    def _set_persistence(self, session: MqttSession, expiry: float) -> None:
        was_persistent = session.persistent
        session.expiry = expiry
        if was_persistent and not session.persistent:
            self.store.delete_session(session.client_id)
        elif session.persistent and not was_persistent:
            self._save(session, None)
            for subscription in session.all_subscriptions():
                self.store.save_subscription(session.client_id, subscription.topic_filter,
                                             subscription.packed())

    def _save(self, session: MqttSession, disconnected_at: float | None) -> None:
        info = session.info
        self.store.save_session(session.client_id, info.authid, info.authrole, info.authmethod,
                                session.expiry, disconnected_at)

    def set_expiry(self, session: MqttSession, seconds: int) -> None:
        """MQTT 5 DISCONNECT changes the session expiry (the connection refused one from 0
        to more)."""
        self._set_persistence(session, self.capped_expiry(seconds))

    def disconnected(self, connection: Outlet, session: MqttSession,
                     will: Will | None) -> None:
        info = session.info
        if info.peer is connection:
            # the text from now on: the info outlives the connection (a persistent session,
            # a retained publication's publisher), the connection's objects must not
            info.peer = str(connection)
        self.router.connections.discard(connection)
        if session.connection is not connection:
            # taken over by a newer connection for the client id: a will is published now,
            # unless it had a delay, which that connection came before (MQTT-3.1.2-8)
            if will is not None and not will.properties.get("will_delay_interval", 0):
                self._send_will(session.client_id, session.info, will)
            return
        session.connection = None
        if will is not None:
            self._publish_will(session, will)
        else:
            self._keep_will(session, None)
        if not session.persistent:
            self.destroy(session)
            return
        self._save(session, time.time())
        self._expire_later(session, session.expiry)

    def _expire_later(self, session: MqttSession, delay: float) -> None:
        self._cancel_expiry(session)
        self._expiry_timers[session] = self.scheduler.callLater(delay, self._expire, session)

    def _cancel_expiry(self, session: MqttSession) -> None:
        timer = self._expiry_timers.pop(session, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self, session: MqttSession) -> None:
        self._expiry_timers.pop(session, None)
        if session.connection is None and self.sessions.get(session.client_id) is session:
            log.info("MQTT session %s expired", session.client_id)
            self.destroy(session)

    def destroy(self, session: MqttSession, disown: bool = True) -> None:
        """Forget a session and everything it queued (its expiry timer would keep it alive);
        ``disown``: no node owns the client id any more (not so when a new session of this
        node replaces it)."""
        self._forget(session)
        session.hand_over(None, leaving=True)
        if session.persistent:
            self.store.delete_session(session.client_id)
        if disown and self.claims is not None:
            self.claims.disown(session.client_id)

    def _forget(self, session: MqttSession) -> None:
        """Take a session out of this node: no timer, no subscriptions, not listed."""
        self._cancel_expiry(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.realm.detach(session)
        self.router.forget(session)

    def _publish_will(self, session: MqttSession, will: Will) -> None:
        delay = will.properties.get("will_delay_interval", 0)
        if delay:
            self._pending_wills[session.client_id] = self.scheduler.callLater(
                min(delay, session.expiry), self._delayed_will, session, will)
            return
        self._keep_will(session, None)
        self._send_will(session.client_id, session.info, will)

    def _delayed_will(self, session: MqttSession, will: Will) -> None:
        self._pending_wills.pop(session.client_id, None)
        self._keep_will(session, None)
        self._send_will(session.client_id, session.info, will)

    def _cancel_will(self, client_id: str) -> None:
        """A new connection for the client id came before the will's delay passed: no will
        (MQTT-3.1.2-8, MQTT-3.1.3-9), whether it resumes the session or starts a new one."""
        pending = self._pending_wills.pop(client_id, None)
        if pending is not None:
            pending.cancel()

    def _send_will(self, client_id: str, info: SessionInfo, will: Will) -> None:
        try:
            self.publish(info, will.topic, will.payload, will.qos, will.retain, will.properties)
        except RouterError as exc:
            log.info("MQTT will of %s on %s not published: %s", client_id, will.topic, exc)

    # publish / subscribe ------------------------------------------------------------------

    def flush_later(self, connection: Outlet) -> None:
        """Have ``connection`` write what it gathered at the end of this reactor turn."""
        self._unflushed.append(connection)
        if not self._flush_due:
            self._flush_due = True
            self._at_turn_end(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        connections, self._unflushed = self._unflushed, []
        for connection in connections:
            connection.flush()

    def publish(self, info: SessionInfo, topic: str, payload: bytes, qos: int, retain: bool,
                properties: dict,
                on_durable: Callable[[Publication, bool], None] | None = None) -> None:
        """Route an MQTT publication (a client's, or a will: ``info`` is its session's)
        through the core (raises RouterError when refused); ``on_durable(publication, ok)``
        once what it made durable is stored (or failed to be), as :meth:`Realm.publish`
        calls it."""
        mapping = self.settings.payload_mapping
        args, kwargs = (UNMAPPED, UNMAPPED) if mapping == "json" else from_bytes(payload, mapping)
        expiry = properties.get("message_expiry_interval") if properties else None
        options = _PUBLISH_OPTIONS[qos, retain, not payload]
        levels = self._levels.get(topic)
        if levels is None:
            levels = from_mqtt(topic)
            if len(topic.encode()) <= TOPIC_NAME_KEPT_BYTES:  # (long ones not kept: see there)
                if len(self._levels) >= LEVELS_KEPT:
                    self._levels.clear()
                self._levels[topic] = levels
        self.realm.publish(info, levels, args, kwargs, options, on_durable, len(payload),
                           payload, properties or None,  # (by position: the faster call)
                           time.time() + expiry if expiry is not None else None, None, topic)

    def subscribe(self, session: MqttSession, topic_filter: str, options: SubscriptionOptions,
                  identifier: int | None) -> tuple[int, Callable[[], None] | None]:
        """(SUBACK reason code, a call that sends the retained messages, if any are due)."""
        existed = session.subscription(topic_filter) is not None
        granted = min(options.qos, self.settings.max_qos)
        try:
            core = self._core_subscribe(session, topic_filter, options.retain_handling != 2,
                                        self.settings.max_subscriptions)
        except InvalidSharedFilter as exc:
            self.count_refusal(session, f"subscribe {topic_filter}", exc)
            return ReasonCode.TOPIC_FILTER_INVALID, None
        except RouterError as exc:
            if exc.uri == errors.LIMIT_EXCEEDED:  # counted by the realm
                return ReasonCode.QUOTA_EXCEEDED, None
            self.count_refusal(session, f"subscribe {topic_filter}", exc)
            return (ReasonCode.NOT_AUTHORIZED if exc.uri == errors.NOT_AUTHORIZED
                    else ReasonCode.TOPIC_FILTER_INVALID), None
        granted_options = shared_options(granted, options.no_local,
                                         options.retain_as_published, options.retain_handling)
        session.add_subscription(MqttSubscription(topic_filter, core, granted_options,
                                                  identifier))
        wants_retained = options.retain_handling == 0 or (options.retain_handling == 1
                                                          and not existed)
        deliver = (partial(self.realm.send_retained, session, core,
                           session.connection.flow.limits.max_buffered_messages)
                   if wants_retained else None)
        return granted, deliver

    def _core_subscribe(self, session: MqttSession, topic_filter: str,
                        get_retained: bool = False, limit: int | None = None) -> Subscription:
        """The core subscription (or shared group, for ``$share/...``) of a filter; raises
        InvalidSharedFilter or RouterError (``limit``: see :meth:`Realm.subscribe`)."""
        group, plain_filter = split_shared(topic_filter)
        levels, match = mqtt_pattern(plain_filter)
        return self.realm.subscribe(session, levels, SubscribeOptions(
            match, get_retained=get_retained, shared_group=group), limit)

    def unsubscribe(self, session: MqttSession, topic_filter: str) -> int:
        subscription = session.subscription(topic_filter)
        if subscription is None:
            return ReasonCode.NO_SUBSCRIPTION_EXISTED
        try:  # first: live messages held behind its retained backlog still go out on it
            self.realm.unsubscribe(session, subscription.core.id)
        except RouterError:
            pass  # the core subscription was already gone; the client's view is what counts
        session.remove_subscription(topic_filter)
        if isinstance(subscription.core, SharedGroup):
            session.hand_over(subscription.core, leaving=False)
        return ReasonCode.SUCCESS

    def delivery_acknowledged(self, session: MqttSession, entry: Outbound) -> None:
        if self.realm.activity is not None and entry[SENT_AT]:
            message = entry[MESSAGE]
            self.realm.activity.acknowledged(session.info, from_mqtt(message.topic), message.qos,
                                             (time.time() - entry[SENT_AT]) * 1000.0)

    # restart ------------------------------------------------------------------------------

    def restore(self) -> int:
        """Bring back persistent sessions (disconnected) with their subscriptions and queues;
        their expiry is capped as a new session's would be (the cap may have been lowered)."""
        now = time.time()
        restored = 0
        for stored in self.store.load():
            stored.expiry = self.capped_expiry(stored.expiry)
            if (stored.disconnected_at is not None
                    and stored.disconnected_at + stored.expiry <= now):
                self.store.delete_session(stored.client_id)
                if self.claims is not None:
                    self.claims.disown(stored.client_id)
                continue
            self._restore_one(stored, now)
            restored += 1
        return restored

    def _restore_one(self, stored: StoredSession, now: float) -> None:
        info = SessionInfo(self.router.new_session_id(), self.realm.name, stored.authid,
                           stored.authrole, stored.authmethod, protocol="mqtt",
                           client_id=stored.client_id)
        session = self._open(stored.client_id, info, stored.expiry)
        for topic_filter, packed in stored.subscriptions.items():
            qos, no_local, retain_as_published, retain_handling, identifier = packed
            try:
                core = self._core_subscribe(session, topic_filter)
            except (InvalidSharedFilter, RouterError) as exc:
                log.warning("MQTT session %s: subscription %s dropped on restore: %s",
                            stored.client_id, topic_filter, exc)
                self.store.delete_subscription(stored.client_id, topic_filter)
                continue
            session.add_subscription(MqttSubscription(
                topic_filter, core, shared_options(qos, no_local, retain_as_published,
                                                   retain_handling), identifier),
                persist=False)
        session.restore_outbound(stored.outbound)
        session.inbound_qos2 = set(stored.inbound)
        remaining = max(0.0, (stored.disconnected_at or now) + stored.expiry - now)
        self._expire_later(session, remaining)


def _as_will(stored: StoredWill) -> Will:
    """The will as the connection had it."""
    message = stored.message
    return Will(message.topic, message.payload, message.qos, message.retain,
                message.properties)
