"""What a frontend session offers the core (its identity and delivery callbacks) and the
handles the core gives it back (a subscription, a registration, an invocation): one
contract in one module, so neither side imports the other."""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

from router.core.model import Args, Details, Kwargs, Passthru, Publication, SessionInfo
from router.core.topic import Topic, is_reserved, pattern_text


class Caller(Protocol):
    """Whoever a call's answer goes to: a session here (a :class:`Peer`) or, in a cluster,
    a caller on another node that only ever gets answers."""

    info: SessionInfo

    def send_result(self, call_request: int, args: Args | None, kwargs: Kwargs | None,
                    progress: bool, passthru: Passthru | None = None) -> None:
        """Return a (possibly progressive) call result to this caller (``passthru``: only
        to a caller that :meth:`supports` its feature)."""

    def send_call_error(self, call_request: int, error: str, args: Args | None,
                        kwargs: Kwargs | None, passthru: Passthru | None = None) -> None:
        """Fail a call of this caller."""

    def supports(self, role: str, feature: str) -> bool:
        """Did the peer announce ``feature`` for ``role``?"""


class Peer(Caller, Protocol):
    """A session attached to a realm, whatever its wire protocol."""

    def send_event(self, subscription: "Subscription", publication: Publication,
                   retained: bool = False) -> None:
        """Deliver one event on one subscription."""

    def ready(self) -> bool:
        """Can it take an event now (connected, not over its flow bound, room in its
        in-flight window)? Shared groups prefer members that are."""

    def backlog_room(self) -> bool:
        """May a retained backlog write one more event now (transport not paused, room in
        the in-flight window, nothing queued)? When it says no, its frontend calls
        ``Realm.backlogs.resume`` once it may; a paused transport also starts the
        slow-consumer clock, so a client that stopped reading is disconnected."""

    def send_invocation(self, invocation: "Invocation") -> None:
        """Ask this callee to run a procedure; raises :class:`Unencodable` or a
        :class:`RouterError` for the caller when this callee cannot be given the call."""

    def send_interrupt(self, invocation: "Invocation", mode: str, reason: str) -> None:
        """Tell this callee to stop working on an invocation."""

    def kill(self, reason: str, message: str | None) -> None:
        """Close the session from the router side."""

    def subscription_revoked(self, subscription: "Subscription", reason: str) -> None:
        """The realm's rules no longer let this session hold ``subscription`` (a reload):
        drop it as the session's own unsubscribe would, and tell the client if its
        protocol can."""

    def registration_revoked(self, registration: "Registration[Peer]", reason: str) -> None:
        """The core has unregistered this callee (a reload took the permission away):
        tell the client if its protocol can."""


NOTHING_YET: Mapping[Any, Any] = MappingProxyType({})
"""A per-session table that stays empty for most sessions (queued and in-flight messages,
grants, unacknowledged events), shared read-only until the session's first entry, when
the session puts a dict of its own in its place: an empty dict is 64 bytes of every idle
session."""


RetainedWrite = Callable[[Publication], bool]
"""Writes one retained event (raises, like ``send_event``, if it cannot); returns whether
the peer can take another now (the ``backlog_room`` answer after it)."""


class RetainedWriter(Protocol):
    """A peer that writes a retained backlog in one pass per batch (optional: a peer
    without ``retained_writer`` gets ``send_event`` per event). What does not change from
    one event to the next (the subscription's options, the connection's limits) is looked
    up once per batch, and the batch's bytes go out in one write."""

    def retained_writer(self, subscription: "Subscription"
                        ) -> "tuple[RetainedWrite, Callable[[], None]] | None":
        """(write one retained event, write what the batch gathered) for one batch of
        ``subscription``'s retained events; None: deliver them one by one with
        ``send_event``. The second is always called once the batch ends."""


class HeldEvents(Protocol):
    """Where a subscriber's live events wait behind its retained ones
    (:class:`router.core.backlog.RetainedBacklog`)."""

    held: deque[Publication]

    def hold(self, publication: Publication) -> None:
        """Queue a live event until the retained backlog is written."""


ProtocolCounts = tuple[tuple[str, int], ...]
"""(protocol name, subscribers) pairs, each protocol once, none with 0."""
NO_PROTOCOLS: ProtocolCounts = ()
_COUNTS: dict[ProtocolCounts, ProtocolCounts] = {}
"""Every small count seen, once: most subscriptions have one subscriber (or a few), so
they share a handful of tuples. Bounded: larger counts are not kept here."""
SHARED_COUNTS_UP_TO = 8
"""Counts whose total is at most this are shared (a few hundred tuples at most)."""


def counted(counts: ProtocolCounts, protocol: str, change: int) -> ProtocolCounts:
    """``counts`` with ``protocol``'s subscribers changed by ``change`` (on subscribe and
    unsubscribe, never per delivery)."""
    table = dict(counts)
    left = table.get(protocol, 0) + change
    if left:
        table[protocol] = left
    else:
        table.pop(protocol, None)
    result = tuple(sorted(table.items()))
    if sum(table.values()) > SHARED_COUNTS_UP_TO:
        return result
    return _COUNTS.setdefault(result, result)


