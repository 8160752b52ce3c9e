"""Where a bridge's QoS >= 1 messages wait for the remote broker, and where it runs: the
contracts its engine fulfils.

The bridge (:mod:`router.bridge`) keeps its queue in memory and writes each change
through :class:`BridgeQueueStore`, in order, so that a restarted router (or, in a
cluster, the node that takes the bridge over) sends what was not yet handed over. The
embedded engine keeps it on the node's SQLite writer
(:mod:`router.engines.embedded.bridge_queues`), the Redis engine in Redis
(:mod:`router.engines.redis.bridges`); a message is an opaque blob here. Which node runs a
bridge is the engine's answer too (:meth:`router.core.engine.Engine.run_bridge`): the only
node, or the one holding the bridge's lock in Redis.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable


@runtime_checkable
class BridgeQueueStore(Protocol):
    """One bridge's durable queue: (sequence number, message blob) rows, oldest first."""

    def load(self, answer: Callable[[list[tuple[int, bytes]]], None],
             failed: Callable[[str], None]) -> None:
        """``answer`` every queued message in sequence order (before any write), at once or
        later on the event loop; or ``failed(why)`` when they cannot be read now."""

    def append(self, seq: int, message: bytes) -> None:
        """Queue ``message`` as number ``seq`` (higher than every earlier one)."""

    def delete(self, seq: int) -> None:
        """The remote acknowledged message ``seq``: it no longer waits."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every change so far is stored (or failed to be)."""

