"""Node failure on the Redis engine: liveness keys, one reaper per dead node.

Keys and channels, beside those of :mod:`router.engines.redis.engine`:

* set ``wr:nodes``: the names of the nodes that run (or died and are not reaped yet).
* string ``wr:node-alive:<node>``: the node's boot id, set with a lifetime of
  ``cluster.node_timeout`` and refreshed every ``cluster.heartbeat_interval``
  (:data:`HEARTBEAT`, which also looks for dead members). A node sets it once before it
  reads anything at start-up (lasting at least :data:`STARTING`), so a node that restarts
  under its name is alive again before it loads what its previous run left.
* string ``wr:node-reaper:<node>``: the node that reaps ``<node>`` (``SET NX``, a lifetime
  of twice ``node_timeout``): exactly one survivor handles a death.
* hash ``wr:testaments:<realm>:<node>``: session id -> MessagePack ``[authid, authrole,
  authmethod, [[topic, args, kwargs, publish options], ...]]``, the testaments of the
  node's WAMP sessions (written in the realm's per-turn batch; removed once published).
* hash ``wr:mqtt-will:<realm>:<node>`` (:mod:`router.engines.redis.sessions`): the wills of
  the node's MQTT connections.
* channel ``wr:node-down``: MessagePack ``[realm, node, [field, value, ...], reaper]``
  (the ``wr:sessions:<realm>`` entries a dead node had), sent by its reaper: every node
  publishes ``wamp.session.on_leave`` for them to its own subscribers, fails the calls it
  forwarded to that node, stops waiting for it to release MQTT sessions, and sends what
  matched the dead node's patterns to the reaper instead, until the reaper announces its
  own (which then cover the sessions and links it adopted). The reaper holds what other
  nodes send it from before its reaping script until the adopted state is loaded and
  subscribed, so nothing published meanwhile misses an adopted session. A node whose
  subscription was down then does the same, but publishes no ``on_leave`` (that list is
  gone), when it reads the interest hash on subscribing again and finds a node it waits for
  there no more, with no alive key (:meth:`RedisRealm.reload_interest`).

A node whose alive key is gone is dead: detected within ``node_timeout`` +
``heartbeat_interval`` of its last refresh. Its reaper runs :data:`REAP` for each realm
(with the dealer's release of its registrations, in one transaction) only while the alive
key is still gone, so a node that restarted meanwhile keeps what it has: publishes its
sessions' testaments and its clients' wills, removes its sessions, subscriptions, interest
and registrations, and becomes the owner of its MQTT clients and AMQP durable links, whose
state it then loads (:meth:`RedisMqttSessionStore.adopt_clients`,
:meth:`RedisAmqpStore.adopt_links`): they queue here until their client comes back on any
node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol

import msgpack
from twisted.internet import task
from twisted.python.failure import Failure

from router.core.engine import StoredTestament
from router.core.incidents import ENGINE_UNAVAILABLE, STORE_FAILED
from router.core.model import SessionInfo
from router.core.testament import publish_testaments
from router.engines.redis.context import EngineContext, RealmContext
from router.engines.redis.lua import script
from router.engines.redis.resp import BlockingRedis, Command, Reply, command
from router.mqtt.persistence import StoredWill

if TYPE_CHECKING:
    from router.core.realm import Realm
    from router.engines.redis.claims import RedisClaims
    from router.engines.redis.dealer import RedisDealer
    from router.engines.redis.links import RedisAmqpStore
    from router.engines.redis.sessions import RedisMqttSessionStore

log = logging.getLogger(__name__)


class LeftRealm(RealmContext, Protocol):
    """A realm's share as failure handling uses it: the stores a dead node's clients are
    adopted into, the dealer that drops its registrations, the hold on forwarded
    publications while it is reaped."""

    realm: "Realm | None"
    sessions: "RedisMqttSessionStore"
    links: "RedisAmqpStore | None"
    claims: "dict[str, RedisClaims[Any]]"
    dealer: "RedisDealer"

    def reap_command(self, node: str, alive_key: bytes) -> Command:
        """The reaping script's call for dead node ``node`` in this realm."""

    def hold_forwarded(self) -> None:
        """Keep publications from other nodes until the reaping is answered."""

    def release_forwarded(self) -> None:
        """Dispatch the publications held since :meth:`hold_forwarded`."""


class WatchedEngine(EngineContext, Protocol):
    """The engine as :class:`NodeWatch` uses it: every realm's share, to reap in each."""

    @property
    def realms(self) -> "Mapping[str, LeftRealm]":
        """The realms of the node, by name."""

