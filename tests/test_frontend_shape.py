"""The three frontends have one shape: each session writes through an ``Outlet`` protocol
of its package, and the WAMP session and handshake touch nothing private of the objects
they are given (autobahn's transports least of all: their private attributes change
without notice between releases)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Protocol

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["router.wamp", "router.mqtt", "router.amqp"])
def test_each_frontend_has_an_outlet_protocol(package):
    outlet = importlib.import_module(f"{package}.outlet").Outlet
    assert issubclass(outlet, Protocol) and outlet is not Protocol


def _attributes(path: Path) -> list[ast.Attribute]:
    return [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute)]


def _foreign_private_reads(path: Path) -> list[str]:
    """``x._name`` where ``x`` is neither ``self`` nor a class of the module: a private
    attribute of another object."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = {"self"} | {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return [f"{path.name}:{node.lineno}: .{node.attr}" for node in _attributes(path)
            if node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in own)]


@pytest.mark.parametrize("module", ["session.py", "handshake.py", "outlet.py", "codec.py"])
def test_the_wamp_session_reads_nothing_private_of_others(module):
    assert _foreign_private_reads(ROOT / "router" / "wamp" / module) == []


def test_no_wamp_module_reads_autobahns_serializer_attributes():
    """The serializer in use is the one the router created, kept by its own factory."""
    reads = [f"{path.name}:{node.lineno}: .{node.attr}"
             for path in sorted((ROOT / "router" / "wamp").glob("*.py"))
             for node in _attributes(path) if node.attr in ("_serializer", "_serializers")]
    assert reads == []


FRONTEND_MODULES = {"wamp": "session.py", "mqtt": "connection.py", "amqp": "connection.py"}


def test_one_slow_consumer_kill_path_serves_the_three_frontends():
    """Counting the disconnection is written once (router/flow.py); each frontend only
    says goodbye its own way."""
    for package, module in FRONTEND_MODULES.items():
        text = (ROOT / "router" / package / module).read_text(encoding="utf-8")
        assert "disconnect_slow_consumer(" in text, package
    counted_in = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "router").rglob("*.py"))
                  if "slow consumer\"" in path.read_text(encoding="utf-8")]
    assert counted_in == ["router/flow.py"]
