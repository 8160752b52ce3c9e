"""One realm's share of the Redis engine (:class:`RedisRealm`): interest both ways,
forwarding, retained writes, the batch of writes per reactor turn. Keys and channels are
described in :mod:`router.engines.redis.engine`."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, deque
from itertools import count
from typing import TYPE_CHECKING, Any, Callable

import msgpack
from twisted.internet import defer, task
from twisted.python.failure import Failure

from router.core.peer import Subscription
from router.core.subscriptions import PatternEntry, SubscriptionIndex
from router.core.incidents import ENGINE_BEHIND, ENGINE_UNAVAILABLE, STORE_FAILED
from router.core.model import Publication
from router.core.retention import RetainedEvent, RetainedStore, RetentionPolicy
from router.core.topic import SERVER_OWNED, Topic
from router.engines.records import (decode_retained, encode_retained, live_entries,
                                    pack_publication, pack_topic, topic_key, unpack_topic)
from router.engines.redis.claims import RedisClaims
from router.engines.redis.dealer import RedisDealer
from router.engines.redis.failure import (ALIVE_PREFIX, NODE_DOWN_CHANNEL, REAP,
                                          REAPED_MARK_LIFETIME, REAPED_PREFIX,
                                          RedisTestaments, take_left, testaments_key)
from router.engines.redis.links import RedisAmqpStore
from router.engines.redis.lua import script
from router.engines.redis.membership import RedisMembership
from router.engines.redis.resp import BlockingRedis, Command, Reply, command
from router.engines.redis.sessions import RedisMqttSessionStore

if TYPE_CHECKING:
    from router.core.realm import Realm
    from router.engines.redis.context import EngineContext

log = logging.getLogger(__name__)

INTEREST_CHANNEL = b"wr:interest"
QOS_CHANNEL_PREFIX = b"wr:node-qos:"
CONFIRM_CHANNEL_PREFIX = b"wr:confirm:"
RETAINED_CHANNEL = b"wr:retained"

SWEEP = script("sweep")
"""Drops topics whose every entry has expired. A topic set again meanwhile has a later
score, so a sweep never removes a fresher value."""

RETAIN = script("retain")
"""Compare and replace one topic: KEYS retained, retained-expiry, retained-token; ARGV
topic, the token the writer's memory had ('' for none), the new token, the entries ('' to
remove), the expiry score ('' for none), the channel, realm and node of the announcement.
Answers {1}, or {0, token, entries} of what Redis holds instead (nothing changed)."""

MAX_ATTEMPTS = 16
"""Writes of one retained change that lost to another node's before it is given up (each
loss means another node's write got through, so this only ends under constant contention)."""


class ConflictError(Exception):
    """A retained change that kept losing to other nodes' changes of the same topic."""


class _NodesAt(PatternEntry):
    """The nodes holding one (topic pattern, match): what :class:`RemoteInterest` indexes."""

    __slots__ = ("nodes",)

    def __init__(self, index_id: int, topic: Topic, match: str) -> None:
        super().__init__(index_id, topic, match)
        self.nodes: set[str] = set()


RETAINED_READ_CHUNK = 500
"""Topics read again per request after a resubscription (see :meth:`RedisRealm.reload_retained`)."""


class RemoteInterest:
    """Which other nodes want which topics of one realm: the broker's index, with node
    names where the broker has sessions."""

    def __init__(self) -> None:
        self.index: SubscriptionIndex[_NodesAt] = SubscriptionIndex()
        self._ids = count(1)
        self._patterns: dict[str, set[tuple[Topic, str]]] = {}

    def replace(self, node: str, patterns: set[tuple[Topic, str]]) -> None:
        """Node ``node`` now holds exactly ``patterns``."""
        index = self.index
        old = self._patterns.pop(node, set())
        for topic, match in old - patterns:
            entry = index.lookup(topic, match)
            if entry is not None:
                entry.nodes.discard(node)
                if not entry.nodes:
                    index.remove(entry)
        for topic, match in patterns - old:
            entry = index.lookup(topic, match)
            if entry is None:
                entry = _NodesAt(next(self._ids), topic, match)
                index.add(entry)
            entry.nodes.add(node)
        if patterns:
            self._patterns[node] = patterns

    def inherit(self, dead: str, heir: str) -> None:
        """Node ``dead`` is gone and ``heir`` adopted what it had: ``heir`` gets its
        patterns too, until ``heir`` announces its own (as the reaping did in the hash)."""
        inherited = self._patterns.get(dead, set())
        self.replace(dead, set())
        if inherited:
            self.replace(heir, self._patterns.get(heir, set()) | inherited)

    def holders(self) -> set[str]:
        """The nodes that hold any pattern."""
        return set(self._patterns)

    def nodes(self, topic: Topic) -> set[str]:
        """The nodes with a pattern matching ``topic``."""
        found: set[str] = set()
        for entry in self.index.matching(topic):
            found.update(entry.nodes)
        return found


