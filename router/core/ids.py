"""WAMP identifiers: global-scope ids are uniformly random in [1, 2^53]."""

from __future__ import annotations

import itertools
import random

MAX_ID = 2 ** 53

# Ids must be uniformly random, not secret (WAMP discloses them): a Mersenne Twister
# seeded from the OS is uniform and ten times cheaper per publication than urandom.
_generator = random.Random()


def random_id() -> int:
    """A global-scope id (session, publication): uniform over [1, 2^53]."""
    return _generator.randrange(1, MAX_ID + 1)


def router_scope_ids() -> "itertools.count[int]":
    """Router-scope ids (subscriptions, registrations): any scheme will do; sequential is cheapest."""
    return itertools.count(1)
