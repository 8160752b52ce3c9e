"""Loaded by a router under test (on its PYTHONPATH) when ``ROUTER_TEST_GARBAGE`` names a
file: the collector keeps what it finds unreachable (``gc.DEBUG_SAVEALL``) instead of
freeing it, and each SIGUSR1 runs a full collection and writes to that file, per type
name, how many objects the collector tracked before it (``tracked``), how many it has
found so far (``garbage``) and how many objects are alive and not garbage (``live``).
Objects that only the collector frees are those in reference cycles: see
tests/test_connection_garbage.py."""

import os

_PATH = os.environ.get("ROUTER_TEST_GARBAGE")

if _PATH:
    import gc
    import json
    import signal
    from collections import Counter

    gc.set_debug(gc.DEBUG_SAVEALL)
    _dumps = [0]

    def _dump(signum, frame) -> None:
        # before the collection: what a full collection would scan now (it also untracks
        # dicts that hold no containers, which only full collections do)
        tracked = (Counter(type(o).__name__ for o in gc.get_objects())
                   - Counter(type(o).__name__ for o in gc.garbage))
        gc.collect()
        garbage = Counter(type(o).__name__ for o in gc.garbage)
        live = Counter(type(o).__name__ for o in gc.get_objects()) - garbage
        _dumps[0] += 1
        with open(_PATH + ".tmp", "w") as out:
            json.dump({"dump": _dumps[0], "garbage": garbage, "live": live,
                       "tracked": tracked}, out)
        os.replace(_PATH + ".tmp", _PATH)

    signal.signal(signal.SIGUSR1, _dump)
