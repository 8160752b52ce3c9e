"""One AMQP subscription: the core's Peer behind a client's receiver link.

Each receiver link is its own core session (its own session id), so two links
of one connection on the same address are two subscriptions, each with its own
QoS, policy, credit and queue. A durable one (see :mod:`router.amqp.persistence`)
outlives its link and connection: while detached it keeps queueing its QoS >= 1
deliveries, on disk, and sends them when the same container attaches the same
link name again.

Delivery rules:

* the delivered QoS is ``delivered_qos(published, granted, policy)``, except on a
  link whose sender settle mode is ``settled``, which carries QoS 0 only;
* QoS 0 is sent pre-settled, and dropped when no link is attached;
* QoS >= 1 stays unsettled until the receiver's outcome: ``accepted`` ends it,
  ``released`` / ``modified`` send it again (``delivery-count`` + 1),
  ``rejected`` drops it (logged); a delivery in flight when the link goes away is
  sent again, counted, on the next attach (durable) or lost with the link;
* nothing is sent beyond the link's credit: the rest waits in the queue;
* a durable subscription writes a delivery's count, incremented, as it sends it:
  after a crash a message that was in flight comes back with ``delivery-count``
  >= 1 (the number of prior, possibly unsuccessful, attempts);
* an accepted QoS >= 1 delivery is recorded in the realm's activity (event log)
  with its latency since it was last sent;
* a durable subscription (see :mod:`router.amqp.persistence`) is dropped, with
  its queue, its expiry timeout after its link went away, unless the link is
  attached again before.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque

from proton import Delivery

from router.amqp.addresses import AddressTopic, address_levels, outgoing_address
from router.amqp.body import bare_message, delivery_prefix
from router.amqp.outlet import Outlet, SubscriberOwner
from router.amqp.persistence import Outgoing
from router.core.incidents import EXPIRED, QUEUE_FULL, SLOW_CONSUMER, UNREPRESENTABLE
from router.core.model import Publication, SessionInfo, remaining
from router.core.options import SubscribeOptions
from router.core.peer import Subscription
from router.core.qos import delivered_qos
from router.core.shared import SharedGroup

log = logging.getLogger(__name__)

PUMP_BATCH = 64
"""Messages one pump sends before it lets the reactor serve other connections: a receiver
that grants a thousand credits to a backlog of a thousand must not hold every other client
up while they are encoded (measured: 70 ms per such pump under load)."""


class AmqpSubscriber:
    """Implements the core's Peer for one (possibly durable) receiver link."""

    def __init__(self, frontend: SubscriberOwner, info: SessionInfo, address: str,
                 qos: int, policy: str, key: tuple[str, str] | None = None,
                 group: str | None = None) -> None:
        self.frontend = frontend
        self.info = info
        self.address = address
        self.group = group
        """The shared group it is a member of (link property ``x-shared-group``), if any."""
        self.qos = qos
        self.policy = policy
        self.key = key
        self.core: Subscription | None = None
        self.mqtt_form = False
        """Subscribed with an MQTT-style address: ``to`` is the MQTT name, not the URI."""
        self.link = None
        self.connection: Outlet | None = None
        self.queue: deque[Outgoing] = deque()
        self.in_flight: OrderedDict[str, Outgoing] = OrderedDict()
        self._seq = itertools.count(1)
        self.expiry_timeout: float | None = None
        self._expiry_call = None
        self._pump_call = None

    @property
    def durable(self) -> bool:
        return self.key is not None

    def subscribe(self, named: AddressTopic) -> None:
        """Subscribe in the core to what the link's address names (raises RouterError)."""
        self.mqtt_form = named.mqtt
        self.core = self.frontend.realm.subscribe(
            self, named.levels, SubscribeOptions(named.match, shared_group=self.group))

    # core Peer ---------------------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        if self.core is None or subscription.id != self.core.id:
            return
        realm = self.frontend.realm
        to = outgoing_address(publication, self.mqtt_form, realm.uri_check)
        if to is None:
            realm.incidents.count(realm.name, "amqp", UNREPRESENTABLE,
                                  f"{self.address}: {publication.name}")
            return
        # a link whose sender settle mode is "settled" carries nothing but QoS 0
        qos = delivered_qos(publication.qos, self.qos, self.policy) if self.qos else 0
        if qos == 0 and (self.link is None or self.connection.flow.over):
            if self.link is not None:
                self._count(SLOW_CONSUMER, qos, publication.name)
            return
        if len(self.queue) >= self.frontend.settings.max_queued:
            self._count(QUEUE_FULL, qos, publication.name)
            if self.connection is not None and self.connection.flow.paused:
                self.connection.flow.overflow()
            return
        item = Outgoing(next(self._seq), to, bare_message(publication, to),
                        publication.qos, qos, retained, expires_at=publication.expires_at)
        if qos and type(subscription) is SharedGroup:
            item.publication = publication
        self.queue.append(item)
        if qos and self.durable:
            self.frontend.store.enqueue(*self.key, item)
        self.pump()

    def _count(self, reason: str, qos: int, topic: str) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "amqp", reason, f"{self.address}, QoS {qos} on {topic}")

    def ready(self) -> bool:
        """Attached, with credit, nothing waiting and not over the flow bound."""
        link = self.link
        return (link is not None and link.credit > 0 and not self.queue
                and not self.connection.flow.over)

    def backlog_room(self) -> bool:
        """Attached, with credit, nothing queued and the transport accepting: a retained
        backlog goes out as the receiver grants credit, never through the queue's bound."""
        link = self.link
        if link is None or link.credit <= 0 or self.queue:
            return False
        if self.connection.flow.paused:
            self.connection.flow.stalled()
            return False
        return True

    def hand_over(self) -> None:
        """The subscriber is gone: other members of its shared group take its QoS >= 1
        messages not accepted yet, except QoS 2 ones already sent (the receiver may
        have them; AMQP's exactly-once, like MQTT-4.8.2-5, forbids a second copy)."""
        group = self.core
        if type(group) is not SharedGroup:
            return
        # (item, sent at least once): in flight, or back in the queue after a detach
        items = ([(item, True) for item in self.in_flight.values()]
                 + [(item, item.delivery_count > 0) for item in self.queue])
        self.in_flight.clear()
        self.queue.clear()
        broker = self.frontend.realm.broker
        for item, sent in items:
            if item.publication is not None and (item.qos == 1 or not sent):
                broker.hand_over(group, item.publication, self.info.session_id)

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        if self.connection is not None:
            self.connection.kill(reason, message)

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        """Detach the link with ``amqp:unauthorized-access``; a durable subscription whose
        link is away is dropped with its queue."""
        if self.connection is not None and self.link is not None:
            self.connection.revoke(self, reason)
        else:
            self.frontend.destroy(self)

    def registration_revoked(self, registration: object, reason: str) -> None:
        """A receiver link never registers."""

    # the link ------------------------------------------------------------------------

    def attach(self, link, connection: Outlet) -> None:
        self.link = link
        self.connection = connection
        self.cancel_expiry()

    def set_expiry(self, timeout: float) -> None:
        """A durable subscription's expiry timeout (already capped)."""
        self.expiry_timeout = timeout
        self.frontend.store.set_expiry(*self.key, timeout)

    def _start_expiry(self, delay: float) -> None:
        self.cancel_expiry()
        self._expiry_call = self.frontend.scheduler.callLater(max(0.0, delay), self._expire)

    def cancel_expiry(self) -> None:
        if self._expiry_call is not None and self._expiry_call.active():
            self._expiry_call.cancel()
        self._expiry_call = None

    def _expire(self) -> None:
        self._expiry_call = None
        if self.link is not None or self.frontend.durable.get(self.key) is not self:
            return  # attached again, or already gone
        log.info("AMQP durable subscription %s/%s expired (%d message(s) dropped)",
                 self.key[0], self.key[1], len(self.queue))
        self.queue.clear()
        self.frontend.destroy(self)

    def detach(self) -> None:
        """The link is gone: QoS >= 1 in flight goes back to the queue, counted; what
        waited behind its retained events is queued as if it had just arrived."""
        self.link = None
        self.connection = None
        self.frontend.realm.backlogs.end(self)
        returned = list(self.in_flight.values())
        self.in_flight.clear()
        self.frontend.realm.stats.redelivered["amqp"] += len(returned)
        for item in returned:
            item.delivery_count += 1
            if self.durable:
                self.frontend.store.update_count(*self.key, item)
        kept = [item for item in self.queue if item.qos > 0]
        self.queue = deque(sorted(returned + kept, key=lambda item: item.seq))
        if self.durable:
            self.frontend.store.set_expiry(*self.key, self.expiry_timeout, time.time())
            self._start_expiry(self.expiry_timeout)

    def restore(self, queued: list[Outgoing]) -> None:
        self.queue.extend(queued)
        if queued:
            self._seq = itertools.count(max(item.seq for item in queued) + 1)
        timeout, detached_at = self.frontend.store.expiry_of(*self.key)
        self.expiry_timeout = timeout
        now = time.time()
        if detached_at is None:  # attached when the router died: detached since now
            detached_at = now
            self.frontend.store.set_expiry(*self.key, timeout, now)
        self._start_expiry(detached_at + timeout - now)

    def pump(self) -> None:
        """Send queued messages while the link has credit; QoS >= 1 waits while the
        connection's transport is paused (the client does not read), QoS 0 goes on to its
        bound (see :mod:`router.flow`)."""
        link, connection = self.link, self.connection
        if link is None or connection is None:
            return
        sent = 0
        flow = connection.flow
        while self.queue and link.credit > 0:
            if flow.paused and self.queue[0].qos:
                break
            if sent == PUMP_BATCH:
                if self._pump_call is None:
                    self._pump_call = self.frontend.scheduler.callLater(0, self._pump_later)
                break
            item = self.queue.popleft()
            if item.expires_at is not None and item.expires_at <= time.time():
                if item.qos and self.durable:
                    self.frontend.store.remove(*self.key, item.seq)
                self._expired(item.topic)
                continue
            tag = f"{item.seq}.{item.delivery_count}"
            delivery = link.delivery(tag)
            ttl = (None if item.expires_at is None
                   else remaining(item.expires_at, time.time(), 1000))
            link.send(delivery_prefix(item.qos > 0, item.delivery_count, item.published_qos,
                                      item.retained, ttl))
            link.send(item.bare)  # the same bytes for every receiver of the publication
            link.advance()
            if item.qos == 0:
                delivery.settle()
            else:
                item.sent_at = time.time()
                self.in_flight[tag] = item
                if self.durable:
                    # counted as it goes out: if the router dies before the outcome, the
                    # next attempt is the (count + 1)th (the item keeps its count until
                    # the attempt is known to have failed)
                    self.frontend.store.update_count(*self.key, item,
                                                     item.delivery_count + 1)
            sent += 1
        if sent:
            connection.process()
        if not self.queue:
            self.frontend.realm.backlogs.resume(self)  # retained events owed to the link

    def _pump_later(self) -> None:
        self._pump_call = None
        self.pump()

    def disposition(self, delivery) -> None:
        """The receiver updated or settled a delivery we sent."""
        tag = delivery.tag
        tag = tag.decode() if isinstance(tag, bytes) else str(tag)
        item = self.in_flight.get(tag)
        if item is None:
            if delivery.settled:
                delivery.settle()
            return
        state = delivery.remote_state
        if state == Delivery.ACCEPTED or (delivery.settled and state in (None, 0,
                                                                         Delivery.RECEIVED)):
            self._done(tag, item)
            self._acknowledged(item)
        elif state in (Delivery.RELEASED, Delivery.MODIFIED):
            del self.in_flight[tag]
            item.delivery_count += 1
            if self.durable:
                self.frontend.store.update_count(*self.key, item)
            self.queue.appendleft(item)
        elif state == Delivery.REJECTED:
            log.info("AMQP subscription %s: message on %s rejected by the receiver (%s)",
                     self.address, item.topic, delivery.remote.condition)
            self._done(tag, item)
        else:
            return  # a non-terminal state (received): wait for the outcome
        delivery.settle()
        self.pump()

    def _expired(self, topic: str) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "amqp", EXPIRED, f"link {self.address}: {topic}")

    def _acknowledged(self, item: Outgoing) -> None:
        activity = self.frontend.realm.activity
        if activity is not None and item.sent_at:
            activity.acknowledged(self.info, address_levels(item.topic), item.qos,
                                  (time.time() - item.sent_at) * 1000.0)

    def _done(self, tag: str, item: Outgoing) -> None:
        del self.in_flight[tag]
        if self.durable:
            self.frontend.store.remove(*self.key, item.seq)
