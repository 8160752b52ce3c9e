"""Both engines implement the engine contract: every member of every Protocol of
``router/core/engine.py`` and of the frontends' store Protocols, with the Protocol's
parameters (what Go asserts with ``var _ Broker = (*RedisBroker)(nil)``; the modules of
each engine are also checked by mypy, see router/engines/conformance.py)."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from router.amqp.persistence import AmqpStore, LinkClaims
from router.core.dealer import ClusterDealer
from router.core import engine as contract
from router.core.engine import Claims, Durability, Engine, Membership
from router.core.history import EventHistory, History
from router.engines.embedded.engine import EmbeddedEngine
from router.engines.embedded.links import SqliteLinkStore
from router.engines.embedded.outbox import SqliteOutboxStore
from router.engines.embedded.sessions import SqliteSessionStore
from router.engines.embedded.sqlite import SqliteStore
from router.engines.redis.claims import RedisClaims
from router.engines.redis.context import EngineContext, RealmContext
from router.engines.redis.dealer import RedisDealer
from router.engines.redis.engine import RedisEngine
from router.engines.redis.failure import LeftRealm, RedisTestaments, WatchedEngine
from router.engines.redis.history import RedisHistory
from router.engines.redis.links import RedisAmqpStore
from router.engines.redis.membership import RedisMembership
from router.engines.redis.outbox import RedisOutboxStore
from router.engines.redis.realm import RedisRealm
from router.engines.redis.sessions import RedisMqttSessionStore
from router.mqtt.persistence import MqttSessionStore, SessionClaims

IMPLEMENTATIONS = [
    (Engine, EmbeddedEngine), (Engine, RedisEngine),
    (Durability, SqliteStore), (Durability, RedisRealm),
    (History, EventHistory), (History, RedisHistory),
    (ClusterDealer, RedisDealer), (Membership, RedisMembership),
    (contract.TestamentStore, RedisTestaments),
    (MqttSessionStore, SqliteSessionStore), (MqttSessionStore, RedisMqttSessionStore),
    (AmqpStore, SqliteLinkStore), (AmqpStore, RedisAmqpStore),
    (contract.OutboxStore, SqliteOutboxStore), (contract.OutboxStore, RedisOutboxStore),
    (Claims, RedisClaims), (SessionClaims, RedisMqttSessionStore),
    (LinkClaims, RedisAmqpStore),
    # what the Redis engine's parts ask of their engine and realm share (no import back)
    (EngineContext, RedisEngine), (RealmContext, RedisRealm), (LeftRealm, RedisRealm),
    (WatchedEngine, RedisEngine),
]


def _members(protocol: type) -> tuple[dict[str, object], set[str]]:
    """The methods (name -> function) and data members a Protocol declares, its Protocol
    bases' included."""
    methods: dict[str, object] = {}
    data: set[str] = set()
    for base in reversed(protocol.__mro__):
        if not getattr(base, "_is_protocol", False) or base is Protocol:
            continue
        data.update(vars(base).get("__annotations__", {}))
        methods.update({name: value for name, value in vars(base).items()
                        if inspect.isfunction(value)
                        and (not name.startswith("_") or name == "__bool__")})
    return methods, data - set(methods)


def _parameters(function: object) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize("protocol, implementation", IMPLEMENTATIONS,
                         ids=[f"{p.__name__}-{i.__name__}" for p, i in IMPLEMENTATIONS])
def test_engine_class_has_every_method_of_the_protocol(protocol, implementation):
    methods, _ = _members(protocol)
    assert methods, protocol  # the Protocol was read
    for name, declared in methods.items():
        implemented = getattr(implementation, name, None)
        assert callable(implemented), f"{implementation.__name__} lacks {name}"
        assert _parameters(implemented) == _parameters(declared), \
            f"{implementation.__name__}.{name}"


def test_data_members_are_set_by_the_stores(tmp_path):
    """Data members are instance attributes: check them on stores that need no server."""
    store = SqliteStore(tmp_path / "db.sqlite3", lambda f, *a: f(*a))
    try:
        links = EmbeddedEngine(store).amqp_store("realm1")
        for name in _members(AmqpStore)[1]:
            assert hasattr(links, name), name
        assert {"release", "adopt", "lost_will"} <= _members(SessionClaims)[1]
        assert {"release", "adopt"} <= _members(LinkClaims)[1]
        assert {"node", "commands", "limits"} <= _members(EngineContext)[1]
        assert {"sessions", "dealer", "engine"} <= _members(LeftRealm)[1]
    finally:
        store.close()
