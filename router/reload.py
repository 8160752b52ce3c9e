"""Live reload (SIGHUP, ``python -m router reload``): realms' roles, principals and
anonymous role, without dropping sessions.

The running router writes its process id to ``<data_dir>/router.pid``; ``reload`` sends it
SIGHUP. The router reads the configuration again in a thread; a file that does not load is
refused whole (the running rules stay, logged with check-config's message). Otherwise each
realm gets its new rules (:mod:`router.core.policy`) and everything else that changed is
named as needing a restart. What happened is logged and written to
``<data_dir>/reload.json``, which ``reload`` waits for and prints.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from router.config import ConfigError, NodeConfig, RealmConfig, load_config
from router.core.authorization import Authorizer, PermissionRule, Role
from router.core.policy import apply_policy
from router.core.router import Router

log = logging.getLogger(__name__)

PID_FILE = "router.pid"
REPORT_FILE = "reload.json"
RELOADED = ("roles", "principals", "anonymous_role")
"""What a reload applies to a running realm; any other difference needs a restart."""
NOT_COMPARED = ("name", "source") + RELOADED


@dataclass
class ReloadReport:
    """One reload's outcome, as logged and as ``reload`` prints it."""

    number: int
    """Reloads this process has done."""
    started: float
    """When the router began this reload (``reload`` waits for one begun after its signal)."""
    pid: int = field(default_factory=os.getpid)
    time: float = field(default_factory=time.time)
    error: str | None = None
    applied: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    """Changes in the files that only a restart applies."""

    def lines(self) -> list[str]:
        if self.error is not None:
            return [f"reload refused, the running configuration stays: configuration error: "
                    f"{self.error}"]
        lines = [f"applied: {line}" for line in self.applied] or ["applied: nothing changed"]
        return lines + [f"needs a restart: {line}" for line in self.restart]


def authorizer_for(roles: dict[str, list[PermissionRule]]) -> Authorizer:
    """A realm's authorizer from its configured roles (at start and on every reload)."""
    return Authorizer({name: Role(name, rules) for name, rules in roles.items()})


def realm_changes(old: RealmConfig, new: RealmConfig) -> tuple[list[str], list[str]]:
    """(what a reload applies, what needs a restart) between two versions of one realm."""
    applied = []
    if old.roles != new.roles:
        applied.append(f"roles {_set_change(old.roles, new.roles)}")
    if old.principals != new.principals:
        applied.append(f"principals {_set_change(old.principals, new.principals)}")
    if old.anonymous_role != new.anonymous_role:
        applied.append(f"anonymous_role {old.anonymous_role} -> {new.anonymous_role}")
    restart = [f"'{each.name}'" for each in dataclasses.fields(RealmConfig)
               if each.name not in NOT_COMPARED
               and getattr(old, each.name) != getattr(new, each.name)]
    return applied, restart


def _set_change(old: dict, new: dict) -> str:
    """``+added -removed ~changed`` keys of two mappings."""
    parts = [f"+{key}" for key in new if key not in old]
    parts += [f"-{key}" for key in old if key not in new]
    parts += [f"~{key}" for key in new if key in old and old[key] != new[key]]
    return " ".join(parts)


def node_changes(old: NodeConfig, new: NodeConfig) -> list[str]:
    """Node-level differences (listeners, engine, data directory...), all needing a restart."""
    changed = [f"'{each.name}' changed" for each in dataclasses.fields(NodeConfig)
               if each.name not in ("realms", "source")
               and getattr(old, each.name) != getattr(new, each.name)]
    added = [name for name in new.realms if name not in old.realms]
    removed = [name for name in old.realms if name not in new.realms]
    if added:
        changed.append(f"realm(s) added: {', '.join(added)}")
    if removed:
        changed.append(f"realm(s) removed: {', '.join(removed)}")
    return changed


def apply(config: NodeConfig, new: NodeConfig, router: Router, number: int,
          started: float) -> ReloadReport:
    """Give ``router``'s realms the rules of ``new`` and update ``config`` (the running
    configuration) to what now runs: restart-only changes stay out of it, so the next reload
    names them again."""
    report = ReloadReport(number, started, restart=node_changes(config, new))
    for name, old in config.realms.items():
        fresh = new.realms.get(name)
        if fresh is None:
            continue
        applied, restart = realm_changes(old, fresh)
        if restart:
            report.restart.append(f"realm {name}: {', '.join(restart)} changed")
        if not applied:
            continue
        outcome = apply_policy(router.realms[name], dict(fresh.principals),
                               authorizer_for(fresh.roles), fresh.anonymous_role,
                               router.principals[name])
        report.applied.append(f"realm {name}: {'; '.join(applied)}; {outcome.summary()}")
        report.applied += [f"realm {name}: {line}" for line in outcome.closed]
        config.realms[name] = dataclasses.replace(old, roles=fresh.roles,
                                                  principals=fresh.principals,
                                                  anonymous_role=fresh.anonymous_role)
    return report


