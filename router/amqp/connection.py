"""One AMQP 1.0 network connection, driven through the python-qpid-proton engine.

Transport-agnostic like the MQTT connection: it is given ``write(bytes)`` and
``close()``, is fed bytes with :meth:`data_received`, and tells the time with the
scheduler. The SASL layer runs first (:mod:`router.amqp.sasl`); the AMQP stream
after it goes into a server-mode ``proton.Transport`` without SASL, whose
collector events are handled after every input and every local action.

Links are keyed by (role, name). A client's receiver link (the router sends) is
a subscription (:mod:`router.amqp.subscriber`); a client's sender link (the
router receives) publishes. Inbound QoS, per message:

* the link's modes give the default: sender settle mode ``settled`` -> 0,
  otherwise 1, and 2 when the receiver settle mode is ``second``;
* an ``x-opt-qos`` annotation (0, 1 or 2) wins, capped at what the link and the
  delivery can carry: a pre-settled delivery (or a ``settled`` link) is QoS 0, a
  ``first`` link at most QoS 1;
* a QoS >= 1 delivery is accepted (and settled) only once everything it made
  durable is on disk; a refused one is rejected with the AMQP error condition.
* a sender link has the realm's ``amqp.inbound_window`` of credit, given back only
  as the router settles deliveries: with a slow disk the client waits for credit,
  and the unsettled deliveries per link never exceed the window.
* a message over the listener's ``max_message_size`` closes its link
  (``amqp:link:message-size-exceeded``); the messages under way (some transfers
  received, more to come) of all the links of a session may hold that much
  together, more closes the connection (``amqp:resource-limit-exceeded``); a
  connection may begin ``amqp.max_sessions`` sessions (its channel-max).

Exactly-once receive: on a durable sender link (target durability other than
``none``, receiver settle mode ``second``) the tag of every QoS 2 delivery that
was published is remembered, durably and before the ``accepted`` disposition
goes out, under (container id, link name) until the client settles it; a
delivery that comes again with such a tag (its disposition was lost, and the
client re-attached the link or reconnected, perhaps to a restarted router) is
accepted again without being published again. Closing the link forgets them.

A durable source (durability ``unsettled-state``) is a durable subscription when
its expiry policy is ``never`` or its timeout is > 0. It is dropped its timeout
after its link went away (whatever the policy names: the link, its session or its
connection, all are gone by then or the link is); the timeout is capped by the
realm's ``amqp.max_link_expiry``, which is also the timeout of policy ``never``,
and the attach answer's source carries the timeout the router uses. On the Redis
engine a durable link follows its client to any node: its attach waits until this node
owns it (:meth:`AmqpFrontend.claim`); the node that had it detaches it there with
``amqp:link:stolen`` and hands its queue over.

``x-opt-retain: true`` sets the topic's retained event; with an empty body (no
body, an empty data section or an amqp-value null) it clears it. A data-section
body is mapped to WAMP with the realm's payload mapping (and its bytes reach
byte-oriented receivers unchanged); see :mod:`router.amqp.body` for every body
kind and property. A message with a value the router cannot carry (a decimal or a
described value) is rejected with ``amqp:not-implemented``, counted as ``unsupported``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from proton import (Collector, Condition, Connection, Data, Delivery, Endpoint, Event, Link,
                    Message, Terminus, Transport, symbol)

from router.amqp.addresses import AddressTopic, InvalidAddress, address_to_topic
from router.amqp.body import Inbound, UnsupportedBody, plain
from router.amqp.conditions import (INTERNAL_ERROR, INVALID_FIELD, LINK_STOLEN,
                                    MESSAGE_SIZE_EXCEEDED, RESOURCE_LIMIT_EXCEEDED,
                                    SHARED_GROUP, UNAUTHORIZED, AttachRefused,
                                    refusal_condition, router_error_condition)
from router.amqp.sasl import Identity, SaslServer
from router.amqp.subscriber import AmqpSubscriber
from router.core import errors
from router.core.errors import RouterError
from router.core.incidents import OVER_LIMIT, TOO_LARGE, UNSUPPORTED
from router.core.model import SessionInfo
from router.core.options import valid_group_name
from router.core.qos import POLICIES
from router.flow import disconnect_slow_consumer

if TYPE_CHECKING:
    from router.amqp.frontend import AmqpFrontend
    from router.flow import ConnectionFlow

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 60.0
MAX_FRAME_SIZE = 64 * 1024
SESSION_CAPACITY = 4 * 1024 * 1024
"""Bytes a session may have received and not yet handed over (its incoming window), unless
the listener's ``max_message_size`` needs more: a message must fit, or its sender would
wait for window for ever."""

def terminus_capabilities(terminus) -> list[str]:
    data = terminus.capabilities
    data.rewind()
    found = []
    while data.next():
        value = data.get_object()
        if isinstance(value, (list, tuple)) or hasattr(value, "elements"):
            found.extend(str(item) for item in getattr(value, "elements", value))
        else:
            found.append(str(value))
    return found


def set_capabilities(terminus, names: list[str]) -> None:
    data = terminus.capabilities
    data.clear()
    if names:
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for name in names:
            data.put_symbol(name)
        data.exit()


class _Publisher:
    """A client's sender link: where its messages go."""

    def __init__(self, link, target: AddressTopic | None,
                 key: tuple[str, str] | None = None) -> None:
        self.link = link
        self.target = target
        self.key = key
        """(container id, link name) of a durable QoS 2 link: its tags are remembered."""
        self.unsettled: set[bytes] = set()
        """Tags of the deliveries received and not yet settled by the router."""
        self.unfinished = 0
        """Bytes of its delivery under way (received in part: more transfers to come)."""


