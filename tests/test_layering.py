"""The frontends are edges: the configuration loads none of them, and inside each
frontend package imports go one way only (no cycle, type-checking imports included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRONTENDS = ("router.wamp", "router.mqtt", "router.amqp", "router.http")


def test_reading_the_configuration_imports_no_frontend():
    script = ("import sys, router.config\n"
              f"print('\\n'.join(m for m in sys.modules if m.startswith({FRONTENDS!r})))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.split() == []


def test_a_router_without_tls_loads_no_wamp_client_and_no_cryptography():
    """The node and every listener's transports, as a router that needs no TLS imports them
    (router/cli.py), load neither autobahn's WAMP client (``autobahn.twisted``: its
    authenticators import ``cryptography``, ~6 MB resident) nor ``cryptography`` itself
    (router/websocket.py); the credentials are checked by router/core/credentials.py."""
    script = ("import sys\nfrom router.tls import leave_out_tls\nassert leave_out_tls()\n"
              "import router.node, router.wamp.transports, router.mqtt.transports\n"
              "import router.amqp.transports\n"
              "print('\\n'.join(m for m in sys.modules if m.split('.')[0] == 'cryptography'"
              " or m.startswith(('autobahn.twisted', 'autobahn.wamp.auth'))))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.split() == []


def _imported_modules(path: Path, package: str, scope: str | None = None) -> set[str]:
    """Every module of ``scope`` (default: ``package``, the package of ``path``, where its
    relative imports start) that ``path`` imports, wherever the import statement is (top
    level, ``if TYPE_CHECKING:``, inside functions)."""
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
        found.update(name for name in names if name.startswith((scope or package) + "."))
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


@pytest.mark.parametrize("package", ["router.mqtt", "router.amqp", "router.http"])
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


def _router_graph() -> dict[str, set[str]]:
    """Every module of ``router/`` (a package by its ``__init__``) -> the modules of
    ``router/`` it imports."""
    files = {}
    for path in (ROOT / "router").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        files[package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"] = (path, package)
    return {name: {target for target in _imported_modules(path, package, "router")
                   if target in files and target != name}
            for name, (path, package) in files.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of ``graph`` that import one another round a circle, one sorted list per
    circle (Tarjan's strongly connected components of more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(circles)


def test_no_import_circle_anywhere_in_the_router():
    graph = _router_graph()
    assert {"router.node", "router.core.peer", "router.mqtt.codec"} <= set(graph)
    assert sum(map(len, graph.values())) > len(graph)  # the parse found the imports
    circles = _circles(graph)
    assert not circles, "\n".join(
        " -> ".join(_cycle({module: graph[module] & set(circle) for module in circle}))
        for circle in circles)


def test_the_circle_finder_finds_each_circle_once():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"},
             "g": set()}
    assert _circles(graph) == [["a", "b"], ["c", "d", "e"]]


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
