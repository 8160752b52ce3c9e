"""One WAMP session on one transport: the state machine and the translation to the core.

States: HANDSHAKE (waiting for HELLO) -> CHALLENGED (CHALLENGE sent) [-> VERIFYING (a
ticket being checked in the verifier's threads)] -> ESTABLISHED -> CLOSING (we sent
GOODBYE) -> CLOSED; a refused login waits in REFUSING (ignoring everything) for the login
guard's delay before its ABORT goes out. WELCOME or the decision to refuse ends the
handshake for the listener's ``handshake_timeout``: the back-off delay is bounded by
``login_backoff.max_delay`` and is never cut short by the handshake timer. Any protocol
violation sends ABORT ``wamp.error.protocol_violation``, drops the session from its realm
and closes the transport; nothing after it is processed. The way from HELLO to WELCOME
or ABORT is :mod:`router.wamp.handshake`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

from autobahn.wamp import message as m
from autobahn.exception import PayloadExceededError
from autobahn.wamp.exception import TransportLost

from router.core import errors
from router.core.errors import PassthruRefused, ProtocolViolation, RouterError, Unencodable
from router.core.incidents import (EXPIRED, SLOW_CONSUMER, TOO_LARGE, UNACKNOWLEDGED,
                                  UNREPRESENTABLE)
from router.core.model import Passthru, Publication, SessionInfo
from router.core.ownership import AnonymousInfo
from router.core.options import (NO_CALL_OPTIONS, parse_call_options, parse_publish_options,
                                 parse_subscribe_options)
from router.core.peer import NOTHING_YET, Invocation, Registration, Subscription
from router.core.qos import ENFORCE_MINIMUM, delivered_qos
from router.core.realm import Realm
from router.core.router import Router
from router.core.shared import SharedGroup
from router.core.topic import from_uri
from router.core.uri import EXACT
from router.flow import disconnect_slow_consumer
from router.wamp import codec
from router.wamp.codec import InvalidUriRequest, WireMessage, decode
from router.wamp.features import ROUTER_ROLES
from router.wamp.handshake import (CHALLENGED, CLOSED, CLOSING, ESTABLISHED, HANDSHAKE,
                                   VERIFYING, Handshake)
from router.wamp import passthru as ppt
from router.wamp.outlet import Outlet
from router.settings import WampSettings

log = logging.getLogger(__name__)

PAYLOAD_SIZE_EXCEEDED = "wamp.error.payload_size_exceeded"
"""ABORT reason when WELCOME is over the client's RawSocket maximum message size."""

ERROR, EVENT, RESULT, INVOCATION, INTERRUPT = 8, 36, 50, 68, 69

SLOW_CONSUMER_CLOSE = "wamp.close.slow_consumer"
"""GOODBYE reason of a session closed for not reading its events (see docs/configuration.md)."""


_DEFAULT_SETTINGS = WampSettings()
"""Of a session before it joins a realm (frozen: one for all)."""


@dataclass(frozen=True, slots=True, eq=False)
class WampListener:
    """What the sessions of one WAMP listener share: the router, the protocol name they
    show (``wamp.rawsocket``, ``wamp.websocket``), the WAMP settings by realm; and, once
    they joined a realm, that realm's settings (:meth:`in_realm`: one per realm)."""

    router: Router
    protocol_name: str
    by_realm: dict[str, WampSettings]
    settings: WampSettings = _DEFAULT_SETTINGS
    """Of the realm (the listener's own, before a session joins one: the defaults)."""
    _in_realms: dict[str, "WampListener"] = field(default_factory=dict)

    def in_realm(self, name: str) -> "WampListener":
        """The same with realm ``name``'s settings (made once per realm)."""
        joined = self._in_realms.get(name)
        if joined is None:
            joined = self._in_realms[name] = replace(
                self, settings=self.by_realm.get(name, self.settings), _in_realms={})
        return joined


