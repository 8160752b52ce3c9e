"""Loaded by ``bench/session_memory.py --tracemalloc`` into the router it starts (this
directory is put first on the router's PYTHONPATH; nothing else imports it).

With ``BENCH_TRACEMALLOC=<prefix>`` in the environment, tracing starts before the router
imports anything, and each SIGUSR2 writes ``<prefix>.<n>.snapshot`` (tracemalloc) and
``<prefix>.<n>.json`` (live objects the collector tracks, per type: count and shallow
bytes; and the dicts, sets and lists other objects hold, per holder's type, since
tracemalloc names a recycled dict's first allocation, not its holder) then
``<prefix>.<n>.done``; the bench diffs two of them.
"""

import os

_PREFIX = os.environ.get("BENCH_TRACEMALLOC")

if _PREFIX:
    import gc
    import json
    import signal
    import sys
    import tracemalloc

    tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "1")))
    _taken = [0]

    def _dump(signum, frame):
        _taken[0] += 1
        name = f"{_PREFIX}.{_taken[0]}"
        gc.collect()
        census = {}
        for obj in gc.get_objects():
            kind = type(obj)
            key = f"{kind.__module__}.{kind.__qualname__}"
            entry = census.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += sys.getsizeof(obj)
            if kind is not dict:
                for held in gc.get_referents(obj):
                    if type(held) in (dict, set, list):
                        key = f"{type(held).__name__} held by {kind.__module__}.{kind.__qualname__}"
                        entry = census.setdefault(key, [0, 0])
                        entry[0] += 1
                        entry[1] += sys.getsizeof(held)
        tracemalloc.take_snapshot().dump(name + ".snapshot")
        with open(name + ".json", "w") as out:
            json.dump(census, out)
        open(name + ".done", "w").close()

    signal.signal(signal.SIGUSR2, _dump)
