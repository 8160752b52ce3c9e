"""The AMQP 1.0 frontend of one realm: authentication, subscriptions, publishing.

Authentication (SASL, see :mod:`router.amqp.sasl`): PLAIN checks the realm's
principals (username = authid, password = the ticket secret; the principal's
role is the authrole); ANONYMOUS, and a client that skips SASL altogether, get
the realm's anonymous role, and are refused when the realm has none. Every
attach is authorized by the core exactly as a WAMP SUBSCRIBE or PUBLISH is.
"""

from __future__ import annotations

import logging
from typing import Callable

from router.amqp.addresses import AddressTopic, InvalidAddress, address_to_pattern
from router.amqp.body import Inbound
from router.amqp.conditions import (INVALID_FIELD, UNAUTHORIZED, AttachRefused,
                                    router_error_condition)
from router.amqp.outlet import Outlet
from router.amqp.persistence import AmqpStore, LinkClaims, StoredDurable, link_id, link_key
from router.amqp.sasl import AUTH, SYS_TEMP, Answer, Identity, parse_plain
from router.amqp.subscriber import AmqpSubscriber
from router.core.errors import RouterError
from router.core.incidents import NOT_AUTHORIZED
from router.core.model import SessionInfo
from router.core.options import PublishOptions
from router.core.ownership import ANONYMOUS, anonymous_authid, owner
from router.core.realm import Realm, durable_callback
from router.core.router import Router
from router.core.scheduler import Scheduler
from router.settings import AmqpSettings


log = logging.getLogger(__name__)


