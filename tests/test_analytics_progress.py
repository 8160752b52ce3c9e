"""The analytics commands' terminal output, without Spark: the JVM's own lines (warnings,
errors) never land inside a stage's progress line."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

from spark_analytics.progress import Console, Progress, relay_jvm_stderr

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
