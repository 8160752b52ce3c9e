"""The engine boundary: everything a realm shares beyond its own node.

A realm asks its engine for three things: where its retained events live (and how they
are made durable), where its event history lives, and how a publication reaches the
other nodes serving the realm. The embedded engine (:mod:`router.engines.embedded`: one
node, retained events in memory written behind to SQLite) answers "nowhere else" to the
last question, so a single node pays one ``None`` check per publication for the boundary.
A clustered engine also needs to know which patterns this node's subscribers hold
(interest), so that other nodes send it only publications it has a receiver for, the
dealer's registrations and calls (:class:`router.core.dealer.ClusterDealer`: a call on
any node reaches a callee on any node) and the sessions of each node (meta API).

The engines live in :mod:`router.engines` and implement these Protocols; only
:mod:`router.node` picks one. The stores of client state that outlives a connection
(MQTT sessions, AMQP durable links) are typed by the frontend that uses them (the core
knows no MQTT or AMQP): :class:`Engine` is generic over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Mapping, Protocol, TypeAlias, TypeVar,
                    runtime_checkable)

from router.core.bridge_queue import BridgeQueueStore
from router.core.dealer import ClusterDealer
from router.core.history import History, HistoryRule
from router.core.incidents import Incidents
from router.core.model import Publication, SessionInfo
from router.core.retention import RetainedStore, RetentionPolicy

if TYPE_CHECKING:
    from router.core.peer import Subscription

Forward = Callable[[Publication], None]
"""Deliver a local publication to the other nodes whose interest matches its topic."""
Interest = Callable[["Subscription", bool], None]
"""Told ``(subscription, True)`` when this node gains a subscription or shared group on a
client pattern and ``(subscription, False)`` when one goes; several may share one pattern,
so an engine counts them."""


@runtime_checkable
class Durability(Protocol):
    """Tells when what a realm's publications changed is stored where the engine keeps it."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(ok)`` on the event loop once everything changed so far is stored;
        ``ok`` is False if storing failed."""


@dataclass(frozen=True, slots=True)
class ClusterLimits:
    """Bounds of what a node has under way with Redis and the other nodes (config
    ``cluster``)."""

    max_pending_calls: int = 10000
    """Forwarded calls waiting for an answer; one more is refused (``limit_exceeded``)."""
    call_timeout: float = 300.0
    """Seconds a forwarded call without its own timeout waits for an answer."""
    max_pending_commands: int = 10000
    """Commands sent to Redis and not answered yet, at most; reading from publishers pauses
    at half of it."""
    session_takeover_timeout: float = 5.0
    """Seconds a node taking over an MQTT session or AMQP durable link waits for the node
    that had it to let go; then it resumes from what Redis holds."""
    confirm_timeout: float = 5.0
    """Seconds a QoS >= 1 publication forwarded to another node waits for that node to say
    it has stored what its receivers keep; then its publisher is told it failed."""
    heartbeat_interval: float = 1.0
    """Seconds between two refreshes of this node's alive key (and looks for dead nodes)."""
    node_timeout: float = 5.0
    """Lifetime of a node's alive key: a node silent this long is dead and reaped."""


StoredTestament: TypeAlias = list[Any]
"""A testament as a store keeps it: ``[topic, args, kwargs, publish options]``, a list
because that is what it reads back from its codec; its payload is application values
(:data:`router.core.model.Args`)."""


@runtime_checkable
class TestamentStore(Protocol):
    """Keeps a copy of each session's testaments beyond this node, so that they are
    published even if the node dies (the Redis engine's other nodes do it then)."""

    def save(self, info: SessionInfo, testaments: list[StoredTestament]) -> bool:
        """``info``'s testaments now are ``testaments`` (each ``[topic, args, kwargs,
        publish options]``, in publication order); an empty list forgets the session.
        False when they cannot be copied at all (then :meth:`when_durable` is not asked)."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(ok)`` once every change saved so far is stored (or failed to be)."""


