"""MQTT persistent sessions in Redis: a session follows its client to any node.

Keys (``<realm>`` and ``<client>`` as given; every write of a reactor turn goes to Redis in
one pipelined batch):

* hash ``wr:mqtt-owner:<realm>``: client id -> the node that has the session in memory
  (connected or not). Only the owner queues publications for it and changes its state.
* hash ``wr:mqtt-session:<realm>``: client id -> MessagePack ``[authid, authrole,
  authmethod, expiry, disconnected_at]`` of a persistent session.
* hash ``wr:mqtt-subs:<realm>:<client>``: topic filter -> MessagePack subscription options.
* hash ``wr:mqtt-queue:<realm>:<client>``: queue sequence number -> the message
  (:meth:`StoredMessage.pack`); hash ``wr:mqtt-state:<realm>:<client>``: sequence number ->
  MessagePack ``[packet id, state]``, so a state change rewrites a few bytes, not the message.
* set ``wr:mqtt-inbound:<realm>:<client>``: QoS 2 packet ids received and not released.
* channel ``wr:mqtt-takeover:<node>``: MessagePack ``[realm, kind, client id, node]``: "take"
  (the sender has claimed the client: close its connection, write what is under way, then
  answer) and "released" (done: the state in Redis is complete).

Ownership: a CONNECT claims the client id in ``wr:mqtt-owner`` and, in the same script,
tells the previous owner to let go. The new owner loads the state from Redis once the old
one answered "released" (or after ``cluster.session_takeover_timeout`` when it does not
answer: a stopped node), so nothing the old owner queued is missed. A "take" (or a second
CONNECT of the client here) that arrives while this node's own claim of that client is
still under way waits for it to finish.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import msgpack

from router.core.incidents import ENGINE_UNAVAILABLE
from router.mqtt.persistence import StoredMessage, StoredOutbound, StoredSession
from router.mqtt.session import QUEUED
from router.store.resp import BlockingRedis, command

if TYPE_CHECKING:
    from router.store.redis_engine import RedisRealm

log = logging.getLogger(__name__)

SESSIONS_CHANNEL_PREFIX = b"wr:mqtt-takeover:"

CLAIM = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if old and old ~= ARGV[2] then
  redis.call('PUBLISH', ARGV[3] .. old, ARGV[4])
  return old
end
return ''
"""
"""KEYS owner hash; ARGV client id, this node, the channel prefix, the "take" message.
Answers the previous owner when it was another node (it has been told), else ''."""

DISOWN = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""
"""Forget the owner of a client id only if it is still this node."""

Release = Callable[[str, Callable[[], None]], None]
"""The frontend's hook: ``release(client_id, done)`` drops the session from this node
(closing its connection as a takeover) and calls ``done`` once its writes are stored."""


