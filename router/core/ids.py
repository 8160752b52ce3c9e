"""WAMP identifiers: global-scope ids are uniformly random in [1, 2^53]."""

from __future__ import annotations

import itertools
import secrets

MAX_ID = 2 ** 53


def random_id() -> int:
    """A global-scope id (session, publication): uniform over [1, 2^53]."""
    return secrets.randbelow(MAX_ID) + 1


def router_scope_ids() -> "itertools.count[int]":
    """Router-scope ids (subscriptions, registrations): any scheme will do; sequential is cheapest."""
    return itertools.count(1)
