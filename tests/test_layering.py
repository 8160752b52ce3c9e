"""The frontends are edges: the configuration loads none of them, and inside each
frontend package imports go one way only (no cycle, type-checking imports included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRONTENDS = ("router.wamp", "router.mqtt", "router.amqp")


def test_reading_the_configuration_imports_no_frontend():
    script = ("import sys, router.config\n"
              f"print('\\n'.join(m for m in sys.modules if m.startswith({FRONTENDS!r})))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.split() == []


def _imported_modules(path: Path, package: str) -> set[str]:
    """Every module of ``package`` that ``path`` imports, wherever the import statement is
    (top level, ``if TYPE_CHECKING:``, inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from router.mqtt import session" imports router.mqtt.session
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.module else base
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.startswith(package + "."))
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as the path that closes it), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


@pytest.mark.parametrize("package", ["router.mqtt", "router.amqp"])
def test_no_import_cycle_inside_the_frontend(package):
    directory = ROOT / package.replace(".", "/")
    modules = {f"{package}.{path.stem}": path for path in directory.glob("*.py")
               if path.stem != "__init__"}
    graph = {name: {target for target in _imported_modules(path, package)
                    if target in modules and target != name}
             for name, path in modules.items()}
    assert sum(map(len, graph.values())) > len(modules) // 2  # the parse found the imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_a_type_checking_cycle(tmp_path):
    """The checker itself: an import only under TYPE_CHECKING still closes a cycle."""
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nimport pkg.b\n"
                                   "if TYPE_CHECKING:\n    from pkg.c import C\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "c.py").write_text("if TYPE_CHECKING:\n    from .a import A\n")
    graph = {f"pkg.{name}": _imported_modules(tmp_path / f"{name}.py", "pkg")
             for name in "abc"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert _cycle(graph) in (["pkg.a", "pkg.b", "pkg.c", "pkg.a"], ["pkg.a", "pkg.c", "pkg.a"])


def test_only_the_node_picks_an_engine():
    """The engines sit behind the contract of ``router/core/engine.py``: no module of
    ``router/`` outside ``router/engines/`` and ``router/node.py`` imports one (frontends
    type against the store Protocols they define)."""
    offenders = []
    seen = 0
    for path in sorted((ROOT / "router").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module == "router.node" or module.startswith("router.engines"):
            seen += "router.engines" in module
            continue
        offenders += [f"{module} imports {target}"  # router/ imports absolutely
                      for target in sorted(_imported_modules(path, "router"))
                      if target == "router.engines" or target.startswith("router.engines.")]
    assert seen > 5  # the engines were found where they live
    assert "router.engines.redis.engine" in _imported_modules(ROOT / "router/node.py", "router")
    assert offenders == [], "\n".join(offenders)


def test_no_import_cycle_among_the_engines():
    """The Redis engine's parts type their back-pointers with ``engines/redis/context.py``'s
    Protocols, so the engine and realm import their parts and never the reverse."""
    modules = {}
    for path in (ROOT / "router/engines").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: {target for target in _imported_modules(path, "router")
                    if target in modules and target != name}
             for name, path in modules.items()}
    assert "router.engines.redis.realm" in graph["router.engines.redis.engine"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