@runtime_checkable
class Membership(Protocol):
    """Which sessions a realm has on this node, for answers about the whole cluster."""

    def joined(self, info: SessionInfo) -> None:
        """``info``'s session joined the realm on this node: other nodes' meta calls list it."""

    def left(self, info: SessionInfo) -> None:
        """``info``'s session left: other nodes no longer list it."""


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One event waiting in a durable outbound queue, as its sender will send it."""

    seq: int
    """Its place in the queue (increasing; what :meth:`OutboxStore.remove` names)."""
    body: bytes
    expires_at: float | None = None
    """After this time it is not sent any more (the publication's message expiry)."""


@runtime_checkable
class OutboxStore(Protocol):
    """A realm's durable queues of outbound events (a webhook's QoS 1 events) that wait until
    their target took them: the order kept, the writes ordered with every other write of the
    engine, so a publisher acknowledged after :meth:`when_durable` knows its event is queued."""

    def load(self, queue: str) -> list[OutboxRecord]:
        """The records of ``queue`` left by an earlier run, oldest first (at start-up)."""

    def forget_others(self, queues: set[str]) -> int:
        """Delete every queue of the realm not named in ``queues`` (webhooks no longer
        configured), at start-up; how many records went."""

    def append(self, queue: str, record: OutboxRecord) -> None:
        """Keep ``record`` at the end of ``queue``."""

    def remove(self, queue: str, seq: int) -> None:
        """The record ``seq`` of ``queue`` was taken by its target (or given up)."""

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(ok)`` once every change made so far is stored."""


@dataclass(slots=True)
class RealmEngine:
    """What an engine provides to one realm."""

    retention: RetainedStore | None = None
    """Retained events (None: the realm retains nothing)."""
    persistence: Durability | None = None
    """Makes retained changes durable; an acknowledgement waits for it."""
    history: History | None = None
    """The realm's event history (None: it keeps none)."""
    forward: Forward | None = None
    """None on a single node: a publication's local fan-out is all there is."""
    interest: Interest | None = None
    """None when no other node needs to know this node's patterns."""
    dealer: ClusterDealer | None = None
    """None on a single node: the realm's own registrations are all there is."""
    membership: Membership | None = None
    """None when no other node asks about this node's sessions."""
    testaments: TestamentStore | None = None
    """None when a session's testaments live only in its node's memory."""


class ServedRealm(Protocol):
    """A built realm as :meth:`Engine.start` hands it over: a
    :class:`router.core.realm.Realm`, named here by what an engine may count on because
    the realm imports this module. An engine that reaches further in (the Redis engine:
    the realm's dealer and broker) names the realm class as :class:`Engine`'s third
    parameter."""

    @property
    def name(self) -> str:
        """The realm's name, the key an engine filed its share of the realm under."""


SessionStore_co = TypeVar("SessionStore_co", covariant=True)
"""What an engine keeps persistent MQTT sessions in (:class:`router.mqtt.persistence.
MqttSessionStore`, which the core does not name)."""
LinkStore_co = TypeVar("LinkStore_co", covariant=True)
"""What an engine keeps durable AMQP links in (:class:`router.amqp.persistence.AmqpStore`)."""
Realm_contra = TypeVar("Realm_contra", bound=ServedRealm, contravariant=True)
"""What an engine is handed the built realms as (:class:`router.core.realm.Realm`)."""
State_co = TypeVar("State_co", covariant=True)
"""The client state a :class:`Claims` store hands over with a claim."""
Paused = Callable[[bool, str], None]
"""``paused(True, source)``: stop reading from publishing connections until
``paused(False, source)`` (see :meth:`router.flow.IntakeGate.set_paused`)."""


@runtime_checkable
class Engine(Protocol[SessionStore_co, LinkStore_co, Realm_contra]):
    """Builds each realm's :class:`RealmEngine`; one engine per node."""

    def open_realm(self, name: str, policy: RetentionPolicy,
                   history: list[HistoryRule]) -> RealmEngine:
        """The engine of realm ``name`` (retained events as they are now, history rules)."""

    def mqtt_session_store(self, realm: str) -> SessionStore_co:
        """Where realm ``realm``'s persistent MQTT sessions live; the Redis engine's is also
        :class:`Claims` (sessions that follow their client to any node)."""

    def amqp_store(self, realm: str) -> LinkStore_co:
        """Where realm ``realm``'s durable AMQP links live; the Redis engine's is also
        :class:`Claims`."""

    def outbox_store(self, realm: str) -> OutboxStore:
        """Where realm ``realm``'s durable outbound queues (webhooks' QoS 1 events) live."""

    def bridge_queue(self, realm: str, bridge: str) -> BridgeQueueStore:
        """Where bridge ``bridge`` of realm ``realm`` keeps its queued messages."""

    def run_bridge(self, realm: str, bridge: str, start: Callable[[], None],
                   stop: Callable[[], None]) -> None:
        """Call ``start()`` once this node is the one to run the bridge (at once on a single
        node; once it holds the bridge's lock in a cluster) and ``stop()`` if it stops being
        that node (then ``start()`` again when it is again); asked after :meth:`start`."""

    def pause_intake_with(self, paused: Paused) -> None:
        """The engine calls ``paused`` while it cannot keep up with publishers (the embedded
        engine never does: its SQLite writer is the node's, which pauses the intake
        itself); asked once, before :meth:`start`."""

    def start(self, realms: Mapping[str, Realm_contra], incidents: Incidents,
              ready: Callable[[], None]) -> None:
        """The realms are built: start receiving for them (incidents counted in
        ``incidents``), and call ``ready()`` once this node sends to and receives from the
        others (at once for a single node): the node lets clients in only then, so nothing
        they publish or subscribe to is missed by a link still being set up."""

    def close(self) -> None:
        """Stop talking to whatever the engine shares state with (at shutdown)."""


@runtime_checkable
class Claims(Protocol[State_co]):
    """A store whose client state follows its client among nodes (the Redis engine's): a
    client first claims the id of its state (an MQTT client id, an AMQP durable link);
    another node's claim makes this one let go."""

    release: Callable[[str, Callable[[], None]], None]
    """Set by the frontend: ``release(id, done)`` drops the state here (its client is
    detached as a takeover) and calls ``done`` once its writes are stored."""

    def claim(self, owned: str, holder: str, load: bool, answer: Callable[[State_co | None], None],
              refused: Callable[[], None]) -> None:
        """Own ``owned`` for ``holder`` (:func:`router.core.ownership.owner`);
        ``answer(state or None)``, with the state only if ``load``; or ``refused()`` when
        the state belongs to another holder (nothing changed)."""

    def hold(self, owned: str, holder: str) -> None:
        """The state of ``owned`` here belongs to ``holder``."""

    def disown(self, owned: str) -> None:
        """The state ended here."""
