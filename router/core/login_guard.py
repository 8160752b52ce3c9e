"""Failed logins, for every protocol: logged (peer and authid, never a secret) and slowed.

The first ``free`` failures of a peer host within ``window`` seconds are logged one line
each; later ones are counted and logged once per cause and interval (a flood of bad logins
must not become a flood of log lines). After those ``free`` failures each further refusal
is held back ``min(2 ** (failures - free), max_delay)`` seconds. The delay is a reactor
timer (``callLater``): the router keeps serving everyone else meanwhile, and only the
refused client waits for its answer.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import Callable

from router.core.incidents import LOGIN_FAILED, Incidents
from router.core.scheduler import Scheduler

log = logging.getLogger("router.auth")

WINDOW = 60.0
FREE_FAILURES = 3
MAX_DELAY = 8.0


def peer_host(peer: str | None) -> str:
    """The host part of ``tcp:1.2.3.4:5``, ``1.2.3.4:5`` or ``tcp6:[::1]:5``."""
    if not peer:
        return "unknown"
    text = peer.split(":", 1)[1] if peer.startswith(("tcp:", "tcp4:", "tcp6:")) else peer
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return text
    return host.strip("[]")


class LoginGuard:
    """Counts failures per peer host; hands out the delay for the next refusal."""

    def __init__(self, clock: Scheduler, window: float = WINDOW, free: int = FREE_FAILURES,
                 max_delay: float = MAX_DELAY, incidents: Incidents | None = None) -> None:
        self.clock = clock
        self.window = window
        self.free = free
        self.max_delay = max_delay
        self.incidents = incidents if incidents is not None else Incidents()
        self._failures: dict[str, deque[float]] = {}
        self.failures: Counter[str] = Counter()
        """protocol -> failed logins since start (for metrics)."""
        self.holds: Counter[str] = Counter()
        """protocol -> refusals held back by the back-off since start."""

    def failed(self, protocol: str, peer: str | None, authid: str | None, method: str,
               reason: str) -> float:
        """Record and log one failed login; returns how long to hold back the refusal."""
        host = peer_host(peer)
        now = self.clock.seconds() if hasattr(self.clock, "seconds") else time.monotonic()
        times = self._failures.setdefault(host, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        times.append(now)
        if len(self._failures) > 10_000:  # forget quiet peers so the table stays small
            for key in [k for k, v in self._failures.items() if v[-1] <= now - self.window]:
                del self._failures[key]
        count = len(times)
        delay = min(2.0 ** (count - self.free), self.max_delay) if count > self.free else 0.0
        self.failures[protocol.lower()] += 1
        if delay:
            self.holds[protocol.lower()] += 1
        if count <= self.free:
            log.warning("%s login failed from %s: authid %r, method %s: %s "
                        "(%d failure(s) in %ds)", protocol, peer or "unknown", authid, method,
                        reason, count, int(self.window),
                        extra={"protocol": protocol.lower(), "peer": peer or "unknown"})
        else:  # a host that keeps failing: counted, and logged once per interval, not per try
            self.incidents.count("", protocol.lower(), LOGIN_FAILED,
                                 f"from {peer or 'unknown'}: authid {authid!r}, method "
                                 f"{method}: {reason} ({count} failure(s) in "
                                 f"{int(self.window)}s; refusal delayed {delay:g}s)")
        return delay

    def refuse(self, delay: float, refusal: Callable[[], None]) -> None:
        """Run ``refusal`` now or after ``delay`` seconds on the reactor (never blocking)."""
        if delay > 0:
            self.clock.callLater(delay, refusal)
        else:
            refusal()
