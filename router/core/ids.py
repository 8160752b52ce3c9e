"""WAMP identifiers: global-scope ids are uniformly random in [1, 2^53]."""

from __future__ import annotations

import itertools
import random

# Ids must be uniformly random, not secret (WAMP discloses them): a Mersenne Twister
# seeded from the OS is uniform and ten times cheaper per publication than urandom.
_random_bits = random.Random().getrandbits


def random_id() -> int:
    """A global-scope id (session, publication): uniform over [1, 2^53]."""
    return _random_bits(53) + 1  # randrange's argument checks cost as much as the draw


def router_scope_ids() -> "itertools.count[int]":
    """Router-scope ids (subscriptions, registrations): any scheme will do; sequential is cheapest."""
    return itertools.count(1)
