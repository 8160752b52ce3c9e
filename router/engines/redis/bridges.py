"""Bridges on the Redis engine: exactly one node runs each, and its queue lives in Redis.

* string ``wr:bridge-lock:<realm>:<bridge>``: the node that runs the bridge, with a TTL of
  ``cluster.node_timeout``. Every node tries every ``cluster.heartbeat_interval``
  (:data:`LOCK`): the holder renews it, another takes it only once it is gone, so a node that
  dies hands its bridges to another within about ``node_timeout``. A holder that could not
  renew for ``node_timeout - heartbeat_interval`` stops its bridge before the key can expire
  (Redis away or this node paused), so two nodes never run one bridge at once as far as
  their clocks agree; a node that shuts down deletes its keys (:data:`UNLOCK`) at once.
* hash ``wr:bridge-queue:<realm>:<bridge>``: sequence number -> queued message, written in
  the realm's batch of the turn (the publisher's acknowledgement waits for it), read by the
  node that takes the bridge over.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from twisted.internet import task

from router.engines.redis.context import EngineContext, RealmContext
from router.engines.redis.lua import script
from router.engines.redis.resp import command

log = logging.getLogger(__name__)

LOCK = script("bridge_lock")
"""KEYS: the lock. ARGV: this node, TTL in ms. Answer: 1 if this node holds it now."""
UNLOCK = script("bridge_unlock")
"""KEYS: the lock. ARGV: this node. Deletes it if this node holds it."""


class RedisBridgeQueue:
    """One bridge's queued messages in a Redis hash."""

    def __init__(self, shared: RealmContext, bridge: str) -> None:
        self._shared = shared
        self.key = f"wr:bridge-queue:{shared.name}:{bridge}"

    def load(self, answer: Callable[[list[tuple[int, bytes]]], None],
             failed: Callable[[str], None]) -> None:
        """Read after this node's pending writes are flushed, so the answer holds them (a
        node taking the bridge over reads what the dead holder left)."""
        self._shared.flush()  # what this node wrote goes before the read
        reply = self._shared.engine.request(command("HGETALL", self.key))
        reply.addCallbacks(
            lambda flat: answer(sorted((int(flat[i]), bytes(flat[i + 1]))
                                       for i in range(0, len(flat), 2))),
            lambda failure: failed(failure.getErrorMessage()))

    def append(self, seq: int, message: bytes) -> None:
        """Written in the realm's per-turn batch."""
        self._shared.write(command("HSET", self.key, seq, message))

    def delete(self, seq: int) -> None:
        """Written in the realm's per-turn batch, after the append it undoes."""
        self._shared.write(command("HDEL", self.key, seq))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """The realm's batch durability: answered once Redis has every write so far."""
        self._shared.when_durable(callback)


class BridgeLocks:
    """The bridges this node may run, each while it holds the bridge's lock."""

    def __init__(self, engine: EngineContext) -> None:
        self.engine = engine
        self._bridges: dict[bytes, _Held] = {}
        self._loop = task.LoopingCall(self.renew)
        self._loop.clock = engine.reactor

    def run(self, realm: str, bridge: str, start: Callable[[], None],
            stop: Callable[[], None]) -> None:
        """Try for the bridge's lock every heartbeat; ``start`` once it is held here,
        ``stop`` if it may be lost (see :meth:`renew`)."""
        key = f"wr:bridge-lock:{realm}:{bridge}".encode()
        self._bridges[key] = _Held(bridge, start, stop)
        if not self._loop.running:
            self._loop.start(self.engine.limits.heartbeat_interval, now=True)

    def renew(self) -> None:
        """Try every lock: take or keep it; stop a bridge whose lock may be lost."""
        limits = self.engine.limits
        ttl = int(limits.node_timeout * 1000)
        for key, held in self._bridges.items():
            if self.engine.commands is None:
                reply = None
            else:
                reply = self.engine.request(command("EVAL", LOCK, 1, key,
                                                    self.engine.node_bytes, ttl))
                reply.addCallbacks(held.answered, lambda failure: None)
            if held.running and (time.monotonic() - held.renewed
                                 > limits.node_timeout - limits.heartbeat_interval):
                log.warning("bridge %s: its lock in Redis was not renewed in time: stopped "
                            "here (another node may run it now)", held.name)
                held.running = False
                held.stop()

    def close(self) -> list[tuple[Any, ...]]:
        """Stop trying; the commands that give up this node's locks."""
        if self._loop.running:
            self._loop.stop()
        return [("EVAL", UNLOCK, 1, key, self.engine.node_bytes)
                for key, held in self._bridges.items() if held.running]


class _Held:
    """One bridge's lock as this node sees it."""

    def __init__(self, name: str, start: Callable[[], None], stop: Callable[[], None]) -> None:
        self.name = name
        self.start = start
        self.stop = stop
        self.running = False
        self.renewed = 0.0

    def answered(self, holds: int) -> None:
        if holds:
            self.renewed = time.monotonic()
            if not self.running:
                log.info("bridge %s: this node runs it (it holds its lock in Redis)", self.name)
                self.running = True
                self.start()
        elif self.running:  # another node holds it: ours expired
            log.warning("bridge %s: another node holds its lock: stopped here", self.name)
            self.running = False
            self.stop()

