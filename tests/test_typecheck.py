"""The type checker is part of the test command: ``mypy --strict`` on ``router/core`` and
``router/engines`` (configuration in pyproject.toml's ``[tool.mypy]``), which also proves
that both engines implement the engine contract (``router/engines/conformance.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mypy(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_core_and_engines_pass_mypy_strict():
    result = _mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_mypy_rejects_an_engine_that_breaks_the_contract(tmp_path):
    """The checker is really run on the contract: an engine whose ``open_realm`` returns
    the wrong type is refused (so a passing run above means something)."""
    broken = tmp_path / "broken_engine.py"
    broken.write_text(
        "from router.engines.conformance import NodeEngine\n"
        "from router.engines.embedded.engine import EmbeddedEngine\n\n\n"
        "class BrokenEngine:\n"
        "    def __init__(self, engine: EmbeddedEngine) -> None:\n"
        "        self.engine = engine\n"
        "        self.open_realm = engine.open_realm\n"
        "        self.amqp_store = engine.amqp_store\n"
        "        self.pause_intake_with = engine.pause_intake_with\n"
        "        self.start = engine.start\n"
        "        self.close = engine.close\n"
        "        self.outbox_store = engine.outbox_store\n"
        "        self.bridge_queue = engine.bridge_queue\n"
        "        self.run_bridge = engine.run_bridge\n\n"
        "    def mqtt_session_store(self, realm: str) -> None:\n"
        "        return None\n\n\n"
        "def as_engine(engine: BrokenEngine) -> NodeEngine:\n"
        "    return engine\n", encoding="utf-8")
    result = _mypy("--strict", "--follow-imports=silent", str(broken))
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'broken_engine.py:22: error: Incompatible return value type (got "BrokenEngine"' \
        in result.stdout, result.stdout
    assert "mqtt_session_store" in result.stdout, result.stdout