class Subscription:
    """One (topic pattern, match) pair and the sessions subscribed to it."""

    __slots__ = ("id", "topic", "match", "created", "subscribers", "is_meta", "protocols",
                 "held")

    def __init__(self, subscription_id: int, topic: Topic, match: str,
                 created: float | None = None) -> None:
        self.id = subscription_id
        self.topic = tuple(map(sys.intern, topic))
        """Its levels interned: the levels many subscriptions share (``sensors``,
        ``devices``, ...) are held once, not once per subscription."""
        self.match = match
        self.created = time.time() if created is None else created
        """When (a float: the ISO text :meth:`details` shows is made when asked; the
        broker's is the reactor turn's, shared by the turn's new subscriptions)."""
        self.subscribers: dict[int, Peer] | tuple[int, Peer] | None = None
        """Its sessions: none, the first as a (session id, peer) pair (56 bytes; a
        one-entry dict is 224 of every subscription with one subscriber), a dict from the
        second on. Read through :meth:`has`, :meth:`pairs` and the like."""
        self.is_meta = is_reserved(topic)
        self.protocols: ProtocolCounts = NO_PROTOCOLS
        """Subscribers per protocol name: a dispatch counts its deliveries per subscription
        from this, not per receiver (see :meth:`router.core.broker.Broker.dispatch`). A
        shared tuple (:func:`counted`), not a Counter (208 bytes per subscription)."""
        self.held: "dict[int, HeldEvents] | None" = None
        """Per session, the retained backlog its live events wait behind (None: none)."""

    def has(self, session_id: int) -> bool:
        """Whether the session is subscribed."""
        members = self.subscribers
        if type(members) is tuple:
            return members[0] == session_id
        return members is not None and session_id in members

    def add(self, session_id: int, peer: Peer) -> bool:
        """Subscribe (or re-subscribe) the session; True if it was not yet."""
        members = self.subscribers
        if members is None:
            self.subscribers = (session_id, peer)
            return True
        if type(members) is tuple:
            if members[0] == session_id:
                self.subscribers = (session_id, peer)
                return False
            self.subscribers = members = {members[0]: members[1]}
        assert type(members) is dict
        added = session_id not in members
        members[session_id] = peer
        return added

    def remove(self, session_id: int) -> Peer:
        """Unsubscribe the session (it is subscribed); its peer."""
        members = self.subscribers
        if type(members) is tuple and members[0] == session_id:
            self.subscribers = None
            return members[1]
        if type(members) is not dict:
            raise KeyError(session_id)
        return members.pop(session_id)

    def pairs(self) -> "list[tuple[int, Peer]] | tuple[tuple[int, Peer], ...]":
        """(session id, peer) of every subscriber, a copy (receivers may leave while a
        dispatch goes through them)."""
        members = self.subscribers
        if isinstance(members, dict):
            return list(members.items())
        return () if members is None else (members,)

    def peers(self) -> list[Peer]:
        """The subscribers' peers, in the order they subscribed."""
        return [peer for _, peer in self.pairs()]

    def session_ids(self) -> list[int]:
        """The subscribers' session ids, in the order they subscribed."""
        return [session_id for session_id, _ in self.pairs()]

    @property
    def uri(self) -> str:
        """The pattern as the meta API shows it: MQTT filters in ``/`` form, the rest dotted."""
        return pattern_text(self.topic, self.match)

    def details(self) -> Details:
        """The subscription as ``wamp.subscription.get`` describes it."""
        return {"id": self.id,
                "created": datetime.fromtimestamp(self.created, timezone.utc).isoformat(),
                "uri": self.uri, "match": self.match}


Callee = TypeVar("Callee")
"""What a registration's callees are: a :class:`Peer` on this node; in a cluster's copy of
every node's registrations (:class:`router.core.dealer.ClusterDealer`), whatever names a
callee on any node."""


class Registration(Generic[Callee]):
    """One procedure pattern (uri, match) and the callees registered on it."""

    __slots__ = ("id", "uri", "match", "policy", "callees", "created", "turn")

    def __init__(self, registration_id: int, uri: str, match: str, policy: str) -> None:
        self.id = registration_id
        self.uri = uri
        self.match = match
        self.policy = policy
        self.callees: list[Callee] = []
        """The callees in order of registration."""
        self.created = datetime.now(timezone.utc).isoformat()
        self.turn = 0
        """Calls picked so far (roundrobin)."""

    def pick(self) -> Callee:
        """The callee for the next call under this registration's invocation policy."""
        if self.policy == "roundrobin":
            callee = self.callees[self.turn % len(self.callees)]
            self.turn += 1
            return callee
        if self.policy == "random":
            return random.choice(self.callees)
        if self.policy == "last":
            return self.callees[-1]
        return self.callees[0]


@dataclass(slots=True, eq=False)
class Invocation:
    """One call at its callee: what routes its results, errors, cancel and timeout back to
    the caller."""

    request_id: int
    registration: Registration[Peer]
    callee: Peer
    caller: Caller
    call_request: int
    procedure: str
    args: Args | None
    kwargs: Kwargs | None
    receive_progress: bool
    disclose_caller: bool
    cancel_mode: str | None = None
    details: Details = field(default_factory=dict)
    passthru: Passthru | None = None
    """The call's Payload Passthru Mode options (``args`` is then ``[opaque bytes]``)."""
