"""Durable AMQP subscriptions and their unacknowledged QoS >= 1 deliveries.

A receiver link attached with a durable source (durability ``unsettled-state``
and expiry policy ``never``, or another expiry policy with a timeout > 0) is a
durable subscription, keyed by the client's container id and the link name. Its
definition and every QoS >= 1 message not yet accepted are written through the
engine's store (:class:`AmqpStore`; the embedded engine's SQLite tables are in
:mod:`router.engines.embedded.links`) in order, so they survive a disconnect and a router restart. The
delivery count of a message is written (incremented) as it is sent, so a message
in flight when the router dies comes back counted.

Every durable source expires (the store keeps the timeout and when it was detached) that many seconds after its link went away: its own timeout, capped by
the realm's ``amqp.max_link_expiry``, which is also the timeout of a source with
expiry policy ``never``. The subscription and its queue are dropped, at run time
or at start-up when the time passed while the router was down (timeouts stored
before a lower cap are capped when they are read).

The store's inbound set holds the delivery tags of QoS 2 messages received on a
client's durable sender link (target durability other than ``none``, receiver
settle mode ``second``), keyed by container id and link name, that were
published but not yet settled by the client: a delivery resent with such a tag
(after a lost disposition, on a re-attached link or after a router restart) is
accepted again but not published again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import msgpack

from router.core.engine import Claims

@dataclass
class Outgoing:
    """One delivery to one receiver, as it will be (re)sent."""

    seq: int
    topic: str
    bare: bytes
    """The encoded bare message (shared by the receivers of one publication); the header
    and annotations are added as it is sent."""
    published_qos: int
    qos: int
    retained: bool
    delivery_count: int = 0
    expires_at: float | None = None
    """Message expiry: not sent after this time."""
    sent_at: float = field(default=0.0, compare=False)
    """When it was last sent (not stored): for the acknowledgement latency."""
    publication: Any = field(default=None, compare=False, repr=False)
    """The publication, kept (not stored) when it came through a shared group: another
    member takes it if this one goes away first."""

    def pack(self) -> bytes:
        return msgpack.packb([self.topic, self.bare, self.published_qos, self.qos,
                              self.retained, self.expires_at, BARE_MESSAGE], use_bin_type=True)

    @classmethod
    def unpack(cls, seq: int, blob: bytes, delivery_count: int) -> "Outgoing":
        topic, body, published_qos, qos, retained, *rest = msgpack.unpackb(blob, raw=False)
        expires_at = rest[0] if rest else None  # stored before messages had an expiry
        if rest[1:] != [BARE_MESSAGE]:  # stored as the payload of a data section
            from router.amqp.body import bytes_message  # (proton: only where AMQP is used)
            body = bytes_message(topic, body)
        return cls(seq, topic, body, published_qos, qos, retained, delivery_count, expires_at)


BARE_MESSAGE = 1
"""The format mark of a queued message stored as its encoded bare message."""


@dataclass
class StoredDurable:
    container: str
    link: str
    address: str
    qos: int
    policy: str
    authid: str
    authrole: str
    authmethod: str
    queued: list[Outgoing] = field(default_factory=list)
    group: str | None = None
    """The shared group the link is a member of, if any."""


@runtime_checkable
class LinkClaims(Claims["StoredDurable"], Protocol):
    """The Redis engine's :class:`Claims` of durable links: also the adoption of the links
    of a node that died."""

    adopt: Callable[[str, "StoredDurable | None"], None]
    """Set by the frontend: ``adopt(link id, stored)`` of a durable link whose node died:
    the link, if Redis holds it and it has not expired, now lives here."""


def expired(timeout: float, detached_at: float | None, now: float) -> bool:
    """Whether a durable subscription detached at ``detached_at`` (None: attached) with
    expiry ``timeout`` is over at ``now``."""
    return detached_at is not None and detached_at + timeout <= now


def link_id(container: str, link: str) -> str:
    """One string for a durable link's (container id, link name), whatever their characters
    (the id of its state among nodes); :func:`link_key` reads it back."""
    return f"{len(container)}:{container}{link}"


def link_key(owned: str) -> tuple[str, str]:
    """(container id, link name) of a :func:`link_id`."""
    length, rest = owned.split(":", 1)
    return rest[:int(length)], rest[int(length):]


class AmqpStore(Protocol):
    """Where a realm's durable AMQP links live (the embedded engine's SQLite file or Redis):
    the frontend reads them at start and queues every change in order."""

    inbound: dict[tuple[str, str], set[bytes]]
    """Unsettled QoS 2 delivery tags per durable sender link (container, link)."""

    def load(self, max_expiry: float, now: float | None = None) -> list[StoredDurable]:
        """The durable subscriptions to restore; expired ones are deleted instead."""

    def expiry_of(self, container: str, link: str) -> tuple[float, float | None]:
        """(timeout, detached_at) of a subscription read by :meth:`load`."""

    def set_expiry(self, container: str, link: str, timeout: float,
                   detached_at: float | None = None) -> None:
        """The subscription's timeout, and since when it is detached (None: attached)."""

    def has_inbound(self, key: tuple[str, str], tag: bytes) -> bool:
        """Whether a QoS 2 delivery with ``tag`` was published and not yet settled."""

    def add_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """A QoS 2 delivery was published; it waits for its settlement."""

    def delete_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """A QoS 2 delivery was settled."""

    def forget_inbound(self, key: tuple[str, str]) -> None:
        """The sender link was closed: its unsettled deliveries are gone (spec 2.6.6)."""

    def save(self, container: str, link: str, address: str, qos: int, policy: str,
             authid: str, authrole: str, authmethod: str, group: str | None = None) -> None:
        """A durable subscription's definition (and its shared group, if any)."""

    def delete(self, container: str, link: str) -> None:
        """The durable subscription and its queue are gone."""

    def enqueue(self, container: str, link: str, item: Outgoing) -> None:
        """A QoS >= 1 delivery queued for the subscription."""

    def update_count(self, container: str, link: str, item: Outgoing,
                     count: int | None = None) -> None:
        """Store the item's delivery count (or ``count``)."""

    def remove(self, container: str, link: str, seq: int) -> None:
        """A queued delivery was accepted (or dropped)."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every change queued so far is stored."""
