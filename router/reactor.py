"""The router's reactor: Twisted's epoll reactor, without a log context per socket event.

Twisted's ``EPollReactor.doPoll`` hands every readable or writable socket to its connection
through ``log.callWithLogger``: the connection's ``logPrefix()``, a copy of the current log
context dict and a thread-local context stack, so that Twisted's legacy log observers can
name the connection in a ``system`` field. The router logs through :mod:`logging` and has no
such observer, and that wrapper cost about a tenth of the router's CPU per RPC call
(``bench/rpc.py``, py-spy). Here the poll loop calls ``_doReadOrWrite`` directly, which
catches and logs whatever a connection raises and drops that connection, as before.
"""

from __future__ import annotations

import errno
import logging

from twisted.internet import epollreactor
from twisted.internet.error import ReactorAlreadyInstalledError
from twisted.internet.main import installReactor

log = logging.getLogger(__name__)


class RouterReactor(epollreactor.EPollReactor):
    """``EPollReactor`` whose poll loop calls each connection without the log context."""

    def doPoll(self, timeout: float | None) -> None:
        """Wait for socket events (at most ``timeout`` seconds) and handle them."""
        try:
            events = self._poller.poll(-1 if timeout is None else timeout,
                                       len(self._selectables))
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
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

    doIteration = doPoll


def install() -> None:
    """Make :class:`RouterReactor` Twisted's reactor, unless one is installed already (then
    that one serves, e.g. in a process that imported ``twisted.internet.reactor`` first)."""
    try:
        installReactor(RouterReactor())
    except ReactorAlreadyInstalledError:
        log.debug("a reactor is already installed: using it")
