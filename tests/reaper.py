"""Nothing a test starts outlives it: pytest hooks that tests/conftest.py takes in.

* After each test's body (passed, failed, or interrupted by pytest-timeout, whose ``signal``
  method raises in the test like a failure), every RouterProcess and RedisServer the body
  made and left running is ended (:func:`tests.harness.stops_what_it_creates`). Processes
  of fixtures are their finalizers' business (so a fixture must not be first asked for
  from a test body, with ``request.getfixturevalue``: its router would be ended).
* When the session ends, whatever descendant process of pytest still runs (a fixture
  whose teardown was cut short, a Spark daemon, a mosquitto client) is ended too, and
  listed: a leak is reported, not hidden.

pytest-timeout's ``thread`` method ends pytest with ``os._exit``, which runs none of this:
the project sets ``timeout_method = "signal"`` (pyproject.toml).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.harness import stops_what_it_creates

GRACE = 10.0
"""Seconds a process has to exit after SIGTERM before SIGKILL."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with stops_what_it_creates():
        return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    left = descendants(os.getpid(), exempt=_ends_with_pytest())
    if not left:
        return
    lines = [f"  {pid} {command_line(pid)}" for pid in left]
    end_all(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"reaper: ended {len(left)} process(es) the tests left running:")
        for line in lines:
            reporter.write_line(line)


def _running_children() -> dict[int, list[int]]:
    """parent pid -> pids of its running (not zombie) children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        state, parent = stat.rsplit(")", 1)[1].split()[:2]  # the name may hold spaces
        if state != "Z":
            children.setdefault(int(parent), []).append(int(entry))
    return children


def _ends_with_pytest() -> set[int]:
    """Children that exit with pytest itself: pyspark's gateway JVM (kept for reuse after
    a SparkSession stops) ends when the pipe to its stdin closes."""
    context = sys.modules.get("pyspark.context")
    gateway = getattr(getattr(context, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return {proc.pid} if proc is not None else set()


def descendants(root: int, exempt: set[int] = frozenset()) -> list[int]:
    """The running processes below ``root`` (but not ``exempt`` ones and theirs), parents
    before their children."""
    if not os.path.isdir("/proc"):
        return []  # not Linux: the per-test part still holds
    children = _running_children()
    found: list[int] = []
    todo = [pid for pid in children.get(root, []) if pid not in exempt]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def command_line(pid: int) -> str:
    try:
        return Path("/proc", str(pid), "cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return "?"


def _running(pid: int) -> bool:
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def end_all(pids: list[int]) -> None:
    """SIGTERM each, SIGKILL those still running ``GRACE`` seconds later."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling processes that are not ours to wait for
    for pid in pids:
        if _running(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass
