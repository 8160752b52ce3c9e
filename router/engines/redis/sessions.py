"""MQTT persistent sessions in Redis: a session follows its client to any node.

Keys (``<realm>`` and ``<client>`` as given; every write of a reactor turn goes to Redis in
one pipelined batch); ownership and takeover (hash ``wr:mqtt-owner:<realm>``, channel
``wr:takeover:<node>``) are :mod:`router.engines.redis.claims`'s, by client id:

* hash ``wr:mqtt-session:<realm>``: client id -> MessagePack ``[authid, authrole,
  authmethod, expiry, disconnected_at]`` of a persistent session.
* hash ``wr:mqtt-subs:<realm>:<client>``: topic filter -> MessagePack subscription options.
* hash ``wr:mqtt-queue:<realm>:<client>``: queue sequence number -> the message
  (:meth:`StoredMessage.pack`); hash ``wr:mqtt-state:<realm>:<client>``: sequence number ->
  MessagePack ``[packet id, state]``, so a state change rewrites a few bytes, not the message.
* set ``wr:mqtt-inbound:<realm>:<client>``: QoS 2 packet ids received and not released.
* hash ``wr:mqtt-will:<realm>:<node>``: client id -> :meth:`StoredWill.pack` of the will of
  its connection on that node, from CONNECT until the will is published or no longer due
  (DISCONNECT, takeover): what a node that died leaves for the one reaping it
  (:mod:`router.engines.redis.failure`).

A node reaping a dead one becomes the owner of its clients in the reaping script and loads
each of their sessions as an own claim (:meth:`RedisMqttSessionStore.adopt_clients`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable

import msgpack

from router.mqtt.persistence import (QUEUED, StoredMessage, StoredOutbound, StoredSession,
                                     StoredWill)
from router.engines.redis.claims import RedisClaims
from router.engines.redis.resp import Command, Reply

if TYPE_CHECKING:
    from router.engines.redis.context import RealmContext


class RedisMqttSessionStore(RedisClaims[StoredSession]):
    """:class:`router.mqtt.persistence.MqttSessionStore`'s methods on Redis, plus the
    ownership of client ids among the nodes (:class:`RedisClaims`)."""

    protocol = "mqtt"
    label = "MQTT client"

    def __init__(self, shared: "RealmContext", realm: str) -> None:
        super().__init__(shared, realm)
        self._session_key = f"wr:mqtt-session:{realm}".encode()
        self.will_key = self.wills_key(self._engine.node)
        self.adopt: Callable[[str, StoredSession | None, StoredWill | None], None] = (
            lambda client_id, stored, will: None)
        self.lost_will: Callable[[str, StoredWill], None] = lambda client_id, will: None
        """Set by the MQTT frontend (as ``adopt``)."""

    def wills_key(self, node: str) -> bytes:
        """The hash of the wills of node ``node``'s connections."""
        return f"wr:mqtt-will:{self._realm}:{node}".encode()

    def adopt_clients(self, clients: list[str], wills: dict[str, StoredWill]) -> None:
        """This node now owns ``clients`` (their node died; the reaping script made it
        their owner): load each one's session as an own claim, then hand it to the frontend
        with its will. The wills of the dead node's other clients (they connected elsewhere
        before the death was found) go to the frontend's ``lost_will``."""
        for client_id in clients:
            self.adopt_owned(client_id, partial(self._adopted, client_id, wills.get(client_id)))
        for client_id in wills.keys() - set(clients):
            self.lost_will(client_id, wills[client_id])

    def _adopted(self, client_id: str, will: StoredWill | None,
                 stored: StoredSession | None) -> None:
        self.adopt(client_id, stored, will)

    def keep_will(self, client_id: str, will: StoredWill | None) -> None:
        """Copy the connection's will to Redis, so the node that reaps this one publishes it if
        this node dies."""
        if will is None:
            self._write("HDEL", self.will_key, client_id)
        else:
            self._write("HSET", self.will_key, client_id, will.pack())

    def _keys(self, client_id: str) -> tuple[bytes, bytes, bytes, bytes]:
        """The subscriptions, queue, queue state and inbound keys of one client."""
        suffix = f"{self._realm}:{client_id}".encode()
        return (b"wr:mqtt-subs:" + suffix, b"wr:mqtt-queue:" + suffix,
                b"wr:mqtt-state:" + suffix, b"wr:mqtt-inbound:" + suffix)

    def _reads(self, owned: str) -> list[Command]:
        subs, queue, state, inbound = self._keys(owned)
        return [("HGET", self._session_key, owned), ("HGETALL", subs), ("HGETALL", queue),
                ("HGETALL", state), ("SMEMBERS", inbound)]

    def _stored(self, owned: str, replies: list[Reply]) -> StoredSession | None:
        return _stored(owned, replies)

    # MqttSessionStore -----------------------------------------------------------

    def load(self) -> list[StoredSession]:
        """Start-up: the sessions this node owned when it stopped."""
        return self.load_owned()

    def save_session(self, client_id: str, authid: str, authrole: str, authmethod: str,
                     expiry: float | None, disconnected_at: float | None) -> None:
        """The session's identity and expiry in Redis, read by whichever node the client connects
        to next."""
        self._write("HSET", self._session_key, client_id, msgpack.packb(
            [authid, authrole, authmethod, expiry, disconnected_at], use_bin_type=True))

    def delete_session(self, client_id: str) -> None:
        """The session ended or expired: everything it had leaves Redis."""
        self._write("HDEL", self._session_key, client_id)
        self._write("DEL", *self._keys(client_id))

    def save_subscription(self, client_id: str, topic_filter: str, options: list[int]) -> None:
        """A subscription of the session in Redis, restored on any node."""
        self._write("HSET", self._keys(client_id)[0], topic_filter, msgpack.packb(options))

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """The session no longer subscribes ``topic_filter``."""
        self._write("HDEL", self._keys(client_id)[0], topic_filter)

    def enqueue(self, client_id: str, outbound: StoredOutbound) -> None:
        """A QoS >= 1 message queued for the session in Redis, so it follows the client to any
        node."""
        _, queue, state, _ = self._keys(client_id)
        self._write("HSET", queue, outbound.seq, outbound.message.pack())
        self._write("HSET", state, outbound.seq,
                    msgpack.packb([outbound.packet_id, outbound.state]))

    def update_outbound(self, client_id: str, seq: int, packet_id: int | None,
                        state: str) -> None:
        """A queued message's packet id and QoS 2 state, so the flow resumes on any node."""
        self._write("HSET", self._keys(client_id)[2], seq, msgpack.packb([packet_id, state]))

    def delete_outbound(self, client_id: str, seq: int) -> None:
        """A queued message was acknowledged: no node resends it."""
        _, queue, state, _ = self._keys(client_id)
        self._write("HDEL", queue, seq)
        self._write("HDEL", state, seq)

    def add_inbound(self, client_id: str, packet_id: int) -> None:
        """An inbound QoS 2 packet id not yet released: a resend to another node is not published
        twice."""
        self._write("SADD", self._keys(client_id)[3], packet_id)

    def delete_inbound(self, client_id: str, packet_id: int) -> None:
        """The client released the packet id (PUBREL)."""
        self._write("SREM", self._keys(client_id)[3], packet_id)


def _stored(client_id: str, replies: list[Reply]) -> StoredSession | None:
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
