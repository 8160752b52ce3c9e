"""The analytics commands' terminal output: the JVM's own lines (warnings, errors) never land
inside a stage's progress line; ``compact`` says what it did, or that there was nothing to do
and why (without starting Spark)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

from spark_analytics.progress import Console, Progress, relay_jvm_stderr
from tests.harness import ROOT

# stands in for the JVM: a child process started with our stderr, writing to it at start-up
# and again later, in the middle of a stage
CHILD = ("import sys\n"
         "sys.stderr.write('WARNING: Using incubator modules\\n'); sys.stderr.flush()\n"
         "print('started', flush=True)\n"
         "sys.stdin.readline()\n"
         "sys.stderr.write('Warning: restricted mode\\n')\n")


def test_jvm_lines_are_whole_lines_between_progress_lines():
    out = io.StringIO()
    console = Console(out)
    progress = Progress(2, console)
    with relay_jvm_stderr(console):
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "started\n"
    try:
        with progress.stage("reading event logs"):
            child.communicate("go\n", timeout=30)
            deadline = time.monotonic() + 30  # the relay thread copies the line
            while "restricted" not in out.getvalue():
                assert time.monotonic() < deadline, out.getvalue()
                time.sleep(0.01)
        with progress.task("charts"):
            pass
    finally:
        child.kill()
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["JVM: WARNING: Using incubator modules", "[1/2] reading event logs ...",
                         "JVM: Warning: restricted mode"], lines
    # the stage's line goes on below the JVM's, saying again what it is
    assert re.fullmatch(r"\[1/2\] reading event logs \.\.\. \d+\.\d s", lines[3]), lines
    assert re.fullmatch(r"\[2/2\] charts \.\.\. \d+\.\d s", lines[4]), lines
    assert len(lines) == 5, lines


def analytics_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_analytics", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def write_day(logs, day: str, name: str, records: int) -> None:
    folder = logs / "realm=r1" / f"date={day}"
    folder.mkdir(parents=True, exist_ok=True)
    start = datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp()
    (folder / name).write_text("".join(json.dumps({
        "ts": start + n, "kind": "publish", "topic": "com.c", "qos": 0, "payload_bytes": 1,
        "receivers": 0}) + "\n" for n in range(records)))


NO_JAVA = {"JAVA_HOME": "/nonexistent"}
"""Spark cannot start with this: a command that succeeds with it started none."""


def test_compact_says_what_it_wrote_then_that_nothing_is_left_without_starting_spark(tmp_path):
    today = datetime.now(timezone.utc).date()
    closed, still_open = (today - timedelta(days=2)).isoformat(), (today - timedelta(days=1))
    logs = tmp_path / "eventlog"
    write_day(logs, closed, "part-0.jsonl", 30)
    write_day(logs, closed, "part-1.jsonl", 12)
    write_day(logs, still_open.isoformat(), ".part-0.jsonl", 5)  # the router still writes it
    write_day(logs, today.isoformat(), "part-0.jsonl", 7)

    first = analytics_cli("compact", "--logs", str(logs))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"compacted realm=r1/date={closed}: 42 records" in first.stdout, first.stdout
    assert re.search(r"1 day\(s\), 42 records: wrote 1 Parquet record file\(s\) under \S+_parquet"
                     r" and \d+ rollup file\(s\)", first.stdout), first.stdout
    progress = [line for line in first.stderr.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert progress and all(re.search(r" \.\.\. \d+\.\d s$", line) for line in progress), \
        first.stderr[-3000:]
    assert any(f"records of realm=r1/date={closed}" in line for line in progress)

    again = analytics_cli("compact", "--logs", str(logs), env=NO_JAVA)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == (f"nothing to compact under {logs}: 1 closed day(s) compacted "
                            f"already; 2 day(s) not closed yet (today, UTC, or a part the "
                            f"router still writes)\n")
