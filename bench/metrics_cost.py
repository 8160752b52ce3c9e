"""What the metrics cost a publication: the counter and histogram updates a publish and its
dispatch make (router/core/realm.py, router/core/broker.py), timed in-process, beside the
CPU a whole publication costs in the fan-out benchmarks (give it with --cpu-us).

End-to-end A/B runs with and without the counters cannot resolve a few per cent on a shared
2-core machine (one run swings by 15-20 %); the bookkeeping itself can be timed exactly.

    .venv/bin/python bench/metrics_cost.py --deliveries 4 --cpu-us 12.5
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from time import time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.core.stats import RealmStats  # noqa: E402

PER_PUBLICATION = """
stats.received[0][protocol] += 1
counts = stats.delivered[0]
for name, n in protocols.items():
    counts[name] += n
stats.delivery_latency.observe(time() - published)
"""
"""The statements Realm.publish and Broker.dispatch run for the metrics, once per
publication whatever the number of receivers (receivers are counted per subscription)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=4,
                        help="receivers per publication (one subscription)")
    parser.add_argument("--cpu-us", type=float, default=12.5,
                        help="router CPU µs per delivery measured by the fan-out benchmark")
    parser.add_argument("--number", type=int, default=1_000_000)
    args = parser.parse_args()
    stats = RealmStats()
    scope = {"stats": stats, "protocol": "mqtt", "protocols": {"mqtt": args.deliveries},
             "time": time, "published": time()}
    best = min(timeit.repeat(PER_PUBLICATION, globals=scope, number=args.number, repeat=5))
    cost = best / args.number * 1e6
    whole = args.cpu_us * args.deliveries
    print(f"metrics_us_per_publication={cost:.3f} publication_cpu_us={whole:.1f} "
          f"share={cost / whole * 100:.1f}%")


if __name__ == "__main__":
    main()