def unpack_patterns(data: bytes | None) -> set[tuple[Topic, str]]:
    """A node's interest as stored in the interest hash and announced on its channel."""
    if not data:
        return set()
    return {(tuple(topic), match) for topic, match in msgpack.unpackb(data, raw=False)}


class RedisRealm:
    """One realm's share of the engine: interest both ways, forwarding, retained writes."""

    def __init__(self, engine: "EngineContext", name: str, policy: RetentionPolicy) -> None:
        self.engine = engine
        self.name = name
        self.realm: "Realm | None" = None
        self.dealer = RedisDealer(engine, name, engine.limits)
        self.members = RedisMembership(engine, name)
        self.remote = RemoteInterest()
        self.local: Counter[tuple[Topic, str]] = Counter()
        self._interest_due = False
        self._announce_after = 0.0
        """Reactor time before which the next announcement of this node's interest waits:
        each announcement packs every pattern, so a burst of changes (one client's 20,000
        filters, handled over many reactor turns) is announced a few times, not once per
        turn (see :meth:`announce_interest`)."""
        self._holding = 0
        """Reapings under way on this node: publications from other nodes wait in
        ``_held`` meanwhile (see :meth:`hold_forwarded`)."""
        self._held: list[tuple[Publication, str | None, int]] = []
        self._announce_after_hold = False
        self._heard: set[str] | None = None
        """Nodes whose interest came on the channel while a read of the hash is under way
        (see :meth:`reload_interest`); None when no read is."""
        self._interest_reads = 0
        self._retained_heard: set[bytes] | None = None
        """Topics whose change came on the channel while :meth:`reload_retained` reads;
        None when no read is."""
        self._retained_reads = 0
        self.retention = RetainedStore(policy, encode_retained)
        self.retention.listeners.append(self._retained_changed)
        self.keys = {kind: f"wr:{kind}:{name}".encode()
                     for kind in ("interest", "retained", "retained-expiry", "retained-token")}
        self._writes: list[bytes] = []
        """Session-state commands of this reactor turn, sent in one batch."""
        self._issued = 0
        self._pending: deque[list[Any]] = deque()
        """[number, ok or None while unanswered, deadline] of each durable request, oldest
        first (so by deadline too)."""
        self._waiters: deque[tuple[int, int, Callable[[bool], None]]] = deque()
        self._failures: list[int] = []
        self._flush_due = False
        self._forwarded = count(1)
        self._unconfirmed: dict[str, deque[tuple[int, float, defer.Deferred[bool]]]] = {}
        """node -> (number, deadline, settled when confirmed) of each QoS >= 1 publication
        sent to it and not confirmed yet, oldest first."""
        self._unconfirmed_count = 0
        self._confirms: dict[str, int] = {}
        """sending node -> number of the latest QoS >= 1 publication received from it, to
        confirm in this turn's batch."""
        self.sessions = RedisMqttSessionStore(self, name)
        self.claims: dict[str, RedisClaims[Any]] = {"mqtt": self.sessions}
        """Protocol -> the ids of its client state that follow their client among nodes."""
        self.links: RedisAmqpStore | None = None
        """The realm's durable AMQP links, where it has an AMQP frontend."""
        self.testaments = RedisTestaments(self)
        self.left: tuple[list[bytes], list[bytes]] | None = None
        """Testaments and wills this node's previous run left, until published."""
        self.tokens: dict[bytes, bytes] = {}
        """topic key -> token of the write whose state this node's memory holds."""
        self._latest_own: dict[bytes, bytes] = {}
        """topic key -> token of this node's latest write of it not yet announced back."""
        self._token_prefix = f"{engine.node}:{os.urandom(4).hex()}:".encode()
        self._tokens = count(1)

    # interest -------------------------------------------------------------

    def interest(self, subscription: Subscription, present: bool) -> None:
        """A local subscription or group came or went; peers hear of it in one message per
        reactor turn, however many subscribes arrived in it (a later turn's changes wait
        while the last message is recent, see :meth:`announce_interest`)."""
        self.members.subscription(subscription, present)
        key = (subscription.topic, subscription.match)
        if present:
            self.local[key] += 1
        else:
            self.local[key] -= 1
            if self.local[key] <= 0:
                del self.local[key]
        if not self._interest_due:
            self._interest_due = True
            reactor = self.engine.reactor
            reactor.callLater(max(0.0, self._announce_after - reactor.seconds()),
                              self.announce_interest)

    def announce_interest(self) -> None:
        """Tell the other nodes every pattern this node's sessions hold. The next one waits
        ten times as long as this one took, so that announcing costs the reactor a tenth
        of its time at most however fast subscriptions change (the other nodes' probes
        see the same interest a little later)."""
        self._interest_due = False
        if self._holding:  # the other nodes keep sending here what the dead node had
            self._announce_after_hold = True
            return
        engine = self.engine
        if engine.commands is None:
            return  # the connection announces it when it comes up (sessions restored first)
        started = time.monotonic()
        packed = msgpack.packb(sorted(self.local), use_bin_type=True)
        engine.send(command("HSET", self.keys["interest"], engine.node, packed)
                    + command("PUBLISH", INTEREST_CHANNEL,
                              msgpack.packb([self.name, engine.node, packed],
                                            use_bin_type=True)), 2)
        self._announce_after = (engine.reactor.seconds()
                                + 10 * (time.monotonic() - started))

    def reload_interest(self) -> defer.Deferred[bool]:
        """The interest channel is subscribed (again): read every node's patterns from the
        hash, since what a node announced between the start-up's read and the subscription
        (or while the subscription was down) never arrives; without it this node would
        not send that node its publications (a bridge started meanwhile on another node
        would not get them, acknowledged all the same). Fires with whether it was read."""
        if self._heard is None:
            self._heard = set()
        self._interest_reads += 1
        waited = sorted(self._waited_nodes())
        keys = ([ALIVE_PREFIX + node.encode() for node in waited]
                + [REAPED_PREFIX + node.encode() for node in waited])
        # one transaction: the reaping script takes a node's patterns out of the hash and
        # marks it reaped only while its alive key is gone, in one step too
        return self.engine.request(
            command("MULTI") + command("HGETALL", self.keys["interest"])
            + (command("MGET", *keys) if keys else b"") + command("EXEC"),
            2 + bool(keys)).addBoth(self._interest_read, waited)

    def _waited_nodes(self) -> set[str]:
        """The other nodes something here waits for or sends to: those whose death this node
        must act on (see :meth:`_interest_read`)."""
        return (self.remote.holders() | self.dealer.waited_nodes()
                | {node for claims in self.claims.values() for node in claims.waited_nodes()}
                | {node for node, waiting in self._unconfirmed.items() if waiting})

    def _interest_read(self, replies: Any, waited: list[str]) -> bool:
        heard = self._heard or set()
        self._interest_reads -= 1
        if not self._interest_reads:
            self._heard = None
        if isinstance(replies, Failure):  # the next subscription (after a reconnect) reads again
            self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                        f"interest not read ({replies.getErrorMessage()})")
            return False
        found, *marks = replies
        for field, packed in zip(found[::2], found[1::2]):
            node = field.decode()
            if node != self.engine.node and node not in heard:  # else announced as new
                self.remote.replace(node, unpack_patterns(packed))
        listed = {field.decode() for field in found[::2]}
        values = marks[0] if marks else []  # the alive keys, then the reaped marks
        for node, boot, reaper in zip(waited, values, values[len(waited):]):
            if node in listed or node in heard:
                continue
            if boot is not None:  # starting again (its previous run's patterns are gone)
                self.remote.replace(node, set())
            elif reaper is not None:  # reaped: the mark the reaping script left
                log.warning("realm %s: node %s was reaped by %s while this node did not "
                            "listen: what waits for it fails now", self.name, node,
                            reaper.decode())
                self.node_down(node, [], None)
            else:  # gone from Redis unreaped (a restart without persistence, a flush)
                log.warning("realm %s: node %s is missing from Redis but was not reaped "
                            "(Redis restarted or flushed?): only its interest is dropped, "
                            "what waits for it waits for its timeout", self.name, node)
                self.remote.replace(node, set())
        return True

    def announced(self, node: str, packed: bytes) -> None:
        """Another node's interest, from the channel."""
        if self._heard is not None:
            self._heard.add(node)
        self.remote.replace(node, unpack_patterns(packed))

    # publications ---------------------------------------------------------

    def forward(self, publication: Publication) -> None:
        """Send ``publication`` once to each node whose interest matches its topic."""
        remote = self.remote
        if not remote.index.by_id:
            return  # no other node subscribes to anything in this realm
        nodes = remote.nodes(publication.topic)
        if not nodes:
            return
        engine = self.engine
        commands = engine.commands
        if commands is None:
            self._not_forwarded(publication, len(nodes), "Redis is not connected")
            return
        try:
            data = pack_publication(self.name, publication)
        except (TypeError, ValueError) as exc:
            self._not_forwarded(publication, len(nodes), f"cannot be sent ({exc})")
            return
        if not publication.qos:
            if not commands.send(b"".join(command("PUBLISH", b"wr:node:" + node.encode(), data)
                                          for node in nodes), len(nodes)):
                self._not_forwarded(publication, len(nodes),
                                    f"{commands.pending} commands unanswered by Redis")
            return
        if self._unconfirmed_count + len(nodes) > engine.limits.max_pending_commands:
            self._not_forwarded(publication, len(nodes), f"{self._unconfirmed_count} "
                                "forwarded publications not confirmed yet")
            return
        number = next(self._forwarded)
        message = msgpack.packb([engine.node, number, data], use_bin_type=True)
        deadline = time.monotonic() + engine.limits.confirm_timeout
        for node in nodes:
            # the publisher's acknowledgement waits until the node confirms it
            confirmed: defer.Deferred[bool] = defer.Deferred()
            self._unconfirmed.setdefault(node, deque()).append((number, deadline, confirmed))
            self._unconfirmed_count += 1
            self._track(confirmed)
            commands.request(command("PUBLISH", QOS_CHANNEL_PREFIX + node.encode(), message)
                             ).addCallbacks(self._handed, self._not_handed,
                                            (confirmed, publication, node),
                                            errbackArgs=(confirmed, publication, node))

    def _not_forwarded(self, publication: Publication, nodes: int, why: str) -> None:
        """Counted; a QoS >= 1 publisher's acknowledgement fails."""
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"topic {publication.name}: not sent to {nodes} node(s): "
                                    f"{why}")
        if publication.qos:  # failed once the publisher's acknowledgement waits for it
            self._track(task.deferLater(self.engine.reactor, 0, lambda: False))

    def _handed(self, listeners: int, confirmed: defer.Deferred[bool], publication: Publication,
                node: str) -> None:
        if listeners == 0:  # the node is not subscribed: stopped, or cut off from Redis
            self._not_handed(None, confirmed, publication, node)

    def _not_handed(self, failure: Failure | None, confirmed: defer.Deferred[bool],
                    publication: Publication, node: str) -> None:
        why = failure.getErrorMessage() if failure is not None else "it is not listening"
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"topic {publication.name}: not handed to node {node}: {why}")
        _settle(confirmed, False)

    def confirmed(self, node: str, number: int) -> None:
        """``node`` has stored what its receivers keep of every publication up to ``number``."""
        waiting = self._unconfirmed.get(node)
        while waiting and waiting[0][0] <= number:
            _settle(waiting.popleft()[2], True)
            self._unconfirmed_count -= 1

    def expire_unconfirmed(self) -> None:
        """Fail what a node did not confirm in time (it died, or is cut off from Redis)."""
        now = time.monotonic()
        for node, waiting in self._unconfirmed.items():
            expired = 0
            while waiting and waiting[0][1] <= now:
                _settle(waiting.popleft()[2], False)
                expired += 1
            if expired:
                self._unconfirmed_count -= expired
                self.engine.incidents.count(
                    self.name, "engine", ENGINE_UNAVAILABLE,
                    f"{expired} publication(s) sent to node {node} not confirmed within "
                    f"{self.engine.limits.confirm_timeout:g} s")

    def reap_command(self, node: str, alive_key: bytes) -> Command:
        """The :data:`router.engines.redis.failure.REAP` call for dead node ``node``."""
        owners = [claims.owner_key for claims in self.claims.values()]
        return ("EVAL", REAP, 6 + len(owners), alive_key, testaments_key(self.name, node),
                self.sessions.wills_key(node), self.members.sessions_key,
                self.members.subscriptions_key, self.keys["interest"], *owners,
                node, self.engine.node, self.name, NODE_DOWN_CHANNEL,
                REAPED_PREFIX + node.encode(), int(REAPED_MARK_LIFETIME * 1000))

    def node_down(self, node: str, left: list[Reply], reaper: str | None) -> None:
        """Node ``node`` died and ``reaper`` reaped it: ``reaper`` gets what matches the
        dead node's patterns, its sessions ``left`` (meta events for this node's
        subscribers), its calls' answers, releases of client state and confirmations will
        not come (what waits for them fails now). From a read of the hash that found it
        reaped unheard (:meth:`_interest_read`): ``reaper`` None (the hash just read gave
        the reaper the dead node's patterns already, see :data:`REAP`) and ``left`` empty (the reaping
        deleted the list, and no node keeps a copy of another's sessions)."""
        if self._heard is not None:  # a read of the hash under way may still list it
            self._heard.add(node)
        if reaper is None or reaper == self.engine.node:
            self.remote.replace(node, set())
        else:
            self.remote.inherit(node, reaper)
        self.dealer.node_down(node)
        for claims in self.claims.values():
            claims.node_down(node)
        waiting = self._unconfirmed.pop(node, None)
        if waiting:
            self._unconfirmed_count -= len(waiting)
            for _, _, confirmed in waiting:
                _settle(confirmed, False)
            self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                        f"{len(waiting)} publication(s) sent to node {node} "
                                        "not confirmed: it died")
        if self.realm is None:
            return
        for field, value in zip(left[::2], left[1::2]):
            authrole, authid = json.loads(value)
            self.realm.publish_meta("wamp.session.on_leave",
                                    [int(field.rsplit(":", 1)[1]), authid, authrole])

    def received(self, publication: Publication, sender: str | None = None,
                 number: int = 0) -> None:
        """A publication from another node: the local fan-out; a QoS >= 1 one is confirmed
        to its sender after this turn's session writes."""
        if self._holding:
            held = self._held
            held.append((publication, sender, number))
            if len(held) >= self.engine.limits.max_pending_commands:
                self.engine.incidents.count(
                    self.name, "engine", ENGINE_BEHIND, f"{len(held)} publications held "
                    "while adopting a dead node's clients: delivered before it finished")
                self._deliver_held()
            return
        if self.realm is not None and not publication.expired():
            self.realm.broker.dispatch(publication)
        if number and sender is not None:
            self._confirms[sender] = number
            self._flush_soon()

    def hold_forwarded(self) -> None:
        """A reaping starts: hold what other nodes send until :meth:`release_forwarded`.
        Once they hear of the death they send here what matched the dead node's patterns,
        and the sessions it adopts must be subscribed before that is delivered."""
        self._holding += 1
        self._announce_after_hold = True  # replaces the dead node's patterns it inherits
        self.engine.adopting(True)

    def release_forwarded(self) -> None:
        """A reaping ended (adopted state loaded and subscribed, or failed): deliver what
        was held, in order, and announce this node's interest, now with what it adopted."""
        self.engine.adopting(False)
        self._holding -= 1
        if self._holding:
            return
        self._deliver_held()
        if self._announce_after_hold:
            self._announce_after_hold = False
            self.announce_interest()

    def _deliver_held(self) -> None:
        held, self._held = self._held, []
        holding, self._holding = self._holding, 0
        for publication, sender, number in held:
            self.received(publication, sender, number)
        self._holding = holding

    # retained events ------------------------------------------------------

    def _retained_changed(self, topic: Topic, entries: list[RetainedEvent], action: str,
                          publication: Publication | None) -> None:
        """Write a local change to Redis and announce it (the announcement comes back here
        too, so every node applies changes in Redis's order)."""
        if action == "expire" or topic[0] == SERVER_OWNED:
            return  # each node expires its own copy (the sweep clears Redis), has its own $SYS
        key = topic_key(topic).encode()
        self._track(self._write_retained(key, entries, action, self.tokens.get(key, b""),
                                         MAX_ATTEMPTS))

    def _write_retained(self, key: bytes, entries: list[RetainedEvent], action: str,
                        expected: bytes, attempts: int) -> defer.Deferred[object]:
        """Replace the topic in Redis if it still holds ``expected``; a Deferred of whether
        the change (or its retry on what Redis held) got stored."""
        engine = self.engine
        keys = self.keys
        token = self._token_prefix + str(next(self._tokens)).encode()
        self._latest_own[key] = token
        if entries:
            self.tokens[key] = token
            expiries = [entry.expires_at for entry in entries if entry.expires_at is not None]
            blob = pack_topic(entries)
            # the topic expires with its last entry; an entry without expiry keeps it
            score = b"" if len(expiries) < len(entries) else repr(max(expiries)).encode()
        else:
            self.tokens.pop(key, None)
            blob = score = b""
        written = engine.request(command(
            "EVAL", RETAIN, 3, keys["retained"], keys["retained-expiry"], keys["retained-token"],
            key, expected, token, blob, score, RETAINED_CHANNEL, self.name, engine.node))
        return written.addCallback(self._written, key, entries, action, token, attempts
                                   ).addErrback(self._write_failed, key, token)

    def _written(self, reply: list[Reply], key: bytes, entries: list[RetainedEvent], action: str,
                 token: bytes, attempts: int) -> "bool | defer.Deferred[object]":
        """Stored, or another node changed the topic first: apply this change to what it
        stored (a cleared topic is cleared again, an eviction yields) and try again."""
        if reply[0] == 1:
            return True
        if self._latest_own.get(key) == token:
            del self._latest_own[key]
        _, current, blob = reply
        if action == "evict":
            return True  # the other node's newer value stays; its announcement brings it here
        if attempts <= 1:
            raise ConflictError(f"changed by other nodes {MAX_ATTEMPTS} times meanwhile")
        stored = self._live(blob)
        merged = self.retention.supersede(stored, entries[-1]) if entries else []
        self.retention.revert(_topic_from_key(key), merged)
        return self._write_retained(key, merged, action, current, attempts - 1)

    def _write_failed(self, failure: Failure, key: bytes, token: bytes) -> bool:
        if self._latest_own.get(key) == token:
            del self._latest_own[key]
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"retained {key.decode()}: not stored "
                                    f"({failure.getErrorMessage()})")
        return False

    # durability ------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue one session-state command; the turn's commands go out in one batch (two
        or more if the turn wrote ``cluster.max_pending_commands`` of them)."""
        writes = self._writes
        self._flush_soon()
        writes.append(data)
        if len(writes) >= self.engine.limits.max_pending_commands:
            self.flush()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            self.engine.reactor.callLater(0, self.flush)

    def flush(self) -> None:
        """Send the queued session-state commands, then the confirmations of the turn's
        forwarded publications, now (one pipelined request). While Redis is not connected
        they wait (those of the start-up restore, before the connection is up), up to
        ``cluster.max_pending_commands``; past that they are lost, counted."""
        self._flush_due = False
        writes = self._writes
        engine = self.engine
        if (not writes and not self._confirms) or (
                engine.commands is None and len(writes) < engine.limits.max_pending_commands):
            return
        if self._confirms:
            writes.extend(command("PUBLISH", CONFIRM_CHANNEL_PREFIX + sender.encode(),
                                  msgpack.packb([self.name, engine.node, number]))
                          for sender, number in self._confirms.items())
            self._confirms = {}
        self._writes = []
        self._track(engine.request(b"".join(writes), len(writes) - 1).addErrback(
            self._batch_failed, len(writes)))

    def _batch_failed(self, failure: Failure, commands: int) -> bool:
        self.engine.incidents.count(self.name, "engine", STORE_FAILED,
                                    f"{commands} client-state write(s) not stored in Redis "
                                    f"({failure.getErrorMessage()})")
        return False

    def _track(self, written: defer.Deferred[Any]) -> None:
        """Count a request that :meth:`when_durable` waits for (False or a failure: lost)."""
        self._issued += 1
        entry = [self._issued, None, time.monotonic() + self.engine.limits.confirm_timeout]
        self._pending.append(entry)
        written.addBoth(self._answered, entry)

    def expire_unanswered(self) -> None:
        """Fail the durable requests Redis has not answered within ``cluster.confirm_timeout``
        (it is stopped or stalled, the connection still up): the acknowledgements waiting
        for them fail now, not when Redis comes back. A late answer changes nothing."""
        pending = self._pending
        now = time.monotonic()
        expired = 0
        while pending and pending[0][2] <= now:  # the head is always unanswered
            expired += 1
            self._answered(False, pending[0])
        if expired:
            self.engine.incidents.count(
                self.name, "engine", ENGINE_UNAVAILABLE,
                f"{expired} write(s) not answered by Redis within "
                f"{self.engine.limits.confirm_timeout:g} s: their acknowledgements fail")

    def _answered(self, result: Any, entry: list[Any]) -> None:
        if entry[1] is not None:  # expired already
            return
        ok = result is not False and not isinstance(result, Failure)
        entry[1] = ok
        if not ok:
            self._failures.append(entry[0])
        pending = self._pending
        while pending and pending[0][1] is not None:
            pending.popleft()
        done = pending[0][0] - 1 if pending else self._issued
        waiters = self._waiters
        while waiters and waiters[0][0] <= done:
            last, first, callback = waiters.popleft()
            try:
                callback(not any(first <= failed <= last for failed in self._failures))
            except Exception:  # one acknowledgement's bug must not hold up the others
                log.exception("realm %s: a durability callback failed", self.name)
        oldest = waiters[0][1] if waiters else done
        self._failures = [failed for failed in self._failures if failed >= oldest]

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every write made so far (retained changes, session state,
        QoS >= 1 publications forwarded) is answered by Redis; ``ok`` is False when one of
        them that was still under way when asked failed."""
        first = self._pending[0][0] if self._pending else self._issued + 1
        self.flush()
        if self._writes:  # Redis is not connected: not stored (yet)
            callback(False)
            return
        if not self._pending:
            callback(not any(failed >= first for failed in self._failures))
            return
        self._waiters.append((self._issued, first, callback))

    def reload_retained(self) -> defer.Deferred[bool]:
        """The retained channel is subscribed (again): what other nodes set or cleared while
        it was not (and what the start-up's read came too early for) was never announced to
        this node, which would answer subscribers from a stale copy for good. So every
        topic's token in Redis is compared with this copy's, and the topics that differ are
        read again. Fires with whether it was read."""
        if self._retained_heard is None:
            self._retained_heard = set()
        self._retained_reads += 1
        own_before = dict(self._latest_own)
        read = self.engine.request(command("HGETALL", self.keys["retained-token"]))
        return read.addCallback(self._retained_tokens_read, own_before).addErrback(
            self._retained_not_read)

    def _retained_tokens_read(self, found: list[bytes],
                              own_before: dict[bytes, bytes]) -> defer.Deferred[bool]:
        stored = dict(zip(found[::2], found[1::2]))
        for key, token in own_before.items():
            # written before the read (Redis answers in order: the read saw it), its
            # announcement lost with the subscription maybe: what Redis holds is the truth
            if self._latest_own.get(key) == token:
                del self._latest_own[key]
        settled = self._settled_retained()
        for key in [key for key in self.tokens if key not in stored and key not in settled]:
            self.apply_retained(key, b"", b"", b"")  # cleared (or swept) meanwhile
        changed = [key for key, token in stored.items()
                   if self.tokens.get(key) != token and key not in settled]
        if not changed:
            return defer.succeed(self._retained_read_done(True))
        return self._read_topics(changed, stored)

    def _read_topics(self, keys: list[bytes], tokens: dict[bytes, bytes]) -> defer.Deferred[bool]:
        """Read ``keys`` again, :data:`RETAINED_READ_CHUNK` at a time: each reply is applied
        in a turn of its own, so many topics changed during a long outage do not hold the
        reactor in one."""
        chunk, rest = keys[:RETAINED_READ_CHUNK], keys[RETAINED_READ_CHUNK:]
        read = self.engine.request(command("HMGET", self.keys["retained"], *chunk))
        return read.addCallback(self._retained_topics_read, chunk, rest, tokens)

    def _retained_topics_read(self, blobs: list[bytes | None], keys: list[bytes],
                              rest: list[bytes],
                              tokens: dict[bytes, bytes]) -> defer.Deferred[bool]:
        settled = self._settled_retained()
        for key, blob in zip(keys, blobs):
            if key not in settled:  # else the channel told a later state already
                self.apply_retained(key, blob or b"", tokens[key], b"")
        if rest:
            return self._read_topics(rest, tokens)
        return defer.succeed(self._retained_read_done(True))

    def _settled_retained(self) -> set[bytes]:
        """Topics a read must leave alone: changed on the channel since it began, or written
        by this node since it began (the announcement still to come back)."""
        return (self._retained_heard or set()) | self._latest_own.keys()

    def _retained_not_read(self, failure: Failure) -> bool:
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"retained events not read ({failure.getErrorMessage()})")
        return self._retained_read_done(False)  # read again at the next subscription

    def _retained_read_done(self, read: bool) -> bool:
        self._retained_reads -= 1
        if not self._retained_reads:
            self._retained_heard = None
        return read

    def retained_announced(self, key: bytes, blob: bytes, token: bytes, node: bytes) -> None:
        """A topic's change, from the channel."""
        if self._retained_heard is not None:
            self._retained_heard.add(key)
        self.apply_retained(key, blob, token, node)

    def apply_retained(self, key: bytes, blob: bytes, token: bytes, node: bytes) -> None:
        """A node (maybe this one) changed a topic in Redis: this copy follows, unless it is
        this node's own change with a later one of its own still on the way. Entries kept
        for a publisher's own session stay: that session may be on this node."""
        if node == self.engine.node_bytes:
            latest = self._latest_own.get(key)
            if latest is not None:
                if latest != token:
                    return
                del self._latest_own[key]
        if blob:
            self.tokens[key] = token
        else:
            self.tokens.pop(key, None)
        self.retention.revert(_topic_from_key(key), self._live(blob))

    def _live(self, blob: bytes) -> list[RetainedEvent]:
        """The entries of a stored topic that have not expired."""
        if not blob:
            return []
        now = time.time()
        return [entry for entry in (decode_retained(data, self.name)
                                    for data in unpack_topic(blob))
                if entry.expires_at is None or entry.expires_at > now]

    def load(self, redis: BlockingRedis) -> None:
        """Start-up: the interest of the other nodes and every retained event, from Redis."""
        engine = self.engine
        found = redis.call("HGETALL", self.keys["interest"])
        for field, packed in zip(found[::2], found[1::2]):
            if (node := field.decode()) != engine.node:
                self.remote.replace(node, unpack_patterns(packed))
        redis.call("HDEL", self.keys["interest"], engine.node)  # a previous run's patterns
        found = redis.call("HGETALL", self.keys["retained-token"])
        self.tokens.update(zip(found[::2], found[1::2]))
        for forget in (self.dealer.release_node(), *self.members.forget_node()):
            redis.call(*forget)  # what a previous run (killed) left
        self.left = take_left(self, redis)
        found = redis.call("HGETALL", self.keys["retained"])
        now = time.time()
        self.retention.restore(
            (_topic_from_key(key), entries) for key, blob in zip(found[::2], found[1::2])
            if (entries := live_entries(unpack_topic(blob), self.name, now)))

    def sweep(self) -> None:
        """Remove topics whose retained entries have all expired from Redis."""
        engine = self.engine
        engine.send(command("EVAL", SWEEP, 3, self.keys["retained"],
                            self.keys["retained-expiry"], self.keys["retained-token"],
                            time.time(), self.name, engine.node, RETAINED_CHANNEL), 1)


def _settle(waiting: defer.Deferred[bool], ok: bool) -> None:
    """Fire ``waiting`` unless an earlier answer did (a failure can precede the timeout)."""
    if not waiting.called:
        waiting.callback(ok)


def _topic_from_key(key: bytes) -> Topic:
    """The inverse of :func:`router.engines.records.topic_key`."""
    return tuple(json.loads(key))


