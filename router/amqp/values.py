"""Values decoded by proton, as plain Python."""

from __future__ import annotations

from proton import Described


def plain(value):
    """An AMQP-decoded value as plain Python (JSON-friendly where it can be)."""
    if isinstance(value, dict):
        return {str(key) if isinstance(key, str) else key: plain(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "elements"):  # proton Array
        return [plain(item) for item in value.elements]
    if isinstance(value, Described):
        return plain(value.value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value
