"""One MQTT bridge: the router as an MQTT client of a remote broker, inside one realm.

Start here. A :class:`Bridge` is two things at once:

* towards the core, a session of its realm (a :class:`router.core.peer.Peer`) that acts
  with the configured role as authid ``bridge-<name>``: it subscribes to the local filter
  of every ``out`` / ``both`` mapping and publishes what the remote sends on ``in`` /
  ``both`` mappings, authorized by the realm's rules like any client;
* towards the remote broker, an MQTT 3.1.1 or 5 client (:mod:`router.bridge.client`, our
  own sans-I/O codec on Twisted) that connects, subscribes to the remote filters, keeps the
  connection alive with PINGREQ and reconnects with a capped exponential back-off.

QoS >= 1 messages for the remote wait in a bounded queue written to the engine's
:class:`router.core.bridge_queue.BridgeQueueStore` (the publisher's acknowledgement waits
for that write, as for any durable receiver) and leave it, in order, when the remote
acknowledged them (PUBACK, or PUBREC/PUBREL/PUBCOMP); a restarted router sends what is left.
At the bound a new message is dropped and counted (``queue_full``); a QoS 0 message while
the remote is away is dropped and counted (``bridge_offline``).

Loops: a message the bridge brought in carries its authid, and the bridge never sends out
a message published by that authid (also after a restart: retained messages keep it). On
the remote side MQTT 5 subscriptions say no-local; MQTT 3.1.1 has no such option, so the
bridge remembers what it sent on topics its own remote subscriptions cover and drops that
same message once when the remote echoes it (a bounded memory: ``ECHO_MEMORY``).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass

from twisted.internet import task

from router.bridge.client import BridgeFactory, BridgeProtocol, client_tls
from router.bridge.settings import BridgeConfig, TopicMapping
from router.core.bridge_queue import BridgeQueueStore
from router.core.errors import RouterError
from router.core.incidents import BRIDGE_OFFLINE, EXPIRED, QUEUE_FULL, UNREPRESENTABLE
from router.core.model import Publication, SessionInfo, remaining
from router.core.options import PublishOptions, SubscribeOptions
from router.core.payload import from_bytes, to_bytes
from router.core.peer import Registration, Subscription
from router.core.realm import Realm, durable_callback
from router.core.router import Router
from router.core.topic import from_mqtt, mqtt_pattern, topic_matches
from router.mqtt.packets import (Connack, Connect, Disconnect, Packet, Pingreq, Pingresp,
                                 Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode,
                                 Suback, Subscribe, SubscriptionOptions)
from router.mqtt.persistence import StoredMessage
from router.mqtt.primitives import MQTT_5, free_packet_id

log = logging.getLogger(__name__)

INCIDENTS = "bridge"
"""The protocol its drops are counted under (with the bridge's name in the detail)."""
ECHO_MEMORY = 1000
"""MQTT 3.1.1: messages sent out whose echo from the remote is still expected, at most."""
FORWARDED_PROPERTIES = ("payload_format_indicator", "content_type", "response_topic",
                        "correlation_data", "user_property")
"""MQTT 5 properties a bridge carries across, both ways."""
SENT, RELEASED = "sent", "released"


@dataclass(slots=True)
class _Queued:
    """One message in the bridge's queue."""

    seq: int
    message: StoredMessage
    durable: bool
    """Written to the store (QoS >= 1); a retained QoS 0 message owed at start-up is not."""
    packet_id: int | None = None
    state: str | None = None
    """None (waiting), ``sent`` (PUBLISH out) or ``released`` (PUBREL out, QoS 2)."""
    sent_before: bool = False


class Bridge:
    """A bridge's session in its realm and its client connection to the remote broker."""

    def __init__(self, config: BridgeConfig, router: Router, realm: Realm,
                 store: BridgeQueueStore, reactor, payload_mapping: str) -> None:
        self.config = config
        self.router = router
        self.realm = realm
        self.store = store
        self.reactor = reactor
        self.payload_mapping = payload_mapping
        self.info = SessionInfo(router.new_session_id(), realm.name, config.authid, config.role,
                                "bridge", protocol="mqtt.bridge",
                                transport={"type": "bridge",
                                           "peer": f"{config.host}:{config.port}"},
                                client_id=config.mqtt_client_id)
        self._tls = None if config.tls is None else client_tls(config.tls, config.host)
        self.connection: BridgeProtocol | None = None
        self.online = False
        """CONNACK accepted and the connection still up ($SYS ``connection/<name>/state``)."""
        self.running = False
        """This node runs the bridge (always once started, with the embedded engine; while
        it holds the bridge's lock, with the Redis engine)."""
        self._writable = True
        self.queue: dict[int, _Queued] = {}
        """By seq, oldest first: every message not yet acknowledged by the remote."""
        self._unsent: deque[int] = deque()
        self._inflight: dict[int, _Queued] = {}
        self._window = config.max_inflight
        self._max_qos = 2
        """What the remote takes (MQTT 5 CONNACK ``maximum_qos``): higher goes at this QoS."""
        self._retain_available = True
        """False when the remote said it keeps no retained messages (it would refuse them)."""
        self._subscribe_id: int | None = None
        """The packet id of the SUBSCRIBE waiting for its SUBACK (not reused meanwhile)."""
        self._seq = itertools.count(1)
        self._next_packet_id = 1
        self._inbound_qos2: set[int] = set()
        self._out: dict[int, TopicMapping] = {}
        """Core subscription id -> the mapping it forwards out."""
        self._in = [(*mqtt_pattern(m.remote_filter), m) for m in config.topics if m.comes_in]
        self._last_publication: int | None = None
        self._echoes: Counter[tuple[str, bytes]] = Counter()
        self._echo_order: deque[tuple[str, bytes]] = deque()
        self._attempts = 0
        self._retry = None
        self._connack_timer = None
        self._pinger: task.LoopingCall | None = None
        self._ping_due = False
        self._stopping = False
        self.forwarded_out = 0
        """Messages handed to the remote (QoS 0 written, QoS >= 1 acknowledged)."""
        self.forwarded_in = 0
        """Messages from the remote published in the realm."""
        self.connects = 0

    # lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """This node runs the bridge (from now, or again): read its queue, then join the
        realm, subscribe the ``out`` filters and connect."""
        self._stopping = False
        self.running = True
        self.store.load(self._loaded, self._not_loaded)

    def _not_loaded(self, why: str) -> None:
        if self._stopping:
            return
        log.warning("bridge %s: its queue cannot be read (%s): again in %.1f s",
                    self.config.name, why, self.config.reconnect_min)
        self._retry = self.reactor.callLater(self.config.reconnect_min, self.start)

    def _loaded(self, rows: list[tuple[int, bytes]]) -> None:
        if self._stopping:
            return
        for seq, blob in rows:
            self.queue[seq] = _Queued(seq, StoredMessage.unpack(blob), True)
            self._unsent.append(seq)
        self._seq = itertools.count(max(self.queue, default=0) + 1)
        if self.queue:
            log.info("bridge %s: %d queued message(s) restored", self.config.name,
                     len(self.queue))
        self.router.track(self)
        self.realm.attach(self)
        subscriptions = []
        for mapping in self.config.topics:
            if not mapping.goes_out:
                continue
            levels, match = mqtt_pattern(mapping.local_filter)
            try:
                subscription = self.realm.subscribe(self, levels, SubscribeOptions(
                    match, get_retained=True))
            except RouterError as exc:
                log.error("bridge %s: cannot forward %s out: %s", self.config.name,
                          mapping.local_filter, exc.message or exc.uri)
                continue
            self._out[subscription.id] = mapping
            subscriptions.append(subscription)
        for subscription in subscriptions:
            self.realm.send_retained(self, subscription, self.config.max_queued)
        self._connect()

    def stop(self) -> None:
        """Leave the realm and say DISCONNECT (at shutdown, or when another node takes the
        bridge over): what is queued stays stored for whoever runs it next."""
        self._stopping = True
        self.running = False
        for timer in (self._retry, self._connack_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._stop_pinger()
        connection, self.connection, self.online = self.connection, None, False
        if connection is not None:
            connection.send(Disconnect())
            connection.close()
        self.realm.detach(self)
        self.router.forget(self)
        self._out.clear()
        self.queue.clear()  # the store has it: read again by the next start
        self._unsent.clear()
        self._inflight.clear()
        self._inbound_qos2.clear()

    def _connect(self) -> None:
        self._retry = None
        config = self.config
        factory = BridgeFactory(self)
        if self._tls is not None:
            self.reactor.connectSSL(config.host, config.port, factory, self._tls,
                                    timeout=config.connect_timeout)
        else:
            self.reactor.connectTCP(config.host, config.port, factory,
                                    timeout=config.connect_timeout)

    def connected(self, connection: BridgeProtocol) -> None:
        if self._stopping:  # an attempt begun before stop
            connection.close()
            return
        config = self.config
        self.connection = connection
        self._writable = True
        properties = {}
        if config.protocol == MQTT_5 and not config.clean_session:
            properties["session_expiry_interval"] = config.session_expiry
        connection.send(Connect(
            protocol_version=config.protocol, clean_start=config.clean_session,
            keep_alive=config.keep_alive, client_id=config.mqtt_client_id,
            username=config.username,
            password=None if config.password is None else config.password.encode(),
            properties=properties))
        self._connack_timer = self.reactor.callLater(config.connect_timeout, connection.abort,
                                                     "no CONNACK in time")

    def lost(self, connection: BridgeProtocol | None, reason: str) -> None:
        if connection is not None and connection is not self.connection:
            return
        was_online = self.online
        self.online = False
        self.connection = None
        self._subscribe_id = None
        self._stop_pinger()
        if self._connack_timer is not None and self._connack_timer.active():
            self._connack_timer.cancel()
        if self._stopping:
            return
        delay = min(self.config.reconnect_max,  # (the exponent capped: a float has a bound)
                    self.config.reconnect_min * 2 ** min(self._attempts, 32))
        delay *= random.uniform(0.8, 1.0)  # edges that lost one cloud do not all come back at once
        self._attempts += 1
        (log.warning if was_online else log.info)(
            "bridge %s: %s %s:%d: %s; again in %.1f s", self.config.name,
            "lost" if was_online else "cannot reach", self.config.host, self.config.port,
            reason, delay)
        self._retry = self.reactor.callLater(delay, self._connect)

    def writable(self, connection: BridgeProtocol, writable: bool) -> None:
        if connection is self.connection:
            self._writable = writable
            if writable:
                self._pump()
                self.realm.backlogs.resume(self)

    # packets from the remote --------------------------------------------------------------

    def received(self, connection: BridgeProtocol, packet: Packet) -> None:
        if connection is not self.connection:
            return
        kind = type(packet)
        if kind is Puback or kind is Pubcomp:
            entry = self._inflight.pop(packet.packet_id, None)  # type: ignore[union-attr]
            if entry is not None:
                self._done(entry)
        elif kind is Pubrec:
            self._pubrec(packet)  # type: ignore[arg-type]
        elif kind is Publish:
            self._incoming(connection, packet)  # type: ignore[arg-type]
        elif kind is Pubrel:
            self._inbound_qos2.discard(packet.packet_id)  # type: ignore[union-attr]
            connection.send(Pubcomp(packet.packet_id))  # type: ignore[union-attr]
        elif kind is Pingresp:
            self._ping_due = False
        elif kind is Connack:
            self._connack(connection, packet)  # type: ignore[arg-type]
        elif kind is Suback:
            self._suback(packet)  # type: ignore[arg-type]
        elif kind is Disconnect:
            connection.abort(f"DISCONNECT from the remote (reason 0x"
                             f"{packet.reason_code:02X})")  # type: ignore[union-attr]

    def _connack(self, connection: BridgeProtocol, packet: Connack) -> None:
        if self._connack_timer is not None and self._connack_timer.active():
            self._connack_timer.cancel()
        if packet.reason_code != ReasonCode.SUCCESS:
            code = packet.reason_code
            name = ReasonCode(code).name if code in ReasonCode._value2member_map_ else code
            log.warning("bridge %s: %s:%d refused the connection: %s", self.config.name,
                        self.config.host, self.config.port, name)
            connection.abort(f"CONNACK refused ({name})")
            return
        self.online = True
        self._attempts = 0
        self.connects += 1
        properties = packet.properties
        self._window = min(self.config.max_inflight,
                           properties.get("receive_maximum", 0xFFFF), 0xFFFF)
        self._max_qos = properties.get("maximum_qos", 2)
        self._retain_available = bool(properties.get("retain_available", 1))
        log.info("bridge %s: connected to %s:%d (session present: %s)", self.config.name,
                 self.config.host, self.config.port, packet.session_present)
        self._resume_inflight(connection, packet.session_present)
        if self._in:
            retain_handling = 1 if packet.session_present else 0
            self._subscribe_id = self._new_packet_id()
            connection.send(Subscribe(self._subscribe_id, [
                (mapping.remote_filter, SubscriptionOptions(min(mapping.qos, self._max_qos),
                                                            no_local=True,
                                                            retain_as_published=True,
                                                            retain_handling=retain_handling))
                for _, _, mapping in self._in]))
        keep_alive = packet.properties.get("server_keep_alive", self.config.keep_alive)
        if keep_alive:
            self._ping_due = False
            self._pinger = task.LoopingCall(self._ping, connection)
            self._pinger.clock = self.reactor
            self._pinger.start(keep_alive, now=False)
        self._pump()
        self.realm.backlogs.resume(self)

    def _resume_inflight(self, connection: BridgeProtocol, session_present: bool) -> None:
        """What was in flight when the last connection ended: the remote that kept the
        session finishes each flow where it stopped (PUBLISH again with DUP, or PUBREL);
        one that did not gets them again as new messages, first, in order."""
        entries = sorted(self._inflight.values(), key=lambda entry: entry.seq)
        if not session_present:
            self._inflight.clear()
            self._inbound_qos2.clear()
            self._unsent.extendleft(reversed([entry.seq for entry in entries]))
            return
        for entry in entries:
            if entry.state == RELEASED:
                connection.send(Pubrel(entry.packet_id))  # type: ignore[arg-type]
            else:
                connection.send(self._publish(entry.message, entry.packet_id, dup=True))

    def _suback(self, packet: Suback) -> None:
        self._subscribe_id = None
        for (_, _, mapping), code in zip(self._in, packet.reason_codes):
            if code >= 0x80:
                log.error("bridge %s: the remote refused the subscription %s (reason 0x%02X)",
                          self.config.name, mapping.remote_filter, code)

    def _ping(self, connection: BridgeProtocol) -> None:
        if self._ping_due:
            connection.abort("no PINGRESP within the keep alive")
            return
        self._ping_due = True
        connection.send(Pingreq())

    def _stop_pinger(self) -> None:
        if self._pinger is not None and self._pinger.running:
            self._pinger.stop()
        self._pinger = None

    # in: remote -> realm ------------------------------------------------------------------

    def _incoming(self, connection: BridgeProtocol, packet: Publish) -> None:
        qos, packet_id = packet.qos, packet.packet_id
        if qos == 2 and packet_id in self._inbound_qos2:
            connection.send(Pubrec(packet_id))  # a resent one: published already
            return
        mapping = self._mapping_in(packet.topic)
        key = (packet.topic, packet.payload)
        if mapping is None or self._echoes.get(key):
            if mapping is not None:
                self._echoes[key] -= 1  # our own message, back from the remote
            self._acknowledge(connection, qos, packet_id, True)
            return
        if qos == 2:
            self._inbound_qos2.add(packet_id)  # type: ignore[arg-type]
        local = mapping.to_local(packet.topic)
        properties = {key: packet.properties[key] for key in FORWARDED_PROPERTIES
                      if key in packet.properties}
        expiry = packet.properties.get("message_expiry_interval")
        args, kwargs = from_bytes(packet.payload, self.payload_mapping)
        options = PublishOptions(qos=qos, retain=packet.retain and bool(packet.payload),
                                 retain_clear=packet.retain and not packet.payload,
                                 exclude_me=True)

        def stored(ok: bool) -> None:
            if not ok:  # not acknowledged: the remote sends it again on the next connection
                connection.abort("a message from the remote could not be stored")
            elif connection is self.connection:
                self._acknowledge(connection, qos, packet_id, True)

        try:
            self.realm.publish(self.info, from_mqtt(local), args, kwargs, options,
                               durable_callback(stored) if qos else None, len(packet.payload),
                               payload=packet.payload, properties=properties or None,
                               expires_at=None if expiry is None else time.time() + expiry,
                               mqtt_topic=local)
        except RouterError as exc:  # counted by the realm; sending it again would not help
            log.info("bridge %s: %s not published: %s", self.config.name, local,
                     exc.message or exc.uri)
            self._inbound_qos2.discard(packet_id)  # type: ignore[arg-type]
            self._acknowledge(connection, qos, packet_id, False)
            return
        self.forwarded_in += 1

    def _mapping_in(self, topic: str) -> TopicMapping | None:
        levels = from_mqtt(topic)
        for pattern, match, mapping in self._in:
            if topic_matches(pattern, match, levels):
                return mapping
        return None

    def _acknowledge(self, connection: BridgeProtocol, qos: int, packet_id: int | None,
                     accepted: bool) -> None:
        code = ReasonCode.SUCCESS if accepted else ReasonCode.NOT_AUTHORIZED
        if qos == 1:
            connection.send(Puback(packet_id, code))  # type: ignore[arg-type]
        elif qos == 2:
            connection.send(Pubrec(packet_id, code))  # type: ignore[arg-type]

    # out: realm -> remote -----------------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        mapping = self._out.get(subscription.id)
        publisher = publication.publisher
        if (mapping is None or publication.publication_id == self._last_publication
                or (publisher is not None and publisher.authid == self.info.authid)):
            return  # not ours, sent already (overlapping mappings), or brought in by us
        self._last_publication = publication.publication_id
        topic = publication.mqtt_topic()
        if topic is None:
            self._count(UNREPRESENTABLE, publication.name)
            return
        qos = min(publication.qos, mapping.qos)
        properties = {}
        if publication.properties and self.config.protocol == MQTT_5:
            properties = {key: publication.properties[key] for key in FORWARDED_PROPERTIES
                          if key in publication.properties}
        message = StoredMessage(mapping.to_remote(topic), to_bytes(publication), qos,
                                retained or publication.retain, properties,
                                publication.expires_at)
        if qos or retained:  # a retained one owed at start-up waits for the connection
            self._enqueue(message)
        elif self.online and self._writable:
            self._send_now(message)
        else:
            self._count(BRIDGE_OFFLINE, message.topic)

    def _enqueue(self, message: StoredMessage) -> None:
        if len(self.queue) >= self.config.max_queued:
            self._count(QUEUE_FULL, f"{message.topic} (max_queued {self.config.max_queued})")
            return
        seq = next(self._seq)
        durable = message.qos > 0
        self.queue[seq] = _Queued(seq, message, durable)
        self._unsent.append(seq)
        if durable:
            self.store.append(seq, message.pack())
        self._pump()

    def _pump(self) -> None:
        """Send waiting messages, oldest first, while the window and the transport allow."""
        connection = self.connection
        while (self.online and self._writable and self._unsent
               and len(self._inflight) < self._window):
            entry = self.queue[self._unsent.popleft()]
            message = entry.message
            if message.expires_at is not None and message.expires_at <= time.time():
                self._count(EXPIRED, message.topic)
                self._remove(entry)
                continue
            if min(message.qos, self._max_qos) == 0:
                self._remove(entry)
                self._send_now(message)
                continue
            entry.packet_id = self._new_packet_id()
            entry.state = SENT
            self._inflight[entry.packet_id] = entry
            connection.send(self._publish(message, entry.packet_id,  # type: ignore[union-attr]
                                          dup=entry.sent_before))
            entry.sent_before = True
            self._remember_echo(message)

    def _send_now(self, message: StoredMessage) -> None:
        self.connection.send(self._publish(message, None))  # type: ignore[union-attr]
        self._remember_echo(message)
        self.forwarded_out += 1

    def _publish(self, message: StoredMessage, packet_id: int | None,
                 dup: bool = False) -> Publish:
        properties = message.properties
        if message.expires_at is not None and self.config.protocol == MQTT_5:
            properties = dict(properties, message_expiry_interval=remaining(
                message.expires_at, time.time()))
        qos = 0 if packet_id is None else min(message.qos, self._max_qos)
        return Publish(message.topic, message.payload, qos,
                       message.retain and self._retain_available, dup and qos > 0, packet_id,
                       properties)

    def _pubrec(self, packet: Pubrec) -> None:
        entry = self._inflight.get(packet.packet_id)
        if entry is None:
            self.connection.send(Pubrel(  # type: ignore[union-attr]
                packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if packet.reason_code >= 0x80:  # refused by the remote: the flow ends here
            del self._inflight[packet.packet_id]
            log.info("bridge %s: the remote refused %s (reason 0x%02X)", self.config.name,
                     entry.message.topic, packet.reason_code)
            self._done(entry)
            return
        entry.state = RELEASED
        self.connection.send(Pubrel(packet.packet_id))  # type: ignore[union-attr]

    def _done(self, entry: _Queued) -> None:
        """The remote has the message: it leaves the queue (and the store)."""
        self._remove(entry)
        self.forwarded_out += 1
        self._pump()
        self.realm.backlogs.resume(self)

    def _remove(self, entry: _Queued) -> None:
        del self.queue[entry.seq]
        if entry.durable:
            self.store.delete(entry.seq)

    def _new_packet_id(self) -> int:
        packet_id = free_packet_id(self._next_packet_id, self._inflight)
        if packet_id == self._subscribe_id:
            packet_id = free_packet_id(packet_id % 65535 + 1, self._inflight)
        self._next_packet_id = packet_id % 65535 + 1
        return packet_id

    def _remember_echo(self, message: StoredMessage) -> None:
        """MQTT 3.1.1: a message our own remote subscriptions cover will come back."""
        if self.config.protocol == MQTT_5 or self._mapping_in(message.topic) is None:
            return
        key = (message.topic, message.payload)
        self._echoes[key] += 1
        self._echo_order.append(key)
        if len(self._echo_order) > ECHO_MEMORY:
            old = self._echo_order.popleft()
            if self._echoes[old] > 0:
                self._echoes[old] -= 1
            if not self._echoes[old]:
                del self._echoes[old]

    def _count(self, reason: str, detail: str) -> None:
        self.router.incidents.count(self.realm.name, INCIDENTS, reason,
                                    f"bridge {self.config.name}: {detail}")

    # the rest of the core's Peer ----------------------------------------------------------

    def ready(self) -> bool:
        return self.online and self._writable and len(self._inflight) < self._window

    def backlog_room(self) -> bool:
        """Retained messages owed at start-up go into the queue while it has room."""
        return len(self.queue) < self.config.max_queued

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        """The router closes the remote connection (it reconnects after its back-off)."""
        if self.connection is not None:
            self.connection.abort(message or reason)

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        mapping = self._out.pop(subscription.id, None)
        if mapping is not None:
            log.error("bridge %s: no longer forwards %s out: %s", self.config.name,
                      mapping.local_filter, reason)

    def registration_revoked(self, registration: Registration, reason: str) -> None:
        """A bridge never registers."""

    def send_invocation(self, invocation) -> None:
        """A bridge never registers, so it is never invoked."""

    def send_interrupt(self, invocation, mode: str, reason: str) -> None:
        """A bridge never registers."""

    def send_result(self, call_request: int, args, kwargs, progress: bool) -> None:
        """A bridge never calls."""

    def send_call_error(self, call_request: int, error: str, args, kwargs) -> None:
        """A bridge never calls."""
