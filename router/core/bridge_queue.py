"""Where a bridge's QoS >= 1 messages wait for the remote broker: the store's contract.

The bridge (:mod:`router.bridge`) keeps its queue in memory and writes each change
through this Protocol, in order, so that a restarted router sends what it had not yet
handed over. The embedded engine implements it on the node's SQLite writer
(:mod:`router.engines.embedded.bridge_queues`); a message is an opaque blob here.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable


@runtime_checkable
class BridgeQueueStore(Protocol):
    """One bridge's durable queue: (sequence number, message blob) rows, oldest first."""

    def load(self) -> list[tuple[int, bytes]]:
        """Every queued message in sequence order (at start-up, before any write)."""

    def append(self, seq: int, message: bytes) -> None:
        """Queue ``message`` as number ``seq`` (higher than every earlier one)."""

    def delete(self, seq: int) -> None:
        """The remote acknowledged message ``seq``: it no longer waits."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every change so far is stored (or failed to be)."""
