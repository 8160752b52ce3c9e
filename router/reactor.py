"""The router's reactor: Twisted's epoll reactor, without a log context per socket event.

Twisted's ``EPollReactor.doPoll`` hands every readable or writable socket to its connection
through ``log.callWithLogger``: the connection's ``logPrefix()``, a copy of the current log
context dict and a thread-local context stack, so that Twisted's legacy log observers can
name the connection in a ``system`` field. The router logs through :mod:`logging` and has no
such observer, and that wrapper cost about a tenth of the router's CPU per RPC call
(``bench/rpc.py``, py-spy). Here the poll loop calls ``_doReadOrWrite`` directly, which
catches and logs whatever a connection raises and drops that connection, as before.

It also runs work at the end of each turn (:meth:`RouterReactor.at_turn_end`): the turn
writer's sends (:mod:`router.flow`), which would otherwise take a ``callLater(0)`` per turn.
"""

from __future__ import annotations

import errno
import logging
from typing import Callable

from twisted.internet import epollreactor
from twisted.internet.error import ReactorAlreadyInstalledError
from twisted.internet.main import installReactor

log = logging.getLogger(__name__)


class RouterReactor(epollreactor.EPollReactor):
    """``EPollReactor`` whose poll loop calls each connection without the log context, and
    runs what was asked for the end of the turn (:meth:`at_turn_end`) after the events."""

    def __init__(self) -> None:
        super().__init__()
        self._turn_end: list[Callable[[], None]] = []

    def tables(self) -> tuple[dict | set, ...]:
        """Twisted's tables of the sockets it watches, which grow with the connections and
        keep their size when they close (for :func:`router.memory.compact`)."""
        return (self._reads, self._writes, self._selectables)

    def at_turn_end(self, work: Callable[[], None]) -> None:
        """Run ``work`` once the events of this turn are handled (the turn writer's sends):
        what ``callLater(0)`` gives, without a timer object, its heap and its bookkeeping per
        turn. Asked from a timer, it runs after a poll that does not wait."""
        self._turn_end.append(work)

    def doPoll(self, timeout: float | None) -> None:
        """Wait for socket events (at most ``timeout`` seconds), handle them, then run the
        turn's end."""
        if self._turn_end:
            timeout = 0
        try:
            events = self._poller.poll(-1 if timeout is None else timeout,
                                       len(self._selectables))
        except OSError as err:
            if err.errno != errno.EINTR:
                raise
            events = []
        selectables = self._selectables
        handle = self._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            try:
                handle(selectable, fd, event)
            except Exception:  # (callWithLogger's job) the other events still run
                log.exception("error handling an event of %r", selectable)
        if self._turn_end:
            turn_end, self._turn_end = self._turn_end, []
            for work in turn_end:
                try:
                    work()
                except Exception:
                    log.exception("error at the end of a reactor turn in %r", work)

    doIteration = doPoll


def install() -> None:
    """Make :class:`RouterReactor` Twisted's reactor, unless one is installed already (then
    that one serves, e.g. in a process that imported ``twisted.internet.reactor`` first)."""
    try:
        installReactor(RouterReactor())
    except ReactorAlreadyInstalledError:
        log.debug("a reactor is already installed: using it")
