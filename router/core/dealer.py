"""The dealer: registrations, call routing, progressive results, cancel and timeout.

Procedures are looked up exact first, then the longest matching prefix
registration, then the wildcard registration whose first wildcard comes last.
Router-provided procedures (the meta APIs) are plain callables checked first;
a call into the ``wamp.`` namespace never reaches a client registration, so a
pattern registration such as prefix ``wam`` cannot answer for the router.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Callable, Generic, Protocol

from twisted.python.failure import Failure

from router.core import errors
from router.core.deadlines import CallDeadlines, answer_timed_out
from router.core.errors import ProtocolViolation, RouterError, Unencodable
from router.core.ids import router_scope_ids
from router.core.model import Args, Kwargs, Passthru, SessionInfo
from router.core.peer import Callee, Caller, Invocation, Peer, Registration
from router.core.scheduler import Scheduler
from router.core.stats import RealmStats
from router.core.topic import from_uri
from router.core.trie import TopicTrie
from router.core.uri import EXACT, PREFIX, is_reserved

INVOKE_POLICIES = ("single", "roundrobin", "random", "first", "last")
CANCEL_MODES = ("skip", "kill", "killnowait")


_NO_CALLS: Mapping[int, Invocation] = MappingProxyType({})
"""The calls in progress of a session that has none: no dict made per call to say so."""

RouterProcedure = Callable[[SessionInfo, Args, Kwargs], object]
"""A procedure the router implements itself: (caller, args, kwargs) -> result, or a
Deferred of the result when the answer needs I/O (cluster-wide meta API on Redis)."""


class RegistrationIndex(Generic[Callee]):
    """Registrations by procedure pattern, looked up by the spec's precedence."""

    def __init__(self) -> None:
        self.exact: dict[str, Registration[Callee]] = {}
        self.prefix: dict[str, Registration[Callee]] = {}
        self._prefix_lengths: Counter[int] = Counter()
        """How many prefix registrations have each URI length."""
        self._lengths: list[int] = []
        """Those lengths, each once, in order: a call probes its procedure's own prefixes of
        these lengths, longest first (:meth:`_longest_prefix`), not every registration."""
        self.wildcard: TopicTrie[Registration[Callee]] = TopicTrie()

    def get(self, uri: str, match: str) -> Registration[Callee] | None:
        """The registration on exactly this (uri, match), if any: REGISTER asks it to join or
        refuse an existing one."""
        if match == EXACT:
            return self.exact.get(uri)
        if match == PREFIX:
            return self.prefix.get(uri)
        return self.wildcard.get(from_uri(uri))

    def add(self, registration: Registration[Callee]) -> None:
        """File a new registration under its match policy, so :meth:`match` finds it."""
        if registration.match == EXACT:
            self.exact[registration.uri] = registration
        elif registration.match == PREFIX:
            self.prefix[registration.uri] = registration
            length = len(registration.uri)
            self._prefix_lengths[length] += 1
            if self._prefix_lengths[length] == 1:
                insort(self._lengths, length)
        else:
            self.wildcard.set(from_uri(registration.uri), registration)

    def remove(self, registration: Registration[Callee]) -> None:
        """Drop a registration whose last callee left."""
        if registration.match == EXACT:
            del self.exact[registration.uri]
        elif registration.match == PREFIX:
            del self.prefix[registration.uri]
            length = len(registration.uri)
            self._prefix_lengths[length] -= 1
            if not self._prefix_lengths[length]:
                del self._prefix_lengths[length]
                del self._lengths[bisect_left(self._lengths, length)]
        else:
            self.wildcard.pop(from_uri(registration.uri))

    def lookup(self, procedure: str) -> Registration[Callee] | None:
        """The registration a call to ``procedure`` goes to."""
        registration = self.exact.get(procedure)
        if registration is not None:
            return registration
        registration = self._longest_prefix(procedure)
        if registration is not None:
            return registration
        matches = list(self.wildcard.match_patterns(from_uri(procedure)))
        if not matches:
            return None
        return max(matches, key=lambda r: (r.uri.split(".") + [""]).index(""))


    def _longest_prefix(self, procedure: str) -> Registration[Callee] | None:
        """The prefix registration with the longest URI that starts ``procedure``: one probe
        per length some prefix registration has, up to the procedure's, longest first. Work
        grows with those lengths and the procedure's, never with the registrations (trying
        each was 0.8 ms a call with 10,000 prefix registrations of another session; walking
        them in order by their common starts, steps as long as the procedure each)."""
        lengths, prefix = self._lengths, self.prefix
        for position in range(bisect_right(lengths, len(procedure)) - 1, -1, -1):
            registration = prefix.get(procedure[:lengths[position]])
            if registration is not None:
                return registration
        return None


class ClusterDealer(Protocol):
    """The dealer's share of a clustered engine: registrations and calls of every node.

    With one, every call goes through :meth:`call` (it invokes a callee on this node with
    :meth:`Dealer.invoke` or forwards the call to the callee's node); a registration is
    answered only once the cluster accepted it.
    """

    def register(self, peer: Peer, registration: Registration[Peer],
                 answer: Callable[[RouterError | None], None]) -> None:
        """Add ``peer`` as a callee of ``registration`` cluster-wide; ``answer(None)`` once
        every call routed on this node can reach it, ``answer(error)`` if refused."""

    def unregister(self, peer: Peer, registrations: list[Registration[Peer]]) -> None:
        """``peer`` is no callee of ``registrations`` anymore."""

    def call(self, caller: Peer, call_request: int, procedure: str, args: Args | None,
             kwargs: Kwargs | None, receive_progress: bool, timeout_ms: int,
             disclose_caller: bool) -> None:
        """Route a call (raise :class:`RouterError` when nobody can take it)."""

    def cancel(self, caller: Caller, call_request: int, mode: str) -> None:
        """Cancel a call this node forwarded (nothing if it is not one)."""

    def caller_left(self, session_id: int) -> None:
        """Tell the callees' nodes to stop the calls of a leaving caller."""


