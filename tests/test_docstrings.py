"""Every public function, method and class of ``router/core`` and ``router/engines`` has a
docstring: they are the contract the frontends and the engines are written against, so
what each one is for is written where it is defined."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("router/core", "router/engines")

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def undocumented(source: str) -> list[str]:
    """Qualified names of the public definitions in ``source`` without a docstring (module
    level and inside classes; what is nested in a function is its own business)."""
    found: list[str] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Definition) and not child.name.startswith("_"):
                if not ast.get_docstring(child):
                    found.append(prefix + child.name)
                if isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(source), "")
    return found


def test_the_check_finds_a_missing_docstring():
    source = ("def documented():\n    '''Why.'''\n\n"
              "def bare():\n    pass\n\n"
              "class Shape:\n    '''Why.'''\n\n    def area(self):\n        return 0\n\n"
              "    def _private(self):\n        pass\n")
    assert undocumented(source) == ["bare", "Shape.area"]


@pytest.mark.parametrize("path", sorted(path.relative_to(ROOT).as_posix()
                                        for package in PACKAGES
                                        for path in (ROOT / package).rglob("*.py")))
def test_public_definitions_have_docstrings(path):
    missing = undocumented((ROOT / path).read_text(encoding="utf-8"))
    assert not missing, f"{path}: no docstring on {', '.join(missing)}"
