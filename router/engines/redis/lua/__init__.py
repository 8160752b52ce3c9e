"""The Redis engine's Lua scripts, one ``.lua`` file each, read once when the engine's
modules are imported (at start) and sent with ``EVAL``; each constant that holds one
documents its KEYS, ARGV and answer next to the code that calls it."""

from __future__ import annotations

from importlib import resources


def script(name: str) -> str:
    """The text of ``<name>.lua`` in this package (shipped as package data)."""
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
