"""Each engine implements the engine contract, as the type checker proves.

Every function below hands an engine class's instance back as the Protocol it implements;
mypy (``python -m mypy``, run by ``tests/test_typecheck.py``) rejects the module when a
class drifts from its Protocol: a missing member, a parameter of another type, a return
type that is not the promised one. It is the counterpart of Go's
``var _ Broker = (*RedisBroker)(nil)``; nothing calls these functions at run time
(``tests/test_engines.py`` checks the names and parameters there).
"""

from __future__ import annotations

from router.amqp.persistence import AmqpStore, LinkClaims, StoredDurable
from router.core.bridge_queue import BridgeQueueStore
from router.core.dealer import ClusterDealer
from router.core.engine import Claims, Durability, Engine, Membership, OutboxStore, TestamentStore
from router.core.history import EventHistory, History
from router.core.realm import Realm
from router.engines.embedded.bridge_queues import SqliteBridgeQueue
from router.engines.embedded.engine import EmbeddedEngine
from router.engines.embedded.links import SqliteLinkStore
from router.engines.embedded.outbox import SqliteOutboxStore
from router.engines.embedded.sessions import SqliteSessionStore
from router.engines.embedded.sqlite import SqliteStore
from router.engines.redis.bridges import RedisBridgeQueue
from router.engines.redis.claims import RedisClaims
from router.engines.redis.context import EngineContext, RealmContext
from router.engines.redis.dealer import RedisDealer
from router.engines.redis.engine import RedisEngine
from router.engines.redis.failure import LeftRealm, RedisTestaments, WatchedEngine
from router.engines.redis.history import RedisHistory
from router.engines.redis.links import RedisAmqpStore
from router.engines.redis.outbox import RedisOutboxStore
from router.engines.redis.membership import RedisMembership
from router.engines.redis.realm import RedisRealm
from router.engines.redis.sessions import RedisMqttSessionStore
from router.mqtt.persistence import MqttSessionStore, SessionClaims

NodeEngine = Engine[MqttSessionStore, AmqpStore, Realm]
"""An engine as the node uses it: stores the MQTT and AMQP frontends can use, started on
the core's realms."""


def embedded_engine(engine: EmbeddedEngine) -> NodeEngine:
    """The embedded engine is an engine for the node."""
    return engine


def embedded_durability(store: SqliteStore) -> Durability:
    """Its SQLite writer tells when a realm's changes are stored."""
    return store


def embedded_history(history: EventHistory) -> History:
    """Its history is the in-memory one."""
    return history


def embedded_sessions(store: SqliteSessionStore) -> MqttSessionStore:
    """Its MQTT sessions live in the SQLite file."""
    return store


def embedded_links(store: SqliteLinkStore) -> AmqpStore:
    """Its durable AMQP links live in the SQLite file."""
    return store


def embedded_outbox(store: SqliteOutboxStore) -> OutboxStore:
    """Its webhook queues live in the SQLite file."""
    return store


def redis_outbox(store: RedisOutboxStore) -> OutboxStore:
    """Its webhook queues live in Redis."""
    return store


def embedded_bridge_queue(queue: SqliteBridgeQueue) -> BridgeQueueStore:
    """Its bridge queues live in the SQLite file."""
    return queue


def redis_bridge_queue(queue: RedisBridgeQueue) -> BridgeQueueStore:
    """Its bridge queues live in Redis, read by whichever node runs the bridge."""
    return queue


def redis_engine(engine: RedisEngine) -> NodeEngine:
    """The Redis engine is an engine for the node."""
    return engine


def redis_durability(realm: RedisRealm) -> Durability:
    """A realm's share of Redis tells when its writes are answered."""
    return realm


def redis_history(history: RedisHistory) -> History:
    """The history kept in Redis."""
    return history


def redis_dealer(dealer: RedisDealer) -> ClusterDealer:
    """Registrations and calls among nodes."""
    return dealer


def redis_membership(members: RedisMembership) -> Membership:
    """Sessions of every node, for the meta API."""
    return members


def redis_testaments(testaments: RedisTestaments) -> TestamentStore:
    """Testaments copied to Redis, published by another node if this one dies."""
    return testaments


def redis_sessions(store: RedisMqttSessionStore) -> SessionClaims:
    """MQTT sessions in Redis, claimed by the node their client connects to."""
    return store


def redis_sessions_store(store: RedisMqttSessionStore) -> MqttSessionStore:
    """... and a session store like the embedded one."""
    return store


def redis_links(store: RedisAmqpStore) -> LinkClaims:
    """Durable AMQP links in Redis, claimed by the node their client attaches to."""
    return store


def redis_links_store(store: RedisAmqpStore) -> AmqpStore:
    """... and a link store like the embedded one."""
    return store


def redis_claims(claims: RedisClaims[StoredDurable]) -> Claims[StoredDurable]:
    """The claiming every Redis store shares."""
    return claims


def redis_engine_context(engine: RedisEngine) -> EngineContext:
    """What the Redis engine's parts ask of the engine (they never import it)."""
    return engine


def redis_watched_engine(engine: RedisEngine) -> WatchedEngine:
    """What the failure watch asks of the engine."""
    return engine


def redis_realm_context(realm: RedisRealm) -> RealmContext:
    """What the Redis stores ask of their realm's share."""
    return realm


def redis_left_realm(realm: RedisRealm) -> LeftRealm:
    """What the adoption of a dead node's clients asks of a realm's share."""
    return realm
