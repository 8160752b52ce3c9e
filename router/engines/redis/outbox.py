"""The Redis engine's durable outbound queues (webhooks): each in Redis, so a webhook's
events outlive its node and its node's disk.

Keys (``<realm>`` and ``<queue>``, the webhook's name, as configured):

* hash ``wr:outbox:<realm>:<queue>``: sequence number -> MessagePack ``[body, expires_at]``.
* hash ``wr:outboxes:<realm>``: queue -> the node that last wrote it, so that a node finds and
  deletes at start its queues whose webhook is no longer configured, without scanning keys,
  and never another node's (whose configuration may differ for a while).

Writes go out in the realm's batch of the reactor turn (:meth:`RealmContext.write`), so a
QoS >= 1 publication forwarded from another node is confirmed to it only once its event is
queued here, and a local publisher's acknowledgement waits for it
(:meth:`RealmContext.when_durable`). The configuration names the one node that runs each
webhook (its ``node`` key): only that node reads and writes its queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import msgpack

from router.core.engine import OutboxRecord
from router.engines.redis.resp import BlockingRedis, command

if TYPE_CHECKING:
    from router.engines.redis.context import RealmContext


class RedisOutboxStore:
    """A realm's outbound queues in Redis (see the module docstring)."""

    def __init__(self, shared: "RealmContext", realm: str) -> None:
        self._shared = shared
        self._realm = realm
        self._index = f"wr:outboxes:{realm}".encode()
        self._indexed: set[str] = set()
        """Queues this node has named itself the writer of since it started."""

    def _key(self, queue: str) -> bytes:
        return f"wr:outbox:{self._realm}:{queue}".encode()

    def _blocking(self) -> BlockingRedis:
        host, port, db = self._shared.engine.address
        return BlockingRedis(host, port, db)

    def load(self, queue: str) -> list[OutboxRecord]:
        """Start-up only (a blocking connection, before the reactor runs)."""
        redis = self._blocking()
        try:
            found = redis.call("HGETALL", self._key(queue))
        finally:
            redis.close()
        records = []
        for seq, packed in zip(found[::2], found[1::2]):
            body, expires_at = msgpack.unpackb(packed)
            records.append(OutboxRecord(int(seq), body, expires_at))
        return sorted(records, key=lambda record: record.seq)

    def forget_others(self, queues: set[str]) -> int:
        """Start-up only, as :meth:`load`."""
        redis = self._blocking()
        try:
            gone = 0
            found = redis.call("HGETALL", self._index)
            node = self._shared.engine.node_bytes
            for name, writer in zip(found[::2], found[1::2]):
                queue = name.decode()
                if writer == node and queue not in queues:
                    gone += redis.call("HLEN", self._key(queue))
                    redis.call("DEL", self._key(queue))
                    redis.call("HDEL", self._index, name)
        finally:
            redis.close()
        return gone

    def append(self, queue: str, record: OutboxRecord) -> None:
        """Written in the realm's per-turn batch; the first append of a queue also names this
        node its writer in the index, so another node never deletes it at start."""
        if queue not in self._indexed:
            self._indexed.add(queue)
            self._shared.write(command("HSET", self._index, queue,
                                       self._shared.engine.node_bytes))
        self._shared.write(command("HSET", self._key(queue), record.seq,
                                   msgpack.packb([record.body, record.expires_at])))

    def remove(self, queue: str, seq: int) -> None:
        """Written in the realm's per-turn batch, after the appends it follows."""
        self._shared.write(command("HDEL", self._key(queue), seq))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """The realm's batch durability: answered once Redis has every write so far."""
        self._shared.when_durable(callback)

