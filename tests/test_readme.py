"""The README as a newcomer reads it: its tour runs as written, and its links lead somewhere.

The tour is every ```` ```sh ```` block marked ``<!-- tour -->`` in README.md, run in order with
``bash -e`` (each command must succeed) against a router started on the shipped ``config.json``
and ``realms/``, as the README's command 1 starts it. A ``<!-- tour output -->`` block after a
tour block lists lines the block must print (in any order: retained messages come in no
promised order). The blocks run verbatim except for two substitutions, both made on the whole
block text:

- the shipped ports (8080, 8081, 1883, 8083, 5672, 9100) become free ports, the same ones the
  copy of ``config.json`` the router runs on was given (the tour names its ports, so port 0 is
  not an option, and a test must not take the shipped ones from a developer's own router);
- ``.venv/bin/python`` becomes ``sys.executable`` (the venv running the tests, which command 2
  makes the repository's ``.venv`` in CI), with this checkout first on ``PYTHONPATH``.

The router and the blocks work on a copy of ``config.json`` and ``realms/`` in a temporary
folder (the blocks' working directory), so the tour's ``role add`` and ``principal add`` edit
the copy, never the repository's files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, RouterProcess, free_port

README = ROOT / "README.md"
SHIPPED_PORTS = (8080, 8081, 1883, 8083, 5672, 8088, 9100)
"""The ports of the shipped config.json, in the order of its listeners."""
BLOCK_TIMEOUT = 60.0
"""Seconds one tour block may take on a loaded machine (each takes about a second idle; the
blocks that wait for messages give up on their own after 10 s, with -W 10)."""

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def tour(text: str) -> list[tuple[str, list[str]]]:
    """(block, lines it must print) for every tour block, in README order."""
    steps: list[tuple[str, list[str]]] = []
    for marker in re.finditer(r"^<!-- tour( output)? -->\n(```[^\n]*\n.*?^```)", text, re.S | re.M):
        body = FENCE.match(marker.group(2)).group(1)  # type: ignore[union-attr]
        if marker.group(1):
            assert steps, "a tour output block before any tour block"
            steps[-1][1].extend(line for line in body.splitlines() if line.strip())
        else:
            assert marker.group(2).startswith("```sh\n"), marker.group(2)[:40]
            steps.append((body, []))
    return steps


def with_ports(text: str, ports: dict[int, int]) -> str:
    """``text`` with every shipped port number replaced by its test port."""
    pattern = r"(?<!\d)(" + "|".join(str(port) for port in ports) + r")(?!\d)"
    return re.sub(pattern, lambda match: str(ports[int(match.group(1))]), text)


def run_block(script: str, cwd: Path, env: dict[str, str]) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of ``bash -e -c script``; past :data:`BLOCK_TIMEOUT` the
    block's whole process group is killed (a client the block started included) and the
    exit code is None."""
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr + f"\n(killed after {BLOCK_TIMEOUT} s)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing the block started outlives it
    return proc.returncode, stdout, stderr


class ShippedRouter(RouterProcess):
    """The router on a copy of the shipped config.json and realms/, on other ports."""

    def __init__(self, workdir: Path, ports: dict[int, int]) -> None:
        self.ports = ports
        super().__init__(workdir, realms=[])

    def write_config(self) -> None:
        shutil.copytree(ROOT / "realms", self.workdir / "realms", dirs_exist_ok=True)
        shipped = (ROOT / "config.json").read_text(encoding="utf-8")
        self.config_path.write_text(with_ports(shipped, self.ports), encoding="utf-8")


@pytest.mark.skipif(not all(shutil.which(tool) for tool in ("mosquitto_pub", "mosquitto_sub",
                                                            "curl")),
                    reason="mosquitto-clients or curl is not installed (README command 2)")
def test_the_tour_runs_as_written(tmp_path):
    """Every tour block succeeds and prints what the README says it prints."""
    shipped = json.loads((ROOT / "config.json").read_text(encoding="utf-8"))
    assert tuple(listener["port"] for listener in shipped["listeners"]) == SHIPPED_PORTS, \
        "config.json's ports changed: update SHIPPED_PORTS"
    steps = tour(README.read_text(encoding="utf-8"))
    assert len(steps) >= 4, "the README's tour blocks are not marked <!-- tour -->"
    free: set[int] = set()
    while len(free) < len(SHIPPED_PORTS):
        free.add(free_port())
    ports = dict(zip(SHIPPED_PORTS, sorted(free)))
    shipped_realm = (ROOT / "realms" / "realm1.json").read_text(encoding="utf-8")
    router = ShippedRouter(tmp_path, ports).start()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        for number, (block, expected) in enumerate(steps, 1):
            script = with_ports(block, ports).replace(".venv/bin/python", sys.executable)
            returncode, stdout, stderr = run_block(script, tmp_path, env)
            shown = f"tour block {number}:\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}"
            assert returncode == 0, shown
            printed = {line.strip() for line in (stdout + stderr).splitlines()}
            missing = [line for line in expected if line.strip() not in printed]
            assert not missing, f"missing {missing}; {shown}"
    finally:
        router.stop()
    assert (ROOT / "realms" / "realm1.json").read_text(encoding="utf-8") == shipped_realm, \
        "the tour edited the repository's realm file, not the copy"


def test_ci_runs_exactly_command_2():
    """`.ci/run` is the README's second command, byte for byte (after its `cd` line)."""
    text = README.read_text(encoding="utf-8")
    commands = FENCE.search(text).group(1).splitlines()  # type: ignore[union-attr]
    command_2 = commands[commands.index(next(c for c in commands if c.startswith("# 2."))) + 1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == command_2


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeats numbered as GitHub numbers them)."""
    seen: dict[str, int] = {}
    result = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_relative_links_lead_somewhere(document):
    """Every relative link names an existing file, and an anchor one of its headings."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        name, _, anchor = target.partition("#")
        path = (document.parent / name).resolve() if name else document
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with anchor #{anchor} in {path.name}")
    assert not broken, f"{document.name}: " + "; ".join(broken)
