"""An MQTT session: the core's Peer for one client id, outliving its connections.

It owns the client's subscriptions, its outbound QoS 1/2 queue (with packet ids
and the PUBLISH -> PUBACK and PUBLISH -> PUBREC -> PUBREL -> PUBCOMP states) and
the packet ids of QoS 2 messages received but not yet released. A persistent
session writes every change of that state to the store, in order, so the
acknowledgements a client gets are backed by the disk and a restarted router
resumes each flow exactly where it stopped.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.core.broker import Subscription
from router.core.incidents import EXPIRED, QUEUE_FULL, SLOW_CONSUMER
from router.core.model import Publication, SessionInfo
from router.core.payload import to_bytes
from router.core.qos import delivered_qos
from router.mqtt.packets import SubscriptionOptions
from router.mqtt.persistence import StoredMessage, StoredOutbound
from router.mqtt.topics import uri_to_topic

if TYPE_CHECKING:
    from router.mqtt.connection import MqttConnection
    from router.mqtt.frontend import MqttFrontend

log = logging.getLogger(__name__)

QUEUED, SENT, RELEASED = "queued", "sent", "released"

_FORWARDED_PROPERTIES = ("payload_format_indicator", "content_type", "response_topic",
                         "correlation_data", "user_property")


def _message(publication: Publication, qos: int, retain: bool,
             properties: dict) -> StoredMessage:
    """The MQTT form of a publication, with the properties MQTT 5 forwards added."""
    if publication.properties:
        properties.update((key, publication.properties[key]) for key in _FORWARDED_PROPERTIES
                          if key in publication.properties)
    return StoredMessage(uri_to_topic(publication.topic), to_bytes(publication), qos, retain,
                         properties, publication.expires_at)


@dataclass
class MqttSubscription:
    topic_filter: str
    core: Subscription
    options: SubscriptionOptions
    identifier: int | None = None

    def packed(self) -> list:
        o = self.options
        return [o.qos, o.no_local, o.retain_as_published, o.retain_handling, self.identifier]


@dataclass(slots=True)
class Outbound:
    seq: int
    packet_id: int | None
    state: str
    message: StoredMessage
    sent_at: float = 0.0


class MqttSession:
    """Implements the core's Peer for an MQTT client id."""

    def __init__(self, frontend: "MqttFrontend", client_id: str, info: SessionInfo,
                 persistent: bool, expiry: float) -> None:
        self.frontend = frontend
        self.client_id = client_id
        self.info = info
        self.persistent = persistent
        self.expiry = expiry
        self.connection: MqttConnection | None = None
        self.subscriptions: dict[str, MqttSubscription] = {}
        self._by_core_id: dict[int, MqttSubscription] = {}
        self.outbound: dict[int, Outbound] = {}  # by seq, in queue order
        self._queued: deque[int] = deque()
        self._by_packet_id: dict[int, Outbound] = {}
        self.inbound_qos2: set[int] = set()
        self._seq = itertools.count(1)
        self._next_packet_id = 1
        self.expiry_timer = None

    def cancel_expiry(self) -> None:
        """Cancel the expiry timer (it holds the session, and its queue, alive)."""
        timer, self.expiry_timer = self.expiry_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    # subscriptions --------------------------------------------------------------

    def add_subscription(self, subscription: MqttSubscription, persist: bool = True) -> None:
        previous = self.subscriptions.get(subscription.topic_filter)
        if previous is not None:
            self._by_core_id.pop(previous.core.id, None)
        self.subscriptions[subscription.topic_filter] = subscription
        self._by_core_id[subscription.core.id] = subscription
        if self.persistent and persist:
            self.frontend.store.save_subscription(self.client_id, subscription.topic_filter,
                                                  subscription.packed())

    def remove_subscription(self, topic_filter: str) -> MqttSubscription | None:
        subscription = self.subscriptions.pop(topic_filter, None)
        if subscription is not None:
            self._by_core_id.pop(subscription.core.id, None)
            if self.persistent:
                self.frontend.store.delete_subscription(self.client_id, topic_filter)
        return subscription

    # delivery (core Peer) ---------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        mine = self._by_core_id.get(subscription.id)
        if mine is None:
            return
        options = mine.options
        publisher = publication.publisher
        if (options.no_local and publisher is not None
                and publisher.session_id == self.info.session_id):
            return
        qos = delivered_qos(publication.qos, options.qos, self.frontend.settings.qos_policy)
        retain = retained or (options.retain_as_published and publication.retain)
        if mine.identifier is None:  # receivers with the same QoS and retain flag share one
            key = ("mqtt-message", qos, retain)
            cache = publication.encodings()
            message = cache.get(key)
            if message is None:
                message = cache[key] = _message(publication, qos, retain, {})
        else:
            message = _message(publication, qos, retain,
                               {"subscription_identifier": [mine.identifier]})
        if qos == 0:
            connection = self.connection
            if connection is None:
                return
            if connection.flow.over:
                self._count(SLOW_CONSUMER, message)
                return
            if mine.identifier is None and message.expires_at is None:
                key = ("mqtt", connection.version, message.retain)
                cache = publication.encodings()
                data = cache.get(key)
                if data is None:
                    data = cache[key] = connection.encode_publish(message)
                connection.write_publish(data, message.topic)
            else:
                connection.send_publish(message, None, False)
            return
        self._enqueue(message)

    def _enqueue(self, message: StoredMessage) -> None:
        if len(self.outbound) >= self.frontend.settings.max_queued:
            self._count(QUEUE_FULL, message)
            connection = self.connection
            if connection is not None and connection.flow.paused:
                connection.flow.overflow()
            return
        entry = Outbound(next(self._seq), None, QUEUED, message)
        self.outbound[entry.seq] = entry
        self._queued.append(entry.seq)
        if self.persistent:
            self.frontend.store.enqueue(self.client_id, StoredOutbound(
                entry.seq, None, QUEUED, message))
        self.pump()

    def _count(self, reason: str, message: StoredMessage) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "mqtt", reason,
                              f"client {self.client_id}, QoS {message.qos} on {message.topic}")

    def pump(self) -> None:
        """Send queued messages while the client's receive window has room and the
        connection's transport is not paused (a client that does not read)."""
        connection = self.connection
        if connection is None:
            return
        flow = connection.flow
        while (self._queued and len(self._by_packet_id) < connection.send_quota
               and not flow.paused):
            entry = self.outbound[self._queued.popleft()]
            now = time.time()
            if entry.message.expires_at is not None and entry.message.expires_at <= now:
                self._drop(entry)
                self._expired(entry.message.topic)
                continue
            entry.packet_id = self._allocate_packet_id()
            entry.state = SENT
            entry.sent_at = now
            self._by_packet_id[entry.packet_id] = entry
            if self.persistent:
                self.frontend.store.update_outbound(self.client_id, entry.seq, entry.packet_id,
                                                    SENT)
                if entry.message.qos == 2:
                    # the packet id must be on disk before the client sees it: after a crash
                    # the same id is resent and the client can recognise the duplicate
                    self.frontend.when_durable(
                        lambda ok, entry=entry: self._transmit_later(entry, ok))
                    continue
            self._transmit(entry)

    def _transmit(self, entry: Outbound) -> bool:
        """Write one in-flight PUBLISH; False if it had to be discarded (too big)."""
        connection = self.connection
        if connection is None or self._by_packet_id.get(entry.packet_id) is not entry:
            return True
        if connection.send_publish(entry.message, entry.packet_id, False):
            return True
        del self._by_packet_id[entry.packet_id]  # too big for this client: as if delivered
        self._drop(entry)
        return False

    def _transmit_later(self, entry: Outbound, stored: bool) -> None:
        if not stored:
            self._unsend(entry)
            return
        if not self._transmit(entry):
            self.pump()

    def _unsend(self, entry: Outbound) -> None:
        """Its packet id never reached the disk: the QoS 2 PUBLISH must not go out with it.
        Back to the queue (in order) it goes, and the connection closes; the next one
        sends it under a packet id that is stored first."""
        if self._by_packet_id.get(entry.packet_id) is entry:
            del self._by_packet_id[entry.packet_id]
        entry.packet_id, entry.state = None, QUEUED
        self._queued = deque(sorted((*self._queued, entry.seq)))
        if self.connection is not None:
            self.connection.store_failed("QoS 2 PUBLISH")

    def resume(self) -> None:
        """After a (re)connect: resend what is in flight, in order, then the queue."""
        connection = self.connection
        if connection is None:
            return
        for entry in list(self._by_packet_id.values()):
            if entry.state == SENT:
                self.frontend.realm.stats.redelivered["mqtt"] += 1
                connection.send_publish(entry.message, entry.packet_id, True)
            else:
                connection.send_pubrel(entry.packet_id)
        self.pump()

    def _allocate_packet_id(self) -> int:
        while True:
            packet_id = self._next_packet_id
            self._next_packet_id = packet_id % 65535 + 1
            if packet_id not in self._by_packet_id:
                return packet_id

    def acknowledged(self, packet_id: int, expected_qos: int) -> bool:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2): the delivery is complete."""
        entry = self._by_packet_id.get(packet_id)
        if entry is None or entry.message.qos != expected_qos:
            return False
        if expected_qos == 2 and entry.state != RELEASED:
            return False
        del self._by_packet_id[packet_id]
        self.frontend.delivery_acknowledged(self, entry)
        self._drop(entry)
        self.pump()
        return True

    def acknowledged_with_error(self, packet_id: int) -> None:
        """PUBREC with a failure reason (MQTT 5): the client refused it; the flow ends."""
        entry = self._by_packet_id.pop(packet_id, None)
        if entry is not None:
            self._drop(entry)
            self.pump()

    def received(self, packet_id: int) -> bool:
        """PUBREC: the client has the QoS 2 message; move to PUBREL."""
        entry = self._by_packet_id.get(packet_id)
        if entry is None or entry.message.qos != 2:
            return False
        if entry.state != RELEASED:
            entry.state = RELEASED
            if self.persistent:
                self.frontend.store.update_outbound(self.client_id, entry.seq, packet_id,
                                                    RELEASED)
        return True

    def _expired(self, topic: str) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "mqtt", EXPIRED, f"client {self.client_id}: {topic}")

    def _drop(self, entry: Outbound) -> None:
        self.outbound.pop(entry.seq, None)
        if self.persistent:
            self.frontend.store.delete_outbound(self.client_id, entry.seq)

    # inbound QoS 2 ----------------------------------------------------------------

    def remember_inbound(self, packet_id: int) -> bool:
        """Record a QoS 2 packet id; False if it is a duplicate (already delivered)."""
        if packet_id in self.inbound_qos2:
            return False
        self.inbound_qos2.add(packet_id)
        if self.persistent:
            self.frontend.store.add_inbound(self.client_id, packet_id)
        return True

    def release_inbound(self, packet_id: int) -> bool:
        if packet_id not in self.inbound_qos2:
            return False
        self.inbound_qos2.discard(packet_id)
        if self.persistent:
            self.frontend.store.delete_inbound(self.client_id, packet_id)
        return True

    # restore after a restart ------------------------------------------------------

    def restore_outbound(self, stored: list[StoredOutbound]) -> None:
        for item in stored:
            entry = Outbound(item.seq, item.packet_id, item.state, item.message)
            self.outbound[entry.seq] = entry
            if item.state == QUEUED or item.packet_id is None:
                entry.state = QUEUED
                self._queued.append(entry.seq)
            else:
                self._by_packet_id[item.packet_id] = entry
        if self.outbound:
            self._seq = itertools.count(max(self.outbound) + 1)

    # core Peer --------------------------------------------------------------------

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        if self.connection is not None:
            self.connection.kill(reason, message)
