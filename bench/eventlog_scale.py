"""Make a bigger event log from one bench/eventlog_report.py generated, fast.

Generating 10M records through the simulated realms (bench/eventlog_report.py) takes about
9 minutes on an idle machine and did not finish on a loaded one. This reads the closed parts
of a smaller log and writes each record ``--factor`` times (a fractional factor writes the
extra copy for that share of the records), each copy a few milliseconds later than the last,
through the router's own :class:`EventLogWriter` (its encoding, its 300 s rotation and UTC
day folders) on a simulated clock. The realms stay interleaved in time as in the source, the
days the same: the same topics, sessions and mix, ``factor`` times as dense.

    .venv/bin/python bench/eventlog_scale.py --source W3M/logs --out W10M/logs --factor 3.3334
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.eventlog.writer import EventLogWriter  # noqa: E402

COPY_SPACING = 0.005
"""Seconds between a record's copies: well under the records' spacing at 10M over 7 days."""
FLUSH_INTERVAL = 1.0
"""Simulated seconds between hand-offs to the writer thread, as bench/eventlog_report.py."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def part_number(path: Path) -> int:
    return int(path.name[len("part-"):-len(".jsonl")])


def realm_records(realm_folder: Path) -> Iterator[tuple[float, str, bytes]]:
    """(ts, realm, line) of one realm's closed parts, in time order (day, then part)."""
    realm = realm_folder.name.removeprefix("realm=")
    for day in sorted(realm_folder.glob("date=*")):
        for part in sorted(day.glob("part-*.jsonl"), key=part_number):
            with part.open("rb") as lines:
                for line in lines:
                    yield orjson.loads(line)["ts"], realm, line


def scale(source: Path, out: Path, factor: float) -> int:
    """Write the copies; returns the records written."""
    clock = Clock()
    writer = EventLogWriter(out, clock=clock, max_queued_records=2**62)
    whole, share = int(factor), factor - int(factor)
    streams = [realm_records(folder) for folder in sorted(source.glob("realm=*"))]
    written, extra, flushed = 0, 0.0, None
    for ts, realm, line in heapq.merge(*streams):
        extra += share
        copies = whole + (1 if extra >= 1 else 0)
        extra -= 1 if extra >= 1 else 0
        for copy in range(copies):
            record = orjson.loads(line)
            record["ts"] = ts + copy * COPY_SPACING
            clock.now = record["ts"]
            writer.append(realm, record)
        written += copies
        if flushed is None or clock.now - flushed >= FLUSH_INTERVAL:
            writer.flush()
            flushed = clock.now
    writer.close()
    return written


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--source", type=Path, required=True, help="a generated log folder")
    options.add_argument("--out", type=Path, required=True, help="the new log folder (new)")
    options.add_argument("--factor", type=float, required=True)
    args = options.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists")
    started = time.perf_counter()
    written = scale(args.source, args.out, args.factor)
    parts = list(args.out.glob("realm=*/date=*/part-*.jsonl"))
    print(f"{written:,} records in {len(parts):,} parts, "
          f"{sum(p.stat().st_size for p in parts) / 2**20:,.0f} MiB, "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
