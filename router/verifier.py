"""Password (ticket) verification off the reactor: PBKDF2 runs in a small thread pool.

One verification costs ~100 ms of CPU by design; on the reactor thread a handful of
logins would stall every other client's traffic. :class:`SecretVerifier` runs them in a
dedicated pool of threads (one fewer than the cores, 1 to 4), at a lower CPU priority than
the reactor (``NICENESS``), and hands each answer back on the reactor. At most
``max_pending`` verifications wait or run at once; over that a login is refused at once
as "server busy" (the caller answers in its protocol's words), so a login flood costs
the router bounded memory and only the flooding clients wait. ``checks`` counts the
checks run per protocol (``router_password_checks_total``): what logins cost the CPU.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Callable

from twisted.internet import threads
from twisted.python.threadpool import ThreadPool

from router.core.credentials import verify_secret
from router.core.incidents import REFUSED, Incidents

THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))
"""One core is left to the reactor: on a 2-core machine a login flood hashing on two threads
took CPU from every other client's traffic (seen in bench/soak.py)."""
MAX_PENDING = 64
NICENESS = 10
"""Added to the nice value of each verifier thread (Linux schedules threads one by one): on
a busy machine a login flood then takes CPU the traffic leaves, not the traffic's. A login
waits longer while the CPU is saturated."""

_lowered = threading.local()


def _verify_at_low_priority(secret: str, stored: str) -> bool:
    """:func:`verify_secret`, in a thread whose CPU priority was lowered on its first use."""
    if not getattr(_lowered, "done", False):
        _lowered.done = True
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread,
                           os.getpriority(os.PRIO_PROCESS, thread) + NICENESS)
        except (AttributeError, OSError):  # not Linux, or not allowed: normal priority
            pass
    return verify_secret(secret, stored)


class SecretVerifier:
    """``verify(...)``: ``answer(ok)`` later on the reactor, or False at once (counted as
    a refusal) when ``max_pending`` verifications are already under way."""

    def __init__(self, reactor, incidents: Incidents, threads_: int = THREADS,
                 max_pending: int = MAX_PENDING) -> None:
        self.reactor = reactor
        self.incidents = incidents
        self.max_pending = max_pending
        self.pending = 0
        self.checks: Counter[str] = Counter()
        """Password checks queued (each one runs PBKDF2 once), per protocol."""
        self.pool = ThreadPool(minthreads=0, maxthreads=threads_, name="secret-verifier")
        reactor.callWhenRunning(self.pool.start)
        reactor.addSystemEventTrigger("during", "shutdown", self.pool.stop)

    def verify(self, secret: str, stored: str, answer: Callable[[bool], None], realm: str,
               protocol: str, peer: str | None) -> bool:
        """Queue one verification; False (and no answer) when the queue is full."""
        if self.pending >= self.max_pending:
            self.incidents.count(realm, protocol, REFUSED,
                                 f"{peer}: login refused as busy, {self.pending} password "
                                 "checks under way (login_backoff.max_pending_verifications)")
            return False
        self.pending += 1
        self.checks[protocol] += 1
        deferred = threads.deferToThreadPool(self.reactor, self.pool, _verify_at_low_priority,
                                             secret, stored)
        deferred.addBoth(self._done, answer)
        return True

    def _done(self, result, answer: Callable[[bool], None]) -> None:
        self.pending -= 1
        answer(result is True)
