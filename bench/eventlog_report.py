"""Time the Spark event-log report on N synthetic records in the router's real layout.

Writes JSON lines straight to ``realm=<r>/date=<d>/part-<n>.jsonl`` (rolled at the writer's
64 MiB) with a realistic mix: mostly publishes to Zipf-popular topics, acks for QoS >= 1,
retained set/clear/expire/evict, subscriptions and sessions joining and leaving. Then runs
the report in-process and prints events, seconds, events/s per core and the Spark driver
JVM's peak resident memory (VmHWM from /proc).

    .venv/bin/python bench/eventlog_report.py --events 1000000
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.eventlog.schema import KINDS  # noqa: E402
from spark_analytics.progress import Progress  # noqa: E402
from spark_analytics.reader import input_files  # noqa: E402
from spark_analytics.report import REPORT_STAGES, build_report  # noqa: E402
from spark_analytics.session import Sizing, start_session  # noqa: E402

DAY = 86_400
FIRST_DAY = 1_767_225_600.0  # 2026-01-01 00:00 UTC
MAX_FILE_BYTES = 64 * 1024 * 1024
REALMS = {"realm1": 0.6, "telemetry": 0.3, "chat": 0.1}
KIND_MIX = {"publish": 0.70, "ack": 0.18, "retained_set": 0.03, "retained_clear": 0.005,
            "retained_expire": 0.003, "retained_evict": 0.002, "subscribe": 0.03,
            "unsubscribe": 0.02, "session_join": 0.015, "session_leave": 0.015}
assert set(KIND_MIX) == set(KINDS), "the mix must cover the schema's kinds"
PROTOCOLS = {"wamp.websocket": 0.55, "wamp.rawsocket": 0.25, "mqtt": 0.15, "amqp": 0.05}
QOS = {0: 0.6, 1: 0.3, 2: 0.1}
TOPICS_PER_REALM = 400
TOPIC_GROUPS = ("sensors", "orders", "chat", "status")
SESSIONS_PER_REALM = 2_000
CHUNK = 50_000


class Realm:
    """A realm's topics (Zipf-popular) and sessions, and the part files being written."""

    def __init__(self, name: str, logs: Path, rng: random.Random) -> None:
        self.name = name
        self.logs = logs
        self.rng = rng
        self.topics = [f"com.example.{name}.{TOPIC_GROUPS[n % len(TOPIC_GROUPS)]}.item{n}"
                       for n in range(TOPICS_PER_REALM)]
        self.topic_weights = [1 / (rank + 1) for rank in range(len(self.topics))]
        self.sessions = [(rng.randint(1, 2**53), f"{name}-user{n % 300}",
                          rng.choices(list(PROTOCOLS), list(PROTOCOLS.values()))[0])
                         for n in range(SESSIONS_PER_REALM)]
        self.awaiting_ack = (1, 1)  # (publication, qos) of the latest QoS >= 1 publish

    def line(self, kind: str, ts: float, topic: str, session: tuple[int, str, str]) -> str:
        """One record as the writer encodes it (compact JSON, absent fields left out)."""
        rng = self.rng
        session_id, authid, protocol = session
        who = (f'"session":{session_id},"authid":"{authid}","authrole":"user",'
               f'"protocol":"{protocol}"')
        if kind == "publish":
            publication, qos = rng.randint(1, 2**53), rng.choices(list(QOS), list(QOS.values()))[0]
            if qos:
                self.awaiting_ack = (publication, qos)
            retain = "true" if rng.random() < 0.1 else "false"
            return (f'{{"ts":{ts:.6f},"kind":"publish","topic":"{topic}",'
                    f'"publication":{publication},{who},"qos":{qos},"retain":{retain},'
                    f'"payload_bytes":{int(rng.lognormvariate(5, 1))},'
                    f'"receivers":{int(rng.paretovariate(1.5))}}}\n')
        if kind == "ack":
            publication, qos = self.awaiting_ack
            return (f'{{"ts":{ts:.6f},"kind":"ack","publication":{publication},{who},'
                    f'"qos":{qos},"latency_ms":{rng.lognormvariate(1.5, 0.8):.3f}}}\n')
        if kind.startswith("retained_"):
            return f'{{"ts":{ts:.6f},"kind":"{kind}","topic":"{topic}"}}\n'
        if kind in ("subscribe", "unsubscribe"):
            return (f'{{"ts":{ts:.6f},"kind":"{kind}",{who},"topic":"{topic}","match":"exact",'
                    f'"subscription":{rng.randint(1, 2**53)},"get_retained":true}}\n')
        duration = f',"duration":{rng.expovariate(1 / 600):.3f}' if kind == "session_leave" else ""
        return f'{{"ts":{ts:.6f},"kind":"{kind}",{who},"authmethod":"ticket"{duration}}}\n'

    def write(self, day: int, lines: list[str]) -> None:
        """Append to the day's newest part, starting a new one past the writer's size limit."""
        day_name = time.strftime("%Y-%m-%d", time.gmtime(FIRST_DAY + day * DAY))
        folder = self.logs / f"realm={self.name}" / f"date={day_name}"
        folder.mkdir(parents=True, exist_ok=True)
        parts = sorted(folder.glob("part-*.jsonl"), key=lambda path: int(path.stem[5:]))
        part = parts[-1] if parts and parts[-1].stat().st_size < MAX_FILE_BYTES else \
            folder / f"part-{len(parts)}.jsonl"
        with part.open("a") as file:
            file.write("".join(lines))