class AmqpFrontend:
    """AMQP connections and (durable) subscriptions of one realm."""

    container_id = "wamp-router"

    def __init__(self, router: Router, realm: Realm, settings: AmqpSettings,
                 store: AmqpStore, scheduler: Scheduler) -> None:
        self.router = router
        self.realm = realm
        self.settings = settings
        self.store = store
        self.scheduler = scheduler
        self.durable: dict[tuple[str, str], AmqpSubscriber] = {}
        self.claims: LinkClaims | None = store if isinstance(store, LinkClaims) else None
        """Set when durable links follow their client among nodes (the Redis engine)."""
        if self.claims is not None:
            self.claims.release = self.release
            self.claims.adopt = self.adopt

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        self.store.when_durable(callback)

    # authentication --------------------------------------------------------------------

    def mechanisms(self, client_cn: str | None = None) -> list[str]:
        """PLAIN always; EXTERNAL with a verified TLS client certificate; ANONYMOUS where
        the realm has an anonymous role (or a client certificate identifies the client)."""
        names = ["PLAIN"]
        if client_cn is not None:
            names.insert(0, "EXTERNAL")
        if self.realm.anonymous_role is not None or client_cn is not None:
            names.append("ANONYMOUS")
        return names

    def authenticate(self, mechanism: str, response: bytes, answer: Answer,
                     peer: str | None = None, client_cn: str | None = None,
                     on_failure: Callable[[float], None] | None = None) -> None:
        """``answer`` the identity for a sasl-init, or a refusal's outcome code: at once, or
        once a PLAIN password is checked in a thread. A failure is logged and counted, and
        ``on_failure`` gets how long the refusal should be held back."""
        principals = self.router.principals[self.realm.name]
        authid = None

        def refuse(reason: str) -> None:
            delay = self.router.login_guard.failed("AMQP", peer, authid, mechanism or "-",
                                                   reason)
            if on_failure is not None:
                on_failure(delay)
            answer(AUTH)

        if mechanism in ("EXTERNAL", "ANONYMOUS") and client_cn is not None:
            principal = principals.get(client_cn)
            if principal is not None:
                answer(Identity(principal.authid, principal.role, "tls"))
                return
            authid, reason = client_cn, "no principal for the client certificate's CN"
        elif mechanism == "ANONYMOUS":
            if self.realm.anonymous_role is not None:
                answer(self.anonymous_identity())
                return
            reason = "anonymous access is off"
        elif mechanism == "EXTERNAL":
            reason = "EXTERNAL needs a verified TLS client certificate"
        elif mechanism != "PLAIN":
            reason = f"mechanism {mechanism!r} is not offered"
        else:
            credentials = parse_plain(response)
            if credentials is None:
                reason = "malformed PLAIN response"
            else:
                authid, password = credentials
                principal = principals.get(authid)
                if principal is None:
                    reason = "no such principal"
                elif principal.ticket_hash is None:
                    reason = "the principal has no password (ticket)"
                else:
                    def verified(ok: bool) -> None:
                        if ok:
                            answer(Identity(principal.authid, principal.role, "password"))
                        else:
                            refuse("wrong password")

                    if not self.router.verifier.verify(password, principal.ticket_hash,
                                                       verified, self.realm.name, "amqp", peer):
                        answer(SYS_TEMP)
                    return
        refuse(reason)

    def anonymous_identity(self) -> Identity:
        """An anonymous client's identity: an authid of the router's choosing, its own."""
        return Identity(anonymous_authid(self.router.new_session_id()),
                        self.realm.anonymous_role, ANONYMOUS)  # type: ignore[arg-type]

    # connections -------------------------------------------------------------------------

    def connected(self, connection: Outlet) -> None:
        self.router.connections.add(connection)
        self.router.track(connection)
        self.realm.attach(connection)

    def disconnected(self, connection: Outlet) -> None:
        self.router.connections.discard(connection)
        self.realm.detach(connection)
        self.router.forget(connection)

    # subscriptions -----------------------------------------------------------------------

    def claim(self, key: tuple[str, str], info: SessionInfo,
              then: Callable[[AttachRefused | None], None]) -> None:
        """``then(None)`` once this node owns the durable link ``key`` for the connection
        of ``info``: at once on a single node; among nodes once the node that had it let
        go, its state restored here. ``then(refusal)`` when the link belongs to another
        owner on another node (Redis keeps who holds each link): nothing of it touched."""
        if self.claims is None:
            then(None)
            return

        def claimed(stored: StoredDurable | None) -> None:
            if stored is not None and key not in self.durable:
                self._restore_one(stored)
            existing = self.durable.get(key)
            if existing is not None:  # the claim wrote the claimant: say whose it is
                self.claims.hold(link_id(*key), owner(  # type: ignore[union-attr]
                    existing.info.authid, existing.info.authmethod))
            then(None)
            if key not in self.durable:  # the attach was refused (or given up): no link
                self.claims.disown(link_id(*key))  # type: ignore[union-attr]

        self.claims.claim(link_id(*key), owner(info.authid, info.authmethod), True, claimed,
                          lambda: then(self._foreign(key, info)))

    def _foreign(self, key: tuple[str, str], info: SessionInfo) -> AttachRefused:
        """The refusal of an attach of another owner's durable link ``key`` (counted)."""
        reason = (f"the durable link {key[1]!r} of container {key[0]!r} belongs to another "
                  "principal")
        self.router.incidents.count(self.realm.name, "amqp", NOT_AUTHORIZED,
                                    f"{info.authid}: {reason}", level=logging.INFO)
        return AttachRefused(UNAUTHORIZED, reason)

    def release(self, owned: str, done: Callable[[], None]) -> None:
        """Another node claimed a durable link: close it here (``amqp:link:stolen``), keep
        its state where it is stored, forget it, and call ``done`` once written."""
        subscriber = self.durable.pop(link_key(owned), None)
        if subscriber is not None:
            if subscriber.connection is not None and subscriber.link is not None:
                subscriber.connection.steal(subscriber)  # its deliveries in flight, counted
            self._unhook(subscriber)
        self.store.when_durable(lambda ok: done())

    def adopt(self, owned: str, stored: StoredDurable | None) -> None:
        """The durable link's node died: the link, unless it expired meanwhile (then
        ``stored`` is None), lives here now, detached, queueing for its client; its expiry
        runs from when it was detached (from now if it was attached)."""
        key = link_key(owned)
        if key in self.durable:  # this node's own claim brought it here
            return
        if stored is None or not self._restore_one(stored):
            self.claims.disown(owned)  # type: ignore[union-attr]  # adopt needs claims

    def subscribe(self, connection: Outlet, link, address: str | None, qos: int,
                  policy: str, durable: bool, group: str | None = None) -> AmqpSubscriber:
        """The subscriber behind a receiver link (``group``: a member of that shared group)."""
        try:
            named = address_to_pattern(address, self.realm.uri_check)
        except InvalidAddress as exc:
            raise AttachRefused(INVALID_FIELD, str(exc)) from None
        info = connection.info
        key = (connection.connection.remote_container or "", link.name) if durable else None
        if key is not None and key in self.durable:
            existing = self.durable[key]
            if (owner(existing.info.authid, existing.info.authmethod)
                    != owner(info.authid, info.authmethod)):
                # checked before anything of it is touched: its link, queue and client stay
                raise self._foreign(key, info)
            if existing.connection is not None and existing.link is not None:
                existing.connection.steal(existing)
            if (existing.address == address and existing.qos == qos
                    and existing.policy == policy and existing.group == group
                    and existing.info.authrole == info.authrole):  # owner checked before
                return existing
            self.destroy(existing, disown=False)
        subscriber = AmqpSubscriber(
            self, SessionInfo(self.router.new_session_id(), self.realm.name, info.authid,
                              info.authrole, info.authmethod, protocol="amqp",
                              transport=info.transport_details()), address, qos, policy, key, group)
        self.router.track(subscriber)
        self.realm.attach(subscriber)
        try:
            subscriber.subscribe(named)
        except RouterError as exc:
            self.realm.detach(subscriber)
            self.router.forget(subscriber)
            raise AttachRefused(router_error_condition(exc), exc.message or exc.uri) from None
        if key is not None:
            self.durable[key] = subscriber
            self.store.save(key[0], key[1], address, qos, policy, info.authid, info.authrole,
                            info.authmethod, group)
        return subscriber

    def unlinked(self, subscriber: AmqpSubscriber, closed: bool) -> None:
        """The subscriber's link went away; ``closed``: the client ended it for good."""
        subscriber.detach()
        if not subscriber.durable or closed:
            self.destroy(subscriber)

    def destroy(self, subscriber: AmqpSubscriber, disown: bool = True) -> None:
        """Forget a subscriber and its queue (an armed expiry timer would keep them alive);
        ``disown``: no node owns its durable link any more."""
        self._unhook(subscriber, hand_over=True)
        key = subscriber.key
        if key is not None and self.durable.get(key) is subscriber:
            del self.durable[key]
            self.store.delete(*key)
            if disown and self.claims is not None:
                self.claims.disown(link_id(*key))

    def _unhook(self, subscriber: AmqpSubscriber, hand_over: bool = False) -> None:
        """Take a subscriber out of the realm (``hand_over``: its shared group's other
        members take its messages)."""
        subscriber.cancel_expiry()
        self.realm.detach(subscriber)
        if hand_over:
            subscriber.hand_over()
        self.router.forget(subscriber)

    # publishing --------------------------------------------------------------------------

    def publish(self, info: SessionInfo, target: AddressTopic, message: Inbound, qos: int,
                retain: bool, on_durable: Callable[[bool], None] | None = None) -> None:
        """Route one inbound message through the core (raises RouterError when refused);
        ``on_durable(ok)`` once what it made durable is stored (or failed to be)."""
        options = PublishOptions(qos=qos, retain=retain and not message.empty,
                                 retain_clear=retain and message.empty, exclude_me=False)
        self.realm.publish(info, target.levels, message.args, message.kwargs, options,
                           durable_callback(on_durable), len(message.bare),
                           payload=message.payload, properties=message.properties,
                           expires_at=message.expires_at, amqp=message.bare,
                           **({"mqtt_topic": target.text} if target.mqtt
                              else {"uri": target.text}))

    # restart -----------------------------------------------------------------------------

    def restore(self) -> int:
        restored = 0
        for stored in self.store.load(self.settings.max_link_expiry):
            if self._restore_one(stored):
                restored += 1
        return restored

    def _restore_one(self, stored: StoredDurable) -> bool:
        key = (stored.container, stored.link)
        info = SessionInfo(self.router.new_session_id(), self.realm.name, stored.authid,
                           stored.authrole, stored.authmethod, protocol="amqp")
        subscriber = AmqpSubscriber(self, info, stored.address, stored.qos, stored.policy, key,
                                    stored.group)
        try:
            named = address_to_pattern(stored.address, self.realm.uri_check)
            self.router.track(subscriber)
            self.realm.attach(subscriber)
            subscriber.subscribe(named)
        except (InvalidAddress, RouterError) as exc:
            log.warning("AMQP durable subscription %s/%s dropped on restore: %s",
                        stored.container, stored.link, exc)
            self.realm.detach(subscriber)
            self.router.forget(subscriber)
            self.store.delete(*key)
            return False
        subscriber.restore(stored.queued)
        self.durable[key] = subscriber
        return True

