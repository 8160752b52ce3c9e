"""RPC across the nodes of a Redis engine: registrations and forwarded calls.

Keys and channels, beside those of :mod:`router.engines.redis.engine`:

* hash ``wr:registrations:<realm>``: ``"<match> <uri>"`` -> JSON ``{"policy": ...,
  "callees": [[node, session, registration, seq, time], ...]}``, callees in the order they
  registered; counter ``wr:registrations-seq:<realm>`` numbers every change; channel
  ``wr:registrations`` announces each change as JSON ``[realm, seq, field, value or
  false]``. The scripts :data:`REGISTER` and :data:`RELEASE` check and change a procedure
  in one step, so two nodes never both hold a ``single`` registration. Every node keeps a
  copy of the hash (read when its subscription is confirmed, then kept current from the
  channel in ``seq`` order) and routes calls from it without asking Redis.
* channel ``wr:rpc:<node>``: calls for callees on that node and the answers to the calls it
  forwarded, one MessagePack array each.

The sessions and subscriptions of every node, for the meta API, are
:mod:`router.engines.redis.membership`'s.

The caller's node owns a forwarded call: it answers the caller, keeps a timer (the call's
own timeout, else ``cluster.call_timeout``) and a bound (``cluster.max_pending_calls``). The
callee's node runs the call with its own dealer, as if the caller were local.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

import msgpack
from twisted.internet import defer
from twisted.python.failure import Failure

from router.core import errors
from router.core.deadlines import CallDeadlines, answer_timed_out
from router.core.dealer import RegistrationIndex
from router.core.engine import ClusterLimits
from router.core.errors import RouterError
from router.core.incidents import ENGINE_UNAVAILABLE, QUEUE_FULL
from router.core.model import Args, Kwargs, Passthru, SessionInfo
from router.core.peer import Caller, Peer, Registration
from router.engines.redis.lua import script
from router.engines.redis.resp import Command, Reply, command

if TYPE_CHECKING:
    from router.core.realm import Realm
    from router.engines.redis.context import EngineContext
RemoteCallee: TypeAlias = "tuple[str, int, int]"
"""A callee in the cluster's copy of the registrations: (node, session, registration id
there)."""
Message: TypeAlias = "list[Any]"
"""A message between the dealers of two nodes as MessagePack decodes it: ``[kind, realm,
...]``, its fields per kind (see the module docstring)."""

REGISTRATIONS_CHANNEL = b"wr:registrations"

REGISTER = script("register")
"""Add callee ``(node, session, registration)`` to procedure ``ARGV[1]`` if the policy
allows; ``{error, message}`` or ``{'', seq}``. Ids travel as strings: Lua numbers are
doubles and cjson would round them."""

RELEASE = script("release")
"""Remove the callees of node ``ARGV[2]`` (only session ``ARGV[3]``'s unless it is empty)
from the procedures ``ARGV[4:]`` (every procedure when none are given); with a fourth key
(the node's alive key) only if it does not exist: the node died and did not come back."""

CALL, CANCEL, RESULT, ERROR = range(4)
"""The kinds of message on a node's ``wr:rpc:<node>`` channel."""


@dataclass(slots=True, eq=False)
class Forwarded:
    """A call this node sent to the callee's node, until that node answers."""

    id: int
    caller: Peer
    call_request: int
    node: str
    receive_progress: bool
    killing: bool = False
    """Canceled in ``kill`` mode: the callee's answer settles it."""


class RemoteCaller:
    """A caller on another node as the callee's node's dealer sees it: what the dealer
    sends it goes back to that node (the call's id there is the ``call_request``)."""

    __slots__ = ("dealer", "node", "info")

    def __init__(self, dealer: "RedisDealer", node: str, info: SessionInfo) -> None:
        self.dealer = dealer
        self.node = node
        self.info = info

    def send_result(self, call_request: int, args: Args | None, kwargs: Kwargs | None,
                    progress: bool, passthru: Passthru | None = None) -> None:
        """A result for a caller on another node: sent back to that node, which passes it on
        (``passthru`` is always ``None``: this caller :meth:`supports` no feature, so the
        dealer never hands it a passthru answer)."""
        self.dealer.answer(self.node, call_request,
                           [RESULT, self.dealer.name, call_request, args, kwargs, progress])

    def send_call_error(self, call_request: int, error: str, args: Args | None,
                        kwargs: Kwargs | None, passthru: Passthru | None = None) -> None:
        """An error for a caller on another node: sent back to that node, which passes it on
        (never with ``passthru``, as for :meth:`send_result`)."""
        self.dealer.answer(self.node, call_request,
                           [ERROR, self.dealer.name, call_request, error, args, kwargs])

    def supports(self, role: str, feature: str) -> bool:
        """Never asked of a caller (features are asked of callees); answered for the
        :class:`Peer` contract."""
        return False  # only asked of callees


class RedisDealer:
    """One realm's registrations and calls across the nodes (a
    :class:`router.core.dealer.ClusterDealer`)."""

    def __init__(self, engine: "EngineContext", name: str, limits: ClusterLimits) -> None:
        self.engine = engine
        self.name = name
        self.limits = limits
        self.realm: "Realm | None" = None
        self.keys = (f"wr:registrations:{name}".encode(),
                     f"wr:registrations-seq:{name}".encode(), REGISTRATIONS_CHANNEL)
        self.index: RegistrationIndex[RemoteCallee] = RegistrationIndex()
        """The cluster's registrations; callees are ``(node, session, registration)``."""
        self._fields: dict[str, Registration[RemoteCallee]] = {}
        self.applied = 0
        """``seq`` of the last change the copy holds."""
        self._held: list[tuple[int, str, str | None]] | None = None
        """Changes announced while the copy is being read again (None: not reading)."""
        self._claims: dict[int, Callable[[RouterError | None], None]] = {}
        """Registrations Redis accepted, by ``seq``, answered once the copy holds them."""
        self._calls: dict[int, Forwarded] = {}
        self._by_caller: dict[tuple[int, int], Forwarded] = {}
        self._deadlines: CallDeadlines[Forwarded] = CallDeadlines(engine.reactor,
                                                                  self._timed_out)
        self._ids = count(1)

    # registrations ----------------------------------------------------------

    def register(self, peer: Peer, registration: Registration[Peer],
                 answer: Callable[[RouterError | None], None]) -> None:
        """Claim the registration in Redis, where every node's registrations meet: ``answer``
        the refusal (as a single node's dealer would refuse it), or None once the cluster's
        copy holds it."""
        info = peer.info
        request = self.engine.request(command(
            "EVAL", REGISTER, 3, *self.keys, _field(registration), registration.policy,
            self.engine.node, info.session_id, registration.id, time.time(), self.name))
        request.addCallbacks(self._claimed, self._claim_failed, callbackArgs=(answer,),
                             errbackArgs=(answer,))

    def _claimed(self, reply: list[Reply], answer: Callable[[RouterError | None], None]) -> None:
        error, detail = reply
        if error:
            answer(RouterError(error.decode(), detail.decode()))
        elif detail <= self.applied:
            answer(None)
        else:
            self._claims[detail] = answer

    def _claim_failed(self, failure: Failure, answer: Callable[[RouterError | None], None]) -> None:
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"registration not claimed ({failure.getErrorMessage()})")
        answer(RouterError(errors.CANCELED, "the cluster (Redis) could not be asked"))

    def unregister(self, peer: Peer, registrations: list[Registration[Peer]]) -> None:
        """The callee's registrations here are released in Redis, so no node routes calls to it
        any more."""
        self.engine.send(command("EVAL", RELEASE, 3, *self.keys, self.name, self.engine.node,
                                 peer.info.session_id, *map(_field, registrations)), 1)

    def release_node(self) -> Command:
        """The command that removes every registration of this node (start, clean stop)."""
        return ("EVAL", RELEASE, 3, *self.keys, self.name, self.engine.node, "")

    def release_dead(self, node: str, alive_key: bytes) -> Command:
        """The command that removes every registration of node ``node`` if it is dead."""
        return ("EVAL", RELEASE, 4, *self.keys, alive_key, self.name, node, "")

    def waited_nodes(self) -> set[str]:
        """The nodes of the calls forwarded from here and not answered yet."""
        return {forwarded.node for forwarded in self._calls.values()}

    def node_down(self, node: str) -> None:
        """Node ``node`` died: the calls forwarded to it will not be answered."""
        for forwarded in [f for f in self._calls.values() if f.node == node]:
            self._fail(forwarded, f"the callee's node {node} died")

    def reload(self) -> defer.Deferred[bool]:
        """The channel is subscribed (again): read the whole hash, then apply the changes
        announced meanwhile that are newer. Fires with whether the hash was read."""
        if self._held is None:
            self._held = []
        return self.engine.request(command("MULTI") + command("HGETALL", self.keys[0])
                                   + command("GET", self.keys[1]) + command("EXEC"),
                                   3).addCallbacks(self._loaded, self._load_failed)

    def _loaded(self, replies: list[Reply]) -> bool:
        found, seq = replies
        if int(seq or 0) >= self.applied:  # else a later read was applied already
            snapshot = dict(zip(found[::2], found[1::2]))
            for field in [f for f in self._fields if f.encode() not in snapshot]:
                self._set(field, None)
            for field, value in snapshot.items():
                self._set(field.decode(), value)
            self.applied = int(seq or 0)
        held, self._held = self._held or [], None
        for change in held:
            self._apply(*change)
        for settled in [s for s in self._claims if s <= self.applied]:
            self._claims.pop(settled)(None)
        return True

    def _load_failed(self, failure: Failure) -> bool:
        self._held = None  # the next subscription (after a reconnect) reads again
        self.engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                    f"registrations not read ({failure.getErrorMessage()})")
        return False

    def changed(self, seq: int, field: str, value: str | None) -> None:
        """A node changed a procedure (announced in Redis's order)."""
        if self._held is not None:
            self._held.append((seq, field, value))
        else:
            self._apply(seq, field, value)

    def _apply(self, seq: int, field: str, value: str | None) -> None:
        if seq <= self.applied:
            return
        self.applied = seq
        self._set(field, value)
        answer = self._claims.pop(seq, None)
        if answer is not None:
            answer(None)

    def _set(self, field: str, value: str | bytes | None) -> None:
        old = self._fields.pop(field, None)
        if old is not None:
            self.index.remove(old)
        if not value:
            return
        entry = json.loads(value)
        match, uri = field.split(" ", 1)
        registration: Registration[RemoteCallee] = Registration(0, uri, match, entry["policy"])
        registration.callees = [(node, int(session), int(registration_id))
                                for node, session, registration_id, *_ in entry["callees"]]
        if old is not None:
            registration.turn = old.turn
        self.index.add(registration)
        self._fields[field] = registration

    # calls ------------------------------------------------------------------

    def call(self, caller: Peer, call_request: int, procedure: str, args: Args | None,
             kwargs: Kwargs | None, receive_progress: bool, timeout_ms: int,
             disclose_caller: bool) -> None:
        """A call with no local callee: forwarded to the node of the callee the cluster's
        registration picks."""
        realm = self.realm
        assert realm is not None
        registration = self.index.lookup(procedure)
        if registration is None:
            raise realm.dealer.no_such_procedure(procedure)
        node, session_id, registration_id = registration.pick()
        if node != self.engine.node:
            self._forward(caller, call_request, procedure, args, kwargs, receive_progress,
                          timeout_ms, disclose_caller, node, session_id, registration_id)
            return
        found = self._callee(session_id, registration_id)
        if found is None:
            raise realm.dealer.no_such_procedure(procedure)  # it left a moment ago
        local, callee = found
        realm.dealer.invoke(local, callee, caller, call_request, procedure, args, kwargs,
                            receive_progress, timeout_ms, disclose_caller)

    def _callee(self, session_id: int,
                registration_id: int) -> tuple[Registration[Peer], Peer] | None:
        """This node's registration and callee session, if both are still here."""
        realm = self.realm
        assert realm is not None
        local = realm.dealer.by_id.get(registration_id)
        callee = realm.sessions.get(session_id)
        if local is None or callee is None or callee not in local.callees:
            return None
        return local, callee

    def _forward(self, caller: Peer, call_request: int, procedure: str, args: Args | None,
                 kwargs: Kwargs | None, receive_progress: bool, timeout_ms: int,
                 disclose_caller: bool, node: str, session_id: int,
                 registration_id: int) -> None:
        engine = self.engine
        if len(self._calls) >= self.limits.max_pending_calls:
            engine.incidents.count(self.name, "wamp", QUEUE_FULL,
                                   f"{len(self._calls)} forwarded calls wait for other nodes: "
                                   f"call to {procedure} refused")
            raise RouterError(errors.LIMIT_EXCEEDED,
                              "too many calls wait for other nodes; try again later")
        if engine.commands is None:
            engine.incidents.count(self.name, "engine", ENGINE_UNAVAILABLE,
                                   f"call to {procedure} on node {node} not sent")
            raise RouterError(errors.CANCELED, f"the callee is on node {node} and the cluster "
                                               "(Redis) is not reachable")
        delay = timeout_ms / 1000.0 if timeout_ms > 0 else self.limits.call_timeout
        call_id = next(self._ids)
        info = caller.info
        try:
            data = msgpack.packb([CALL, self.name, engine.node, call_id, session_id,
                                  registration_id, procedure, args, kwargs, receive_progress,
                                  disclose_caller, info.session_id, info.authid,
                                  info.authrole, int(delay * 1000)], use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise RouterError(errors.INVALID_ARGUMENT,
                              f"the arguments cannot be sent to the callee: {exc}") from None
        forwarded = Forwarded(call_id, caller, call_request, node, receive_progress)
        self._deadlines.start(forwarded, delay)
        self._calls[call_id] = forwarded
        self._by_caller[(info.session_id, call_request)] = forwarded
        engine.commands.request(command("PUBLISH", _channel(node), data)).addCallbacks(
            self._sent, self._not_sent, callbackArgs=(forwarded,), errbackArgs=(forwarded,))

    def _sent(self, receivers: int, forwarded: Forwarded) -> None:
        """Nobody listens on the node's channel: it is not running (or not connected)."""
        if receivers == 0:
            self._fail(forwarded, f"the callee's node {forwarded.node} is not running")

    def _not_sent(self, failure: Failure, forwarded: Forwarded) -> None:
        self._fail(forwarded, f"the call was not sent to node {forwarded.node} "
                              f"({failure.getErrorMessage()})")

    def _fail(self, forwarded: Forwarded, message: str) -> None:
        if self._calls.get(forwarded.id) is forwarded:
            self.engine.incidents.count(self.name, "wamp", ENGINE_UNAVAILABLE, message)
            self._finish(forwarded)
            forwarded.caller.send_call_error(forwarded.call_request, errors.CANCELED,
                                             [message], None)

    def _timed_out(self, forwarded: Forwarded) -> None:
        """No answer in time (the callee's node also times the call out, if it runs)."""
        self._finish(forwarded)
        answer_timed_out(forwarded.caller, forwarded.call_request,
                         self.realm.stats if self.realm is not None else None)

    def _finish(self, forwarded: Forwarded) -> None:
        self._deadlines.stop(forwarded)
        self._calls.pop(forwarded.id, None)
        self._by_caller.pop((forwarded.caller.info.session_id, forwarded.call_request), None)

    def cancel(self, caller: Caller, call_request: int, mode: str) -> None:
        """A CANCEL of a forwarded call: sent to the callee's node, and the caller answered
        unless ``kill`` waits for the callee."""
        forwarded = self._by_caller.get((caller.info.session_id, call_request))
        if forwarded is None or forwarded.killing:
            return
        self._send_cancel(forwarded, mode)
        if self.realm is not None:
            self.realm.stats.call_cancels += 1
        if mode == "kill":
            forwarded.killing = True
            return
        self._finish(forwarded)
        caller.send_call_error(call_request, errors.CANCELED, ["call canceled"], None)

    def _send_cancel(self, forwarded: Forwarded, mode: str) -> None:
        self.engine.send(command("PUBLISH", _channel(forwarded.node), msgpack.packb(
            [CANCEL, self.name, self.engine.node, forwarded.id,
             forwarded.caller.info.session_id, mode])), 1)

    def caller_left(self, session_id: int) -> None:
        """A caller left: its forwarded calls are canceled on the callees' nodes, so callees stop
        working for nobody."""
        if not self._calls:
            return
        for forwarded in [f for f in self._calls.values()
                          if f.caller.info.session_id == session_id]:
            self._finish(forwarded)
            self._send_cancel(forwarded, "killnowait")

    # the node's channel -------------------------------------------------------

    def received(self, message: Message) -> None:
        """A message on this node's ``wr:rpc:<node>`` channel for this realm."""
        kind = message[0]
        if kind == RESULT:
            _, _, call_id, args, kwargs, progress = message
            forwarded = self._calls.get(call_id)
            if forwarded is None:
                return  # answered already (timeout, cancel)
            if not progress:
                self._finish(forwarded)
            elif not forwarded.receive_progress:
                return
            forwarded.caller.send_result(forwarded.call_request, args, kwargs, progress)
        elif kind == ERROR:
            _, _, call_id, error, args, kwargs = message
            forwarded = self._calls.get(call_id)
            if forwarded is not None:
                self._finish(forwarded)
                forwarded.caller.send_call_error(forwarded.call_request, error, args, kwargs)
        elif kind == CALL:
            self._invoke(message)
        elif kind == CANCEL:
            _, _, origin, call_id, session_id, mode = message
            if self.realm is not None:
                self.realm.dealer.cancel(
                    RemoteCaller(self, origin, SessionInfo(session_id, self.name, "", "")),
                    call_id, mode)

    def _invoke(self, message: Message) -> None:
        """Run a call another node forwarded, with this node's dealer."""
        (_, _, origin, call_id, session_id, registration_id, procedure, args, kwargs,
         receive_progress, disclose, caller_id, authid, authrole, timeout_ms) = message
        caller = RemoteCaller(self, origin, SessionInfo(caller_id, self.name, authid, authrole))
        realm = self.realm
        found = self._callee(session_id, registration_id) if realm is not None else None
        if realm is None or found is None:
            caller.send_call_error(call_id, errors.NO_SUCH_PROCEDURE,
                                   [f"the callee of '{procedure}' left node {self.engine.node}"],
                                   None)
            return
        local, callee = found
        try:
            realm.dealer.invoke(local, callee, caller, call_id, procedure,
                                args, kwargs, receive_progress, timeout_ms, disclose)
        except RouterError as exc:
            caller.send_call_error(call_id, exc.uri, exc.args_list, exc.kwargs)

    def answer(self, node: str, call_id: int, message: Message) -> None:
        """Send a result or error back to the caller's node."""
        try:
            data = msgpack.packb(message, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            data = msgpack.packb([ERROR, self.name, call_id, errors.INVALID_ARGUMENT,
                                  [f"the callee's answer cannot be sent to the caller: {exc}"],
                                  None], use_bin_type=True)
        self.engine.send(command("PUBLISH", _channel(node), data), 1)


def _field(registration: Registration[Peer]) -> str:
    """A registration's field in the registrations hash: its match and its URI."""
    return f"{registration.match} {registration.uri}"


def _channel(node: str) -> bytes:
    return b"wr:rpc:" + node.encode()
