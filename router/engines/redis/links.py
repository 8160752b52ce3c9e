"""AMQP durable receiver links in Redis: a durable link follows its client to any node.

Keys (``<realm>`` as configured, ``<link>`` the link's
:func:`router.amqp.persistence.link_id` of container id and link name; every write of a
reactor turn goes to Redis in one pipelined batch); ownership and takeover (hash
``wr:amqp-owner:<realm>``, channel ``wr:takeover:<node>``) are
:mod:`router.engines.redis.claims`'s, by link id:

* hash ``wr:amqp-link:<realm>``: link -> MessagePack ``[container, link name, address, qos,
  policy, authid, authrole, authmethod, shared group]``.
* hash ``wr:amqp-expiry:<realm>``: link -> MessagePack ``[timeout, detached_at]``.
* hash ``wr:amqp-queue:<realm>:<link>``: sequence number -> the queued message
  (:meth:`Outgoing.pack`); hash ``wr:amqp-count:<realm>:<link>``: sequence number -> its
  delivery count, so counting an attempt rewrites a number, not the message.

A node reaping a dead one becomes the owner of its durable links in the reaping script and
loads each of them as an own claim (:meth:`RedisAmqpStore.adopt_links`): detached and
subscribed there, they queue until their client attaches on any node (or they expire).

The QoS 2 delivery tags of durable *sender* links (exactly-once publishing) stay in the
node's SQLite, as on a single node (:class:`router.engines.embedded.links.SqliteInboundTags`,
which the store holds and hands those calls to).
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import TYPE_CHECKING, Callable

import msgpack

from router.amqp.persistence import Outgoing, StoredDurable, expired, link_id
from router.engines.embedded.links import SqliteInboundTags
from router.engines.embedded.sqlite import SqliteStore
from router.engines.redis.claims import RedisClaims
from router.engines.redis.resp import Command, Reply

if TYPE_CHECKING:
    from router.engines.redis.context import RealmContext

log = logging.getLogger(__name__)


class RedisAmqpStore(RedisClaims[StoredDurable]):
    """:class:`router.amqp.persistence.AmqpStore`'s durable subscriptions on Redis, plus the
    ownership of durable links among the nodes (:class:`RedisClaims`); the QoS 2 tags of
    sender links in the node's SQLite file."""

    protocol = "amqp"
    label = "AMQP durable link"

    def __init__(self, shared: "RealmContext", realm: str, local: SqliteStore) -> None:
        super().__init__(shared, realm)
        self._tags = SqliteInboundTags(local, realm)
        self.inbound = self._tags.inbound
        """Unsettled QoS 2 delivery tags per durable sender link (container, link)."""
        self._expiry: dict[tuple[str, str], tuple[float, float | None]] = {}
        """(timeout, detached_at) of each link read or set here."""
        self._link_key = f"wr:amqp-link:{realm}".encode()
        self._expiry_key = f"wr:amqp-expiry:{realm}".encode()
        self.max_expiry = math.inf
        """The realm's ``amqp.max_link_expiry``: caps the timeouts read (set by :meth:`load`)."""
        self.adopt: Callable[[str, StoredDurable | None], None] = lambda owned, stored: None
        """Set by the AMQP frontend."""

    def adopt_links(self, links: list[str]) -> None:
        """This node now owns ``links`` (their node died; the reaping script made it their
        owner): load each one as an own claim, then hand it to the frontend."""
        for owned in links:
            self.adopt_owned(owned, partial(self._adopted, owned))

    def _adopted(self, owned: str, stored: StoredDurable | None) -> None:
        self.adopt(owned, stored)

    def _keys(self, owned: str) -> tuple[bytes, bytes]:
        """The queue and delivery count keys of one link."""
        suffix = f"{self._realm}:{owned}".encode()
        return b"wr:amqp-queue:" + suffix, b"wr:amqp-count:" + suffix

    def _reads(self, owned: str) -> list[Command]:
        queue, counts = self._keys(owned)
        return [("HGET", self._link_key, owned), ("HGET", self._expiry_key, owned),
                ("HGETALL", queue), ("HGETALL", counts)]

    def _stored(self, owned: str, replies: list[Reply]) -> StoredDurable | None:
        """The link's subscription and queue; None if Redis holds none or it expired (then
        it is deleted)."""
        record, expiry, queue, counts = replies
        if record is None:
            return None
        (container, link, address, qos, policy, authid, authrole, authmethod,
         group) = msgpack.unpackb(record, raw=False)
        timeout, detached_at = (msgpack.unpackb(expiry) if expiry is not None
                                else (self.max_expiry, None))
        timeout = min(timeout, self.max_expiry)
        if expired(timeout, detached_at, time.time()):
            log.info("AMQP durable subscription %s/%s expired while no node had it",
                     container, link)
            self.delete(container, link)
            return None
        self._expiry[(container, link)] = (timeout, detached_at)
        count_of = dict(zip(counts[::2], counts[1::2]))
        queued = [Outgoing.unpack(int(seq), blob, int(count_of.get(seq, 0)))
                  for seq, blob in sorted(zip(queue[::2], queue[1::2]),
                                          key=lambda item: int(item[0]))]
        return StoredDurable(container, link, address, qos, policy, authid, authrole,
                             authmethod, queued=queued, group=group)

    # AmqpStore (router.amqp.persistence) ------------------------------------------------

    def load(self, max_expiry: float, now: float | None = None) -> list[StoredDurable]:
        """Start-up: the durable links this node owned when it stopped."""
        self.max_expiry = max_expiry
        return self.load_owned()

    def expiry_of(self, container: str, link: str) -> tuple[float, float | None]:
        """(timeout, detached_at) of a link read by :meth:`load` or claimed here."""
        return self._expiry[(container, link)]

    def set_expiry(self, container: str, link: str, timeout: float,
                   detached_at: float | None = None) -> None:
        """The link's timeout and detach time, in Redis: a node adopting the link knows when it
        expires."""
        self._expiry[(container, link)] = (timeout, detached_at)
        self._write("HSET", self._expiry_key, link_id(container, link),
                    msgpack.packb([timeout, detached_at]))

    def save(self, container: str, link: str, address: str, qos: int, policy: str,
             authid: str, authrole: str, authmethod: str, group: str | None = None) -> None:
        """A durable link's definition in Redis, so any node can restore it."""
        self._write("HSET", self._link_key, link_id(container, link), msgpack.packb(
            [container, link, address, qos, policy, authid, authrole, authmethod, group],
            use_bin_type=True))

    def delete(self, container: str, link: str) -> None:
        """The link is gone: its definition, expiry and queue leave Redis."""
        self._expiry.pop((container, link), None)
        owned = link_id(container, link)
        self._write("HDEL", self._link_key, owned)
        self._write("HDEL", self._expiry_key, owned)
        self._write("DEL", *self._keys(owned))

    def enqueue(self, container: str, link: str, item: Outgoing) -> None:
        """A message queued for the link in Redis, so it follows the link to any node."""
        queue, counts = self._keys(link_id(container, link))
        self._write("HSET", queue, item.seq, item.pack())
        self._write("HSET", counts, item.seq, item.delivery_count)

    def update_count(self, container: str, link: str, item: Outgoing,
                     count: int | None = None) -> None:
        """The delivery count of a queued message, kept apart from the message so counting
        rewrites a number only."""
        self._write("HSET", self._keys(link_id(container, link))[1], item.seq,
                    item.delivery_count if count is None else count)

    def remove(self, container: str, link: str, seq: int) -> None:
        """A queued message was accepted or dropped."""
        queue, counts = self._keys(link_id(container, link))
        self._write("HDEL", queue, seq)
        self._write("HDEL", counts, seq)

    def has_inbound(self, key: tuple[str, str], tag: bytes) -> bool:
        """See :meth:`SqliteInboundTags.has_inbound` (sender links' tags stay on the node)."""
        return self._tags.has_inbound(key, tag)

    def add_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """See :meth:`SqliteInboundTags.add_inbound`."""
        self._tags.add_inbound(key, tag)

    def delete_inbound(self, key: tuple[str, str], tag: bytes) -> None:
        """See :meth:`SqliteInboundTags.delete_inbound`."""
        self._tags.delete_inbound(key, tag)

    def forget_inbound(self, key: tuple[str, str]) -> None:
        """See :meth:`SqliteInboundTags.forget_inbound`."""
        self._tags.forget_inbound(key)

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Once Redis (the links) and the node's SQLite (QoS 2 tags of sender links) have
        what was written so far."""
        super().when_durable(lambda shared: self._tags.when_durable(
            lambda stored: callback(shared and stored)))
