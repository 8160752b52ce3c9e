"""Idle router RSS: ``python -m router run`` on a configuration, its resident memory a few
seconds after its ``ready:`` line (the figure ``VmRSS`` gives, as bench/session_memory.py
reads it before its sessions connect).

Run it with the interpreter of the install to measure: a fresh venv with only
``pip install -e .`` is the router-only figure (no test or analytics extras, which bring
numpy, loaded by autobahn when present). Every port of the configuration becomes 0 and the
data directory a temporary one, so it runs next to anything.

    python bench/idle_rss.py config.json                 # the shipped configuration
    python bench/idle_rss.py config.json --only websocket,rawsocket --runs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.memory import resident_bytes  # noqa: E402

SETTLE_S = 4.0
"""Seconds after the ready line before RSS is read."""


def idle_config(source: Path, only: list[str], workdir: Path) -> Path:
    """A copy of ``source`` on ephemeral ports and a data directory in ``workdir``
    (``only``: keep just these listener types)."""
    config = json.loads(source.read_text())
    config["listeners"] = [dict(listener, port=0) for listener in config["listeners"]
                           if not only or listener["type"] in only]
    config["data_dir"] = str(workdir / "data")
    config["realms_dir"] = str((source.parent / config.get("realms_dir", "realms")).resolve())
    path = workdir / "config.json"
    path.write_text(json.dumps(config))
    return path


def measure(config: Path, settle: float = SETTLE_S, timeout: float = 60.0) -> float:
    """MB resident ``settle`` seconds after the router said ready."""
    proc = subprocess.Popen([sys.executable, "-m", "router", "run", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        for line in proc.stderr:  # type: ignore[union-attr]
            if "ready: " in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the router did not say ready in time")
        else:
            raise RuntimeError(f"the router exited ({proc.wait()}) before it was ready")
        time.sleep(settle)
        return resident_bytes(proc.pid) / 2**20
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--only", default="",
                        help='listener types to keep, e.g. "websocket,rawsocket"')
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--settle", type=float, default=SETTLE_S)
    args = parser.parse_args()
    only = [kind for kind in args.only.split(",") if kind]
    figures = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-idle-rss-") as workdir:
            figures.append(measure(idle_config(args.config.resolve(), only, Path(workdir)),
                                   args.settle))
    print(f"{sys.executable}: {args.config} {args.only or 'all listeners'}: idle RSS "
          + " / ".join(f"{mb:.1f}" for mb in figures) + f" MB ({args.settle:g} s after ready)")


if __name__ == "__main__":
    main()
