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

Its turn is shorter than Twisted's where nothing needs Twisted's: a socket that is only
readable (most events) is read without ``_doReadOrWrite``'s checks, and a turn without a
due timer or a thread's call skips ``runUntilCurrent`` and its context manager (together
about a tenth of the router's CPU per RPC call, ``bench/rpc.py``).
"""

from __future__ import annotations

import errno
import logging
from select import EPOLLIN
from typing import Callable

from twisted.internet import epollreactor
from twisted.internet.error import ReactorAlreadyInstalledError
from twisted.internet.main import installReactor

log = logging.getLogger(__name__)

_LONGEST_WAIT = 2147483
"""The longest poll in seconds (Twisted's: epoll's milliseconds in a C int)."""


class _Descriptors(dict[int, None]):
    """A set of file descriptors kept as a dict's keys: what ``EPollReactor`` asks of its
    ``_reads`` and ``_writes`` sets (``in``, ``add``, ``remove``, iteration) at a dict's
    cost per entry. A set keeps a half to three quarters of its table free: at 19,800
    connections the readers' set had just grown to 131,072 slots, 106 bytes a connection,
    where this dict takes 33 (``bench/session_memory.py --tracemalloc``)."""

    __slots__ = ()
    add = dict.setdefault  # (the value None)
    remove = dict.__delitem__

    def discard(self, fd: int) -> None:
        """Forget ``fd`` if it is here."""
        self.pop(fd, None)


class RouterReactor(epollreactor.EPollReactor):
    """``EPollReactor`` whose poll loop calls each connection without the log context, and
    runs what was asked for the end of the turn (:meth:`at_turn_end`) after the events."""

    def __init__(self) -> None:
        super().__init__()
        self._reads: _Descriptors = _Descriptors()  # type: ignore[assignment]
        self._writes: _Descriptors = _Descriptors()  # type: ignore[assignment]
        self._turn_end: list[Callable[[], None]] = []
        self.turn_began = self.seconds()
        """When this turn's poll returned: the time of its reads, one float for all of them
        (what an MQTT connection keeps as the time of its last read; a float of its own was
        24 bytes of every connection)."""

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
        self.turn_began = self.seconds()
        selectables = self._selectables
        handle = self._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            try:
                if event != EPOLLIN:
                    handle(selectable, fd, event)
                    continue
                # readable and nothing else (most events): _doReadOrWrite's read, without
                # its checks for hang-ups and writability and its ``fileno() == -1`` check
                # (a closed socket's read fails and drops the connection all the same)
                try:
                    why = selectable.doRead()
                except BaseException as error:  # Twisted's: logged, the connection dropped
                    log.exception("error reading from %r", selectable)
                    why = error
                if why:
                    self._disconnectSelectable(selectable, why, True)
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

    def mainLoop(self) -> None:
        """Twisted's loop: due timers and threads' calls, then a poll for at most the time
        to the next timer; ``runUntilCurrent`` only when something is due (a timer, a
        thread's call, or a ``stop()`` asked during the turn, which only it carries out), and
        one context (errors are logged and the loop goes on, as Twisted's) for all turns."""
        while self._started:
            try:
                while self._started:
                    pending = self._pendingTimedCalls
                    wait = pending[0].time - self.seconds() if pending else None
                    if self.threadCallQueue or self._newTimedCalls or self._justStopped or (
                            wait is not None and wait <= 0):
                        self.runUntilCurrent()
                        timeout = self.timeout()
                    else:
                        timeout = None if wait is None else min(_LONGEST_WAIT, wait)
                    self.doPoll(timeout if self.running else 0)
            except BaseException:  # Twisted's loop logs whatever it is and goes on
                log.exception("unexpected error in the reactor's main loop")


def install() -> None:
    """Make :class:`RouterReactor` Twisted's reactor, unless one is installed already (then
    that one serves, e.g. in a process that imported ``twisted.internet.reactor`` first)."""
    try:
        installReactor(RouterReactor())
    except ReactorAlreadyInstalledError:
        log.debug("a reactor is already installed: using it")
