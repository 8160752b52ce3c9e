"""What the Prometheus metrics and the ``$SYS`` figures read of a running node.

Both read figures the node owns without owning the node: they see it through these
Protocols (:class:`router.node.Node` implements them), so the node may import them and
they never import the node.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from router.bridge.bridge import Bridge
from router.core.router import Router
from router.core.stats import Histogram
from router.limits import ConnectionLimits
from router.memory import MemoryReclaimer
from router.mqtt.frontend import MqttFrontend
from router.webhooks.webhook import Webhook


class WriterFigures(Protocol):
    """How the node's SQLite writer keeps up."""

    @property
    def commit_seconds(self) -> Histogram:
        """Time to commit one batch."""

    @property
    def batch_writes(self) -> Histogram:
        """Writes committed together in one transaction."""


class EventLogFigures(Protocol):
    """How far the event log writer is behind."""

    @property
    def backlog(self) -> int:
        """Records not yet written by the writer thread."""


class NodeFigures(Protocol):
    """The parts of a node its metrics and ``$SYS`` figures count."""

    @property
    def router(self) -> Router:
        """The realms, their sessions and the incidents counted on them."""

    @property
    def mqtt(self) -> Mapping[str, MqttFrontend]:
        """Per realm, its MQTT frontend: the persistent sessions whose client is away."""

    @property
    def webhooks(self) -> Sequence[Webhook]:
        """Every realm's webhooks: their state, queue and counts."""

    @property
    def bridges(self) -> Sequence[Bridge]:
        """The node's MQTT bridges: connected or not, queued, forwarded."""

    @property
    def reclaimer(self) -> MemoryReclaimer:
        """The heap trims: how many, how long, what they gave back."""

    @property
    def listener_limits(self) -> Sequence[ConnectionLimits]:
        """The connection bounds of every listener (and their counts)."""

    @property
    def store(self) -> WriterFigures:
        """The node's SQLite writer."""

    @property
    def eventlog(self) -> EventLogFigures:
        """The event log writer."""