def delivery_tag(delivery) -> bytes:
    tag = delivery.tag
    return tag.encode("utf-8", "surrogateescape") if isinstance(tag, str) else bytes(tag)


def durable_source(source: Terminus) -> bool:
    """A receiver link's source makes it a durable subscription: durability
    ``unsettled-state`` and expiry policy ``never`` or a timeout."""
    return (source.durability == Terminus.DELIVERIES
            and (source.expiry_policy == Terminus.EXPIRE_NEVER or (source.timeout or 0) > 0))


class AmqpConnection:
    """The protocol state of one connection (the core Peer that publishes)."""

    def __init__(self, frontend: "AmqpFrontend", write: Callable[[bytes], None],
                 close: Callable[[], None], peer: str, flow: "ConnectionFlow",
                 max_message_size: int) -> None:
        self.frontend = frontend
        self.max_message_size = max_message_size
        """The listener's: the largest message a client may send (a delivery over it closes
        its link), and the most its deliveries under way may hold together."""
        self._unfinished_bytes: dict[object, int] = {}
        """What the deliveries under way of each session's sender links hold together (only
        sessions holding some)."""
        self.flow = flow
        """Outbound bound (QoS 0 dropped while ``flow.over``, QoS >= 1 queues wait while
        ``flow.paused``) and intake pausing."""
        flow.owner = self
        self._write = write
        self._close = close
        self.peer = peer
        self.sasl = SaslServer(frontend.mechanisms(), frontend.authenticate,
                               allow_skip=frontend.realm.anonymous_role is not None,
                               wake=self.sasl_answered)
        self.handshake_done: Callable[[], None] = lambda: None
        """Set by the transport: OPEN arrived, or the login was refused."""
        self.verifying: Callable[[bool], None] = lambda active: None
        """Set by the transport: a password check started (True) or was answered (False)."""
        self.info: SessionInfo | None = None
        self.transport: Transport | None = None
        self.connection: Connection | None = None
        self.collector: Collector | None = None
        self.links: dict[tuple[str, str], object] = {}
        self._claiming: dict[tuple[str, str], object] = {}
        """Durable links whose attach waits for this node to own them (Redis engine)."""
        self._awaiting_settle: dict[tuple[str, str], object] = {}
        self._processing = False
        self._again = False
        self._closed = False
        self._tick_call = None

    # bytes in -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self.transport is None:
            self.sasl.receive(data)
            out = self.sasl.take_output()
            if out:
                self._write(out)
            if self.sasl.failed:
                log.info("AMQP connection %s: %s", self.peer, self.sasl.reason)
                self.handshake_done()  # the refusal may be held back by the login guard
                self._close_now()
                return
            if not self.sasl.done:
                if self.sasl.state == "verifying":
                    self.verifying(True)
                return
            identity = self.sasl.identity or self.frontend.anonymous_identity()
            self._start_engine(identity)
            data = self.sasl.rest
        try:
            self._push(data)
        except Exception:
            log.exception("AMQP connection %s: unexpected error", self.peer)
            self._close_now()

    def sasl_answered(self) -> None:
        """The sasl-outcome was decided later (password checked in a thread): send it and
        go on with the bytes that arrived meanwhile."""
        self.verifying(False)
        self.data_received(b"")

    def _start_engine(self, identity: Identity) -> None:
        self.info = SessionInfo(self.frontend.router.new_session_id(), self.frontend.realm.name,
                                identity.authid, identity.authrole, identity.authmethod,
                                protocol="amqp", transport={"type": "amqp", "peer": self.peer})
        self.frontend.connected(self)
        transport = Transport(Transport.SERVER)
        transport.require_auth(False)
        transport.max_frame_size = MAX_FRAME_SIZE
        transport.idle_timeout = IDLE_TIMEOUT
        transport.channel_max = self.frontend.settings.max_sessions - 1  # (channels from 0)
        connection = Connection()
        collector = Collector()
        connection.collect(collector)
        transport.bind(connection)
        self.transport, self.connection, self.collector = transport, connection, collector

    def _push(self, data: bytes) -> None:
        transport = self.transport
        while data and not self._closed:
            capacity = transport.capacity()
            if capacity < 0:
                break  # the input side is closed: ignore whatever follows
            if capacity == 0:
                self.process()
                if transport.capacity() == 0:
                    break
                continue
            chunk, data = data[:capacity], data[capacity:]
            transport.push(chunk)
            self.process()
        self.process()

    # the engine loop ---------------------------------------------------------------------

    def process(self) -> None:
        """Handle pending engine events and write pending output (not re-entrant)."""
        if self.transport is None or self._closed:
            return
        if self._processing:
            self._again = True
            return
        self._processing = True
        try:
            while True:
                self._again = False
                event = self.collector.peek()
                while event is not None:
                    try:
                        self._dispatch(event)
                    except Exception:
                        log.exception("AMQP connection %s: error handling %s", self.peer,
                                      event.type)
                        self.connection.condition = Condition(INTERNAL_ERROR, "internal error")
                        self.connection.close()
                    self.collector.pop()
                    event = self.collector.peek()
                self._flush()
                if not self._again and self.collector.peek() is None:
                    break
        finally:
            self._processing = False
        self._schedule_tick()

    def _flush(self) -> None:
        transport = self.transport
        pending = transport.pending()
        while pending > 0:
            out = bytes(transport.peek(pending))
            transport.pop(len(out))
            self._write(out)
            pending = transport.pending()
        # pending < 0: the output side is closed; no output and a closed input side
        # (proton drops undecodable input that way): nothing more can happen either
        if (pending < 0 or (pending == 0 and transport.capacity() < 0)) and not self._closed:
            if transport.condition is not None:
                log.info("AMQP connection %s: closed (%s: %s)", self.peer,
                         transport.condition.name, transport.condition.description)
            self._close_now()

    def _schedule_tick(self) -> None:
        if self._closed or self.transport is None:
            return
        now = time.time()
        deadline = self.transport.tick(now)
        if self._tick_call is not None and self._tick_call.active():
            self._tick_call.cancel()
        self._tick_call = None
        if deadline:
            self._tick_call = self.frontend.scheduler.callLater(max(0.0, deadline - now),
                                                                self._tick)

    def _tick(self) -> None:
        self._tick_call = None
        if not self._closed:
            self.process()

    def _dispatch(self, event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            self.handshake_done()
            connection = event.connection
            if connection.state & Endpoint.LOCAL_UNINIT:
                connection.container = self.frontend.container_id
                connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            if event.session.state & Endpoint.LOCAL_UNINIT:
                event.session.incoming_capacity = max(
                    SESSION_CAPACITY, self.max_message_size + 2 * MAX_FRAME_SIZE)
                event.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            if event.link.state & Endpoint.LOCAL_UNINIT:
                self._attach(event.link)
        elif kind == Event.LINK_FLOW:
            handler = self.links.get(self._key(event.link))
            if isinstance(handler, AmqpSubscriber):
                handler.pump()
        elif kind == Event.DELIVERY:
            delivery = event.delivery
            handler = self.links.get(self._key(delivery.link))
            if isinstance(handler, AmqpSubscriber):
                handler.disposition(delivery)
            elif isinstance(handler, _Publisher):
                self._incoming(handler, delivery)
            elif delivery.readable:  # on a link the router closed (too large): let go
                if delivery.pending:
                    delivery.link.recv(delivery.pending)
                if not delivery.partial:
                    delivery.settle()
        elif kind == Event.LINK_REMOTE_CLOSE:
            self._link_gone(event.link, closed=True)
            if not event.link.state & Endpoint.LOCAL_CLOSED:
                event.link.close()
        elif kind == Event.LINK_REMOTE_DETACH:
            self._link_gone(event.link, closed=False)
            event.link.detach()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            session = event.session
            for key, handler in list(self.links.items()):
                if handler.link.session == session:
                    self._link_gone(handler.link, closed=False)
            if not session.state & Endpoint.LOCAL_CLOSED:
                session.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            if not event.connection.state & Endpoint.LOCAL_CLOSED:
                event.connection.close()

    @staticmethod
    def _key(link) -> tuple[str, str]:
        return ("sender" if link.is_sender else "receiver", link.name)

    # attach --------------------------------------------------------------------------------

    def _attach(self, link) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        key = self._key(link)
        if key in self.links or key in self._claiming:
            self._refuse(link, INVALID_FIELD,
                         f"a {key[0]} link named {link.name!r} is already attached")
            return
        limit = self.frontend.settings.max_links
        if len(self.links) + len(self._claiming) >= limit:
            realm = self.frontend.realm
            realm.incidents.count(realm.name, "amqp", OVER_LIMIT,
                                  f"connection {self.peer}: link {link.name!r}: "
                                  f"max_links ({limit}) reached", level=logging.INFO)
            self._refuse(link, RESOURCE_LIMIT_EXCEEDED,
                         f"the connection has {limit} links attached, the maximum")
            return
        if link.is_sender and durable_source(link.remote_source):
            self._claiming[key] = link
            self.frontend.claim((self.connection.remote_container or "", link.name),
                                self.info, lambda refused: self._claimed(link, key, refused))
            return
        self._open(link, key)

    def _claimed(self, link, key: tuple[str, str], refused: AttachRefused | None) -> None:
        """This node owns the durable link now: attach it, unless the client gave up on it
        (or on its session or the connection) meanwhile; or refuse it (another owner's)."""
        if (self._claiming.pop(key, None) is not link or self._closed
                or link.session.state & Endpoint.REMOTE_CLOSED):
            return
        if refused is not None:
            self._refuse(link, refused.condition, refused.description)
        else:
            self._open(link, key)
        self.process()

    def _open(self, link, key: tuple[str, str]) -> None:
        try:
            if link.is_sender:
                self._attach_subscriber(link, key)
            else:
                self._attach_publisher(link, key)
        except AttachRefused as refused:
            log.info("AMQP connection %s: link %r refused: %s", self.peer, link.name,
                     refused.description)
            self._refuse(link, refused.condition, refused.description)

    def _refuse(self, link, condition: str, description: str) -> None:
        if link.is_sender:
            # a refused subscription: no source (spec 2.6.3), then detach with the error
            link.source.address = None
            link.source.type = Terminus.UNSPECIFIED
        else:
            link.target.address = None
            link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def _attach_subscriber(self, link, key) -> None:
        source = link.remote_source
        try:
            properties = {str(k): plain(v) for k, v in (link.remote_properties or {}).items()}
        except UnsupportedBody as exc:
            raise AttachRefused(INVALID_FIELD, f"link properties: {exc}") from None
        capabilities = terminus_capabilities(source)
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            granted = 0
        elif link.remote_rcv_settle_mode == Link.RCV_SECOND:
            granted = 2
        else:
            granted = 1
        asked_policy = "qos-policy" in capabilities or "qos-policy" in properties
        policy = self.frontend.settings.qos_policy
        if asked_policy:
            policy = properties.get("qos-policy", policy)
            if policy not in POLICIES:
                raise AttachRefused(INVALID_FIELD, f"unknown qos-policy {policy!r} "
                                    f"(one of {', '.join(POLICIES)})")
        get_retained = properties.get("get-retained") is True or "retained" in capabilities
        never = source.expiry_policy == Terminus.EXPIRE_NEVER
        timeout = source.timeout or 0
        durable = durable_source(source)
        group = properties.get(SHARED_GROUP)
        if group is not None and not valid_group_name(group):
            raise AttachRefused(INVALID_FIELD, f"{SHARED_GROUP} must be a non-empty string "
                                "without '/', '+' or '#'")
        subscriber = self.frontend.subscribe(self, link, source.address, granted, policy,
                                             durable, group)
        if durable:
            cap = self.frontend.settings.max_link_expiry
            if never or timeout > cap:
                timeout = cap
                link.source.expiry_policy = Terminus.EXPIRE_WITH_LINK
                link.source.timeout = cap
            subscriber.set_expiry(float(timeout))
        offered = (["qos-policy"] if asked_policy else []) + (
            ["retained"] if "retained" in capabilities else [])
        set_capabilities(link.source, offered)
        answered = {}
        if asked_policy:
            answered[symbol("qos-policy")] = policy
        if group is not None:
            answered[symbol(SHARED_GROUP)] = group
        if answered:
            link.properties = answered
        self.links[key] = subscriber
        subscriber.attach(link, self)
        link.open()
        subscriber.pump()
        if get_retained:  # after what a durable link had queued
            self.frontend.realm.send_retained(subscriber, subscriber.core,
                                              self.flow.limits.max_buffered_messages)

    def _attach_publisher(self, link, key) -> None:
        address = link.remote_target.address
        named = self._publish_target(address) if address else None
        target = link.remote_target
        durable = (target.durability != Terminus.NONDURABLE
                   and link.remote_rcv_settle_mode == Link.RCV_SECOND
                   and link.remote_snd_settle_mode != Link.SND_SETTLED)
        self.links[key] = _Publisher(
            link, named, (self.connection.remote_container or "", link.name) if durable else None)
        link.max_message_size = self.max_message_size
        link.open()
        link.flow(self.frontend.settings.inbound_window)

    def _publish_target(self, address: str) -> AddressTopic:
        realm = self.frontend.realm
        try:
            named = address_to_topic(address, realm.uri_check)
            realm.check_publish(self.info, named.levels)
        except InvalidAddress as exc:
            raise AttachRefused(INVALID_FIELD, str(exc)) from None
        except RouterError as exc:
            raise AttachRefused(router_error_condition(exc), exc.message or exc.uri) from None
        return named

    def _link_gone(self, link, closed: bool) -> None:
        if self._claiming.get(self._key(link)) is link:
            del self._claiming[self._key(link)]  # the client gave up before the answer
        handler = self.links.pop(self._key(link), None)
        if isinstance(handler, AmqpSubscriber):
            self.frontend.unlinked(handler, closed)
        elif isinstance(handler, _Publisher):
            self._unfinished(handler, 0)
            for waiting_key, delivery in list(self._awaiting_settle.items()):
                if delivery.link == link:
                    del self._awaiting_settle[waiting_key]
            if closed and handler.key is not None:
                self.frontend.store.forget_inbound(handler.key)

    def steal(self, subscriber: AmqpSubscriber) -> None:
        """Another connection attached the same durable link: detach ours."""
        link = subscriber.link
        key = self._key(link)
        if self.links.get(key) is subscriber:
            del self.links[key]
        subscriber.detach()
        link.condition = Condition(LINK_STOLEN, "the link was attached elsewhere")
        link.close()  # "forcibly closed" (spec 2.8.16); a detach would not carry the error
        self.process()

    def revoke(self, subscriber: AmqpSubscriber, reason: str) -> None:
        """A reload took the subscriber's permission away: forget it (durable state too)
        and close its link with ``amqp:unauthorized-access``."""
        link = subscriber.link
        key = self._key(link)
        if self.links.get(key) is subscriber:
            del self.links[key]
        subscriber.detach()
        self.frontend.destroy(subscriber)
        link.condition = Condition(UNAUTHORIZED, reason)
        link.close()
        self.process()

    # inbound messages -----------------------------------------------------------------------

    def _incoming(self, publisher: _Publisher, delivery) -> None:
        if not self.flow.publisher:
            self.flow.became_publisher()
        link = publisher.link
        tag = delivery_tag(delivery)
        waiting_key = (link.name, tag)
        waiting = self._awaiting_settle.get(waiting_key)
        if waiting is not None and waiting == delivery:
            if delivery.settled:  # rcv-settle-mode second: the sender settled, so do we
                del self._awaiting_settle[waiting_key]
                if publisher.key is not None:
                    self.frontend.store.delete_inbound(publisher.key, tag)
                self._settle(publisher, delivery)
            return
        if not delivery.readable:
            return
        publisher.unsettled.add(tag)  # from its first frame on: it took a credit
        if delivery.aborted:
            if publisher.unfinished:
                self._unfinished(publisher, 0)
            self._settle(publisher, delivery)
            return
        size = delivery.pending
        if size > self.max_message_size:
            self._too_large(publisher, size)
            return
        if delivery.partial:
            self._unfinished(publisher, size)
            return
        if publisher.unfinished:  # (it came in more than one part)
            self._unfinished(publisher, 0)
        data = bytes(link.recv(size))
        link.advance()
        presettled = delivery.settled
        message = Message()
        try:
            message.decode(data)
        except Exception as exc:
            self._outcome(publisher, delivery, presettled, Delivery.REJECTED,
                          Condition("amqp:decode-error", f"undecodable message: {exc}"))
            return
        annotations = {str(k): v for k, v in (message.annotations or {}).items()}
        qos = self._inbound_qos(link, presettled, annotations.get("x-opt-qos"))
        retain = annotations.get("x-opt-retain") is True
        store = self.frontend.store
        remembered = publisher.key is not None and store.has_inbound(publisher.key, tag)
        if remembered:
            if presettled:  # the client settled it: done with it, published already
                store.delete_inbound(publisher.key, tag)
                self._settle(publisher, delivery)
                return
            # published already, its disposition got lost: answer again, publish once
            self.frontend.when_durable(lambda ok: self._durable(publisher, delivery, ok))
            return
        remember = qos == 2 and not presettled and publisher.key is not None
        if remember:  # the receipt is stored with the message, before the disposition goes
            store.add_inbound(publisher.key, tag)
        acknowledged = not presettled and qos > 0
        try:
            named = publisher.target or self._publish_target(message.address)
            inbound = Inbound(message, data, self.frontend.settings.payload_mapping)
            self.frontend.publish(self.info, named, inbound, qos, retain,
                                  (lambda ok: self._durable(publisher, delivery, ok))
                                  if acknowledged else None)
        except (AttachRefused, RouterError, TypeError, ValueError) as exc:
            if isinstance(exc, UnsupportedBody):
                realm = self.frontend.realm
                realm.incidents.count(realm.name, "amqp", UNSUPPORTED, f"{self.peer}: {exc}")
            if remember:
                store.delete_inbound(publisher.key, tag)
            self._outcome(publisher, delivery, presettled, Delivery.REJECTED,
                          refusal_condition(exc))
            return
        if not acknowledged:
            self._outcome(publisher, delivery, presettled, Delivery.ACCEPTED, None)

    def _too_large(self, publisher: _Publisher, size: int) -> None:
        """A message over ``max_message_size`` (AMQP 1.0 section 2.7.3): its link is closed
        with ``amqp:link:message-size-exceeded``, its bytes let go; counted."""
        link = publisher.link
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "amqp", TOO_LARGE,
                              f"connection {self.peer}: link {link.name!r}: a message of "
                              f"{size} bytes or more, over max_message_size "
                              f"({self.max_message_size}): link closed", level=logging.INFO)
        link.recv(size)  # (what comes after on the closed link is dropped as it comes)
        self._link_gone(link, closed=True)
        link.condition = Condition(MESSAGE_SIZE_EXCEEDED, f"a message is over the maximum "
                                   f"size of {self.max_message_size} bytes")
        link.close()

    def _unfinished(self, publisher: _Publisher, size: int) -> None:
        """The delivery under way on ``publisher``'s link holds ``size`` bytes now. Those of
        all the links of one session together may be one message's worth at most (a client
        writes a message's transfers one after the other on a session): more closes the
        connection with ``amqp:resource-limit-exceeded``, counted, as each link's may be a
        message's worth and a session may have ``amqp.max_links`` links. A connection has at
        most ``amqp.max_sessions`` sessions (its channel-max), which bounds the whole."""
        session = publisher.link.session
        held = self._unfinished_bytes.get(session, 0) + size - publisher.unfinished
        publisher.unfinished = size
        if held:
            self._unfinished_bytes[session] = held
        else:
            self._unfinished_bytes.pop(session, None)
        if held > self.max_message_size and not self.connection.state & Endpoint.LOCAL_CLOSED:
            realm = self.frontend.realm
            realm.incidents.count(realm.name, "amqp", OVER_LIMIT,
                                  f"connection {self.peer}: messages under way on several "
                                  f"links of a session hold {held} bytes together, over "
                                  f"max_message_size ({self.max_message_size}): connection "
                                  f"closed", level=logging.INFO)
            self.connection.condition = Condition(
                RESOURCE_LIMIT_EXCEEDED, f"the messages under way on a session hold more "
                f"than {self.max_message_size} bytes together")
            self.connection.close()

    def _durable(self, publisher: _Publisher, delivery, ok: bool) -> None:
        if self._closed or self.links.get(self._key(publisher.link)) is not publisher:
            return
        self._outcome(publisher, delivery, False,
                      Delivery.ACCEPTED if ok else Delivery.RELEASED, None)
        self.process()

    def _outcome(self, publisher: _Publisher, delivery, presettled: bool, state,
                 condition) -> None:
        if presettled:
            self._settle(publisher, delivery)
            return
        if condition is not None:
            delivery.local.condition = condition
        delivery.update(state)
        link = delivery.link
        if link.rcv_settle_mode == Link.RCV_SECOND and not delivery.settled:
            self._awaiting_settle[(link.name, delivery_tag(delivery))] = delivery
        else:
            self._settle(publisher, delivery)

    def _settle(self, publisher: _Publisher, delivery) -> None:
        """Settle an inbound delivery, and give its credit back: the sender may have at
        most the window in flight, counting what the router has not settled yet."""
        unsettled = publisher.unsettled
        unsettled.discard(delivery_tag(delivery))  # before settling: that may free it
        delivery.settle()
        window = self.frontend.settings.inbound_window
        link = publisher.link
        missing = window - len(unsettled) - link.credit
        if missing > 0 and (missing * 2 >= window or not unsettled):
            link.flow(missing)  # in batches of half the window, or when all is settled

    @staticmethod
    def _inbound_qos(link, presettled: bool, annotated) -> int:
        if presettled or link.remote_snd_settle_mode == Link.SND_SETTLED:
            cap = 0
        elif link.rcv_settle_mode == Link.RCV_SECOND:
            cap = 2
        else:
            cap = 1
        if isinstance(annotated, int) and not isinstance(annotated, bool) \
                and 0 <= annotated <= 2:
            return min(int(annotated), cap)
        return cap

    # core Peer --------------------------------------------------------------------------

    def send_event(self, subscription, publication, retained: bool = False) -> None:
        pass  # a connection never subscribes; its receiver links do

    def ready(self) -> bool:
        return False  # never a group member: its receiver links are

    def backlog_room(self) -> bool:
        return False  # never owed retained events: its receiver links are

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        if self._closed:
            return
        if self.connection is not None:
            self.connection.condition = Condition(
                UNAUTHORIZED if reason == errors.KILLED else "amqp:connection:forced",
                message or reason)
            self.connection.close()
            self.process()
        self._close_now()

    # flow ---------------------------------------------------------------------------------

    def resume_output(self) -> None:
        """The transport drained: send what the receiver links have queued."""
        for handler in list(self.links.values()):
            if isinstance(handler, AmqpSubscriber):
                handler.pump()

    def slow_consumer(self) -> None:
        """Over the outbound bound for too long: close with resource-limit-exceeded (best
        effort: the client is not reading); the flow then aborts the transport."""
        if self._closed or self.info is None:
            return
        realm = self.frontend.realm
        disconnect_slow_consumer(realm.incidents, realm.name, "amqp", self.peer,
                                 self._resource_limit_exceeded)
        self._closed = True

    def _resource_limit_exceeded(self) -> None:
        """AMQP's goodbye to a slow consumer: close the connection with that condition."""
        self.connection.condition = Condition(RESOURCE_LIMIT_EXCEEDED,
                                              "the client did not read its messages fast enough")
        self.connection.close()
        self.process()

    # life cycle ---------------------------------------------------------------------------

    def _close_now(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def connection_lost(self) -> None:
        self._closed = True
        # the SASL layer refers back to this connection (``wake``) and to the protocol (its
        # authenticator): gone with the connection, so that no reference cycle keeps them;
        # a password check still running answers into the SASL object alone
        self.sasl = None
        if self._tick_call is not None and self._tick_call.active():
            self._tick_call.cancel()
        for handler in list(self.links.values()):
            if isinstance(handler, AmqpSubscriber):
                self.frontend.unlinked(handler, closed=False)
        self.links.clear()
        self._awaiting_settle.clear()
        if self.info is not None:
            self.frontend.disconnected(self)
        if self.transport is not None:
            self.transport.unbind()