class WampSession:
    """Implements autobahn's ITransportHandler for the router side, and the core's Peer.

    Slotted; its queue of unwritten events is made on first use and its handshake is
    dropped once the session is established: an idle subscribed session holds its
    dicts, its SessionInfo and its subscriptions."""

    __slots__ = ("_listener", "_subscribed", "_unacked", "transport", "state", "_realm",
                 "_handshake", "client_roles", "_last_payload_size", "info")

    def __init__(self, listener: WampListener) -> None:
        self._listener = listener
        """What the sessions of its listener (in its realm, once joined) share: one
        reference, not four."""
        self._subscribed: dict[int, tuple[int, str, bool]] = NOTHING_YET  # type: ignore[assignment]
        """subscription id -> (granted QoS, policy, raw view) of the subscriptions that may
        need acks or get byte publications as ``ppt_scheme: "mqtt"`` EVENTs (the shared
        read-only :data:`NOTHING_YET` until the first)."""
        self._unacked: _UnackedTable = NOTHING_YET  # type: ignore[assignment]
        """Events sent and not acknowledged, by publication, with their redelivery timer and
        the ones held back while the transport is paused (:data:`NOTHING_YET` until the
        first)."""
        self.transport: Outlet | None = None
        self.state = HANDSHAKE
        self._realm: Realm | None = None
        self._handshake: Handshake | None = Handshake(listener.router)
        self.client_roles: frozenset[tuple[str, str]] = frozenset()
        """(role, feature) pairs the client announced (:func:`announced`)."""
        self._last_payload_size = 0
        self.info: SessionInfo | None = None  # type: ignore[assignment]

    @property
    def _router(self) -> Router:
        return self._listener.router

    # ITransportHandler ------------------------------------------------------

    @property
    def _transport(self) -> Outlet | None:
        """autobahn's WebSocket protocol sets this before ``onOpen``, which sets the same:
        not kept twice (a slot is 8 bytes of every session)."""
        return self.transport

    @_transport.setter
    def _transport(self, transport: Outlet) -> None:
        pass

    def onOpen(self, transport: Outlet) -> None:
        self.transport = transport
        transport.flow.owner = self
        self._router.connections.add(self)

    def onClose(self, was_clean: bool) -> None:
        self.state = CLOSED
        info = self.info
        if info is not None and info.peer is not None and type(info.peer) is not str:
            # the text from now on: an info may outlive its connection (a retained
            # publication keeps its publisher's), the connection's objects must not
            info.peer = str(info.peer)
        self._leave_realm()
        self._router.connections.discard(self)

    def on_payload(self, payload: bytes, is_binary: bool | None) -> None:
        """Entry point for every transport message (WebSocket message or RawSocket frame)."""
        if self.state == CLOSED:
            return
        self._last_payload_size = len(payload)
        try:
            for msg, raw in decode(self.transport.object_serializer, payload, is_binary):
                state = self.state
                if state == ESTABLISHED:  # (most messages: _handle's first case, one call less)
                    handler = _ESTABLISHED_HANDLERS.get(type(msg))
                    if handler is not None:
                        handler(self, msg, raw)
                        continue
                elif state == CLOSED:
                    return
                self._handle(msg, raw)
        except ProtocolViolation as exc:
            self.protocol_violation(str(exc))

    # state machine --------------------------------------------------------

    def _handle(self, msg: m.Message, raw: list) -> None:
        if self.state == ESTABLISHED:
            handler = _ESTABLISHED_HANDLERS.get(type(msg))
            if handler is None:
                raise ProtocolViolation(f"{type(msg).__name__.upper()} is not allowed "
                                        "in an established session")
            handler(self, msg, raw)
        elif self.state == HANDSHAKE:
            if type(msg) is not m.Hello:
                raise ProtocolViolation(f"{type(msg).__name__.upper()} received before HELLO")
            self._handshake.on_hello(self, msg, raw)
        elif self.state == CHALLENGED:
            if type(msg) is not m.Authenticate:
                raise ProtocolViolation(f"{type(msg).__name__.upper()} received while "
                                        "waiting for AUTHENTICATE")
            self._handshake.on_authenticate(self, msg)
        elif self.state == VERIFYING:
            raise ProtocolViolation(f"{type(msg).__name__.upper()} received while the "
                                    "authentication is being verified")
        elif self.state == CLOSING and type(msg) is m.Goodbye:
            self._close_transport()
        # REFUSING: the ABORT is on its way; nothing the client says changes that

    def welcome(self, realm: Realm, authid: str | None, authrole: str, authmethod: str,
                 session_id: int | None = None) -> None:
        """Join ``realm``; ``authid`` None: an anonymous session, named by the router
        (:class:`AnonymousInfo`)."""
        if session_id is None or session_id in self._router.peers:
            session_id = self._router.new_session_id()
        self.info = (SessionInfo if authid is not None else AnonymousInfo)(
            session_id, realm.name, authid, authrole, authmethod,  # type: ignore[arg-type]
            protocol=self._listener.protocol_name,
            peer=self.transport.info_peer)
        authid = self.info.authid
        self._listener = self._listener.in_realm(realm.name)
        self.state = ESTABLISHED
        self._handshake = None  # done with: one object less per session
        self.transport.handshake_done()
        try:
            self.transport.send(WireMessage([m.Welcome.MESSAGE_TYPE, session_id, {
                "realm": realm.name, "authid": authid, "authrole": authrole,
                "authmethod": authmethod, "authprovider": "static", "roles": ROUTER_ROLES}]))
        except PayloadExceededError as exc:
            # the client cannot learn of this session: it must never exist (never attached)
            self._router.incidents.count(realm.name, "wamp", TOO_LARGE,
                                         f"session {session_id}: WELCOME: {exc}: aborted")
            self.abort(PAYLOAD_SIZE_EXCEEDED, "WELCOME exceeds your maximum message size")
            return
        except TransportLost:
            pass
        self._realm = realm
        self._router.track(self)
        realm.attach(self)

    # established: pub/sub ------------------------------------------------------

    def _on_goodbye(self, msg: m.Goodbye, raw: list) -> None:
        self.send(WireMessage([m.Goodbye.MESSAGE_TYPE, {}, "wamp.close.goodbye_and_out"]))
        self._leave_realm()
        self._close_transport()

    def _on_abort(self, msg: m.Abort, raw: list) -> None:
        self._leave_realm()
        self._close_transport()

    def _on_publish(self, msg: m.Publish, raw: list) -> None:
        options = parse_publish_options(raw[2])
        args, passthru, payload = msg.args, None, None
        if msg.payload is not None or "ppt_scheme" in raw[2]:
            passthru, args = ppt.read(self.supports, "publisher", raw[2], args, msg.kwargs,
                                      msg.payload, "PUBLISH")
            if passthru.scheme == ppt.RAW_SCHEME:
                payload = args[0]  # MQTT and AMQP receivers get these bytes as they are
        elif options.retain and not msg.args and not msg.kwargs:
            # an empty retained event would reach MQTT subscribers as a zero-byte retained
            # message, which MQTT forbids (MQTT-3.3.1-10/11): empty + retain clears, as there
            options = replace(options, retain=False, retain_clear=True)
        request = msg.request
        if not self.transport.flow.publisher:
            self.transport.flow.became_publisher()
        on_durable = partial(self._acknowledge_publish, request) if options.acknowledge else None
        topic = msg.topic
        try:
            self._realm.check_uri(topic)
            self._realm.publish(self.info, from_uri(topic), args, msg.kwargs, options,
                                on_durable, self._last_payload_size, uri=topic,
                                payload=payload, passthru=passthru)
        except RouterError as exc:
            if options.acknowledge:
                self._send_error(m.Publish.MESSAGE_TYPE, request, exc)

    def _acknowledge_publish(self, request: int, publication: Publication, ok: bool) -> None:
        """PUBLISHED once the publication's retained state is stored (ERROR if that failed)."""
        if not ok:
            self._send_error(m.Publish.MESSAGE_TYPE, request, RouterError(
                "wamp.error.unavailable",
                "the event was delivered but could not be stored as the retained event"))
        elif self.state == ESTABLISHED:
            self.send(WireMessage([m.Published.MESSAGE_TYPE, request,
                                    publication.publication_id]))

    def _on_invalid_uri(self, msg: InvalidUriRequest, raw: list) -> None:
        if msg.request_type == m.Publish.MESSAGE_TYPE:
            if not parse_publish_options(msg.options).acknowledge:
                return
        self._send_error(msg.request_type, msg.request,
                         RouterError(errors.INVALID_URI, msg.reason))

    def _on_subscribe(self, msg: m.Subscribe, raw: list) -> None:
        options = parse_subscribe_options(raw[2])
        raw_view = "_ppt_scheme" in raw[2]
        try:
            if raw_view:
                self._check_raw_view(raw[2]["_ppt_scheme"])
            self._realm.check_uri(msg.topic, options.match)
            subscription = self._realm.subscribe(self, from_uri(msg.topic), options,
                                                 self._listener.settings.max_subscriptions)
        except RouterError as exc:
            self._send_error(m.Subscribe.MESSAGE_TYPE, msg.request, exc)
            return
        granted = options.qos if options.qos is not None else self._listener.settings.granted_qos
        policy = options.qos_policy or self._listener.settings.qos_policy
        if granted or policy != ENFORCE_MINIMUM or raw_view:
            if self._subscribed is NOTHING_YET:
                self._subscribed = {}
            self._subscribed[subscription.id] = (granted, policy, raw_view)
        else:
            self._forget_subscription(subscription.id)
        self.send(WireMessage([m.Subscribed.MESSAGE_TYPE, msg.request, subscription.id]))
        if options.get_retained:
            self._realm.send_retained(self, subscription,
                                      self.transport.flow.limits.max_buffered_messages)

    def _on_unsubscribe(self, msg: m.Unsubscribe, raw: list) -> None:
        try:
            self._realm.unsubscribe(self, msg.subscription)
        except RouterError as exc:
            self._send_error(m.Unsubscribe.MESSAGE_TYPE, msg.request, exc)
            return
        self._forget_subscription(msg.subscription)
        self.send(WireMessage([m.Unsubscribed.MESSAGE_TYPE, msg.request]))

    def _forget_subscription(self, subscription_id: int) -> None:
        if subscription_id in self._subscribed:
            del self._subscribed[subscription_id]

    def _check_raw_view(self, scheme: object) -> None:
        """``_ppt_scheme: "mqtt"``: byte publications (MQTT payloads, AMQP data bodies) as
        they are, for a subscriber that announced Payload Passthru Mode."""
        if scheme != ppt.RAW_SCHEME:
            raise RouterError(errors.INVALID_ARGUMENT,
                              f"option '_ppt_scheme' may only be '{ppt.RAW_SCHEME}'")
        if not self.supports("subscriber", "payload_passthru_mode"):
            raise RouterError(errors.FEATURE_NOT_SUPPORTED, "option '_ppt_scheme' needs "
                              "payload_passthru_mode announced for the subscriber role")

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        if subscription.match != EXACT and publication.uri(self._realm.uri_check) is None:
            self._count(UNREPRESENTABLE, publication)  # only a pattern can reach such a topic
            return
        own = self._subscribed.get(subscription.id)
        raw_view = False
        if publication.passthru is not None:
            self._check_passthru(publication.passthru)
        elif own is not None and own[2]:
            raw_view = publication.payload is not None
        if own is not None and delivered_qos(publication.qos, own[0], own[1]) > 0:
            self._send_acknowledged(subscription, publication, retained, raw_view)
            return
        if self.transport.flow.over:
            self._count(SLOW_CONSUMER, publication)
            return
        if retained:
            self.send(_event(subscription, publication, retained=True, raw_view=raw_view))
            return
        cache = publication.encodings()
        key = (subscription.id, "raw") if raw_view else subscription.id
        event = cache.get(key)
        if event is None:
            event = cache[key] = _event(subscription, publication, raw_view=raw_view)
        self.send(event)

    def _check_passthru(self, passthru: Passthru) -> None:
        """May this session take a passthru publication (raises :class:`PassthruRefused`
        if not: skipped and counted)?"""
        if not self.supports("subscriber", passthru.feature):
            raise PassthruRefused(f"scheme '{passthru.scheme}': the session did not "
                                  f"announce {passthru.feature}")

    def ready(self) -> bool:
        """Joined, not over the flow bound and room for unacknowledged events."""
        return (self.state == ESTABLISHED and not self.transport.flow.over
                and len(self._unacked) < self._listener.settings.max_unacked)

    def backlog_room(self) -> bool:
        """Joined, the transport accepting and room for unacknowledged events (a retained
        backlog on an acknowledged subscription waits for EVENT_RECEIVED)."""
        if self.state != ESTABLISHED or len(self._unacked) >= self._listener.settings.max_unacked:
            return False
        if self.transport.flow.paused:
            self.transport.flow.stalled()
            return False
        return True

    def _send_acknowledged(self, subscription: Subscription, publication: Publication,
                           retained: bool, raw_view: bool = False) -> None:
        """At-least-once: the event is sent again until the client answers EVENT_RECEIVED."""
        if retained:
            event = _event(subscription, publication, retained=True, acknowledged=True,
                           raw_view=raw_view)
        else:
            key = (subscription.id, "ack", raw_view)
            cache = publication.encodings()
            event = cache.get(key)
            if event is None:
                event = cache[key] = _event(subscription, publication, acknowledged=True,
                                            raw_view=raw_view)
        pending = self._unacked.get(publication.publication_id)
        if pending is None and len(self._unacked) >= self._listener.settings.max_unacked:
            self._count(UNACKNOWLEDGED, publication)
            if self.transport.flow.paused:
                self.transport.flow.overflow()
            return
        # an unencodable event raises here, before it is awaited
        unacked = self._unacked
        if unacked is NOTHING_YET:
            unacked = self._unacked = _UnackedTable()
        if self.transport.flow.paused:
            event.serialize(self.transport.object_serializer)
            if unacked.unwritten is None:
                unacked.unwritten = deque()
            unacked.unwritten.append(event)
        else:
            self.send(event)
        if pending is None:
            pending = unacked[publication.publication_id] = _Unacked(publication, time.time())
            if unacked.redelivery is None or not unacked.redelivery.active():
                unacked.redelivery = self._router.scheduler.callLater(
                    self._listener.settings.ack_timeout, self._redeliver)
        if type(subscription) is SharedGroup:
            pending.group = subscription
        pending.events.append(event)

    def _count(self, reason: str, publication: Publication) -> None:
        self._realm.incidents.count(self._realm.name, "wamp", reason,
                                    f"session {self.info.session_id}, {publication.name}")

    def resume_output(self) -> None:
        """The transport drained: write the acknowledged events held back, in order."""
        unwritten = self._unacked.unwritten if type(self._unacked) is _UnackedTable else None
        while unwritten and not self.transport.flow.paused:  # (None until something waited)
            self.send(unwritten.popleft())
        if self._realm is not None:
            self._realm.backlogs.resume(self)  # retained events owed to new subscriptions

    def slow_consumer(self) -> None:
        """Over the outbound bound for too long: GOODBYE (best effort) and leave; the
        flow then aborts the transport."""
        if self.state != ESTABLISHED:
            self.state = CLOSED
            return
        realm = self._realm
        disconnect_slow_consumer(realm.incidents, realm.name, "wamp",
                                 f"session {self.info.session_id}", self._slow_consumer_goodbye)
        self._leave_realm()
        self.state = CLOSED

    def _slow_consumer_goodbye(self) -> None:
        """WAMP's goodbye to a slow consumer."""
        self.send(WireMessage([m.Goodbye.MESSAGE_TYPE, {
            "message": "the client did not read its events fast enough"}, SLOW_CONSUMER_CLOSE]))

    def _on_event_received(self, msg: m.EventReceived, raw: list) -> None:
        pending = self._unacked.pop(msg.publication, None) if self._unacked else None
        if pending is not None and len(self._unacked) == self._listener.settings.max_unacked - 1:
            self._realm.backlogs.resume(self)  # a slot of the in-flight window is free
        if pending is not None and self._realm.activity is not None:
            self._realm.activity.acknowledged(self.info, pending.publication.topic,
                                              pending.publication.qos or 1,
                                              (time.time() - pending.sent_at) * 1000.0)

    def _redeliver(self) -> None:
        if self.state != ESTABLISHED:
            return  # (the timer was cancelled with the table: not called then)
        unacked = self._unacked
        unacked.redelivery = None
        timeout = self._listener.settings.ack_timeout
        if self.transport.flow.paused:  # the client is not reading: sending again piles up
            unacked.redelivery = self._router.scheduler.callLater(timeout, self._redeliver)
            return
        due = time.time() - timeout
        for publication_id, pending in list(self._unacked.items()):
            if pending.publication.expired():
                del self._unacked[publication_id]
                self._expired(pending.publication)
                continue
            if pending.sent_at > due:
                continue
            if pending.attempts >= self._listener.settings.max_redeliveries:
                self._count(UNACKNOWLEDGED, pending.publication)
                del self._unacked[publication_id]
                continue
            pending.attempts += 1
            pending.sent_at = time.time()
            for event in pending.events:
                self.send(event)
        if unacked:
            unacked.redelivery = self._router.scheduler.callLater(timeout, self._redeliver)
        if len(self._unacked) < self._listener.settings.max_unacked:
            self._realm.backlogs.resume(self)  # given up or expired ones freed the window

    def _expired(self, publication: Publication) -> None:
        realm = self._realm
        realm.incidents.count(realm.name, "wamp", EXPIRED,
                              f"session {self.info.session_id}: {publication.name}")

    # established: rpc -----------------------------------------------------------

    def _on_register(self, msg: m.Register, raw: list) -> None:
        try:
            self._realm.register(self, msg.procedure, msg.match or EXACT,
                                 msg.invoke or "single", partial(self._registered, msg.request),
                                 self._listener.settings.max_registrations)
        except RouterError as exc:
            self._send_error(m.Register.MESSAGE_TYPE, msg.request, exc)

    def _registered(self, request: int, registration: Registration,
                    error: RouterError | None) -> None:
        if self.state != ESTABLISHED:
            return  # left while the cluster was asked
        if error is not None:
            self._send_error(m.Register.MESSAGE_TYPE, request, error)
        else:
            self.send(WireMessage([m.Registered.MESSAGE_TYPE, request, registration.id]))

    def _on_unregister(self, msg: m.Unregister, raw: list) -> None:
        try:
            self._realm.dealer.unregister(self, msg.registration)
        except RouterError as exc:
            self._send_error(m.Unregister.MESSAGE_TYPE, msg.request, exc)
            return
        self.send(WireMessage([m.Unregistered.MESSAGE_TYPE, msg.request]))

    def _on_call(self, msg: m.Call | codec.Call, raw: list) -> None:
        args, passthru = msg.args, None
        if type(msg) is codec.Call:  # no options, so no passthru either
            options = NO_CALL_OPTIONS
        else:
            options = parse_call_options(raw[2])
            if msg.payload is not None or "ppt_scheme" in raw[2]:
                passthru, args = ppt.read(self.supports, "caller", raw[2], args, msg.kwargs,
                                          msg.payload, "CALL")
        try:
            self._realm.call(self, msg.request, msg.procedure, args, msg.kwargs, options,
                             passthru, self._listener.settings.max_pending_calls)
        except RouterError as exc:
            self._send_error(m.Call.MESSAGE_TYPE, msg.request, exc)

    def _on_cancel(self, msg: m.Cancel, raw: list) -> None:
        try:
            self._realm.dealer.cancel(self, msg.request, msg.mode or "killnowait")
        except RouterError as exc:
            self._send_error(m.Call.MESSAGE_TYPE, msg.request, exc)

    def _on_yield(self, msg: m.Yield | codec.Yield, raw: list) -> None:
        if not self._realm.dealer.was_issued(self, msg.request):
            raise ProtocolViolation(f"YIELD for unknown invocation {msg.request}")
        args, passthru = msg.args, None
        if msg.payload is not None or "ppt_scheme" in raw[2]:
            passthru, args = ppt.read(self.supports, "callee", raw[2], args, msg.kwargs,
                                      msg.payload, "YIELD")
        self._realm.dealer.yield_(self, msg.request, args, msg.kwargs, bool(msg.progress),
                                  passthru)

    def _on_error(self, msg: m.Error, raw: list) -> None:
        if msg.request_type != m.Invocation.MESSAGE_TYPE:
            raise ProtocolViolation(f"ERROR for request type {msg.request_type} "
                                    "(only INVOCATION errors come from clients)")
        if not self._realm.dealer.was_issued(self, msg.request):
            raise ProtocolViolation(f"ERROR for unknown invocation {msg.request}")
        args, passthru = msg.args, None
        if msg.payload is not None or "ppt_scheme" in raw[3]:
            passthru, args = ppt.read(self.supports, "callee", raw[3], args, msg.kwargs,
                                      msg.payload, "ERROR")
        self._realm.dealer.invocation_error(self, msg.request, msg.error, args, msg.kwargs,
                                            passthru)

    def send_invocation(self, invocation: Invocation) -> None:
        """Raises :class:`RouterError` (``payload_size_exceeded``) when the INVOCATION is over
        this callee's maximum message size, so the caller is answered instead of waiting."""
        details = invocation.details
        head = [INVOCATION, invocation.request_id, invocation.registration.id, details]
        try:
            if invocation.passthru is not None:
                self.transport.send(WireMessage(ppt.write(
                    head, details, invocation.passthru, invocation.args)))  # type: ignore[arg-type]
            else:
                self.transport.send_once(_with_payload(head, invocation.args, invocation.kwargs))
        except PayloadExceededError as exc:
            self._too_large(exc)
            raise RouterError(PAYLOAD_SIZE_EXCEEDED,
                              f"the call does not fit the callee's maximum: {exc}") from None
        except TransportLost:
            pass

    def send_interrupt(self, invocation: Invocation, mode: str, reason: str) -> None:
        self.send(WireMessage([INTERRUPT, invocation.request_id,
                                {"mode": mode, "reason": reason}]))

    def send_result(self, call_request: int, args: list | None, kwargs: dict | None,
                    progress: bool, passthru: Passthru | None = None) -> None:
        details = {"progress": True} if progress else {}
        if passthru is not None:
            self._answer(call_request, "result", not progress, self.transport.send, WireMessage(
                ppt.write([RESULT, call_request, details], details, passthru,
                          args)))  # type: ignore[arg-type]
        else:
            self._answer(call_request, "result", not progress, self.transport.send_once,
                         _with_payload([RESULT, call_request, details], args, kwargs))

    def send_call_error(self, call_request: int, error: str, args: list | None,
                        kwargs: dict | None, passthru: Passthru | None = None) -> None:
        if passthru is not None:
            details: dict = {}
            self._answer(call_request, "error", True, self.transport.send, WireMessage(ppt.write(
                [ERROR, m.Call.MESSAGE_TYPE, call_request, details, error], details, passthru,
                args)))  # type: ignore[arg-type]
        else:
            self._answer(call_request, "error", True, self.transport.send_once, _with_payload(
                [ERROR, m.Call.MESSAGE_TYPE, call_request, {}, error], args, kwargs))

    def _answer(self, call_request: int, what: str, final: bool,
                send: Callable[[Any], None], message: Any) -> None:
        """Send this caller a RESULT or its callee's ERROR: one over the caller's maximum
        message size (RawSocket) is not sent, and a final one ends the call with ERROR
        ``payload_size_exceeded`` instead of silence (a progressive result is only counted)."""
        try:
            send(message)
        except Unencodable as exc:
            self._send_unencodable(call_request, what, exc)
        except PayloadExceededError as exc:
            self._too_large(exc)
            if final:
                self._send_error(m.Call.MESSAGE_TYPE, call_request, RouterError(
                    PAYLOAD_SIZE_EXCEEDED, f"the {what} does not fit: {exc}"))
        except TransportLost:
            pass

    def _send_unencodable(self, call_request: int, what: str, exc: Unencodable) -> None:
        """The callee answered with values this caller's serializer cannot carry."""
        self._send_error(m.Call.MESSAGE_TYPE, call_request, RouterError(
            errors.INVALID_ARGUMENT, f"the callee's {what} cannot be sent to this session: {exc}"))

    # peer ---------------------------------------------------------------------

    def supports(self, role: str, feature: str) -> bool:
        return (role, feature) in self.client_roles

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        """Drop it; a subscriber that announced ``subscription_revocation`` gets
        ``UNSUBSCRIBED`` with request 0 (WAMP AP, Subscription Revocation), others nothing."""
        self._realm.unsubscribe(self, subscription.id)
        self._forget_subscription(subscription.id)
        if self.supports("subscriber", "subscription_revocation"):
            self.send(WireMessage([m.Unsubscribed.MESSAGE_TYPE, 0, {
                "subscription": subscription.id, "reason": errors.NOT_AUTHORIZED}]))

    def registration_revoked(self, registration: Registration, reason: str) -> None:
        """``UNREGISTERED`` with request 0 to a callee that announced
        ``registration_revocation`` (the core has already unregistered it). The reason is a
        URI (clients check it); the router's log says which rule went."""
        if self.supports("callee", "registration_revocation"):
            self.send(WireMessage([m.Unregistered.MESSAGE_TYPE, 0, {
                "registration": registration.id, "reason": errors.NOT_AUTHORIZED}]))

    def kill(self, reason: str, message: str | None) -> None:
        """Close the session from the router side with GOODBYE (e.g. on shutdown)."""
        if self.state != ESTABLISHED:
            self._close_transport()
            return
        self.send(WireMessage([m.Goodbye.MESSAGE_TYPE, {"message": message} if message else {},
                                reason]))
        self.state = CLOSING
        self._leave_realm()

    def protocol_violation(self, reason: str) -> None:
        log.info("protocol violation from %s: %s", self.peer_address(), reason)
        self.abort(errors.PROTOCOL_VIOLATION, reason)

    # plumbing -----------------------------------------------------------------

    def abort(self, reason: str, message: str) -> None:
        self.send(WireMessage([m.Abort.MESSAGE_TYPE, {"message": message}, reason]))
        self._leave_realm()
        self._close_transport()

    def _send_error(self, request_type: int, request: int, exc: RouterError) -> None:
        """Answer a request with ERROR; one over the peer's maximum message size (its message
        may name the client's long URI) goes without its message: the request must be
        answered, and the URI says why."""
        try:
            self.transport.send(WireMessage(_with_payload(
                [ERROR, request_type, request, {}, exc.uri], exc.args_list, exc.kwargs)))
        except PayloadExceededError as too_large:
            self._too_large(too_large)
            self.send(WireMessage([ERROR, request_type, request, {}, exc.uri]))
        except TransportLost:
            pass

    def send(self, msg: WireMessage) -> None:
        try:
            self.transport.send(msg)
        except PayloadExceededError as exc:
            self._too_large(exc)
        except TransportLost:
            pass

    def send_once(self, raw: list) -> None:
        """Send a message that has this receiver only (see ``Outlet.send_once``); raises
        :class:`Unencodable`."""
        try:
            self.transport.send_once(raw)
        except PayloadExceededError as exc:
            self._too_large(exc)
        except TransportLost:
            pass

    def _too_large(self, exc: PayloadExceededError) -> None:
        """A message over the peer's maximum is not sent: counted as an incident."""
        self._router.incidents.count(
            self._realm.name if self._realm else "", "wamp", TOO_LARGE,
            f"session {self.info.session_id if self.info else '-'}: {exc}")

    def _leave_realm(self) -> None:
        """Leave the realm; events of shared groups not acknowledged go to other members."""
        redelivery = getattr(self._unacked, "redelivery", None)
        if redelivery is not None and redelivery.active():
            redelivery.cancel()
        shared = [pending for pending in self._unacked.values() if pending.group is not None]
        self._unacked = NOTHING_YET  # type: ignore[assignment]
        realm, self._realm = self._realm, None
        if realm is not None:
            realm.detach(self)
            for pending in shared:
                realm.broker.hand_over(pending.group, pending.publication, self.info.session_id)
            self._router.forget(self)

    def _close_transport(self) -> None:
        self.state = CLOSED
        if self.transport is not None:
            self.transport.close_wamp()

    def peer_address(self) -> str:
        return getattr(self.transport, "peer", None) or "unknown"


