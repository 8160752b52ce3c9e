"""One MQTT network connection: CONNECT handshake, packet dispatch, keep-alive.

Transport-agnostic: a transport's subclass says how bytes are written and the connection
closed (``_write_raw``, ``_close_out``; see :mod:`router.mqtt.transports`) and feeds it
bytes with :meth:`data_received`, so MQTT over TCP and over WebSocket share it. The
session it attaches to (and everything routing-related) lives elsewhere.
"""

from __future__ import annotations

import logging
import struct
import time
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Callable, Generator, Iterable, Iterator, TypeVar

from router.core import errors
from router.core.errors import RouterError
from router.core.incidents import TOO_LARGE
from router.core.model import remaining
from router.flow import disconnect_slow_consumer
from router.held import HeldTransport
from router.mqtt.codec import BARE_ACK, PUBACK, PUBCOMP, PUBREC, PUBREL, ServerCodec
from router.mqtt.outlet import FLUSH_AT
from router.mqtt.packets import (Connack, Connect, Disconnect, Pingreq, Pingresp, Puback,
                                 Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Suback,
                                 Subscribe, Unsuback, Unsubscribe)
from router.mqtt.persistence import StoredMessage
from router.mqtt.primitives import MqttProtocolError
from router.mqtt.spread import spread

if TYPE_CHECKING:
    from router.core.model import Publication
    from router.flow import ConnectionFlow
    from router.limits import Gate
    from router.mqtt.frontend import Identity, MqttFrontend
    from router.mqtt.session import MqttSession

log = logging.getLogger(__name__)

SERVER_RECEIVE_MAXIMUM = 100

_PACKET_ID = struct.Struct(">H").pack

_SUCCESS = ReasonCode.SUCCESS
"""(An enum member read from its class costs ~150 ns on Python 3.11; once per PUBLISH.)"""

T = TypeVar("T")


@lru_cache(maxsize=64)
def _keep_alive_span(keep_alive: int) -> float:
    """Seconds without a packet before the keep-alive runs out: 1.5 times the keep alive
    (MQTT-3.1.2-24), one float object for the connections with the same keep alive (one
    each was 24 bytes of every connection)."""
    return keep_alive * 1.5


NO_PROPERTIES: dict = {}
"""The properties of a PUBLISH that has none (shared, never written)."""


