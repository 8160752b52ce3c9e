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
* nothing is sent beyond the link's credit: the rest waits in the queue.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from proton import Delivery, Message, symbol

from router.amqp.persistence import Outgoing
from router.core.broker import Subscription
from router.core.model import Publication, SessionInfo
from router.core.payload import to_bytes
from router.core.qos import delivered_qos

if TYPE_CHECKING:
    from router.amqp.connection import AmqpConnection
    from router.amqp.frontend import AmqpFrontend

log = logging.getLogger(__name__)

X_OPT_QOS = symbol("x-opt-qos")
X_OPT_RETAIN = symbol("x-opt-retain")


def encode_message(item: Outgoing) -> bytes:
    """An outgoing message: the payload bytes as one data section, annotated."""
    message = Message(body=item.payload, inferred=True)
    message.address = item.topic
    message.durable = item.qos > 0
    message.delivery_count = item.delivery_count
    annotations = {X_OPT_QOS: item.published_qos}
    if item.retained:
        annotations[X_OPT_RETAIN] = True
    message.annotations = annotations
    return bytes(message.encode())


class AmqpSubscriber:
    """Implements the core's Peer for one (possibly durable) receiver link."""

    def __init__(self, frontend: "AmqpFrontend", info: SessionInfo, address: str,
                 qos: int, policy: str, key: tuple[str, str] | None = None) -> None:
        self.frontend = frontend
        self.info = info
        self.address = address
        self.qos = qos
        self.policy = policy
        self.key = key
        self.core: Subscription | None = None
        self.link = None
        self.connection: AmqpConnection | None = None
        self.queue: deque[Outgoing] = deque()
        self.in_flight: OrderedDict[str, Outgoing] = OrderedDict()
        self._seq = itertools.count(1)

    @property
    def durable(self) -> bool:
        return self.key is not None

    # core Peer ---------------------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        if self.core is None or subscription.id != self.core.id:
            return
        if publication.expires_at is not None and publication.expires_at <= time.time():
            return
        # a link whose sender settle mode is "settled" carries nothing but QoS 0
        qos = delivered_qos(publication.qos, self.qos, self.policy) if self.qos else 0
        if qos == 0 and self.link is None:
            return
        if len(self.queue) >= self.frontend.settings.max_queued:
            log.warning("AMQP subscription %s: queue full, dropping a QoS %d message on %s",
                        self.address, qos, publication.topic)
            return
        item = Outgoing(next(self._seq), publication.topic, to_bytes(publication),
                        publication.qos, qos, retained)
        self.queue.append(item)
        if qos and self.durable:
            self.frontend.store.enqueue(*self.key, item)
        self.pump()

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        if self.connection is not None:
            self.connection.kill(reason, message)

    # the link ------------------------------------------------------------------------

    def attach(self, link, connection: "AmqpConnection") -> None:
        self.link = link
        self.connection = connection

    def detach(self) -> None:
        """The link is gone: QoS >= 1 in flight goes back to the queue, counted."""
        self.link = None
        self.connection = None
        returned = list(self.in_flight.values())
        self.in_flight.clear()
        for item in returned:
            item.delivery_count += 1
            if self.durable:
                self.frontend.store.update_count(*self.key, item)
        kept = [item for item in self.queue if item.qos > 0]
        self.queue = deque(sorted(returned + kept, key=lambda item: item.seq))

    def restore(self, queued: list[Outgoing]) -> None:
        self.queue.extend(queued)
        if queued:
            self._seq = itertools.count(max(item.seq for item in queued) + 1)

    def pump(self) -> None:
        """Send queued messages while the link has credit."""
        link, connection = self.link, self.connection
        if link is None or connection is None:
            return
        sent = False
        while self.queue and link.credit > 0:
            item = self.queue.popleft()
            tag = f"{item.seq}.{item.delivery_count}"
            delivery = link.delivery(tag)
            link.send(encode_message(item))
            link.advance()
            if item.qos == 0:
                delivery.settle()
            else:
                self.in_flight[tag] = item
            sent = True
        if sent:
            connection.process()

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
            self.frontend.delivery_acknowledged(self, item)
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

    def _done(self, tag: str, item: Outgoing) -> None:
        del self.in_flight[tag]
        if self.durable:
            self.frontend.store.remove(*self.key, item.seq)
