"""The sessions and subscriptions of every node of a Redis engine, for the meta API.

Keys (beside those of :mod:`router.engines.redis.engine`): hash ``wr:sessions:<realm>``:
``"<node>:<session>"`` -> JSON ``[authrole, authid]``, and hash
``wr:subscriptions:<realm>``: ``"<node>:<subscription>"`` -> JSON ``[match, levels]``
(:meth:`RedisMembership.install` answers the meta procedures from them).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from router.core import errors
from router.core.peer import Subscription
from router.core.dealer import RouterProcedure
from router.core.errors import RouterError
from router.core.meta import authroles_filter, by_match, lookup_args, topic_arg
from router.core.model import Args, Kwargs, SessionInfo
from router.core.topic import Topic, topic_matches
from router.engines.redis.lua import script
from router.engines.redis.resp import Command, command

if TYPE_CHECKING:
    from router.engines.redis.context import EngineContext

DROP_NODE_FIELDS = script("drop_node_fields")
"""Forget the entries (sessions, subscriptions) whose field starts with ``ARGV[1]``
(``"<node>:"``)."""


class RedisMembership:
    """One realm's sessions and subscriptions on every node, for the cluster-wide meta API."""

    def __init__(self, engine: "EngineContext", name: str) -> None:
        self.engine = engine
        self.sessions_key = f"wr:sessions:{name}".encode()
        self.subscriptions_key = f"wr:subscriptions:{name}".encode()

    def _field(self, local_id: int) -> str:
        return f"{self.engine.node}:{local_id}"

    def joined(self, info: SessionInfo) -> None:
        """List the session in Redis, so meta calls on any node count it."""
        self.engine.send(command("HSET", self.sessions_key, self._field(info.session_id),
                                 json.dumps([info.authrole, info.authid])), 1)

    def left(self, info: SessionInfo) -> None:
        """The session no longer appears in other nodes' meta answers."""
        self.engine.send(command("HDEL", self.sessions_key, self._field(info.session_id)), 1)

    def subscription(self, subscription: Subscription, present: bool) -> None:
        """A subscription or shared group on a client pattern came or went on this node."""
        field = self._field(subscription.id)
        self.engine.send(command("HSET", self.subscriptions_key, field, json.dumps(
            [subscription.match, list(subscription.topic)])) if present
            else command("HDEL", self.subscriptions_key, field), 1)

    def forget_node(self) -> list[Command]:
        """The commands that remove this node's sessions and subscriptions (start, clean
        stop)."""
        return [("EVAL", DROP_NODE_FIELDS, 1, key, f"{self.engine.node}:")
                for key in (self.sessions_key, self.subscriptions_key)]

    def _read(self, key: bytes) -> defer.Deferred[list[tuple[str, int, bytes]]]:
        """A Deferred of ``[(node, id, value), ...]`` from one of the hashes."""
        commands = self.engine.commands
        if commands is None:
            return defer.fail(RouterError(errors.CANCELED,
                                          "the cluster (Redis) is not reachable"))
        return commands.request(command("HGETALL", key)).addCallback(
            lambda found: [(*_node_and_id(field), value)
                           for field, value in zip(found[::2], found[1::2])])

    def _sessions(self, args: Args) -> defer.Deferred[list[int]]:
        roles = authroles_filter(args)
        return self._read(self.sessions_key).addCallback(
            lambda found: [session for _, session, value in found
                           if roles is None or json.loads(value)[0] in roles])

    def session_count(self, caller: SessionInfo, args: Args,
                      kwargs: Kwargs) -> defer.Deferred[int]:
        """``wamp.session.count`` over every node (read from Redis)."""
        return self._sessions(args).addCallback(len)

    def session_list(self, caller: SessionInfo, args: Args,
                     kwargs: Kwargs) -> defer.Deferred[list[int]]:
        """``wamp.session.list`` over every node (read from Redis)."""
        return self._sessions(args)

    def _subscriptions(self) -> defer.Deferred[list[tuple[str, int, str, Topic]]]:
        """A Deferred of ``[(node, id, match, topic), ...]``, by node and id."""
        return self._read(self.subscriptions_key).addCallback(lambda found: sorted(
            (node, subscription_id, *_pattern(value))
            for node, subscription_id, value in found))

    def subscription_list(self, caller: SessionInfo, args: Args,
                          kwargs: Kwargs) -> defer.Deferred[dict[str, list[int]]]:
        """``wamp.subscription.list`` over every node (read from Redis)."""
        return self._subscriptions().addCallback(
            lambda found: by_match((match, sid) for _, sid, match, _ in found))

    def subscription_match(self, caller: SessionInfo, args: Args,
                           kwargs: Kwargs) -> defer.Deferred[list[int] | None]:
        """``wamp.subscription.match`` over every node (read from Redis)."""
        topic = topic_arg(args)
        return self._subscriptions().addCallback(
            lambda found: [sid for _, sid, match, pattern in found
                           if topic_matches(pattern, match, topic)] or None)

    def subscription_lookup(self, local: RouterProcedure) -> RouterProcedure:
        """wamp.subscription.lookup: this node's subscription if it has one, else the one
        of the first node (by name) that has it."""

        def lookup(caller: SessionInfo, args: Args, kwargs: Kwargs) -> Any:
            here = local(caller, args, kwargs)
            if here is not None:
                return here
            wanted = lookup_args(args, kwargs)
            return self._subscriptions().addCallback(lambda found: next(
                (sid for _, sid, match, pattern in found if (pattern, match) == wanted), None))

        return lookup

    def install(self, procedures: dict[str, RouterProcedure]) -> None:
        """Answer the meta API for every node of the realm (see docs/architecture.md)."""
        procedures.update({
            "wamp.session.count": self.session_count,
            "wamp.session.list": self.session_list,
            "wamp.subscription.list": self.subscription_list,
            "wamp.subscription.match": self.subscription_match,
            "wamp.subscription.lookup": self.subscription_lookup(
                procedures["wamp.subscription.lookup"]),
        })


def _node_and_id(field: bytes) -> tuple[str, int]:
    node, local_id = field.rsplit(b":", 1)
    return node.decode(), int(local_id)


def _pattern(value: bytes) -> tuple[str, Topic]:
    match, levels = json.loads(value)
    return match, tuple(levels)