class RedisMqttSessionStore:
    """:class:`router.mqtt.persistence.MqttSessionStore`'s methods on Redis, plus the
    ownership of client ids among the nodes (see the module docstring)."""

    def __init__(self, shared: "RedisRealm", realm: str) -> None:
        self._shared = shared
        self._engine = shared.engine
        self._realm = realm
        self._owner_key = f"wr:mqtt-owner:{realm}".encode()
        self._session_key = f"wr:mqtt-session:{realm}".encode()
        self.release: Release = lambda client_id, done: done()
        """Set by the MQTT frontend."""
        self._claims: dict[str, list[Callable[[], None]]] = {}
        """Client ids this node is claiming -> what waits for the claim to finish (other
        nodes' "take", a second CONNECT of the client here)."""
        self._waiting: dict[str, tuple[bool, Callable[[StoredSession | None], None], Any]] = {}
        """Client ids whose previous owner has not answered yet -> (load, answer, timer)."""

    def _keys(self, client_id: str) -> tuple[bytes, bytes, bytes, bytes]:
        """The subscriptions, queue, queue state and inbound keys of one client."""
        suffix = f"{self._realm}:{client_id}".encode()
        return (b"wr:mqtt-subs:" + suffix, b"wr:mqtt-queue:" + suffix,
                b"wr:mqtt-state:" + suffix, b"wr:mqtt-inbound:" + suffix)

    def _write(self, *args: bytes | str | int | float) -> None:
        self._shared.write(command(*args))

    # ownership ------------------------------------------------------------------

    def claim(self, client_id: str, load: bool,
              answer: Callable[[StoredSession | None], None]) -> None:
        """Make this node the client's owner; ``answer(state)`` with the session Redis
        holds (read once the node that had it let go; only if ``load``: a clean start
        needs none), or None. ``answer`` may run at once."""
        engine = self._engine
        after = self._claims.get(client_id)
        if after is not None:  # a claim of this node is under way: it brings the state here
            after.append(partial(answer, None))
            return
        self._claims[client_id] = []
        take = msgpack.packb([self._realm, "take", client_id, engine.node], use_bin_type=True)
        claimed = engine.request(command("EVAL", CLAIM, 1, self._owner_key, client_id,
                                         engine.node, SESSIONS_CHANNEL_PREFIX, take))
        claimed.addCallbacks(self._claimed, self._claim_failed, (client_id, load, answer),
                             errbackArgs=(client_id, answer))

    def _claimed(self, previous: bytes, client_id: str, load: bool,
                 answer: Callable[[StoredSession | None], None]) -> None:
        if not previous:
            self._ready(client_id, load, answer)
            return
        timeout = self._engine.limits.session_takeover_timeout
        timer = self._engine.reactor.callLater(timeout, self._not_released, client_id,
                                               previous.decode())
        self._waiting[client_id] = (load, answer, timer)

    def _ready(self, client_id: str, load: bool,
               answer: Callable[[StoredSession | None], None]) -> None:
        """No other node has the session any more: answer (with its state if ``load``)."""
        if load:
            self._load(client_id, answer)
        else:
            self._finish(client_id, answer, None)

    def _claim_failed(self, failure: Any, client_id: str,
                      answer: Callable[[StoredSession | None], None]) -> None:
        self._engine.incidents.count(self._realm, "mqtt", ENGINE_UNAVAILABLE,
                                     f"client {client_id}: session not claimed or read in Redis "
                                     f"({failure.getErrorMessage()}): this node's copy, if "
                                     "any, is used")
        self._finish(client_id, answer, None)

    def _not_released(self, client_id: str, node: str) -> None:
        log.warning("MQTT client %s: node %s did not release the session within %.1f s: "
                    "resumed from what Redis holds", client_id, node,
                    self._engine.limits.session_takeover_timeout)
        load, answer, _ = self._waiting.pop(client_id)
        self._ready(client_id, load, answer)

    def released(self, client_id: str) -> None:
        """The previous owner let go: its writes are in Redis."""
        waiting = self._waiting.pop(client_id, None)
        if waiting is not None:
            load, answer, timer = waiting
            if timer.active():
                timer.cancel()
            self._ready(client_id, load, answer)

    def take(self, client_id: str, node: str) -> None:
        """Node ``node`` claimed the client: let go (after this node's own claim, if one is
        under way), then tell it."""
        after = self._claims.get(client_id)
        if after is not None:
            after.append(partial(self.take, client_id, node))
            return
        done = msgpack.packb([self._realm, "released", client_id, self._engine.node],
                             use_bin_type=True)
        self.release(client_id, lambda: self._shared.write(
            command("PUBLISH", SESSIONS_CHANNEL_PREFIX + node.encode(), done)))

    def disown(self, client_id: str) -> None:
        """The session ended here: no node owns the client any more (unless one claimed it)."""
        self._write("EVAL", DISOWN, 1, self._owner_key, client_id, self._engine.node)

    def _load(self, client_id: str, answer: Callable[[StoredSession | None], None]) -> None:
        """Read a client's state in one transaction, then answer with it."""
        subs, queue, state, inbound = self._keys(client_id)
        reads = [("HGET", self._session_key, client_id), ("HGETALL", subs),
                 ("HGETALL", queue), ("HGETALL", state), ("SMEMBERS", inbound)]
        data = command("MULTI") + b"".join(command(*args) for args in reads) + command("EXEC")
        self._shared.flush()
        loaded = self._engine.request(data, len(reads) + 1)
        loaded.addCallback(partial(_stored, client_id))  # a decoding error fails the claim
        loaded.addCallbacks(partial(self._finish, client_id, answer), self._claim_failed,
                            errbackArgs=(client_id, answer))

    def _finish(self, client_id: str, answer: Callable[[StoredSession | None], None],
                stored: StoredSession | None) -> None:
        """Answer the claim, then let go for the nodes that asked meanwhile."""
        after = self._claims.pop(client_id, [])
        answer(stored)
        for then in after:
            then()

    # MqttSessionStore -----------------------------------------------------------

    def load(self) -> list[StoredSession]:
        """Start-up: the sessions this node owned when it stopped."""
        host, port, db = self._engine.address
        redis = BlockingRedis(host, port, db)
        try:
            owners = redis.call("HGETALL", self._owner_key)
            sessions = []
            for client, node in zip(owners[::2], owners[1::2]):
                if node != self._engine.node_bytes:
                    continue
                client_id = client.decode()
                subs, queue, state, inbound = self._keys(client_id)
                replies = [redis.call("HGET", self._session_key, client),
                           redis.call("HGETALL", subs), redis.call("HGETALL", queue),
                           redis.call("HGETALL", state), redis.call("SMEMBERS", inbound)]
                stored = _stored(client_id, replies)
                if stored is None:
                    redis.call("HDEL", self._owner_key, client)  # a clean session's claim
                else:
                    sessions.append(stored)
            return sessions
        finally:
            redis.close()

    def save_session(self, client_id: str, authid: str, authrole: str, authmethod: str,
                     expiry: float | None, disconnected_at: float | None) -> None:
        self._write("HSET", self._session_key, client_id, msgpack.packb(
            [authid, authrole, authmethod, expiry, disconnected_at], use_bin_type=True))

    def delete_session(self, client_id: str) -> None:
        self._write("HDEL", self._session_key, client_id)
        self._write("DEL", *self._keys(client_id))

    def save_subscription(self, client_id: str, topic_filter: str, options: list) -> None:
        self._write("HSET", self._keys(client_id)[0], topic_filter, msgpack.packb(options))

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        self._write("HDEL", self._keys(client_id)[0], topic_filter)

    def enqueue(self, client_id: str, outbound: StoredOutbound) -> None:
        _, queue, state, _ = self._keys(client_id)
        self._write("HSET", queue, outbound.seq, outbound.message.pack())
        self._write("HSET", state, outbound.seq,
                    msgpack.packb([outbound.packet_id, outbound.state]))

    def update_outbound(self, client_id: str, seq: int, packet_id: int | None,
                        state: str) -> None:
        self._write("HSET", self._keys(client_id)[2], seq, msgpack.packb([packet_id, state]))

    def delete_outbound(self, client_id: str, seq: int) -> None:
        _, queue, state, _ = self._keys(client_id)
        self._write("HDEL", queue, seq)
        self._write("HDEL", state, seq)

    def add_inbound(self, client_id: str, packet_id: int) -> None:
        self._write("SADD", self._keys(client_id)[3], packet_id)

    def delete_inbound(self, client_id: str, packet_id: int) -> None:
        self._write("SREM", self._keys(client_id)[3], packet_id)

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        self._shared.when_durable(callback)


def _stored(client_id: str, replies: list) -> StoredSession | None:
    """A session from the replies to HGET session, HGETALL subscriptions / queue / queue
    state, SMEMBERS inbound; None if Redis has no persistent session of that client."""
    record, subs, queue, states, inbound = replies
    if record is None:
        return None
    authid, authrole, authmethod, expiry, disconnected_at = msgpack.unpackb(record, raw=False)
    stored = StoredSession(client_id, authid, authrole, authmethod, expiry, disconnected_at)
    for topic_filter, options in zip(subs[::2], subs[1::2]):
        stored.subscriptions[topic_filter.decode()] = msgpack.unpackb(options)
    state_of = dict(zip(states[::2], states[1::2]))
    for seq, message in sorted(zip(queue[::2], queue[1::2]), key=lambda item: int(item[0])):
        packed_state = state_of.get(seq)
        packet_id, state = (msgpack.unpackb(packed_state, raw=False) if packed_state
                            else (None, QUEUED))
        stored.outbound.append(StoredOutbound(int(seq), packet_id, state,
                                              StoredMessage.unpack(message)))
    stored.inbound = {int(packet_id) for packet_id in inbound}
    return stored
