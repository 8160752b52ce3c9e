"""The Redis engine: many nodes serve the same realms; Redis is the only shared part.

Keys and channels (``<realm>`` and ``<node>`` as configured):

* channel ``wr:node:<node>``: QoS 0 publications other nodes send this node, one
  MessagePack array each (:func:`pack_publication`). A publishing node sends to a node only
  when that node's interest matches the topic, so idle nodes cost a busy one nothing.
* channel ``wr:node-qos:<node>``: QoS >= 1 publications, MessagePack ``[sending node, number,
  publication]``. The receiving node runs its fan-out, then publishes MessagePack ``[realm,
  its node, number]`` on the sender's ``wr:confirm:<node>`` in the same batch as, and after,
  the session writes of that turn: Redis runs a batch in order, so when the confirmation
  arrives every persistent receiver's copy is stored. The publisher's acknowledgement waits
  for it (at most ``cluster.confirm_timeout``; a node that is not listening fails it at once).
* hash ``wr:interest:<realm>``: node -> the patterns its subscribers hold in the realm;
  channel ``wr:interest`` announces each change to the other nodes. A node reads the hash
  at start and again each time its channels are subscribed, so a change announced before
  it listened is not missed (it would not send that node its publications).
* hash ``wr:retained:<realm>``: topic -> its retained entries (the SQLite row format,
  :mod:`router.engines.records`); hash ``wr:retained-token:<realm>``: topic -> the token of the
  write that set it; sorted set ``wr:retained-expiry:<realm>``: topic -> when the last of
  its entries expires, swept by every node; channel ``wr:retained`` announces each
  change. Every node keeps the realm's retained events in memory (loaded at start, kept
  current from the channel), so retained-on-subscribe and ``get_retained`` never wait for
  Redis and see every node's events. A node changes a topic only if Redis still holds the
  state its memory had (the token it last saw, compared and replaced in one script with the
  announcement); otherwise it applies its event to what Redis holds and tries again, so two
  nodes setting one topic at once end as if one had set it after the other.
* lists ``wr:history:<realm>:<match>:<pattern>``: the realm's event history per rule
  (:mod:`router.engines.redis.history`).
* ``wr:bridge-lock:<realm>:<bridge>`` and ``wr:bridge-queue:<realm>:<bridge>``: which node
  runs each MQTT bridge, and its queue (:mod:`router.engines.redis.bridges`).

Delivery between nodes is Redis PUB/SUB: a QoS 0 publication reaches another node at most
once; a QoS >= 1 publication is acknowledged to its publisher only once every node it was
sent to has confirmed it, so one a node missed (disconnected, killed) is never acknowledged.

Registrations, forwarded calls and the sessions of every node: :mod:`router.engines.redis.dealer`.
MQTT persistent sessions (:mod:`router.engines.redis.sessions`) and AMQP durable links
(:mod:`router.engines.redis.links`) follow their client among nodes
(:mod:`router.engines.redis.claims`); their writes go out in one batch per reactor turn
(:meth:`RedisRealm.write`), as do copies of WAMP testaments and MQTT wills;
:meth:`RedisRealm.when_durable` waits for them, for retained writes and for QoS >= 1
publications forwarded to other nodes. A node that dies is found and reaped by one of the
others: :mod:`router.engines.redis.failure`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

import msgpack
from twisted.internet import defer, task
from twisted.python.failure import Failure

from router.core.engine import ClusterLimits, Paused, RealmEngine
from router.core.history import HistoryRule
from router.core.incidents import ENGINE_BEHIND, ENGINE_UNAVAILABLE, Incidents
from router.core.retention import RetentionPolicy
from router.engines.embedded.sqlite import SqliteStore
from router.engines.records import unpack_publication
from router.engines.redis.bridges import BridgeLocks, RedisBridgeQueue
from router.engines.redis.claims import TAKEOVER_CHANNEL_PREFIX
from router.engines.redis.dealer import REGISTRATIONS_CHANNEL
from router.engines.redis.failure import NODE_DOWN_CHANNEL, NodeWatch, publish_left
from router.engines.redis.history import RedisHistory
from router.engines.redis.links import RedisAmqpStore
from router.engines.redis.outbox import RedisOutboxStore
from router.engines.redis.realm import (CONFIRM_CHANNEL_PREFIX, INTEREST_CHANNEL,
                                        QOS_CHANNEL_PREFIX, RETAINED_CHANNEL, RedisRealm)
from router.engines.redis.resp import BlockingRedis, Reply, RespFactory, RespProtocol, command
from router.engines.redis.sessions import RedisMqttSessionStore

if TYPE_CHECKING:
    from router.core.realm import Realm

log = logging.getLogger(__name__)

READY_WARNING_AFTER = 5.0
"""Seconds after which a node still setting up its Redis links says so in its log."""


class RedisEngine:
    """The engine of a node among several on one Redis (see the module docstring)."""

    def __init__(self, address: tuple[str, int, int], node: str, reactor: Any,
                 local: SqliteStore, limits: ClusterLimits = ClusterLimits()) -> None:
        self.address = address
        self.local = local
        """The node's SQLite store: keeps what stays on the node (QoS 2 tags of AMQP durable
        sender links)."""
        self.node = node
        self.node_bytes = node.encode()
        self.reactor = reactor
        self.limits = limits
        self.channel = b"wr:node:" + node.encode()
        self.qos_channel = QOS_CHANNEL_PREFIX + node.encode()
        self.confirm_channel = CONFIRM_CHANNEL_PREFIX + node.encode()
        self.rpc_channel = b"wr:rpc:" + node.encode()
        self.sessions_channel = TAKEOVER_CHANNEL_PREFIX + node.encode()
        self.incidents = Incidents()
        """Replaced by the router's own in :meth:`start`."""
        self.on_pressure: Callable[[bool], None] = lambda pressed: None
        """Stop (True) / restart (False) reading from publishers: Redis is behind (set by
        :meth:`pause_intake_with`)."""
        self.on_adopting: Callable[[bool], None] = lambda adopting: None
        """Stop (True) / restart (False) reading from publishers while this node adopts a
        dead node's clients: a local publication must not miss them either."""
        self._adopting = 0
        self.realms: dict[str, RedisRealm] = {}
        self.commands: RespProtocol | None = None
        self._subscribed = False
        """The subscriber connection has the registrations channel."""
        self._ready: Callable[[], None] | None = None
        """What :meth:`start` was given to call once connected, until called."""
        self._retry: Any = None
        """The pending retry of failed first reads (a DelayedCall), if any."""
        self._connectors: list[Any] = []
        self._sweeper = task.LoopingCall(self.sweep)
        self._sweeper.clock = reactor
        self.watch = NodeWatch(self)
        self.bridge_locks = BridgeLocks(self)

    def open_realm(self, name: str, policy: RetentionPolicy,
                   history: list[HistoryRule]) -> RealmEngine:
        """The realm's share of the cluster: its state read from Redis now (a blocking read:
        start-up, before the reactor runs), then kept in step with the other nodes."""
        shared = self.realms[name] = RedisRealm(self, name, policy)
        host, port, db = self.address
        redis = BlockingRedis(host, port, db)
        try:
            if len(self.realms) == 1:
                self.watch.announce(redis)  # alive again before reading what it left
            shared.load(redis)
        finally:
            redis.close()
        return RealmEngine(shared.retention, shared, RedisHistory(self, name, history),
                           shared.forward, shared.interest, shared.dealer, shared.members,
                           shared.testaments)

    def mqtt_session_store(self, realm: str) -> RedisMqttSessionStore:
        """Realm ``realm``'s persistent MQTT sessions, in Redis: they follow their client
        to any node."""
        return self.realms[realm].sessions

    def amqp_store(self, realm: str) -> RedisAmqpStore:
        """Realm ``realm``'s durable AMQP links, in Redis: they follow their client to any
        node (the node's SQLite keeps the QoS 2 tags of durable sender links)."""
        shared = self.realms[realm]
        store = RedisAmqpStore(shared, realm, self.local)
        shared.claims["amqp"] = shared.links = store
        return store

    def outbox_store(self, realm: str) -> RedisOutboxStore:
        """Realm ``realm``'s webhook queues, in Redis (each read and written only by the node
        the configuration names to run its webhook)."""
        return RedisOutboxStore(self.realms[realm], realm)

    def bridge_queue(self, realm: str, bridge: str) -> RedisBridgeQueue:
        """Bridge ``bridge``'s queue, in Redis (read by whichever node runs it)."""
        return RedisBridgeQueue(self.realms[realm], bridge)

    def run_bridge(self, realm: str, bridge: str, start: Callable[[], None],
                   stop: Callable[[], None]) -> None:
        """Run the bridge while this node holds its lock (:mod:`.bridges`)."""
        self.bridge_locks.run(realm, bridge, start, stop)

    def pause_intake_with(self, paused: Paused) -> None:
        """Publishers pause while Redis is behind and while this node adopts a dead node's
        clients."""
        self.on_pressure = lambda pressed: paused(pressed, "Redis")
        self.on_adopting = lambda adopting: paused(adopting, "dead-node adoption")

    def start(self, realms: "Mapping[str, Realm]", incidents: Incidents,
              ready: Callable[[], None]) -> None:
        """Receive from the other nodes for ``realms`` and send to them; ``ready()`` once both
        connections are up, the channels subscribed and the registrations, interest and
        retained events read (see :meth:`_read_registrations`)."""
        self.incidents = incidents
        self._ready = ready
        self.reactor.callLater(READY_WARNING_AFTER, self._still_connecting)
        for name, shared in self.realms.items():
            realm = shared.realm = shared.dealer.realm = realms[name]
            shared.members.install(realm.dealer.procedures)
        host, port, db = self.address
        for connected in (self._commands_up, self._subscriber_up):
            self._connectors.append(self.reactor.connectTCP(
                host, port, RespFactory(db, connected, self.limits.max_pending_commands)))
        self._sweeper.start(1.0, now=False)
        self.watch.start()

    def _commands_up(self, connection: RespProtocol) -> None:
        self.commands = connection
        connection.on_lost = self._commands_down
        connection.on_pressure = self._pressure
        self.watch.beat()  # at once: the start-up's longer lifetime ends
        for shared in self.realms.values():
            shared.announce_interest()
            shared.flush()
            if shared.left is not None:  # next turn: a failure there is its own
                left, shared.left = shared.left, None
                self.reactor.callLater(0, publish_left, shared, self.node, *left, None)
        self._read_registrations()

    def _commands_down(self) -> None:
        self.commands = None

    def _read_registrations(self) -> None:
        """Read every realm's registrations, interest and retained events once both
        connections are up (whichever came last): from then on no announced change is
        missed."""
        if self.commands is not None and self._subscribed:
            reads = [read for shared in self.realms.values()
                     for read in (shared.dealer.reload(), shared.reload_interest(),
                                  shared.reload_retained())]
            if self._ready is not None:
                defer.gatherResults(reads, consumeErrors=True).addCallbacks(
                    self._first_reads, self._first_reads_failed)

    def _first_reads(self, read: list[bool]) -> None:
        """Ready once every realm's first reads succeeded; a failed one (Redis still
        loading its data, say) is read again a second later, or when the connections come
        back."""
        if self._ready is None:
            return
        if all(read):
            ready, self._ready = self._ready, None
            ready()
        else:
            self._read_again()

    def _first_reads_failed(self, failure: Failure) -> None:
        log.error("reading the cluster's state failed: %s; trying again in 1 s",
                  failure.getTraceback())
        self._read_again()

    def _read_again(self) -> None:
        """One retry a second later (a reconnect meanwhile reads too, and adds none)."""
        if self._retry is None or not self._retry.active():
            self._retry = self.reactor.callLater(1.0, self._read_registrations)

    def _still_connecting(self) -> None:
        if self._ready is not None:
            host, port, _ = self.address
            log.warning("still connecting to Redis at %s:%d (the channels subscribed, the "
                        "registrations, interest and retained events read): clients are let "
                        "in only then", host, port)

    def _subscriber_up(self, connection: RespProtocol) -> None:
        connection.on_push = self._push
        connection.on_lost = self._subscriber_down
        connection.send(command("SUBSCRIBE", self.channel, self.qos_channel,
                                self.confirm_channel, self.rpc_channel,
                                self.sessions_channel, INTEREST_CHANNEL, RETAINED_CHANNEL,
                                NODE_DOWN_CHANNEL, REGISTRATIONS_CHANNEL), 0)

    def _subscriber_down(self) -> None:
        self._subscribed = False

    def adopting(self, started: bool) -> None:
        """One realm's reaping started or ended; reading pauses while any is under way."""
        self._adopting += 1 if started else -1
        if self._adopting == (1 if started else 0):
            self.on_adopting(started)

    def _pressure(self, pressed: bool) -> None:
        if pressed:
            self.incidents.count("", "engine", ENGINE_BEHIND,
                                 f"{self.commands.pending if self.commands else 0} commands "
                                 "unanswered by Redis: reading from publishers paused")
        self.on_pressure(pressed)

    def send(self, data: bytes, replies: int, realm: str = "", what: str = "") -> None:
        """Fire and forget; counted (``what`` was lost, in ``realm``) when Redis is not
        reachable or too far behind."""
        commands = self.commands
        if commands is None:
            why = "Redis is not connected"
        elif not commands.send(data, replies):
            why = f"{commands.pending} commands unanswered by Redis"
        else:
            return
        self.incidents.count(realm, "engine", ENGINE_UNAVAILABLE,
                             f"{what}: {why}" if what else why)

    def request(self, data: bytes, skipped: int = 0) -> defer.Deferred[Reply]:
        """A Deferred of the last reply (see :meth:`RespProtocol.request`); failed when
        Redis is not connected."""
        if self.commands is None:
            return defer.fail(ConnectionError("Redis is not connected"))
        return self.commands.request(data, skipped)

    def _push(self, message: list[Reply]) -> None:
        if not isinstance(message, list):
            return
        if message[0] != b"message":
            if message[:2] == [b"subscribe", REGISTRATIONS_CHANNEL]:
                self._subscribed = True
                self._read_registrations()
            return
        channel, data = message[1], message[2]
        try:
            self._received(channel, data)
        except Exception:  # one bad message must not cost the connection the ones after it
            log.exception("a message on %r could not be handled", channel)
            self.incidents.count("", "engine", ENGINE_UNAVAILABLE,
                                 f"a message on {channel!r} could not be handled")

    def _received(self, channel: bytes, data: bytes) -> None:
        """Act on one message of a subscribed channel."""
        if channel == self.qos_channel:
            sender, number, data = msgpack.unpackb(data, raw=False)
            realm, publication = unpack_publication(data)
            shared = self.realms.get(realm)
            if shared is not None:
                shared.received(publication, sender, number)
        elif channel == self.confirm_channel:
            realm, node, number = msgpack.unpackb(data, raw=False)
            shared = self.realms.get(realm)
            if shared is not None:
                shared.confirmed(node, number)
        elif channel == self.rpc_channel:
            rpc = msgpack.unpackb(data, raw=False, strict_map_key=False)
            shared = self.realms.get(rpc[1])
            if shared is not None:
                shared.dealer.received(rpc)
        elif channel == self.sessions_channel:
            realm, protocol, kind, owned, node = msgpack.unpackb(data, raw=False)
            shared = self.realms.get(realm)
            claims = shared.claims.get(protocol) if shared is not None else None
            if claims is not None:
                if kind == "take":
                    claims.take(owned, node)
                else:
                    claims.released(owned)
        elif channel == REGISTRATIONS_CHANNEL:
            realm, seq, field, value = json.loads(data)
            shared = self.realms.get(realm)
            if shared is not None:
                shared.dealer.changed(seq, field, value or None)
        elif channel == RETAINED_CHANNEL:
            realm, node, key, blob, token = msgpack.unpackb(data, raw=True)
            shared = self.realms.get(realm.decode())
            if shared is not None:
                shared.retained_announced(key, blob, token, node)
        elif channel == NODE_DOWN_CHANNEL:
            realm, node, left, reaper = msgpack.unpackb(data, raw=False)
            shared = self.realms.get(realm)
            if shared is not None:
                shared.node_down(node, left, reaper)
        elif channel == INTEREST_CHANNEL:
            realm, node, packed = msgpack.unpackb(data, raw=False)
            shared = self.realms.get(realm)
            if shared is not None and node != self.node:
                shared.announced(node, packed)
        else:
            realm, publication = unpack_publication(data)
            shared = self.realms.get(realm)
            if shared is not None:
                shared.received(publication)

    def sweep(self) -> None:
        """Once a second: expired retained topics, unconfirmed forwards and unanswered writes are
        settled, so nothing waits forever on a silent node or Redis."""
        for shared in self.realms.values():
            shared.sweep()
            shared.expire_unconfirmed()  # first: it counts its own incidents
            shared.expire_unanswered()

    def close(self) -> None:
        """Take this node's registrations, sessions, testaments, wills and alive key out of
        Redis (its sessions were closed: what was due is published), then disconnect."""
        if self._sweeper.running:
            self._sweeper.stop()
        forget = self.watch.close() + self.bridge_locks.close()
        for shared in self.realms.values():
            shared.flush()  # what this turn wrote goes first
            forget += [shared.dealer.release_node(), *shared.members.forget_node(),
                       ("DEL", shared.testaments.key, shared.sessions.will_key)]
        self.send(b"".join(command(*args) for args in forget), len(forget))
        for connector in self._connectors:
            connector.factory.stopTrying()
            connector.disconnect()