NODES_KEY = b"wr:nodes"
ALIVE_PREFIX = b"wr:node-alive:"
REAPER_PREFIX = b"wr:node-reaper:"
REAPED_PREFIX = b"wr:node-reaped:"
REAPED_MARK_LIFETIME = 24 * 3600.0
"""Seconds the reaping script's mark ``wr:node-reaped:<node>`` (its value: the reaper) lasts:
how long a node whose Redis subscription was down may take to come back and still act on a
reaping it did not hear (:meth:`router.engines.redis.realm.RedisRealm.reload_interest`)."""
NODE_DOWN_CHANNEL = b"wr:node-down"
STARTING = 30.0
"""Seconds the alive key set at start-up lasts, however short ``node_timeout`` is: a node
may take a while from reading Redis to its first heartbeat (restoring sessions, opening
listeners), and must not look dead meanwhile. A node that dies while starting is found dead
after at most this long."""

HEARTBEAT = script("heartbeat")
"""KEYS nodes set, this node's alive key; ARGV this node, boot id, node timeout (ms), reaper
lifetime (ms), alive and reaper key prefixes. Refreshes this node's key and answers {1 if
it had expired, the dead nodes this node now reaps}."""

REAP = script("reap")
"""KEYS the dead node's alive key, testaments and wills; the realm's sessions,
subscriptions and interest hashes, then its owner hashes (MQTT clients, AMQP durable links:
:mod:`router.engines.redis.claims`); ARGV the dead node, this node, the realm, the node-down
channel (every node then forgets the dead node's interest, see
:meth:`RedisRealm.node_down`), the dead node's reaped mark and its lifetime (ms, see
:data:`REAPED_MARK_LIFETIME`). The dead node's patterns move into this node's field of the
interest hash (until this node announces its own, which then cover what it adopted), so a
node that reads the hash meanwhile sends it what the adopted clients want, as the nodes that
heard the announcement do. Nothing (nil) if the node is alive again, else {testaments,
wills, {the ids this node now owns, per owner hash}}."""

ADOPTED = {"mqtt": "MQTT session(s)", "amqp": "AMQP durable link(s)"}
"""What the ids of each owner hash are, for the log of a reaping."""

REAPED = script("reaped")
"""KEYS the dead node's alive and reaper keys, the nodes set; ARGV the dead node: reaped
(unless it came back), no other node needs to."""


def testaments_key(realm: str, node: str) -> bytes:
    """The hash of the testaments of node ``node``'s sessions in realm ``realm``."""
    return f"wr:testaments:{realm}:{node}".encode()


