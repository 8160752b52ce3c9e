"""Client state that follows its client to any node: ownership, takeover, load on claim.

Shared by MQTT persistent sessions (:mod:`router.engines.redis.sessions`) and AMQP durable
links (:mod:`router.engines.redis.links`); each names its state by a string id (a client id,
a container id and link name) and says which keys hold it.

* hash ``wr:<protocol>-owner:<realm>``: id -> the node that has the state in memory
  (client attached or not). Only the owner queues publications for it and changes it.
* hash ``wr:<protocol>-holder:<realm>``: id -> who the state belongs to
  (:func:`router.core.ownership.owner`), set by the claim that created it, removed with the
  owner entry. A claim for another holder is refused in the claiming script itself: the
  state, its node and its client are not touched.
* channel ``wr:takeover:<node>``: MessagePack ``[realm, protocol, kind, id, node]``: "take"
  (the sender has claimed the id: detach its client, write what is under way, then
  answer) and "released" (done: the state in Redis is complete).

A claim (MQTT CONNECT, AMQP attach of a durable link) sets this node as the owner and, in
the same script, tells the previous owner to let go. The new owner loads the state from
Redis once the old one answered "released" (or after ``cluster.session_takeover_timeout``
when it does not answer: a stopped node; or at once when that node is found dead,
:meth:`RedisClaims.node_down`), so nothing the old owner queued is missed. A
"take" (or a second claim here) that arrives while this node's own claim of that id is
still under way waits for it to finish.

The node that reaps a dead one becomes the owner of the dead node's ids in the reaping
script (:data:`router.engines.redis.failure.REAP`, every owner hash of the realm) and loads
each one's state as an own claim (:meth:`RedisClaims.adopt_owned`).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

import msgpack
from twisted.python.failure import Failure

from router.core.incidents import ENGINE_UNAVAILABLE
from router.engines.redis.lua import script
from router.engines.redis.resp import BlockingRedis, Command, Reply, command

if TYPE_CHECKING:
    from router.engines.redis.context import RealmContext

log = logging.getLogger(__name__)

TAKEOVER_CHANNEL_PREFIX = b"wr:takeover:"

CLAIM = script("claim")
"""KEYS owner hash, holder hash; ARGV id, this node, the channel prefix, the "take"
message, the claiming holder. Answers nil when the state belongs to another holder (nothing
changed), the previous owner when it was another node (it has been told), else ''."""

DISOWN = script("disown")
"""Forget the owner and holder of an id only if it is still this node's."""

Stored = TypeVar("Stored")

Release = Callable[[str, Callable[[], None]], None]
"""The frontend's hook: ``release(id, done)`` drops the state from this node (detaching
its client as a takeover) and calls ``done`` once its writes are stored."""


class RedisClaims(Generic[Stored]):
    """The ownership of ids among the nodes (see the module docstring); a subclass says
    how one id's state is read (:meth:`_reads`) and decoded (:meth:`_stored`)."""

    protocol = ""
    """"mqtt" or "amqp": names the owner hash, the takeover messages and incidents."""
    label = ""
    """What an id names, for logs: "MQTT client"."""

    def __init__(self, shared: "RealmContext", realm: str) -> None:
        self._shared = shared
        self._engine = shared.engine
        self._realm = realm
        self.owner_key = f"wr:{self.protocol}-owner:{realm}".encode()
        self.holder_key = f"wr:{self.protocol}-holder:{realm}".encode()
        self.release: Release = lambda owned, done: done()
        """Set by the frontend."""
        self._claims: dict[str, list[Callable[[], None]]] = {}
        """Ids this node is claiming -> what waits for the claim to finish (other nodes'
        "take", a second claim here)."""
        self._waiting: dict[str, tuple[bool, Callable[[Stored | None], None], Any]] = {}
        """Ids whose previous owner has not answered yet -> (load, answer, timer)."""
        self._waiting_for: dict[str, str] = {}
        """Ids in ``_waiting`` -> the node they wait for."""

    def _reads(self, owned: str) -> list[Command]:
        """The commands that read one id's state (answered in this order)."""
        raise NotImplementedError

    def _stored(self, owned: str, replies: list[Reply]) -> Stored | None:
        """The state from the replies to :meth:`_reads`; None if Redis holds none."""
        raise NotImplementedError

    def _write(self, *args: bytes | str | int | float) -> None:
        self._shared.write(command(*args))

    def _message(self, kind: str, owned: str) -> bytes:
        message: bytes = msgpack.packb(
            [self._realm, self.protocol, kind, owned, self._engine.node], use_bin_type=True)
        return message

    def claim(self, owned: str, holder: str, load: bool,
              answer: Callable[[Stored | None], None], refused: Callable[[], None]) -> None:
        """Make this node the owner of ``owned`` for ``holder``; ``answer(state)`` with what
        Redis holds (read once the node that had it let go; only if ``load``: a clean start
        needs none), or None; ``refused()`` instead if the state belongs to another holder.
        Either may run at once."""
        after = self._claims.get(owned)
        if after is not None:  # a claim of this node is under way: this one follows it, to
            # be checked against what it leaves (refused, or the state here already)
            after.append(partial(self.claim, owned, holder, load, answer, refused))
            return
        self._claims[owned] = []
        engine = self._engine
        claimed = engine.request(command("EVAL", CLAIM, 2, self.owner_key, self.holder_key,
                                         owned, engine.node, TAKEOVER_CHANNEL_PREFIX,
                                         self._message("take", owned), holder))
        claimed.addCallbacks(self._claimed, self._claim_failed, (owned, load, answer, refused),
                             errbackArgs=(owned, answer))

    def _claimed(self, previous: bytes | None, owned: str, load: bool,
                 answer: Callable[[Stored | None], None], refused: Callable[[], None]) -> None:
        if previous is None:  # another holder's: nothing was changed
            self._finish(owned, lambda nothing: refused(), None)
            return
        if not previous:
            self._ready(owned, load, answer)
            return
        timeout = self._engine.limits.session_takeover_timeout
        timer = self._engine.reactor.callLater(timeout, self._not_released, owned,
                                               previous.decode())
        self._waiting[owned] = (load, answer, timer)
        self._waiting_for[owned] = previous.decode()

    def _ready(self, owned: str, load: bool, answer: Callable[[Stored | None], None]) -> None:
        """No other node has the state any more: answer (with it if ``load``)."""
        if load:
            self._load(owned, answer)
        else:
            self._finish(owned, answer, None)

    def _claim_failed(self, failure: Failure, owned: str,
                      answer: Callable[[Stored | None], None]) -> None:
        self._engine.incidents.count(self._realm, self.protocol, ENGINE_UNAVAILABLE,
                                     f"{self.label} {owned}: not claimed or read in Redis "
                                     f"({failure.getErrorMessage()}): this node's copy, if "
                                     "any, is used")
        self._finish(owned, answer, None)

    def _not_released(self, owned: str, node: str) -> None:
        log.warning("%s %s: node %s did not release the session within %.1f s: resumed from "
                    "what Redis holds", self.label, owned, node,
                    self._engine.limits.session_takeover_timeout)
        load, answer, _ = self._waiting.pop(owned)
        del self._waiting_for[owned]
        self._ready(owned, load, answer)

    def waited_nodes(self) -> set[str]:
        """The nodes whose release of an id a claim of this node waits for."""
        return set(self._waiting_for.values())

    def node_down(self, node: str) -> None:
        """Node ``node`` was found dead: claims waiting for it to let go resume at once
        from what it had written to Redis."""
        for owned in [o for o, waited in self._waiting_for.items() if waited == node]:
            self.released(owned)

    def released(self, owned: str) -> None:
        """The previous owner let go: its writes are in Redis."""
        waiting = self._waiting.pop(owned, None)
        if waiting is not None:
            del self._waiting_for[owned]
            load, answer, timer = waiting
            if timer.active():
                timer.cancel()
            self._ready(owned, load, answer)

    def take(self, owned: str, node: str) -> None:
        """Node ``node`` claimed ``owned``: let go (after this node's own claim, if one is
        under way), then tell it."""
        after = self._claims.get(owned)
        if after is not None:
            after.append(partial(self.take, owned, node))
            return
        done = self._message("released", owned)
        self.release(owned, lambda: self._shared.write(
            command("PUBLISH", TAKEOVER_CHANNEL_PREFIX + node.encode(), done)))

    def adopt_owned(self, owned: str, adopted: Callable[[Stored | None], None]) -> None:
        """This node now owns ``owned`` (its node died; the reaping script made this node
        its owner): load its state as an own claim, then ``adopted(state)``; None if Redis
        holds none, or if a claim of this node is under way (it brings the state here).
        Another node's "take" waits for the load, then gets "released" as from any owner."""
        after = self._claims.get(owned)
        if after is not None:
            after.append(partial(adopted, None))
            return
        self._claims[owned] = []
        self._load(owned, adopted)

    def hold(self, owned: str, holder: str) -> None:
        """Who the state of ``owned`` here belongs to (state stored without a holder entry,
        by an older version, gets one this way)."""
        self._write("HSET", self.holder_key, owned, holder)

    def disown(self, owned: str) -> None:
        """The state ended here: no node owns the id any more (unless one claimed it)."""
        self._write("EVAL", DISOWN, 2, self.owner_key, self.holder_key, owned,
                    self._engine.node)

    def _load(self, owned: str, answer: Callable[[Stored | None], None]) -> None:
        """Read the state in one transaction, then answer with it."""
        reads = self._reads(owned)
        data = command("MULTI") + b"".join(command(*args) for args in reads) + command("EXEC")
        self._shared.flush()
        loaded = self._engine.request(data, len(reads) + 1)
        loaded.addCallback(partial(self._stored, owned))  # a decoding error fails the claim
        loaded.addCallbacks(partial(self._finish, owned, answer), self._claim_failed,
                            errbackArgs=(owned, answer))

    def _finish(self, owned: str, answer: Callable[[Stored | None], None],
                stored: Stored | None) -> None:
        """Answer the claim, then let go for the nodes that asked meanwhile."""
        after = self._claims.pop(owned, [])
        try:
            answer(stored)
        finally:  # a bug in one client's answer must not leave the others waiting
            for then in after:
                then()

    def load_owned(self) -> list[Stored]:
        """Start-up: the states this node owned when it stopped (an owner entry without
        state, left by a claim that stored nothing, is dropped)."""
        host, port, db = self._engine.address
        redis = BlockingRedis(host, port, db)
        try:
            owners = redis.call("HGETALL", self.owner_key)
            found = []
            for owned, node in zip(owners[::2], owners[1::2]):
                if node != self._engine.node_bytes:
                    continue
                stored = self._stored(owned.decode(),
                                      [redis.call(*args) for args in self._reads(owned.decode())])
                if stored is None:
                    redis.call("HDEL", self.owner_key, owned)
                    redis.call("HDEL", self.holder_key, owned)
                else:
                    found.append(stored)
            return found
        finally:
            redis.close()

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once Redis answered every write of the realm queued so far."""
        self._shared.when_durable(callback)