class MqttConnection(ServerCodec):
    """The protocol state of one connection, and its codec (server side, filters decoded
    lazily): one object, not two (a codec of its own was 104 bytes of every connection).

    Slotted, with its alias tables and inbound window made on first use; its keep-alive is
    a deadline on the frontend's one wheel (:class:`router.core.scheduler.Deadlines`), not
    a timer of its own. Writes go straight to the transport (the subclass's ``_write_raw``);
    a :class:`HeldTransport` is put between them only for a refused login's held answer."""

    __slots__ = ("frontend", "flow", "session", "send_quota", "_client_max_packet", "_aliases",
                 "outbound_alias_limit", "_keep_alive", "last_read",
                 "deadline_next", "deadline_prev", "_will", "_closed", "_inbound_open",
                 "_connect_state", "gate", "_held", "transport", "_unsent", "_unsent_bytes")

    transport_name: str
    """``mqtt`` or ``mqtt.websocket`` (the transport's subclass says)."""

    def __init__(self, frontend: "MqttFrontend", flow: "ConnectionFlow", transport: object,
                 gate: "Gate | None") -> None:
        self.frontend = frontend
        self.flow = flow
        """Outbound bound (QoS 0 dropped while ``flow.over``, the QoS >= 1 queue waits
        while ``flow.paused``) and intake pausing."""
        flow.owner = self
        self.gate = gate
        """The listener's admission of this connection: CONNECT ends its handshake timer,
        and one over a cap gets CONNACK 0x97 (quota exceeded)."""
        self._held: HeldTransport | None = None
        """Between the connection and its transport while a refused login's answer is held
        back (:meth:`hold_answers`); else None."""
        ServerCodec.__init__(self, max_packet_size=frontend.settings.max_packet_size)
        self.session: MqttSession | None = None
        self.send_quota = 65535
        self._client_max_packet = None
        self._aliases: tuple[dict[int, str], dict[str, int]] | None = None
        """(the client's topic aliases, ours to the client) once either is used (MQTT 5)."""
        self.outbound_alias_limit = 0
        """Topic aliases this connection may send (MQTT 5); then its PUBLISH bytes are its
        own, not shared with other receivers."""
        self._keep_alive: float | None = None
        self.last_read = 0.0
        """When the last packet came: the reactor turn's time (:attr:`MqttFrontend.clock`),
        a float shared with the turn's other reads, not one of its own."""
        self.deadline_next = self.deadline_prev = None
        self._will = None
        self._closed = False
        self._unsent: list[bytes] | None = None
        """Packets of this reactor turn, written together at its end (:meth:`flush`): one
        transport write per turn instead of one per packet."""
        self._unsent_bytes = 0
        self._inbound_open: set[int] | None = None
        """Packet ids of this connection's QoS > 0 publishes that hold a slot of the
        Receive Maximum (MQTT 5 4.9): until PUBACK, or for QoS 2 until PUBCOMP (or a
        PUBREC with an error). At most SERVER_RECEIVE_MAXIMUM + 1 (then 0x93)."""
        self._connect_state: str | None = None
        """"checking" while CONNECT is authenticated, "waiting" when the answer comes later
        (packets after CONNECT stay in the codec until then); "spreading" while a packet's
        work goes on over several reactor turns (:mod:`router.mqtt.spread`: the packets
        after it wait in the codec, and reads pause, until it is done); else None. Outside
        the calls that handle CONNECT, it is None or one of the two that hold packets
        back ("waiting", "spreading")."""
        self.transport = transport
        """The Twisted transport (its TLS client certificate)."""

    @property
    def peer(self) -> str:
        """The client's address, as logs show it (the transport's subclass says how; made
        when asked: the session's SessionInfo keeps it, the connection need not)."""
        raise NotImplementedError

    @property
    def info_peer(self) -> object:
        """What the session's SessionInfo keeps as its peer while connected: the text (a
        transport that keeps it anyway), or an object whose ``str()`` makes it."""
        return self.peer

    @property
    def version(self) -> int:
        return self.protocol_version or 4

    # bytes in -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self.receive_data(data)
        state = self._connect_state
        if state is not None:  # "waiting" or "spreading": the packets wait
            if state == "spreading":
                self._touch()  # the client is alive; its packets wait for ours to be done
            if self.buffered() > self.frontend.settings.max_packet_size:
                self._fail(ReasonCode.QUOTA_EXCEEDED, "too much data held back"
                           if state == "spreading" else "too much data before CONNACK", False)
            return
        self._process()

    def _process(self) -> None:
        """Handle the complete packets in the codec (stopping while CONNECT is checked, or
        while a packet's work goes on in later turns)."""
        self._guarded(self._handle_buffered)

    def _handle_buffered(self) -> None:
        next_item = self.next_item
        item = next_item()
        if item is not None:
            self._touch()  # once per read: the keep-alive clock needs no finer grain
        while item is not None:
            # the commonest packets come as parts (see ServerCodec.next_item), not objects
            kind = type(item)
            if kind is tuple and self.session is not None:
                topic, payload, qos, retain, packet_id = item
                if qos or not self.flow.publisher:
                    self._on_publish(topic, payload, qos, retain, packet_id, NO_PROPERTIES)
                else:  # the commonest: :meth:`_on_publish`'s QoS 0 path, one call less
                    self._publish(topic, payload, 0, retain, NO_PROPERTIES, None)
            elif kind is int and self.session is not None:
                # a bare acknowledgement, with the ones of its kind right behind it
                kind = item >> 16
                self._on_acks(kind, self.more_bare_acks(kind, item & 0xFFFF))
            else:
                self._handle(item)
            if self._closed or self._connect_state is not None:  # (waiting or spreading)
                break
            item = next_item()

    def _guarded(self, work: Callable[[], None]) -> None:
        """Run packet handling: a protocol error closes the connection with its reason."""
        if self._closed:
            return
        try:
            work()
        except MqttProtocolError as error:
            self._fail(error.reason_code, error.message, error.send_connack)
        except Exception:  # a router bug must cost this connection only, and be seen
            log.exception("MQTT connection %s: unexpected error", self.peer)
            self._fail(ReasonCode.UNSPECIFIED_ERROR, "internal error", False)

    def _handle(self, packet) -> None:
        kind = type(packet)
        if kind is Connect:
            if self.session is not None or self._connect_state is not None:
                raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "second CONNECT")
            self._on_connect(packet)
            return
        if self.session is None:
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "CONNECT must come first")
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR,
                                    f"{kind.__name__.upper()} is not supported here")
        handler(self, packet)

    # connect --------------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        gate = self.gate
        if gate is not None:
            refused = gate.refused
            self._handshake_passed()  # the handshake timer stops
            if refused:  # over a cap of the listener
                self._send(Connack(False, ReasonCode.QUOTA_EXCEEDED))
                self._close_now()
                return
        if self.version != 5 and self._granted_keep_alive(packet.keep_alive) < packet.keep_alive:
            # MQTT 3.1.1 cannot be told another keep alive: refused (0x02), as by Mosquitto
            log.info("MQTT client %s: keep alive %d s is over the maximum of %d s", self.peer,
                     packet.keep_alive, self.frontend.settings.max_keepalive)
            self._send(Connack(False, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID))
            self._close_now()
            return
        self._connect_state = "checking"
        self.frontend.authenticate(self, packet, partial(self._authenticated, packet))
        if self._connect_state == "checking":
            self._connect_state = "waiting"

    def _authenticated(self, packet: Connect, identity: "int | Identity") -> None:
        """Attach the session (at once, or once another node let go of it)."""
        resume = self._connect_state == "waiting"
        self._connect_state = None
        if self._closed:
            return
        if isinstance(identity, int):
            self._send(Connack(False, identity))
            self._close_now()
            return
        self._connect_state = "attaching"
        self.frontend.connect(self, packet, identity, partial(self._attached, packet, resume))
        if self._connect_state == "attaching":
            self._connect_state = "waiting"

    def _attached(self, packet: Connect, resume: bool, session: "MqttSession | int",
                  session_present: bool, assigned_id: str | None) -> None:
        """CONNACK; then, if the answer came later, the packets that followed CONNECT.
        ``session`` is a refusal's reason code when the client id is another owner's."""
        resume = resume or self._connect_state == "waiting"
        self._connect_state = None
        if isinstance(session, int):
            self._send(Connack(False, session))
            self._close_now()
            return
        if self._closed:  # gone while its session was fetched from another node
            self.frontend.disconnected(self, session, None)
            return
        settings = self.frontend.settings
        keep_alive = self._granted_keep_alive(packet.keep_alive)
        self.session = session
        properties = {}
        if self.version == 5:
            self.send_quota = packet.properties.get("receive_maximum", 65535)
            self._client_max_packet = packet.properties.get("maximum_packet_size")
            self.outbound_alias_limit = min(packet.properties.get("topic_alias_maximum", 0),
                                             settings.topic_alias_maximum)
            if self.outbound_alias_limit:
                self._aliases = ({}, {})
            properties = {"receive_maximum": SERVER_RECEIVE_MAXIMUM,
                          "topic_alias_maximum": settings.topic_alias_maximum,
                          "shared_subscription_available": 1,
                          "maximum_packet_size": settings.max_packet_size}
            if assigned_id is not None:
                properties["assigned_client_identifier"] = assigned_id
            if session.expiry != packet.properties.get("session_expiry_interval", 0):
                # the server's choice differs from the request (a cap): say so (3.2.2.3.2)
                properties["session_expiry_interval"] = int(session.expiry)
            if keep_alive != packet.keep_alive:
                properties["server_keep_alive"] = keep_alive
        else:
            self.send_quota = SERVER_RECEIVE_MAXIMUM
        self._will = packet.will
        if keep_alive:
            self._keep_alive = _keep_alive_span(keep_alive)
            self._touch()
            self.frontend.deadlines.watch(self)
        self._send(Connack(session_present, ReasonCode.SUCCESS, properties))
        session.resume()
        if resume:
            self._process()

    def _handshake_passed(self) -> None:
        """CONNECT arrived: the gate's handshake timer stops."""
        self.gate.passed()  # type: ignore[union-attr]

    def _granted_keep_alive(self, requested: int) -> int:
        """The keep alive the server uses: the request, or ``mqtt.max_keepalive`` for one
        that is 0 (none) or above it (0 = no maximum). An MQTT 5 client hears of it in
        CONNACK; an MQTT 3.1.1 client asking for no keep alive is silently held to it."""
        maximum = self.frontend.settings.max_keepalive
        if maximum and (requested == 0 or requested > maximum):
            return maximum
        return requested

    # publish in -------------------------------------------------------------------------

    def _on_publish_packet(self, packet: Publish) -> None:
        self._on_publish(packet.topic, packet.payload, packet.qos, packet.retain,
                         packet.packet_id, packet.properties)

    def _on_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                    packet_id: int | None, properties: dict) -> None:
        if properties:
            topic = self._resolve_alias(topic, properties)
        flow = self.flow
        if not flow.publisher:
            flow.became_publisher()
        if not qos:
            self._publish(topic, payload, 0, retain, properties, None)
            return
        if self.protocol_version == 5:
            if self._inbound_open is None:
                self._inbound_open = set()
            self._inbound_open.add(packet_id)  # type: ignore[arg-type]
            if len(self._inbound_open) > SERVER_RECEIVE_MAXIMUM:
                raise MqttProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                                        "more unacknowledged QoS > 0 publishes than allowed")
        session = self.session
        if qos == 2 and not session.remember_inbound(packet_id):
            # a duplicate, routed already: acknowledge once its receipt is on disk too
            self.frontend.when_durable(
                lambda ok: self._emit(BARE_ACK(PUBREC, 2, packet_id)) if ok
                else self.store_failed("PUBREC"))
            return
        reason = self._publish(topic, payload, qos, retain, properties,
                               partial(self._stored, qos, packet_id))
        if reason != _SUCCESS:
            if qos == 2:
                session.release_inbound(packet_id)
            self._acknowledge(qos, packet_id, reason)

    def _stored(self, qos: int, packet_id: int, publication: "Publication", ok: bool) -> None:
        """PUBACK / PUBREC only once the publication is stored where its QoS requires (the
        realm's ``on_durable``, a partial: no closure and no frame of its own per publish).

        MQTT 3.1.1 has no negative acknowledgement: a failed commit closes the connection,
        and the client sends the message again when it reconnects."""
        if ok:
            self._acknowledge(qos, packet_id, _SUCCESS)
            return
        if qos == 2:  # not received after all: a retransmission is routed again
            self.session.release_inbound(packet_id)
        if self.version == 5:
            self._acknowledge(qos, packet_id, ReasonCode.UNSPECIFIED_ERROR)
        else:
            self.store_failed("PUBACK" if qos == 1 else "PUBREC")

    def _acknowledge(self, qos: int, packet_id: int, reason: int) -> None:
        """PUBACK (QoS 1) or PUBREC (QoS 2) of an inbound publish. A PUBACK, or a PUBREC
        with a failure, frees its slot of the Receive Maximum (a successful PUBREC's slot
        waits for PUBCOMP)."""
        if self._inbound_open and (qos == 1 or reason >= 0x80):
            self._inbound_open.discard(packet_id)
        if reason == _SUCCESS:
            self._emit(BARE_ACK(PUBACK if qos == 1 else PUBREC, 2, packet_id))
        else:
            self._send((Puback if qos == 1 else Pubrec)(packet_id, reason))

    def store_failed(self, what: str) -> None:
        """The store could not write what ``what`` would promise: close, promise nothing."""
        if not self._closed:
            self._fail(ReasonCode.UNSPECIFIED_ERROR, f"the router could not store the state "
                       f"a {what} promises", False)

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: dict,
                 on_durable: "Callable[[Publication, bool], None] | None") -> int:
        """Route an inbound PUBLISH; returns the MQTT 5 reason code for its acknowledgement."""
        try:
            self.frontend.publish(self.session.info, topic, payload, qos, retain, properties,
                                  on_durable)
        except RouterError as exc:
            self.frontend.count_refusal(self.session, f"publish to {topic}", exc)
            if exc.uri == errors.NOT_AUTHORIZED:
                return ReasonCode.NOT_AUTHORIZED
            if exc.uri == errors.INVALID_ARGUMENT:
                return ReasonCode.PAYLOAD_FORMAT_INVALID
            if exc.uri == errors.LIMIT_EXCEEDED:  # a retained event over the retained quota
                return ReasonCode.QUOTA_EXCEEDED
            return ReasonCode.TOPIC_NAME_INVALID
        return _SUCCESS

    def _resolve_alias(self, topic: str, properties: dict) -> str:
        alias = properties.get("topic_alias")
        if alias is None:
            return topic
        if alias > self.frontend.settings.topic_alias_maximum:
            raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID,
                                    f"topic alias {alias} is over the maximum")
        aliases = self._aliases
        if topic:
            if aliases is None:
                aliases = self._aliases = ({}, {})
            aliases[0][alias] = topic
            return topic
        topic = aliases[0].get(alias) if aliases is not None else None
        if topic is None:
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}")
        return topic

    def _on_acks(self, kind: int, packet_ids: list[int]) -> None:
        """Bare acknowledgements of one kind (packet ids only: success), in the order the
        client sent them, by their first byte."""
        if kind == PUBACK:
            self.session.acknowledged(packet_ids, 1)
        elif kind == PUBREC:
            for packet_id in packet_ids:
                self._received(packet_id)
        elif kind == PUBCOMP:
            self.session.acknowledged(packet_ids, 2)
        else:
            self._on_pubrels(packet_ids)

    def _on_pubrel_packet(self, packet: Pubrel) -> None:
        self._on_pubrels([packet.packet_id])

    def _on_pubrels(self, packet_ids: list[int]) -> None:
        """PUBRELs, in order: each PUBCOMP once the release of its packet id is stored (one
        wait for the run)."""
        release = self.session.release_inbound
        found = [release(packet_id) for packet_id in packet_ids]

        def complete(ok: bool) -> None:
            if not ok:
                self.store_failed("PUBCOMP")
                return
            for packet_id, known in zip(packet_ids, found):
                if self._inbound_open:  # a QoS 2 flow's slot frees at PUBCOMP
                    self._inbound_open.discard(packet_id)
                if known:
                    self._emit(BARE_ACK(PUBCOMP, 2, packet_id))
                else:
                    self._send(Pubcomp(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

        self.frontend.when_durable(complete)

    # acknowledgements of our publishes --------------------------------------------------

    def _on_puback(self, packet: Puback) -> None:
        self.session.acknowledged([packet.packet_id], 1)

    def _on_pubrec(self, packet: Pubrec) -> None:
        if packet.reason_code >= 0x80:
            self.session.acknowledged_with_error(packet.packet_id)
            return
        self._received(packet.packet_id)

    def _received(self, packet_id: int) -> None:
        if self.session.received(packet_id):
            self._emit(BARE_ACK(PUBREL, 2, packet_id))
        else:
            self.send_pubrel(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        self.session.acknowledged([packet.packet_id], 2)

    # subscribe ----------------------------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        identifier = (packet.properties.get("subscription_identifier") or [None])[0]
        frontend, session = self.frontend, self.session
        codes: list[int] = []
        retained: list[Callable[[], None]] = []

        def work() -> Iterator[None]:
            # every filter decoded and checked before any is applied: a malformed
            # packet closes the connection having changed nothing
            subscriptions = yield from _taken(packet.subscriptions)
            for topic_filter, options in subscriptions:
                code, deliver_retained = frontend.subscribe(session, topic_filter, options,
                                                            identifier)
                codes.append(code)
                if deliver_retained is not None:
                    retained.append(deliver_retained)
                yield

        def turn_over(finished: bool) -> None:
            # SUBACK once every filter is in place; the retained messages of each turn's
            # subscriptions go in that turn, before a live event of a later turn could
            # (a PUBLISH may precede the SUBACK, MQTT-3.8.4)
            if finished:
                self._send(Suback(packet.packet_id, codes))
            for deliver in retained:
                deliver()
            retained.clear()

        self._spread(work(), turn_over)

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        frontend, session = self.frontend, self.session
        codes: list[int] = []

        def work() -> Iterator[None]:
            for topic_filter in (yield from _taken(packet.topic_filters)):
                codes.append(frontend.unsubscribe(session, topic_filter))
                yield

        def turn_over(finished: bool) -> None:
            if finished:
                self._send(Unsuback(packet.packet_id, codes))

        self._spread(work(), turn_over)

    def _spread(self, work: Iterator[None], turn_over: Callable[[bool], None]) -> None:
        """A packet's work, a few milliseconds per reactor turn; while it takes more than
        one, the packets after it wait and reading pauses (TCP holds the client back)."""
        def turn_done(finished: bool) -> None:
            turn_over(finished)
            if finished == (self._connect_state == "spreading"):
                self._connect_state = None if finished else "spreading"
                self.flow.hold_reading(not finished)
                if finished:
                    self._process()

        spread(work, turn_done,
               lambda run: self.frontend.scheduler.callLater(0, self._guarded, run))

    def _on_pingreq(self, packet: Pingreq) -> None:
        self._send(Pingresp())

    def _on_disconnect(self, packet: Disconnect) -> None:
        expiry = packet.properties.get("session_expiry_interval")
        if expiry and not self.session.persistent:
            # not a valid DISCONNECT (MQTT-3.14.2-2: from 0 to more): a protocol error, so
            # the will stays due and is published
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "DISCONNECT sets a session "
                                    "expiry on a session that had none")
        if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
            self._will = None
        if expiry is not None:
            self.frontend.set_expiry(self.session, expiry)
        self._close_now()

    # bytes out ----------------------------------------------------------------------------

    def send_publish(self, message: StoredMessage, packet_id: int | None, dup: bool) -> bool:
        """False if the client's maximum packet size rules the message out (MQTT 5).

        A QoS 1/2 message without expiry goes from its template in this connection's
        version, made on first use and shared by its receivers of the version: the head is
        ``message.encodings[key]``, the tail ``[-1 - key]``, the packet id goes between.
        (Int keys and bytes values only: a dict of atoms is not tracked by the collector,
        so a queued message's cache is not one more object to scan.)"""
        if packet_id is not None and message.expires_at is None and not self.outbound_alias_limit:
            # the commonest
            encodings = message.encodings
            key = (self.protocol_version or 4) * 2 + dup
            head = encodings.get(key)
            if head is None:
                head, tail = self.encode_publish_template(
                    message.topic, message.payload, message.qos, message.retain, dup,
                    message.properties)
                encodings[key], encodings[-1 - key] = head, tail
            data = head + _PACKET_ID(packet_id) + encodings[-1 - key]
            if self._client_max_packet is not None:
                return self.write_publish(data, message.topic)
            self._emit(data)
            return True
        if self.outbound_alias_limit:
            return self._send_aliased(message, packet_id, dup)
        return self.write_publish(self.encode_publish(message, packet_id, dup), message.topic)

    def encode_publish(self, message: StoredMessage, packet_id: int | None = None,
                       dup: bool = False) -> bytes:
        """A PUBLISH's bytes; without a packet id (QoS 0) they can be shared by receivers
        (with one, :meth:`send_publish` shares its template)."""
        if packet_id is None and message.expires_at is None and (
                not message.properties or self.version != 5):
            return self.encode_plain_publish(message.topic, message.payload,
                                                   message.retain)
        return self.encode(self._publish_packet(message, message.topic, packet_id, dup,
                                                      message.properties))

    @staticmethod
    def _publish_packet(message: StoredMessage, topic: str, packet_id: int | None, dup: bool,
                        properties: dict) -> Publish:
        if message.expires_at is not None:
            properties = dict(properties)
            # the received interval minus the time waited (MQTT-3.3.2-6), rounded up: a
            # message sent at once keeps its interval, and one not yet expired never says 0
            properties["message_expiry_interval"] = remaining(message.expires_at, time.time())
        return Publish(topic, message.payload, message.qos if packet_id else 0, message.retain,
                       dup, packet_id, properties)

    def _send_aliased(self, message: StoredMessage, packet_id: int | None, dup: bool) -> bool:
        """A PUBLISH under a topic alias: the topic name goes with the alias once, then the
        alias alone. Aliases go to topics first come, first served; once the client's
        maximum is used up, further topics are sent by name."""
        topic = message.topic
        aliases = self._aliases[1]  # type: ignore[index]  # (made with the alias limit)
        alias = aliases.get(topic)
        if alias is None and len(aliases) >= self.outbound_alias_limit:
            return self.write_publish(self.encode_publish(message, packet_id, dup), topic)
        properties = dict(message.properties)
        properties["topic_alias"] = alias or len(aliases) + 1
        data = self.encode(self._publish_packet(message, "" if alias else topic,
                                                      packet_id, dup, properties))
        if not self.write_publish(data, topic):
            return False
        if alias is None:  # only once the client has the name can the alias stand alone
            aliases[topic] = properties["topic_alias"]
        return True

    @property
    def publish_encoder(self) -> Callable[[str, bytes, bool], bytes]:
        """Encodes a QoS 0 PUBLISH without properties (topic, payload, retain) in this
        connection's version: taken once per batch of a retained backlog."""
        return self.encode_plain_publish

    @property
    def max_packet(self) -> int | None:
        """The client's maximum packet size (MQTT 5), if it gave one."""
        return self._client_max_packet

    def write_packets(self, data: bytes) -> None:
        """Write packets already checked against :attr:`max_packet` (a retained batch)
        with the rest of this turn's."""
        self._emit(data)

    def write_publish(self, data: bytes, topic: str) -> bool:
        if self._client_max_packet is not None and len(data) > self._client_max_packet:
            self.frontend.router.incidents.count(
                self.frontend.realm.name, "mqtt", TOO_LARGE,
                f"client {self.session.client_id}: {len(data)} bytes on {topic} is over its "
                f"maximum packet size of {self._client_max_packet}: discarded")
            return False
        self._emit(data)
        return True

    def send_pubrel(self, packet_id: int, reason: int = ReasonCode.SUCCESS) -> None:
        if reason == ReasonCode.SUCCESS:
            self._emit(BARE_ACK(PUBREL, 2, packet_id))
        else:
            self._send(Pubrel(packet_id, reason))

    def _send(self, packet) -> None:
        if not self._closed:
            self._emit(self.encode(packet))

    def _emit(self, data: bytes) -> None:
        """Write ``data`` with the rest of this turn's packets (at once past FLUSH_AT)."""
        if self._closed:
            return
        unsent = self._unsent
        if unsent is None:
            self._unsent = [data]
            self._unsent_bytes = len(data)
            self.frontend.flush_later(self)
            return
        unsent.append(data)
        gathered = self._unsent_bytes = self._unsent_bytes + len(data)
        if gathered >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write the packets gathered (the frontend calls it at the end of the turn)."""
        unsent, self._unsent = self._unsent, None
        if unsent and not self._closed:
            data = unsent[0] if len(unsent) == 1 else b"".join(unsent)
            if self._held is None:
                self._write_out(data)
            else:
                self._held.write(data)

    def _write_out(self, data: bytes) -> None:
        """Write to the transport, counted by the flow while the transport is paused."""
        self._write_raw(data)
        flow = self.flow
        if flow.paused:
            flow.wrote(len(data))

    def _write_raw(self, data: bytes) -> None:
        """Write ``data`` to the transport (the transport's subclass says how)."""
        raise NotImplementedError

    def _close_out(self) -> None:
        """Close the transport once what was written is sent (the subclass says how)."""
        raise NotImplementedError

    def hold_answers(self, delay: float) -> None:
        """Hold what is written back by ``delay`` seconds, and the close after it (a
        refused login's answer, see :class:`router.core.login_guard.LoginGuard`)."""
        if self._held is None:
            self._held = HeldTransport(self.frontend.scheduler, self._write_out,
                                       self._close_out)
        self._held.hold = delay

    # life cycle -----------------------------------------------------------------------------

    def _touch(self) -> None:
        self.last_read = self.frontend.clock.turn_began

    @property
    def due(self) -> float:
        """When the keep-alive runs out: the last read plus 1.5 times the keep alive (the
        wheel asks when the connection is filed and when its slot comes)."""
        return self.last_read + (self._keep_alive or 0.0)

    def deadline_passed(self) -> None:
        """The keep-alive ran out (told by the frontend's wheel)."""
        log.info("MQTT client %s: keep-alive expired", self.session.client_id
                 if self.session else self.peer)
        self._fail(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep-alive timeout", False)

    def _fail(self, reason: int, message: str, send_connack: bool) -> None:
        log.info("MQTT connection %s: closing (0x%02x %s)", self.peer, reason, message)
        if send_connack:
            try:
                self._send(Connack(False, reason))
            except ValueError:
                pass  # no MQTT 3.1.1 CONNACK code for this reason: close without one
        elif self.session is not None and self.version == 5:
            self._send(Disconnect(reason))
        self._close_now()

    def kill(self, reason: str, message: str | None) -> None:
        """Router-side close (shutdown, takeover, a login a reload revoked: 0x87); the will
        stays due: a server-side close publishes it (MQTT-3.1.2-8, takeover included: 5.0
        section 3.1.4)."""
        code = (ReasonCode.SESSION_TAKEN_OVER if reason == "takeover"
                else ReasonCode.NOT_AUTHORIZED if reason == errors.KILLED
                else ReasonCode.SERVER_SHUTTING_DOWN)
        if self.session is not None and self.version == 5:
            self._send(Disconnect(code))
        self._close_now()

    def resume_output(self) -> None:
        """The transport drained: send the session's queued QoS >= 1 messages (then its
        retained backlogs)."""
        if self.session is not None and not self._closed:
            self.session.pump()

    def slow_consumer(self) -> None:
        """Over the outbound bound for too long: DISCONNECT 0x97 (MQTT 5); the flow then
        aborts the transport."""
        if self.session is not None and not self._closed:
            realm = self.frontend.realm
            disconnect_slow_consumer(realm.incidents, realm.name, "mqtt",
                                     f"client {self.session.client_id}", self._quota_exceeded)
        self.flush()
        self._closed = True

    def _quota_exceeded(self) -> None:
        """MQTT 5's goodbye to a slow consumer (3.1.1 has no server DISCONNECT)."""
        if self.version == 5:
            self._send(Disconnect(ReasonCode.QUOTA_EXCEEDED))

    def _close_now(self) -> None:
        self.flush()
        if not self._closed:
            self._closed = True
            if self._held is None:
                self._close_out()
            else:
                self._held.close()

    def connection_lost(self) -> None:
        """The transport is gone: publish the will if due, detach from the session."""
        self._closed = True
        self._held = None  # (it holds two bound methods of this connection: a cycle)
        if self._keep_alive is not None:
            self.frontend.deadlines.forget(self)
            self._keep_alive = None
        if self.session is not None:
            self.frontend.disconnected(self, self.session, self._will)
            if self.session.connection is None:  # offline (not taken over): what waited
                self.frontend.realm.backlogs.end(self.session)  # behind retained is queued


def _taken(items: Iterable[T]) -> Generator[None, None, list[T]]:
    """Take every item (a lazily decoded packet's filters), yielding after each; returns
    them as a list."""
    taken = []
    for item in items:
        taken.append(item)
        yield
    return taken


_HANDLERS = {
    Publish: MqttConnection._on_publish_packet,
    Pubrel: MqttConnection._on_pubrel_packet,
    Puback: MqttConnection._on_puback,
    Pubrec: MqttConnection._on_pubrec,
    Pubcomp: MqttConnection._on_pubcomp,
    Subscribe: MqttConnection._on_subscribe,
    Unsubscribe: MqttConnection._on_unsubscribe,
    Pingreq: MqttConnection._on_pingreq,
    Disconnect: MqttConnection._on_disconnect,
}