class RedisTestaments:
    """One realm's :class:`router.core.engine.TestamentStore` on Redis (this node's hash)."""

    def __init__(self, shared: "LeftRealm") -> None:
        self._shared = shared
        self.key = testaments_key(shared.name, shared.engine.node)

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once Redis holds every testament saved so far."""
        self._shared.when_durable(callback)

    def save(self, info: SessionInfo, testaments: list[StoredTestament]) -> bool:
        """Copy the session's testaments to Redis, so another node publishes them if this one
        dies; False when they cannot be encoded."""
        if not testaments:
            self._shared.write(command("HDEL", self.key, info.session_id))
            return True
        try:
            blob = msgpack.packb([info.authid, info.authrole, info.authmethod, testaments],
                                 use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            self._shared.engine.incidents.count(
                self._shared.name, "wamp", STORE_FAILED,
                f"session {info.session_id}: testaments not copied to Redis ({exc}): "
                "published only if its node runs when it leaves")
            return False
        self._shared.write(command("HSET", self.key, info.session_id, blob))
        return True


def publish_left(shared: "LeftRealm", node: str, testaments: list[bytes], wills: list[bytes],
                 adopted: list[list[bytes]] | None) -> None:
    """Publish what node ``node`` (dead, or this node's previous run) left in realm
    ``shared``: its sessions' testaments; its clients' wills, with their sessions if
    ``adopted`` (the ids this node now owns, per :attr:`RedisRealm.claims` entry; None:
    this node's previous run, whose state was loaded at start), and its durable links."""
    realm = shared.realm
    if realm is None:
        return
    for session_id, blob in zip(testaments[::2], testaments[1::2]):
        authid, authrole, authmethod, stored = msgpack.unpackb(blob, raw=False)
        publish_testaments(realm, SessionInfo(int(session_id), shared.name, authid, authrole,
                                              authmethod), stored)
    by_client = {client.decode(): StoredWill.unpack(blob)
                 for client, blob in zip(wills[::2], wills[1::2])}
    adopted_of: dict[str, list[str]] = {}
    if adopted is None:
        for client_id, will in by_client.items():
            shared.sessions.adopt(client_id, None, will)
    else:
        adopted_of = {protocol: [owned.decode() for owned in ids]
                      for protocol, ids in zip(shared.claims, adopted)}
        shared.sessions.adopt_clients(adopted_of["mqtt"], by_client)
        if shared.links is not None:
            shared.links.adopt_links(adopted_of["amqp"])
    if adopted is not None or testaments or wills:
        counts = ", ".join(f"{len(ids)} {ADOPTED[protocol]}"
                           for protocol, ids in adopted_of.items())
        log.info("realm %s: node %s left %d testament(s), %d will(s)%s", shared.name, node,
                 len(testaments) // 2, len(by_client), f"; {counts} adopted" if counts else "")


def take_left(shared: "LeftRealm", redis: BlockingRedis) -> tuple[list[bytes], list[bytes]]:
    """Start-up: the testaments and wills this node's previous run left (it was killed and
    came back before it was reaped), removed from Redis, to publish once running."""
    keys = (testaments_key(shared.name, shared.engine.node), shared.sessions.will_key)
    found = [redis.call("HGETALL", key) for key in keys]
    redis.call("DEL", *keys)
    return found[0], found[1]


class NodeWatch:
    """This node's alive key, and the search for dead nodes (see the module docstring)."""

    def __init__(self, engine: "WatchedEngine") -> None:
        self.engine = engine
        self.boot = os.urandom(8).hex()
        self.alive_key = ALIVE_PREFIX + engine.node_bytes
        self._timeout_ms = int(engine.limits.node_timeout * 1000)
        self._loop = task.LoopingCall(self.beat)
        self._loop.clock = engine.reactor

    def announce(self, redis: BlockingRedis) -> None:
        """Start-up, before anything is read: this node is alive (again)."""
        previous = redis.call("GET", self.alive_key)
        if previous is not None:
            log.warning("node %s: its previous run (boot %s) did not stop cleanly and was not "
                        "found dead yet: this run publishes what it left", self.engine.node,
                        previous.decode())
        redis.call("SET", self.alive_key, self.boot, "PX",
                   max(self._timeout_ms, int(STARTING * 1000)))
        redis.call("SADD", NODES_KEY, self.engine.node)

    def start(self) -> None:
        """Refresh this node's alive key and look for dead nodes every ``heartbeat_interval``."""
        self._loop.start(self.engine.limits.heartbeat_interval, now=False)

    def beat(self) -> None:
        """Refresh the alive key; reap the dead nodes this node won."""
        engine = self.engine
        if engine.commands is None:
            return  # the key runs out if this lasts: other nodes will reap this one
        engine.request(command(
            "EVAL", HEARTBEAT, 2, NODES_KEY, self.alive_key, engine.node, self.boot,
            self._timeout_ms, 2 * self._timeout_ms, ALIVE_PREFIX, REAPER_PREFIX)
        ).addCallbacks(self._beaten, self._not_beaten)

    def _beaten(self, reply: list[Reply]) -> None:
        lost, dead = reply
        if lost:
            log.error("node %s: its alive key had expired (no heartbeat for %.1f s): other "
                      "nodes may have reaped it (sessions adopted, registrations removed); "
                      "restart it to register again", self.engine.node,
                      self.engine.limits.node_timeout)
        for node in dead:
            self.reap(node.decode())

    def _not_beaten(self, failure: Failure) -> None:
        self.engine.incidents.count("", "engine", ENGINE_UNAVAILABLE,
                                    f"heartbeat not written to Redis "
                                    f"({failure.getErrorMessage()}): other nodes find this "
                                    "one dead if it lasts longer than cluster.node_timeout")

    def reap(self, node: str) -> None:
        """Act for dead node ``node`` in every realm, then take it out of the nodes set."""
        engine = self.engine
        limits = engine.limits
        log.warning("node %s is dead (no heartbeat for %.1f s, looked every %.1f s): "
                    "node %s reaps it", node, limits.node_timeout, limits.heartbeat_interval,
                    engine.node)
        alive_key = ALIVE_PREFIX + node.encode()
        for shared in engine.realms.values():
            reaping = (command("MULTI") + command(*shared.reap_command(node, alive_key))
                       + command(*shared.dealer.release_dead(node, alive_key))
                       + command("EXEC"))
            shared.hold_forwarded()
            engine.request(reaping, 3).addCallback(self._reaped, shared, node).addErrback(
                self._reap_failed, shared, node)
        engine.send(command("EVAL", REAPED, 3, alive_key, REAPER_PREFIX + node.encode(),
                            NODES_KEY, node), 1, what=f"node {node} not marked reaped")

    def _reaped(self, replies: list[Reply], shared: "LeftRealm", node: str) -> None:
        reaped, _ = replies
        if reaped is None:
            log.info("realm %s: node %s is alive again: not reaped", shared.name, node)
            shared.release_forwarded()
            return
        publish_left(shared, node, *reaped)
        # the adopted states load in requests sent just now: once this one is answered,
        # they are loaded and subscribed here
        self.engine.request(command("PING")).addBoth(
            lambda _: shared.release_forwarded())

    def _reap_failed(self, failure: Failure, shared: "LeftRealm", node: str) -> None:
        log.error("realm %s: node %s not (fully) reaped: %s", shared.name, node,
                  failure.getTraceback())
        shared.release_forwarded()

    def close(self) -> list[Command]:
        """Stop beating; the commands that say this node stopped cleanly."""
        if self._loop.running:
            self._loop.stop()
        return [("DEL", self.alive_key), ("SREM", NODES_KEY, self.engine.node)]
