"""The harness leaves no process behind, whatever a test's outcome (tests/reaper.py): an
inner pytest run whose test times out with a router it started in its body, and whose
fixture starts a router and never stops it, ends with neither running."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.harness import ROOT
from tests.reaper import command_line, descendants

INNER_TIMEOUT = 10
"""pytest-timeout's limit in the inner run: room for a router start on a loaded machine."""

INNER = '''
import threading

import pytest

from tests.harness import RouterProcess, realm_file


@pytest.fixture
def leaked(tmp_path):
    yield RouterProcess(tmp_path, [realm_file("realm1")]).start()  # never stopped


def test_body_times_out(tmp_path):
    RouterProcess(tmp_path, [realm_file("realm1")]).start()
    (tmp_path.parent / "started").write_text("yes")  # under --basetemp
    threading.Event().wait(600)  # hangs: pytest-timeout ends it


def test_fixture_leaks(leaked):
    pass
'''


def survivors(marker: str) -> list[str]:
    """Command lines of running processes that mention ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            line = command_line(int(entry))
            if marker in line and "pytest" not in line:
                found.append(f"{entry} {line}")
    return found


def test_no_router_outlives_a_timed_out_test_or_a_leaking_fixture(tmp_path: Path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    base = tmp_path / "base"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    before = set(descendants(os.getpid()))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.reaper", "-p", "no:cacheprovider",
         f"--basetemp={base}", f"--timeout={INNER_TIMEOUT}", "-o", "timeout_method=signal",
         "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT + 60)
    output = result.stdout + result.stderr
    assert (base / "started").exists(), output  # the router was up before the timeout
    assert "Timeout" in output and "1 failed, 1 passed" in output, output
    # the fixture's router was only found when the session ended: ended and listed
    assert "reaper: ended 1 process(es)" in output and "-m router run" in output, output
    assert survivors(str(base)) == [], output
    assert set(descendants(os.getpid())) <= before
