"""An MQTT session: the core's Peer for one client id, outliving its connections.

It owns the client's subscriptions, its outbound QoS 1/2 queue (with packet ids
and the PUBLISH -> PUBACK and PUBLISH -> PUBREC -> PUBREL -> PUBCOMP states) and
the packet ids of QoS 2 messages received but not yet released. A persistent
session writes every change of that state to the store, in order, so the
acknowledgements a client gets are backed by the disk and a restarted router
resumes each flow exactly where it stopped.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from functools import partial
from typing import Callable

from router.core.incidents import (EXPIRED, OVER_LIMIT, QUEUE_FULL, SLOW_CONSUMER,
                                   UNREPRESENTABLE)
from router.core.model import Publication, SessionInfo
from router.core.payload import to_bytes
from router.core.peer import NOTHING_YET, Subscription
from router.core.qos import delivered_qos
from router.core.shared import SharedGroup
from router.core.topic import to_mqtt
from router.core.uri import EXACT
from router.mqtt.outlet import FLUSH_AT, Outlet, SessionOwner
from router.mqtt.packets import ReasonCode, SubscriptionOptions
from router.mqtt.persistence import QUEUED, RELEASED, SENT, StoredMessage, StoredOutbound
from router.mqtt.primitives import MqttProtocolError, free_packet_id

log = logging.getLogger(__name__)

_FORWARDED_PROPERTIES = ("payload_format_indicator", "content_type", "response_topic",
                         "correlation_data", "user_property")


def _message(publication: Publication, topic: str, qos: int, retain: bool,
             properties: dict) -> StoredMessage:
    """The MQTT form of a publication, with the properties MQTT 5 forwards added."""
    if publication.properties:
        properties.update((key, publication.properties[key]) for key in _FORWARDED_PROPERTIES
                          if key in publication.properties)
    return StoredMessage(topic, to_bytes(publication), qos, retain, properties,
                         publication.expires_at)


class MqttSubscription:
    """One of a session's topic filters: its core subscription (or shared group) and the
    options granted (slotted; the identifier kept as ``identifiers`` alone, the filter
    text only where the core subscription's levels do not give it back)."""

    __slots__ = ("_filter", "core", "options", "identifiers")

    def __init__(self, topic_filter: str, core: Subscription, options: SubscriptionOptions,
                 identifier: int | None = None) -> None:
        self._filter: str | None = None if to_mqtt(core.topic) == topic_filter else topic_filter
        """The filter's text if it is not its core subscription's levels joined (a
        ``$share/...`` filter); else None: made when asked (subscribe and unsubscribe
        only), not kept, about 60 bytes of every subscription."""
        self.core = core
        self.options = options
        self.identifiers: tuple[int] | None = None if identifier is None else (identifier,)
        """``(identifier,)``, or None: what every delivery sends."""

    @property
    def topic_filter(self) -> str:
        """The topic filter the client subscribed."""
        text = self._filter
        return to_mqtt(self.core.topic) if text is None else text

    @property
    def identifier(self) -> int | None:
        """The MQTT 5 subscription identifier, if the client gave one."""
        return None if self.identifiers is None else self.identifiers[0]

    def packed(self) -> list:
        o = self.options
        return [o.qos, o.no_local, o.retain_as_published, o.retain_handling, self.identifier]


Outbound = list
"""A QoS >= 1 delivery in flight (or queued from a shared group): ``[seq, packet id,
state, message, sent at, shared group, publication]``, read by the index constants below.
A list, not a slotted object: one is made per QoS >= 1 delivery, and a list is ~5x
cheaper to make. The shared group (in memory only) and its publication let another
member take it over (:meth:`MqttSession.hand_over`); ``sent at`` (what the activity log
times acknowledgements by) stays 0.0 for one sent at once while the realm has no log."""
SEQ, PACKET_ID, STATE, MESSAGE, SENT_AT, GROUP, PUBLICATION = range(7)


_MATCHING = "mqtt-matching"
"""A publication's wire-cache key for its matching core subscriptions by id, made by the
first client with overlapping filters that it reaches (see :meth:`MqttSession._combined`)."""

_NONE_QUEUED: tuple[int, ...] = ()
"""The queue of a session that never queued: its deque (760 bytes) is made on first use."""
_NO_PACKET_IDS: frozenset[int] = frozenset()
"""The inbound QoS 2 packet ids of a session that never had one (a set is 216 bytes)."""


class MqttSession:
    """Implements the core's Peer for an MQTT client id.

    Slotted, and what most sessions never use (queue, inbound QoS 2 ids, subscription
    tables) is made on first use: an idle session with one subscription is this object and
    its subscription, no dict. Its client id is its SessionInfo's; an offline session's
    expiry timer is kept by the frontend."""

    __slots__ = ("frontend", "info", "persistent", "connection",
                 "_subscriptions", "_by_core_id", "_may_overlap",
                 "_last_publication", "outbound", "_queued", "_by_packet_id", "inbound_qos2",
                 "_last_seq", "_next_packet_id")

    def __init__(self, frontend: SessionOwner, info: SessionInfo, expiry: float) -> None:
        self.frontend = frontend
        self.info = info
        self.persistent = expiry
        """Its expiry in seconds: true (not 0) for a session that outlives its connection
        (kept, with the store's copy); one slot for both (:attr:`expiry` reads it)."""
        self.connection: Outlet | None = None
        self._subscriptions: MqttSubscription | dict[str, MqttSubscription] | None = None
        """Its only subscription, or from the second on a dict by topic filter (two
        one-entry dicts were ~400 bytes of every session with a single subscription)."""
        self._by_core_id: dict[int, MqttSubscription] = NOTHING_YET  # type: ignore[assignment]
        """By core subscription id, from the second subscription on (:data:`NOTHING_YET`
        while there are fewer)."""
        self._may_overlap = 0
        """Two of its filters can match one topic: how many of its subscriptions have a
        wildcard while it holds two or more (0 with fewer). Kept as they come and go, so a
        change costs the same however many the session holds."""
        self._last_publication: int | None = None
        self.outbound: dict[int, Outbound | StoredMessage] = NOTHING_YET  # type: ignore[assignment]
        """By seq, in queue order (the shared empty :data:`NOTHING_YET` until the first). A
        message that only waits in the queue is held as its (shared) StoredMessage; its
        Outbound, one more object for the collector to scan per queued message (10,000
        per full queue), is made when it is sent, or at once if it came through a shared
        group (which it may have to be handed back to)."""
        self._queued: deque[int] | tuple[int, ...] = _NONE_QUEUED
        self._by_packet_id: dict[int, Outbound] = NOTHING_YET  # type: ignore[assignment]
        """In flight, by packet id (:data:`NOTHING_YET` until the first is sent)."""
        self.inbound_qos2: set[int] | frozenset[int] = _NO_PACKET_IDS
        self._last_seq = 0
        self._next_packet_id = 1

    @property
    def expiry(self) -> float:
        """Seconds the session outlives its connection (0: it ends with it)."""
        return self.persistent

    @expiry.setter
    def expiry(self, expiry: float) -> None:
        self.persistent = expiry

    @property
    def client_id(self) -> str:
        """The MQTT client id (its SessionInfo's)."""
        return self.info.client_id  # type: ignore[return-value]

    # subscriptions --------------------------------------------------------------

    def subscription(self, topic_filter: str) -> MqttSubscription | None:
        """Its subscription to ``topic_filter``, if it has one."""
        held = self._subscriptions
        if type(held) is MqttSubscription:
            return held if held.topic_filter == topic_filter else None
        return None if held is None else held.get(topic_filter)

    def all_subscriptions(self) -> list[MqttSubscription]:
        """Its subscriptions (a list of its own)."""
        held = self._subscriptions
        if held is None:
            return []
        return [held] if type(held) is MqttSubscription else list(held.values())

    def _mine(self, core_id: int) -> MqttSubscription | None:
        """Its subscription whose core subscription (or shared group) has ``core_id``."""
        held = self._subscriptions
        if type(held) is MqttSubscription and held.core.id == core_id:
            return held
        return self._by_core_id.get(core_id)

    def add_subscription(self, subscription: MqttSubscription, persist: bool = True) -> None:
        previous = self.subscription(subscription.topic_filter)
        if previous is not None:
            self._unindex(previous)
        held = self._subscriptions
        if held is None:
            self._subscriptions = subscription
        else:
            if type(held) is MqttSubscription:
                self._subscriptions = {held.topic_filter: held}
                self._by_core_id = {held.core.id: held}
                self._may_overlap = int(held.core.match != EXACT)
            self._subscriptions[subscription.topic_filter] = subscription  # type: ignore[index]
            self._by_core_id[subscription.core.id] = subscription
            if subscription.core.match != EXACT:
                self._may_overlap += 1
        if self.persistent and persist:
            self.frontend.store.save_subscription(self.client_id, subscription.topic_filter,
                                                  subscription.packed())

    def remove_subscription(self, topic_filter: str) -> MqttSubscription | None:
        subscription = self.subscription(topic_filter)
        if subscription is not None:
            self._unindex(subscription)
            if self.persistent:
                self.frontend.store.delete_subscription(self.client_id, topic_filter)
        return subscription

    def _unindex(self, subscription: MqttSubscription) -> None:
        """Forget ``subscription`` (the one it holds for its filter); back to no dict at all
        when one subscription is left."""
        held = self._subscriptions
        if type(held) is MqttSubscription:
            self._subscriptions = None
        else:
            del held[subscription.topic_filter]  # type: ignore[union-attr]
            self._by_core_id.pop(subscription.core.id, None)
            if len(held) == 1:  # type: ignore[arg-type]
                (self._subscriptions,) = held.values()  # type: ignore[union-attr]
                self._by_core_id = NOTHING_YET  # type: ignore[assignment]
                self._may_overlap = 0
            elif subscription.core.match != EXACT:
                self._may_overlap -= 1

    # delivery (core Peer) ---------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        mine = self._subscriptions  # (:meth:`_mine` inlined: once per delivery)
        if type(mine) is not MqttSubscription or mine.core.id != subscription.id:
            mine = self._by_core_id.get(subscription.id)
            if mine is None:
                return
        topic = publication.mqtt_topic()
        if topic is None:  # a WAMP/AMQP topic with "/" or a wildcard inside a level
            realm = self.frontend.realm
            realm.incidents.count(realm.name, "mqtt", UNREPRESENTABLE,
                                  f"client {self.client_id}: {publication.name}")
            return
        if (retained or not self._may_overlap or type(subscription) is SharedGroup
                or self._behind_retained(subscription)):
            # a shared group's copy is its own, besides the client's other subscriptions;
            # so is a copy that waited behind the subscription's retained events
            options = mine.options
            publisher = publication.publisher
            if (options.no_local and publisher is not None
                    and publisher.session_id == self.info.session_id):
                return
            qos = delivered_qos(publication.qos, options.qos, self.frontend.settings.qos_policy)
            retain = retained or (options.retain_as_published and publication.retain)
            identifiers = mine.identifiers
        else:
            # one copy for all this client's matching subscriptions (MQTT-3.3.4-2, -4): the
            # core calls once per matching subscription; the first call delivers for all
            if publication.publication_id == self._last_publication:
                return
            self._last_publication = publication.publication_id
            combined = self._combined(publication)
            if combined is None:
                return
            qos, retain, identifiers = combined
        cache = publication.wire_cache
        if cache is None:
            cache = publication.wire_cache = {}
        if not qos:
            connection = self.connection
            if connection is None:
                return
            if connection.flow.over:
                self._count(SLOW_CONSUMER, 0, topic)
                return
            version = connection.version
            if (identifiers is None and publication.expires_at is None
                    and not connection.outbound_alias_limit
                    and (version != 5 or not publication.properties)):
                # the commonest delivery: one PUBLISH's bytes for every receiver of the
                # version, joined straight from topic and payload (no StoredMessage)
                key = ("mqtt", version, retain)
                data = cache.get(key)
                if data is None:
                    data = cache[key] = connection.publish_encoder(topic, to_bytes(publication),
                                                                   retain)
                connection.write_publish(data, topic)
                return
        # receivers with the same QoS, retain flag and identifiers share one message
        key = ("mqtt-message", qos, retain, identifiers)
        message = cache.get(key)
        if message is None:
            message = cache[key] = _message(
                publication, topic, qos, retain,
                {} if identifiers is None else {"subscription_identifier": list(identifiers)})
        if qos:
            if type(subscription) is SharedGroup:
                self._enqueue(message, subscription, publication)
            else:
                self._enqueue(message)
            return
        # (QoS 0 with subscription identifiers, message expiry or MQTT 5 properties)
        if message.expires_at is not None or connection.outbound_alias_limit:
            connection.send_publish(message, None, False)  # bytes of its own
        else:
            key = ("mqtt", connection.version, retain, identifiers)
            data = cache.get(key)
            if data is None:
                data = cache[key] = connection.encode_publish(message)
            connection.write_publish(data, message.topic)

    def retained_writer(self, subscription: Subscription
                        ) -> tuple[Callable[[Publication], bool], Callable[[], None]] | None:
        """One batch of a retained backlog (:class:`router.core.peer.RetainedWriter`). A
        message that goes as a plain QoS 0 PUBLISH (no message expiry, no MQTT 5 property)
        is encoded straight from the publication, without the StoredMessage and the
        encodings cache a live fan-out shares, and the batch is one write; any other
        takes :meth:`send_event`'s path, in order. None (every event by
        :meth:`send_event`) with topic aliases or a subscription identifier."""
        mine = self._mine(subscription.id)
        connection = self.connection
        if (mine is None or connection is None or connection.outbound_alias_limit
                or mine.identifiers is not None):
            return None
        options = mine.options
        policy = self.frontend.settings.qos_policy
        qos_for = tuple(delivered_qos(qos, options.qos, policy) for qos in range(3))
        own = self.info.session_id if options.no_local else None
        forwards = connection.version == 5  # MQTT 3.1.1 has no properties to forward
        encode, max_packet = connection.publish_encoder, connection.max_packet
        send_event, backlog_room = self.send_event, self.backlog_room
        frames: list[bytes] = []
        gathered = 0

        def write(publication: Publication) -> bool:
            nonlocal gathered
            if (qos_for[publication.qos] or publication.expires_at is not None
                    or (forwards and publication.properties)):
                written()
                send_event(subscription, publication, True)
                return backlog_room()
            publisher = publication.publisher
            if own is not None and publisher is not None and publisher.session_id == own:
                return True
            topic = publication.mqtt_topic()
            if topic is None:
                send_event(subscription, publication, True)  # counted as unrepresentable
                return True
            payload = publication.payload
            frame = encode(topic, to_bytes(publication) if payload is None else payload, True)
            if max_packet is not None and len(frame) > max_packet:
                written()
                connection.write_publish(frame, topic)  # discarded, counted as too large
                return True
            frames.append(frame)
            gathered += len(frame)
            if gathered < FLUSH_AT:
                return True
            written()
            return backlog_room()

        def written() -> None:
            nonlocal gathered
            if frames:
                connection.write_packets(b"".join(frames))
                frames.clear()
                gathered = 0

        return write, written

    def _behind_retained(self, core: Subscription) -> bool:
        """Do this session's live events on ``core`` wait behind its retained events?"""
        held = core.held
        return held is not None and self.info.session_id in held

    def _combined(self, publication: Publication) -> tuple[int, bool, tuple | None] | None:
        """(QoS, retain, subscription identifiers) of the one copy for all this client's
        subscriptions matching ``publication``; None if no-local rules out every one.
        The realm's index says which match, walked once per publication (kept in its wire
        cache for the dispatch); each client then looks at the fewer of its own
        subscriptions and the matching ones: a client with two filters pays for two,
        however many filters other clients hold that match (each client walking the
        matches was clients x matches: 5,000 of one client's filters made every publish
        to 200 clients with '#' and 'a/#' cost 429 ms of the reactor instead of 1.5)."""
        cache = publication.wire_cache
        if cache is None:
            cache = publication.wire_cache = {}
        matching = cache.get(_MATCHING)
        if matching is None:
            matching = cache[_MATCHING] = {
                core.id: core for core in self.frontend.realm.broker.index.matching(
                    publication.topic)}
        by_core_id = self._by_core_id
        if len(by_core_id) <= len(matching):
            both = [(mine, matching[core_id]) for core_id, mine in by_core_id.items()
                    if core_id in matching]
        else:
            both = [(by_core_id[core_id], core) for core_id, core in matching.items()
                    if core_id in by_core_id]
        publisher = publication.publisher
        own = publisher is not None and publisher.session_id == self.info.session_id
        policy = self.frontend.settings.qos_policy
        qos, retain, identifiers = -1, False, []
        for mine, core in both:
            if (own and mine.options.no_local) or self._behind_retained(core):
                continue  # (one waiting behind its retained events gets its own copy later)
            options = mine.options
            qos = max(qos, delivered_qos(publication.qos, options.qos, policy))
            retain = retain or (options.retain_as_published and publication.retain)
            if mine.identifier is not None:
                identifiers.append(mine.identifier)
        if qos < 0:
            return None
        return qos, retain, tuple(sorted(identifiers)) or None

    def ready(self) -> bool:
        """Connected, not over the flow bound, nothing waiting and room in the client's
        receive window: a shared group's preferred kind of member."""
        connection = self.connection
        return (connection is not None and not connection.flow.over and not self._queued
                and len(self._by_packet_id) < connection.send_quota)

    def backlog_room(self) -> bool:
        """Connected, nothing queued, room in the client's receive window and the transport
        accepting: a retained backlog never grows the (persistent) queue, its QoS >= 1
        messages go out as acknowledgements free the window."""
        connection = self.connection
        if (connection is None or self._queued
                or len(self._by_packet_id) >= connection.send_quota):
            return False
        if connection.flow.paused:
            connection.flow.stalled()
            return False
        return True

    def hand_over(self, group: SharedGroup | None, leaving: bool) -> None:
        """Give messages that came through shared groups to other members of their group.

        On an UNSUBSCRIBE (``group``, not ``leaving``) only what was not sent yet moves:
        the client still completes what it has (MQTT 3.10.4). When the session ends
        (``leaving``, every group) unacknowledged QoS 1 moves too (it may then arrive
        twice, as QoS 1 allows); a QoS 2 message already sent never moves (MQTT-4.8.2-5).
        What no other member takes stays here (and goes with the session when it ends)."""
        broker = self.frontend.realm.broker
        moved = set()
        for entry in list(self.outbound.values()):
            if (type(entry) is not list or entry[GROUP] is None
                    or (group is not None and entry[GROUP] is not group)):
                continue
            if entry[STATE] != QUEUED and not (leaving and entry[MESSAGE].qos == 1):
                continue
            if broker.hand_over(entry[GROUP], entry[PUBLICATION], self.info.session_id):
                if self._by_packet_id.get(entry[PACKET_ID]) is entry:
                    del self._by_packet_id[entry[PACKET_ID]]
                moved.add(entry[SEQ])
                self._drop(entry)
        if moved:
            self._queued = deque(seq for seq in self._queued if seq not in moved)
            self.pump()

    def _enqueue(self, message: StoredMessage, group: SharedGroup | None = None,
                 publication: Publication | None = None) -> None:
        outbound = self.outbound
        connection = self.connection
        frontend = self.frontend
        if len(outbound) >= frontend.settings.max_queued:
            self._count(QUEUE_FULL, message.qos, message.topic)
            if connection is not None and connection.flow.paused:
                connection.flow.overflow()
            return
        seq = self._last_seq = self._last_seq + 1
        if outbound is NOTHING_YET:
            outbound = self.outbound = {}
        if (not self._queued and connection is not None and not self.persistent
                and message.expires_at is None and not connection.flow.paused
                and len(self._by_packet_id) < connection.send_quota):
            # the commonest case: nothing waits and the client's window has room, so it
            # goes at once, never queued (what pump would do, without the round trip; a
            # retained backlog waiting for room is resumed by whatever makes room)
            entry = outbound[seq] = [
                seq, None, QUEUED, message,
                0.0 if frontend.realm.activity is None else time.time(), group, publication]
            self._send(entry, connection)
            return
        outbound[seq] = (message if group is None
                         else [seq, None, QUEUED, message, 0.0, group, publication])
        self._queue(seq)
        if self.persistent:
            frontend.store.enqueue(self.client_id, StoredOutbound(seq, None, QUEUED, message))
        if (connection is not None and not connection.flow.paused
                and len(self._by_packet_id) < connection.send_quota):
            self.pump()  # (else it waits, as pump would leave it, for what makes room)

    def _queue(self, seq: int) -> None:
        if type(self._queued) is tuple:
            self._queued = deque()
        self._queued.append(seq)

    def _count(self, reason: str, qos: int, topic: str) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "mqtt", reason,
                              f"client {self.client_id}, QoS {qos} on {topic}")

    def pump(self) -> None:
        """Send queued messages while the client's receive window has room and the
        connection's transport is not paused (a client that does not read); then the
        retained events owed to new subscriptions (see :meth:`backlog_room`)."""
        connection = self.connection
        if connection is None:
            return
        if self._queued:
            self._send_queued(connection)
        if not self._queued:
            self.frontend.realm.backlogs.resume(self)

    def _send_queued(self, connection: Outlet) -> None:
        """:meth:`pump`'s sending of the queue."""
        flow, quota, in_flight = connection.flow, connection.send_quota, self._by_packet_id
        if in_flight is NOTHING_YET:  # (made here: the loop's bound reads what _send fills)
            in_flight = self._by_packet_id = {}
        now = time.time()  # one clock read per pump: it runs within one reactor turn
        while self._queued and len(in_flight) < quota and not flow.paused:
            seq = self._queued.popleft()
            entry = self.outbound[seq]
            message = entry if type(entry) is StoredMessage else entry[MESSAGE]
            if message.expires_at is not None and message.expires_at <= now:
                self._forget(seq)
                self._expired(message.topic)
                continue
            if type(entry) is StoredMessage:
                entry = self.outbound[seq] = [seq, None, QUEUED, message, 0.0, None, None]
            entry[SENT_AT] = now
            self._send(entry, connection)

    def _send(self, entry: Outbound, connection: Outlet) -> bool:
        """Put a delivery in flight under a free packet id and write its PUBLISH; False if
        the client's maximum packet size rules it out (then it is forgotten, as if
        delivered). A persistent session stores the packet id first, and a QoS 2 PUBLISH
        waits until it is on disk (after a crash the same id is resent, so the client can
        recognise the duplicate): :meth:`_transmit_later` hands it back here, and an entry
        that has its packet id already is only written. Every first send of a QoS >= 1
        delivery takes it: it is the hot path, and calls nothing but the write."""
        in_flight = self._by_packet_id
        packet_id = entry[PACKET_ID]
        if packet_id is None:
            if in_flight is NOTHING_YET:
                in_flight = self._by_packet_id = {}
            packet_id = self._next_packet_id
            if packet_id in in_flight:
                packet_id = free_packet_id(packet_id, in_flight)
            self._next_packet_id = packet_id % 65535 + 1
            entry[PACKET_ID] = packet_id
            entry[STATE] = SENT
            in_flight[packet_id] = entry
            if self.persistent:
                self.frontend.store.update_outbound(self.client_id, entry[SEQ], packet_id, SENT)
                if entry[MESSAGE].qos == 2:
                    # (a partial: a lambda here would make ``self`` a cell of every call)
                    self.frontend.when_durable(partial(self._transmit_later, entry))
                    return True
        if connection.send_publish(entry[MESSAGE], packet_id, False):
            return True
        del in_flight[packet_id]  # too big for this client: as if delivered
        self._drop(entry)
        return False

    def _transmit_later(self, entry: Outbound, stored: bool) -> None:
        """A QoS 2 PUBLISH whose packet id is on disk (or not: ``stored`` false) goes out,
        if its connection and flow are still there."""
        if not stored:
            self._unsend(entry)
            return
        connection = self.connection
        if (connection is not None and self._by_packet_id.get(entry[PACKET_ID]) is entry
                and not self._send(entry, connection)):
            self.pump()

    def _unsend(self, entry: Outbound) -> None:
        """Its packet id never reached the disk: the QoS 2 PUBLISH must not go out with it.
        Back to the queue (in order) it goes, and the connection closes; the next one
        sends it under a packet id that is stored first."""
        if self._by_packet_id.get(entry[PACKET_ID]) is entry:
            del self._by_packet_id[entry[PACKET_ID]]
        entry[PACKET_ID], entry[STATE] = None, QUEUED
        self._queued = deque(sorted((*self._queued, entry[SEQ])))
        if self.connection is not None:
            self.connection.store_failed("QoS 2 PUBLISH")

    def resume(self) -> None:
        """After a (re)connect: resend what is in flight, in order, then the queue."""
        connection = self.connection
        if connection is None:
            return
        for entry in list(self._by_packet_id.values()):
            if entry[STATE] == SENT:
                self.frontend.realm.stats.redelivered["mqtt"] += 1
                connection.send_publish(entry[MESSAGE], entry[PACKET_ID], True)
            else:
                connection.send_pubrel(entry[PACKET_ID])
        self.pump()

    def acknowledged(self, packet_ids: list[int], expected_qos: int) -> None:
        """PUBACKs (QoS 1) or PUBCOMPs (QoS 2), in the order the client sent them (a run
        read together): those deliveries are complete (one whose flow is not at that
        step is ignored); then what waited for room in the window goes, once per run."""
        in_flight = self._by_packet_id
        frontend = self.frontend
        activity = frontend.realm.activity
        for packet_id in packet_ids:
            entry = in_flight.get(packet_id)
            if (entry is None or entry[MESSAGE].qos != expected_qos
                    or (expected_qos == 2 and entry[STATE] != RELEASED)):
                continue
            del in_flight[packet_id]
            if activity is not None:
                frontend.delivery_acknowledged(self, entry)
            self._forget(entry[SEQ])
        self.pump()

    def acknowledged_with_error(self, packet_id: int) -> None:
        """PUBREC with a failure reason (MQTT 5): the client refused it; the flow ends."""
        entry = self._by_packet_id.get(packet_id)
        if entry is not None:
            del self._by_packet_id[packet_id]
            self._drop(entry)
            self.pump()

    def received(self, packet_id: int) -> bool:
        """PUBREC: the client has the QoS 2 message; move to PUBREL."""
        entry = self._by_packet_id.get(packet_id)
        if entry is None or entry[MESSAGE].qos != 2:
            return False
        if entry[STATE] != RELEASED:
            entry[STATE] = RELEASED
            if self.persistent:
                self.frontend.store.update_outbound(self.client_id, entry[SEQ], packet_id,
                                                    RELEASED)
        return True

    def _expired(self, topic: str) -> None:
        realm = self.frontend.realm
        realm.incidents.count(realm.name, "mqtt", EXPIRED, f"client {self.client_id}: {topic}")

    def _drop(self, entry: Outbound) -> None:
        self._forget(entry[SEQ])

    def _forget(self, seq: int) -> None:
        self.outbound.pop(seq, None)
        if self.persistent:
            self.frontend.store.delete_outbound(self.client_id, seq)

    # inbound QoS 2 ----------------------------------------------------------------

    def remember_inbound(self, packet_id: int) -> bool:
        """Record a QoS 2 packet id; False if it is a duplicate (already delivered). One
        more than ``mqtt.max_inbound_qos2`` awaiting PUBREL is counted and closes the
        connection (MQTT 3.1.1 has no way to refuse it; MQTT 5 has 0x93)."""
        if packet_id in self.inbound_qos2:
            return False
        maximum = self.frontend.settings.max_inbound_qos2
        if len(self.inbound_qos2) >= maximum:
            realm = self.frontend.realm
            realm.incidents.count(realm.name, "mqtt", OVER_LIMIT,
                                  f"client {self.client_id}: more than {maximum} QoS 2 "
                                  "messages awaiting PUBREL: connection closed")
            raise MqttProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                                    f"more than {maximum} QoS 2 messages awaiting PUBREL")
        if type(self.inbound_qos2) is frozenset:
            self.inbound_qos2 = set()
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
        if stored and self.outbound is NOTHING_YET:
            self.outbound, self._by_packet_id = {}, {}
        for item in stored:
            if item.state == QUEUED or item.packet_id is None:
                self.outbound[item.seq] = item.message
                self._queue(item.seq)
            else:
                entry = [item.seq, item.packet_id, item.state, item.message, 0.0, None, None]
                self.outbound[entry[SEQ]] = entry
                self._by_packet_id[item.packet_id] = entry
        if self.outbound:
            self._last_seq = max(self.outbound)

    # core Peer --------------------------------------------------------------------

    def supports(self, role: str, feature: str) -> bool:
        return False

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        """MQTT has no server-side unsubscribe: the filter is dropped (from a persistent
        session's stored state too) and nothing is sent, so its messages stop, as on
        Mosquitto after an ACL reload; the core counts it (incident ``revoked``)."""
        mine = self._mine(subscription.id)
        if mine is not None:
            self.frontend.unsubscribe(self, mine.topic_filter)

    def registration_revoked(self, registration: object, reason: str) -> None:
        """MQTT sessions never register."""

    def kill(self, reason: str, message: str | None) -> None:
        if self.connection is not None:
            self.connection.kill(reason, message)