class Dealer:
    """Registrations and in-flight calls for one realm."""

    def __init__(self, scheduler: Scheduler, stats: RealmStats | None = None) -> None:
        self._scheduler = scheduler
        self.stats = stats if stats is not None else RealmStats()
        self._ids = router_scope_ids()
        self.registrations: RegistrationIndex[Peer] = RegistrationIndex()
        self.cluster: ClusterDealer | None = None
        """Set by a clustered engine: registrations and calls span every node."""
        self.by_id: dict[int, Registration[Peer]] = {}
        self._by_session: dict[int, dict[Registration[Peer], None]] = {}
        """The registrations each session is a callee of, in order: counted against its
        limit, and dropped when it leaves, without a look at anyone else's."""
        self.procedures: dict[str, RouterProcedure] = {}
        self._invocation_ids: dict[int, int] = {}
        self._invocations: dict[int, dict[int, Invocation]] = {}
        """Calls in progress by callee session id, then invocation request id: a leaving
        callee settles its own without a look at anyone else's."""
        self._calls: dict[int, dict[int, Invocation]] = {}
        """Calls in progress by caller session id, then the caller's request id: its CANCEL,
        its bound and its leaving look at its own only."""
        self._deadlines: CallDeadlines[Invocation] = CallDeadlines(scheduler, self._timed_out)

    def register(self, peer: Peer, uri: str, match: str, policy: str,
                 limit: int | None = None) -> Registration[Peer]:
        """Add ``peer`` as a callee of ``uri``; ``limit``: how many registrations the session
        may hold (one more raises ``limit_exceeded``)."""
        if policy not in INVOKE_POLICIES:
            raise RouterError(errors.INVALID_ARGUMENT, f"unknown invocation policy '{policy}'")
        if limit is not None and len(self._by_session.get(peer.info.session_id, ())) >= limit:
            raise RouterError(errors.LIMIT_EXCEEDED,
                              f"the session holds {limit} registrations, the maximum")
        registration = self.registrations.get(uri, match)
        if registration is None:
            registration = Registration(next(self._ids), uri, match, policy)
            self.registrations.add(registration)
            self.by_id[registration.id] = registration
        elif registration.policy != policy:
            raise RouterError(errors.PROCEDURE_EXISTS_WITH_DIFFERENT_POLICY,
                              f"'{uri}' is registered with policy '{registration.policy}'")
        elif policy == "single" or peer in registration.callees:
            raise RouterError(errors.PROCEDURE_ALREADY_EXISTS,
                              f"'{uri}' is already registered")
        registration.callees.append(peer)
        self._by_session.setdefault(peer.info.session_id, {})[registration] = None
        return registration

    def unregister(self, peer: Peer, registration_id: int) -> Registration[Peer]:
        """The callee's UNREGISTER: it stops receiving calls on the registration (gone when it
        was the last callee); the cluster is told so other nodes stop routing here."""
        registration = self.by_id.get(registration_id)
        if registration is None or peer not in registration.callees:
            raise RouterError(errors.NO_SUCH_REGISTRATION,
                              f"no registration {registration_id} for this session")
        self.drop_callee(registration, peer)
        if self.cluster is not None:
            self.cluster.unregister(peer, [registration])
        return registration

    def drop_callee(self, registration: Registration[Peer], peer: Peer) -> None:
        """Remove one callee here only (a cluster is told by the caller of this, if at all)."""
        registration.callees.remove(peer)
        held = self._by_session.get(peer.info.session_id)
        if held is not None:
            held.pop(registration, None)
            if not held:
                del self._by_session[peer.info.session_id]
        if registration.callees:
            return
        del self.by_id[registration.id]
        self.registrations.remove(registration)

    def call(self, caller: Peer, call_request: int, procedure: str, args: Args | None,
             kwargs: Kwargs | None, receive_progress: bool = False, timeout_ms: int = 0,
             disclose_caller: bool = False, passthru: Passthru | None = None,
             limit: int | None = None) -> None:
        """Route a call; the outcome reaches ``caller`` through its Peer callbacks.
        A ``passthru`` call goes only to a callee of this node that announced its feature
        (else ``wamp.error.feature_not_supported``). ``limit``: how many calls the caller
        may have in progress on this node's callees (one more raises ``limit_exceeded``;
        calls forwarded to other nodes are the cluster's to bound)."""
        self.stats.calls += 1
        builtin = self.procedures.get(procedure)
        if passthru is not None and (builtin is not None or self.cluster is not None):
            self.stats.call_errors += 1
            raise RouterError(errors.FEATURE_NOT_SUPPORTED,
                              "payload passthru calls go to client callees on one node only")
        if builtin is not None:
            self._call_builtin(caller, call_request, builtin, args, kwargs)
            return
        if is_reserved(procedure):
            raise self.no_such_procedure(procedure)
        calls = self._calls.get(caller.info.session_id, _NO_CALLS)
        if call_request in calls:  # (it would hide the first call from the bound and the caller)
            raise ProtocolViolation(f"CALL {call_request}: a call with that request id is in "
                                    f"progress")
        if limit is not None and len(calls) >= limit:
            self.stats.call_errors += 1
            raise RouterError(errors.LIMIT_EXCEEDED,
                              f"the session has {limit} calls in progress, the maximum")
        if self.cluster is not None:
            self.cluster.call(caller, call_request, procedure, args, kwargs, receive_progress,
                              timeout_ms, disclose_caller)
            return
        registration = self.registrations.lookup(procedure)
        if registration is None:
            raise self.no_such_procedure(procedure)
        self.invoke(registration, registration.pick(), caller, call_request, procedure, args,
                    kwargs, receive_progress, timeout_ms, disclose_caller, passthru)

    def no_such_procedure(self, procedure: str) -> RouterError:
        """The error for a call nobody can take (counted)."""
        self.stats.call_errors += 1
        return RouterError(errors.NO_SUCH_PROCEDURE, f"no callee registered for '{procedure}'")

    def invoke(self, registration: Registration[Peer], callee: Peer, caller: Caller,
               call_request: int, procedure: str, args: Args | None, kwargs: Kwargs | None,
               receive_progress: bool = False, timeout_ms: int = 0,
               disclose_caller: bool = False, passthru: Passthru | None = None) -> None:
        """Send a call to ``callee`` of ``registration`` and track it until it is settled."""
        if passthru is not None and not callee.supports("callee", passthru.feature):
            self.stats.call_errors += 1
            raise RouterError(errors.FEATURE_NOT_SUPPORTED,
                              f"the callee did not announce {passthru.feature}")
        callee_id = callee.info.session_id
        request_id = self._invocation_ids.get(callee_id, 0) + 1
        self._invocation_ids[callee_id] = request_id
        invocation = Invocation(request_id, registration, callee, caller, call_request,
                                procedure, args, kwargs, receive_progress, disclose_caller,
                                passthru=passthru)
        details = invocation.details
        if registration.match != EXACT:
            details["procedure"] = procedure
        if receive_progress:
            details["receive_progress"] = True
        if disclose_caller:
            details["caller"] = caller.info.session_id
            details["caller_authid"] = caller.info.authid
            details["caller_authrole"] = caller.info.authrole
        if timeout_ms > 0:
            self._deadlines.start(invocation, timeout_ms / 1000.0)
        invocations = self._invocations.get(callee_id)
        if invocations is None:
            invocations = self._invocations[callee_id] = {}
        invocations[request_id] = invocation
        calls = self._calls.get(caller.info.session_id)
        if calls is None:
            calls = self._calls[caller.info.session_id] = {}
        calls[call_request] = invocation
        try:
            callee.send_invocation(invocation)
        except Unencodable as exc:
            self._finish(invocation)
            raise RouterError(errors.INVALID_ARGUMENT,
                              f"the arguments cannot be sent to the callee: {exc}") from None
        except RouterError:  # (the callee cannot take it: over its maximum message size)
            self._finish(invocation)
            raise

    def _call_builtin(self, caller: Peer, call_request: int, procedure: RouterProcedure,
                      args: Args | None, kwargs: Kwargs | None) -> None:
        try:
            result = procedure(caller.info, list(args or ()), dict(kwargs or {}))
        except TypeError as exc:
            raise RouterError(errors.INVALID_ARGUMENT, str(exc)) from exc
        if hasattr(result, "addCallbacks"):  # a Deferred: the answer needs I/O (Redis)
            result.addCallbacks(partial(self._builtin_answer, caller, call_request),
                                partial(self._builtin_failed, caller, call_request))
            return
        self._builtin_answer(caller, call_request, result)

    def _builtin_answer(self, caller: Caller, call_request: int, result: object) -> None:
        caller.send_result(call_request, None if result is None else [result], None, False)

    def _builtin_failed(self, caller: Caller, call_request: int, failure: Failure) -> None:
        error = failure.value
        if isinstance(error, RouterError):
            caller.send_call_error(call_request, error.uri, error.args_list, error.kwargs)
        else:
            caller.send_call_error(call_request, errors.CANCELED,
                                   [f"the answer could not be made: {failure.getErrorMessage()}"],
                                   None)

    def yield_(self, callee: Peer, request_id: int, args: Args | None, kwargs: Kwargs | None,
               progress: bool, passthru: Passthru | None = None) -> None:
        """A callee's (progressive) result; unknown ids are late yields after a cancel."""
        invocation = self._invocation(callee, request_id)
        if invocation is None:
            return
        if progress:
            if invocation.receive_progress and invocation.cancel_mode is None:
                self._result(invocation, args, kwargs, True, passthru)
            return
        self._finish(invocation)
        if invocation.cancel_mode is None or invocation.cancel_mode == "kill":
            # in kill mode the callee may finish before it handles the INTERRUPT:
            # the caller then gets the RESULT (RFC: "RESULT or ERROR")
            self._result(invocation, args, kwargs, False, passthru)

    def _result(self, invocation: Invocation, args: Args | None, kwargs: Kwargs | None,
                progress: bool, passthru: Passthru | None) -> None:
        """A result to the caller; a passthru one only if the caller announced it (the RFC
        makes that ``feature_not_supported``; the caller gets it, as the call ends here)."""
        caller = invocation.caller
        if passthru is None:
            caller.send_result(invocation.call_request, args, kwargs, progress)
        elif caller.supports("caller", passthru.feature):
            caller.send_result(invocation.call_request, args, kwargs, progress, passthru)
        else:
            self.stats.call_errors += 1
            caller.send_call_error(invocation.call_request, errors.FEATURE_NOT_SUPPORTED,
                                   [f"the callee answered with a payload passthru result and "
                                    f"this session did not announce {passthru.feature}"], None)

    def invocation_error(self, callee: Peer, request_id: int, error: str, args: Args | None,
                         kwargs: Kwargs | None, passthru: Passthru | None = None) -> None:
        """The callee's ERROR for an invocation: passed to the caller, and the call is settled
        (unknown ids are late replies after a cancel or timeout)."""
        invocation = self._invocation(callee, request_id)
        if invocation is None:
            return
        self.stats.call_errors += 1
        self._finish(invocation)
        if invocation.cancel_mode == "kill":
            error = errors.CANCELED
        elif invocation.cancel_mode is not None:
            return
        caller = invocation.caller
        if passthru is None:
            caller.send_call_error(invocation.call_request, error, args, kwargs)
        elif caller.supports("caller", passthru.feature):
            caller.send_call_error(invocation.call_request, error, args, kwargs, passthru)
        else:  # the error URI reaches it; the payload it could not take does not
            caller.send_call_error(invocation.call_request, error, None, None)

    def cancel(self, caller: Caller, call_request: int, mode: str) -> None:
        """The caller's CANCEL in ``mode`` (skip, kill, killnowait): the callee is interrupted if
        it can be, and the caller answered unless ``kill`` waits for the callee's own answer."""
        if mode not in CANCEL_MODES:
            raise RouterError(errors.INVALID_ARGUMENT, f"unknown cancel mode '{mode}'")
        calls = self._calls.get(caller.info.session_id)
        invocation = None if calls is None else calls.get(call_request)
        if invocation is None:
            if self.cluster is not None:
                self.cluster.cancel(caller, call_request, mode)
            return
        if invocation.cancel_mode is not None:
            return
        if mode != "skip" and not invocation.callee.supports("callee", "call_canceling"):
            mode = "skip"
        invocation.cancel_mode = mode
        self.stats.call_cancels += 1
        if mode != "skip":
            invocation.callee.send_interrupt(invocation, mode, errors.CANCELED)
        if mode != "kill":
            self._finish(invocation)
            caller.send_call_error(call_request, errors.CANCELED, ["call canceled"], None)

    def _timed_out(self, invocation: Invocation) -> None:
        if invocation.callee.supports("callee", "call_canceling"):
            invocation.callee.send_interrupt(invocation, "killnowait", errors.TIMEOUT)
        invocation.cancel_mode = "timeout"
        self._finish(invocation)
        answer_timed_out(invocation.caller, invocation.call_request, self.stats)

    def _invocation(self, callee: Peer, request_id: int) -> Invocation | None:
        """The call in progress at ``callee`` under ``request_id``, if any."""
        invocations = self._invocations.get(callee.info.session_id)
        return None if invocations is None else invocations.get(request_id)

    def _finish(self, invocation: Invocation) -> None:
        self._deadlines.stop(invocation)
        _forget(self._calls, invocation.caller.info.session_id, invocation.call_request)
        _forget(self._invocations, invocation.callee.info.session_id, invocation.request_id)

    def remove_session(self, peer: Peer) -> None:
        """Unregister a leaving session and settle the calls it was part of."""
        session_id = peer.info.session_id
        registrations = list(self._by_session.get(session_id, ()))
        for registration in registrations:
            self.drop_callee(registration, peer)
        if self.cluster is not None:
            if registrations:
                self.cluster.unregister(peer, registrations)
            self.cluster.caller_left(session_id)
        for invocation in list(self._invocations.get(session_id, _NO_CALLS).values()):
            self._finish(invocation)
            if invocation.caller is peer:
                continue  # its own call: nothing goes to a session that is gone
            if invocation.cancel_mode is None or invocation.cancel_mode == "kill":
                invocation.caller.send_call_error(
                    invocation.call_request, errors.CANCELED, ["callee left"], None)
        for invocation in list(self._calls.get(session_id, _NO_CALLS).values()):
            self._finish(invocation)
            if invocation.callee.supports("callee", "call_canceling"):
                invocation.callee.send_interrupt(invocation, "killnowait", errors.CANCELED)
        self._invocation_ids.pop(session_id, None)

    def was_issued(self, callee: Peer, request_id: int) -> bool:
        """Did this callee ever get an invocation with ``request_id``? (Late replies are fine.)"""
        return 0 < request_id <= self._invocation_ids.get(callee.info.session_id, 0)



def _forget(by_session: dict[int, dict[int, Invocation]], session_id: int,
            request: int) -> None:
    """Drop ``request`` of ``session_id`` from one of the dealer's two indexes (and the
    session's entry with its last call: an idle session holds nothing there)."""
    requests = by_session.get(session_id)
    if requests is not None:
        requests.pop(request, None)
        if not requests:
            del by_session[session_id]