def generate(logs: Path, events: int, days: int, seed: int = 1) -> None:
    """``events`` records spread over ``days`` UTC days and the realms, in time order per file."""
    rng = random.Random(seed)
    realms = {name: Realm(name, logs, rng) for name in REALMS}
    kinds, kind_weights = list(KIND_MIX), list(KIND_MIX.values())
    for day in range(days):
        for name, share in REALMS.items():
            realm = realms[name]
            count = round(events * share / days)
            start, step = FIRST_DAY + day * DAY, DAY / max(count, 1)
            for offset in range(0, count, CHUNK):
                size = min(CHUNK, count - offset)
                chosen_kinds = rng.choices(kinds, kind_weights, k=size)
                topics = rng.choices(realm.topics, realm.topic_weights, k=size)
                sessions = rng.choices(realm.sessions, k=size)
                realm.write(day, [realm.line(kind, start + (offset + n) * step, topic, session)
                                  for n, (kind, topic, session)
                                  in enumerate(zip(chosen_kinds, topics, sessions))])


def spark_driver_pid() -> int | None:
    """The Spark JVM is this process's java child (pyspark starts it through spark-submit)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and "java" in (stat.parent / "cmdline").read_text():
            return int(stat.parent.name)
    return None


def peak_memory_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--events", type=int, default=1_000_000)
    options.add_argument("--days", type=int, default=2)
    options.add_argument("--master", default="local[*]")
    options.add_argument("--driver-memory", default="4g")
    options.add_argument("--keep", type=Path, help="write logs and report here and keep them")
    args = options.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="eventlog-bench-"))
    logs, out = work / "logs", work / "out"
    try:
        started = time.perf_counter()
        generate(logs, args.events, args.days)
        files = input_files(logs)
        input_bytes = sum(path.stat().st_size for path in files)
        print(f"generated {args.events:,} events, {len(files)} files, "
              f"{input_bytes / 2**20:,.0f} MiB in {time.perf_counter() - started:.1f} s")

        progress = Progress(REPORT_STAGES)
        started = time.perf_counter()
        spark = start_session(Sizing.for_input(input_bytes), args.master, args.driver_memory)
        session_seconds = time.perf_counter() - started
        try:
            cores = spark.sparkContext.defaultParallelism
            started = time.perf_counter()
            build_report(spark, logs, out, progress=progress)
            seconds = time.perf_counter() - started
            pid = spark_driver_pid()
            peak = f"{peak_memory_bytes(pid) / 2**20:,.0f} MiB" if pid else "unknown"
        finally:
            spark.stop()
        print(f"events:               {args.events:,}")
        print(f"spark start:          {session_seconds:.1f} s")
        print(f"report:               {seconds:.1f} s")
        print(f"events/s:             {args.events / seconds:,.0f}")
        print(f"events/s per core:    {args.events / seconds / cores:,.0f}  ({cores} cores)")
        print(f"driver JVM peak RSS:  {peak}")
        print(f"report page:          {out / 'report.html'}")
    finally:
        if args.keep is None:
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