class Reloader:
    """Reloads a running node's configuration on request (SIGHUP), one reload at a time."""

    def __init__(self, config: NodeConfig, router: Router, reactor: Any) -> None:
        self.config = config
        self.router = router
        self.reactor = reactor
        self.reloads = 0
        self._running = False
        self._again = False

    def request(self) -> None:
        """Reload now, or right after the reload under way (a second SIGHUP is not lost)."""
        if self._running:
            self._again = True
            return
        self._running = True
        self.reloads += 1
        number, started = self.reloads, time.time()
        in_thread(self.reactor, lambda: load_config(self.config.source),
                  lambda new: self._loaded(number, started, new),
                  lambda exc: self._refused(number, started, exc))

    def _loaded(self, number: int, started: float, new: NodeConfig) -> None:
        report = apply(self.config, new, self.router, number, started)
        for line in report.lines():
            log.info("reload: %s", line)
        self._done(report)

    def _refused(self, number: int, started: float, exc: Exception) -> None:
        message = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        report = ReloadReport(number, started, error=message)
        log.error("reload: %s", report.lines()[0])
        self._done(report)

    def _done(self, report: ReloadReport) -> None:
        path = self.config.data_dir / REPORT_FILE
        in_thread(self.reactor, lambda: write_report(path, report), self._finished,
                  self._finished)

    def _finished(self, failure: Exception | None) -> None:
        """The report is written (``failure``: the error that kept it from being written)."""
        if failure is not None:
            log.error("reload: cannot write %s: %s", self.config.data_dir / REPORT_FILE,
                      failure)
        self._running = False
        if self._again:
            self._again = False
            self.request()


def in_thread(reactor: Any, work: Callable[[], Any], done: Callable[[Any], None],
              failed: Callable[[Exception], None]) -> None:
    """Run ``work`` off the reactor; ``done(result)`` or ``failed(exc)`` back on it."""
    from twisted.internet import threads

    deferred = threads.deferToThreadPool(reactor, reactor.getThreadPool(), work)
    deferred.addCallbacks(done, lambda failure: failed(failure.value))


def write_report(path: Path, report: ReloadReport) -> None:
    """Replace the report file at once (``reload`` polls it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(report)) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_report(path: Path) -> dict | None:
    """The last report, or None if there is none (yet)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def signal_reload(config: NodeConfig, timeout: float) -> int:
    """``python -m router reload``: SIGHUP the router running on ``config``'s data directory,
    wait for its report and print it; the exit code (0 applied, 1 refused or no router)."""
    import signal

    if not hasattr(signal, "SIGHUP"):
        print("reload needs SIGHUP, which this system does not have: restart the router",
              file=sys.stderr)
        return 1
    pid_file = config.data_dir / PID_FILE
    try:
        pid = int(pid_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        print(f"no running router found: {pid_file} is missing or unreadable (is the router "
              f"started with this --config?)", file=sys.stderr)
        return 1
    if not _is_router(pid):
        print(f"no running router found: process {pid} of {pid_file} is gone or is not the "
              "router (a stale pid file)", file=sys.stderr)
        return 1
    report_path = config.data_dir / REPORT_FILE
    sent = time.time()
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = read_report(report_path)
        if report is not None and report.get("pid") == pid and report.get("started", 0) >= sent:
            for line in ReloadReport(**report).lines():
                print(line)
            return 1 if report["error"] else 0
        time.sleep(0.1)
    print(f"the router (process {pid}) did not report within {timeout:g} s; see its log",
          file=sys.stderr)
    return 1


def _is_router(pid: int) -> bool:
    """Is ``pid`` alive and, where ``/proc`` tells, running ``router``? A pid file left by
    a router killed with SIGKILL may name a process that reused the number: a SIGHUP would
    stop most programs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's: /proc says what it runs
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: alive is all we can know
    return b"router" in command
