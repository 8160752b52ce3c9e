"""Session testaments: publications a session leaves behind when it goes away.

On detach the ``detached`` bucket is published, then the ``destroyed`` one (we
have no session resumption, so both fire), each authorized as a publish by the
testator at the time it is published. With an engine that keeps them beyond this node
(``RealmEngine.testaments``), every change of a session's testaments is copied there, so
that another node publishes them (:func:`publish_testaments`) if this one dies; the
answer to ``add_testament`` / ``flush_testaments`` then waits until the copy is stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeAlias

from twisted.internet import defer

from router.core import errors
from router.core.engine import StoredTestament, TestamentStore
from router.core.errors import ProtocolViolation, RouterError
from router.core.incidents import REFUSED
from router.core.model import Args, Details, Kwargs, SessionInfo
from router.core.options import parse_publish_options
from router.core.peer import Peer
from router.core.realm import Realm
from router.core.topic import from_uri
from router.core.uri import is_reserved

SCOPES = ("detached", "destroyed")

log = logging.getLogger(__name__)

Answer: TypeAlias = "int | defer.Deferred[int | None] | None"
"""What a testament procedure answers: at once, or once the engine stored its copy."""


@dataclass(frozen=True, slots=True)
class Testament:
    """One event a session asked to be published when it goes (``wamp.session.add_testament``)."""
    topic: str
    args: Args | None
    kwargs: Kwargs | None
    raw_options: Details
    """As the session gave them: what a copy beyond this node keeps."""

    def stored(self) -> StoredTestament:
        """The copy's form: ``[topic, args, kwargs, publish options]``."""
        return [self.topic, self.args, self.kwargs, self.raw_options]


def publish_testaments(realm: Realm, info: SessionInfo, stored: list[StoredTestament]) -> None:
    """Publish testaments (in their copy's form) on behalf of a session that is gone: its own
    node's, or, when that node died, any node's."""
    for topic, args, kwargs, raw_options in stored:
        try:
            realm.publish(info, from_uri(topic), args, kwargs, parse_publish_options(raw_options),
                          uri=topic)
        except (RouterError, ProtocolViolation) as exc:
            message = exc.message or exc.uri if isinstance(exc, RouterError) else str(exc)
            log.warning("testament of session %s on '%s' not published: %s",
                        info.session_id, topic, message)


class Testaments:
    """The testaments of every session of one realm."""

    def __init__(self, realm: Realm, max_per_session: int = 100,
                 store: TestamentStore | None = None) -> None:
        self._realm = realm
        self._max = max_per_session
        self._store = store
        self._by_session: dict[int, dict[str, list[Testament]]] = {}
        realm.dealer.procedures["wamp.session.add_testament"] = self.add
        realm.dealer.procedures["wamp.session.flush_testaments"] = self.flush
        realm.on_leave(self._publish_all)

    def add(self, caller: SessionInfo, args: Args, kwargs: Kwargs) -> Answer:
        """``wamp.session.add_testament``: checked and authorized now, so it cannot fail when the
        session is gone; bounded per session (``wamp.max_testaments``)."""
        topic = args[0] if args else kwargs.get("topic")
        t_args = args[1] if len(args) > 1 else kwargs.get("args")
        t_kwargs = args[2] if len(args) > 2 else kwargs.get("kwargs")
        raw_options = kwargs.get("publish_options") or {}
        scope = kwargs.get("scope", "destroyed")
        if type(topic) is not str:
            raise RouterError(errors.INVALID_ARGUMENT, "'topic' (a string) is required")
        if scope not in SCOPES:
            raise RouterError(errors.INVALID_ARGUMENT, f"scope must be one of {', '.join(SCOPES)}")
        if t_args is not None and type(t_args) is not list:
            raise RouterError(errors.INVALID_ARGUMENT, "'args' must be a list")
        if t_kwargs is not None and type(t_kwargs) is not dict:
            raise RouterError(errors.INVALID_ARGUMENT, "'kwargs' must be a dict")
        try:
            parse_publish_options(raw_options)  # refused now, not when it is published
        except ProtocolViolation as exc:
            raise RouterError(errors.INVALID_ARGUMENT, str(exc)) from exc
        self._realm.check_uri(topic)
        if is_reserved(topic):
            raise RouterError(errors.NOT_AUTHORIZED, "the 'wamp.' namespace is reserved")
        self._realm.authorize(caller, "publish", from_uri(topic))
        buckets = self._by_session.setdefault(caller.session_id, {s: [] for s in SCOPES})
        if sum(len(bucket) for bucket in buckets.values()) >= self._max:
            realm = self._realm
            realm.incidents.count(realm.name, "wamp", REFUSED,
                                  f"session {caller.session_id}: testament limit {self._max}")
            raise RouterError(errors.LIMIT_EXCEEDED,
                              f"this session already has {self._max} testaments, the realm's "
                              "maximum (wamp.max_testaments)")
        buckets[scope].append(Testament(topic, t_args, t_kwargs, raw_options))
        return self._copy(caller, buckets, None)

    def flush(self, caller: SessionInfo, args: Args,
              kwargs: Kwargs) -> Answer:
        """``wamp.session.flush_testaments``: drop the testaments of a scope; answers how many
        went."""
        scope = args[0] if args else kwargs.get("scope", "destroyed")
        if scope not in SCOPES:
            raise RouterError(errors.INVALID_ARGUMENT, f"scope must be one of {', '.join(SCOPES)}")
        bucket = self._by_session.get(caller.session_id, {}).get(scope, [])
        flushed = len(bucket)
        bucket.clear()
        if not flushed:
            return flushed
        return self._copy(caller, self._by_session[caller.session_id], flushed)

    def _copy(self, info: SessionInfo, buckets: dict[str, list[Testament]],
              answer: int | None) -> Answer:
        """Keep the engine's copy of the session's testaments current (if it keeps one):
        ``answer``, once the copy is stored (a Deferred), so that the caller knows that
        what it asked for holds even if this node dies."""
        store = self._store
        if store is None:
            return answer
        not_copied = RouterError(errors.UNAVAILABLE, "done on this node, but not (yet) copied "
                                 "to the cluster (Redis): lost if this node dies")
        if not store.save(info, [testament.stored() for scope in SCOPES
                                 for testament in buckets[scope]]):
            return defer.fail(not_copied)
        stored: defer.Deferred[int | None] = defer.Deferred()
        store.when_durable(lambda ok: stored.callback(answer) if ok else stored.errback(
            not_copied))
        return stored

    def _publish_all(self, peer: Peer) -> None:
        buckets = self._by_session.pop(peer.info.session_id, None)
        if not buckets:
            return
        stored = [testament.stored() for scope in SCOPES for testament in buckets[scope]]
        publish_testaments(self._realm, peer.info, stored)
        if self._store is not None and stored:
            self._store.save(peer.info, [])
