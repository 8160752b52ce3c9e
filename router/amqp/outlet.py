"""What an AMQP subscriber sees of its connection and of its frontend, as protocols.

The subscriber is below both in the import graph (connection -> frontend ->
subscriber): it gets the objects, but knows them only by these shapes, so neither
module is imported by it and the package has no import cycle.
"""

from __future__ import annotations

from typing import Any, Protocol

from proton import Connection

from router.amqp.persistence import AmqpStore
from router.core.model import SessionInfo
from router.core.realm import Realm
from router.core.scheduler import Scheduler
from router.flow import ConnectionFlow
from router.settings import AmqpSettings


class Outlet(Protocol):
    """The connection a receiver link is attached on (an ``AmqpConnection``)."""

    flow: ConnectionFlow
    info: SessionInfo | None
    connection: Connection | None
    """The proton engine's connection (its ``remote_container`` names the client)."""

    def process(self) -> None:
        """Write what the subscriber put on its link."""

    def steal(self, subscriber: Any) -> None:
        """Detach ``subscriber``'s link: it was attached on another connection."""

    def revoke(self, subscriber: Any, reason: str) -> None:
        """Close ``subscriber``'s link as unauthorized and forget it."""

    def kill(self, reason: str, message: str | None) -> None: ...


class SubscriberOwner(Protocol):
    """The realm's AMQP frontend, as its subscribers use it (an ``AmqpFrontend``)."""

    settings: AmqpSettings
    store: AmqpStore
    realm: Realm
    scheduler: Scheduler
    durable: dict[tuple[str, str], Any]
    """Durable subscribers by (container id, link name)."""

    def destroy(self, subscriber: Any) -> None:
        """Forget ``subscriber`` and its queue."""