class _UnackedTable(dict[int, "_Unacked"]):
    """A session's events sent and not acknowledged, by publication, the timer that sends
    them again and the ones held back while its transport is paused: one slot of the
    session for the three, made with the first acknowledged event."""

    __slots__ = ("redelivery", "unwritten")

    def __init__(self) -> None:
        super().__init__()
        self.redelivery: Any = None
        self.unwritten: deque[WireMessage] | None = None
        """In order (bounded by ``max_unacked`` publications)."""


@dataclass(slots=True)
class _Unacked:
    publication: Publication
    sent_at: float
    attempts: int = 0
    events: list[WireMessage] = field(default_factory=list)
    group: SharedGroup | None = None
    """Came through this shared group: another member takes it if this session leaves."""


def _event(subscription: Subscription, publication: Publication, retained: bool = False,
           acknowledged: bool = False, raw_view: bool = False) -> WireMessage:
    """The EVENT for one subscription; shared by every receiver of a live publication.
    ``raw_view``: a byte publication's bytes as they are (``ppt_scheme: "mqtt"``)."""
    details = publication.publisher_details()
    if subscription.match != EXACT:
        details["topic"] = publication.uri_view
    if retained:
        details["retained"] = True
    if acknowledged:
        details["x_acknowledged_delivery"] = True
    head = [EVENT, subscription.id, publication.publication_id, details]
    if publication.passthru is not None:
        return WireMessage(ppt.write(head, details, publication.passthru,
                                     publication.args))  # type: ignore[arg-type]
    if raw_view:
        publisher = publication.publisher
        ppt.raw_details(details, publisher.protocol if publisher is not None else None,
                        publication.properties)
        head.append([publication.payload])
        return WireMessage(head)
    return WireMessage(_with_payload(head, publication.args, publication.kwargs))


def _with_payload(raw: list, args: list | None, kwargs: dict | None) -> list:
    """Append Arguments/ArgumentsKw, dropping trailing empty elements as the spec advises."""
    if kwargs:
        raw.append(args or [])
        raw.append(kwargs)
    elif args:
        raw.append(args)
    return raw


_ESTABLISHED_HANDLERS = {
    m.Publish: WampSession._on_publish,
    m.Subscribe: WampSession._on_subscribe,
    m.Unsubscribe: WampSession._on_unsubscribe,
    m.Register: WampSession._on_register,
    m.Unregister: WampSession._on_unregister,
    m.Call: WampSession._on_call,
    codec.Call: WampSession._on_call,
    m.Cancel: WampSession._on_cancel,
    m.Yield: WampSession._on_yield,
    codec.Yield: WampSession._on_yield,
    m.Error: WampSession._on_error,
    InvalidUriRequest: WampSession._on_invalid_uri,
    m.EventReceived: WampSession._on_event_received,
    m.Goodbye: WampSession._on_goodbye,
    m.Abort: WampSession._on_abort,
}
