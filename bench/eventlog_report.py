"""Time the Spark event-log report on N records written exactly as the router writes them.

The records come from the router's own :class:`RealmEventLog` (the schema's record builders)
through its :class:`EventLogWriter` (its encoding, its default 300 s part rotation and UTC
day folders), driven by a simulated clock: a realistic mix of publishes to Zipf-popular
topics, acks naming their topic, retained set/clear/expire/evict, subscriptions (exact,
prefix, MQTT filters), sessions joining and leaving, refusals and incident counts. Then, in
one Spark session, it times a bare read (the writer's schema, group by realm and topic) and
the report, and prints both, their ratio and the Spark driver JVM's peak resident memory.

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

from router.core.broker import Subscription  # noqa: E402
from router.core.incidents import NOT_AUTHORIZED, QUEUE_FULL, SLOW_CONSUMER  # noqa: E402
from router.core.model import Publication, SessionInfo  # noqa: E402
from router.core.uri import EXACT, MQTT, PREFIX  # noqa: E402
from router.eventlog.realm_log import RealmEventLog, RealmLogSettings  # noqa: E402
from router.eventlog.schema import KINDS  # noqa: E402
from router.eventlog.writer import EventLogWriter  # noqa: E402
from spark_analytics.progress import Progress  # noqa: E402
from spark_analytics.reader import event_ddl, input_files  # noqa: E402
from spark_analytics.storage import LocalFiles, to_url  # noqa: E402
from spark_analytics.report import REPORT_STAGES, build_report  # noqa: E402
from spark_analytics.session import Sizing, start_session  # noqa: E402

DAY = 86_400
FIRST_DAY = 1_767_225_600.0  # 2026-01-01 00:00 UTC
REALMS = {"realm1": 0.6, "telemetry": 0.3, "chat": 0.1}
KIND_MIX = {"publish": 0.70, "ack": 0.18, "retained_set": 0.03, "retained_clear": 0.005,
            "retained_expire": 0.003, "retained_evict": 0.002, "subscribe": 0.03,
            "unsubscribe": 0.02, "session_join": 0.015, "session_leave": 0.015,
            "refused": 0.002, "incident": 0.001}
assert set(KIND_MIX) == set(KINDS), "the mix must cover the schema's kinds"
PROTOCOLS = {"wamp.websocket": 0.55, "wamp.rawsocket": 0.25, "mqtt": 0.15, "amqp": 0.05}
QOS = {0: 0.6, 1: 0.3, 2: 0.1}
TOPICS_PER_REALM = 400
TOPIC_GROUPS = ("sensors", "orders", "chat", "status")
SESSIONS_PER_REALM = 2_000
FLUSH_INTERVAL = 1.0
"""Simulated seconds between hand-offs to the writer thread (eventlog.flush_interval's
default): rotation by age is decided per hand-off, so this keeps the parts 300 s long."""


class Clock:
    """The simulated time the realm logs and the writer read."""

    def __init__(self) -> None:
        self.now = FIRST_DAY

    def __call__(self) -> float:
        return self.now


class Realm:
    """A realm's topics (Zipf-popular), sessions and subscriptions, logging through the
    router's own :class:`RealmEventLog`."""

    def __init__(self, name: str, writer: EventLogWriter, clock: Clock,
                 rng: random.Random) -> None:
        self.rng = rng
        self.log = RealmEventLog(name, writer, RealmLogSettings(), clock)
        self.topics = [("com", "example", name, TOPIC_GROUPS[n % len(TOPIC_GROUPS)], f"item{n}")
                       for n in range(TOPICS_PER_REALM)]
        self.topic_weights = [1 / (rank + 1) for rank in range(len(self.topics))]
        self.sessions = [SessionInfo(rng.randint(1, 2**53), name, f"{name}-user{n % 300}", "user",
                                     "ticket", protocol=rng.choices(
                                         list(PROTOCOLS), list(PROTOCOLS.values()))[0])
                         for n in range(SESSIONS_PER_REALM)]
        self.subscriptions = [Subscription(n, topic[:cut], match) for n, (topic, cut, match)
                              in enumerate((topic, len(topic), EXACT) for topic in self.topics)]
        self.subscriptions += [Subscription(len(self.subscriptions), ("com", "example", name),
                                            PREFIX),
                               Subscription(len(self.subscriptions) + 1,
                                            ("com", "example", name, "+", "#"), MQTT)]

    def record(self, kind: str, ts: float, topic: tuple, session: SessionInfo) -> None:
        """Log one record of ``kind`` as the router would."""
        rng, log = self.rng, self.log
        if kind == "publish":
            log.published(Publication(
                rng.randint(1, 2**53), topic, None, None, session,
                retain=rng.random() < 0.1, payload_bytes=int(rng.lognormvariate(5, 1)),
                qos=rng.choices(list(QOS), list(QOS.values()))[0], timestamp=ts),
                int(rng.paretovariate(1.5)) - 1)
        elif kind == "ack":
            log.acknowledged(session, topic, rng.choice((1, 2)), rng.lognormvariate(1.5, 0.8))
        elif kind.startswith("retained_"):
            log.retained(topic, kind.removeprefix("retained_"), None)
        elif kind == "subscribe":
            log.subscribed(session, rng.choice(self.subscriptions), True)
        elif kind == "unsubscribe":
            log.unsubscribed(session, rng.choice(self.subscriptions))
        elif kind == "session_join":
            log.joined(session)
        elif kind == "session_leave":
            session.joined_at = ts - rng.expovariate(1 / 600)
            log.left(session)
        elif kind == "refused":
            log.refused(session, "publish", topic, EXACT, NOT_AUTHORIZED)
        else:
            log.incident(session.protocol.split(".")[0], rng.choice((SLOW_CONSUMER, QUEUE_FULL)),
                         rng.randint(1, 50))
            log.flush_incidents()


def generate(logs: Path, events: int, days: int, seed: int = 1) -> None:
    """About ``events`` records over ``days`` UTC days, the realms interleaved in time as on
    a real node, written by the router's writer with its default rotation."""
    rng = random.Random(seed)
    clock = Clock()
    writer = EventLogWriter(logs, clock=clock, max_queued_records=2**62)
    realms = [Realm(name, writer, clock, rng) for name in REALMS]
    kinds, kind_weights = list(KIND_MIX), list(KIND_MIX.values())
    step = days * DAY / events
    chosen_realms = rng.choices(realms, list(REALMS.values()), k=events)
    chosen_kinds = rng.choices(kinds, kind_weights, k=events)
    flushed = FIRST_DAY
    for n, (realm, kind) in enumerate(zip(chosen_realms, chosen_kinds)):
        clock.now = FIRST_DAY + n * step
        realm.record(kind, clock.now, rng.choices(realm.topics, realm.topic_weights)[0],
                     rng.choice(realm.sessions))
        if clock.now - flushed >= FLUSH_INTERVAL:
            writer.flush()
            flushed = clock.now
    writer.close()


def bare_read_seconds(spark, logs: Path) -> float:
    """The baseline: read every part with the writer's schema, count per realm and topic."""
    started = time.perf_counter()
    (spark.read.schema(event_ddl()).option("basePath", str(logs)).json(str(logs))
     .groupBy("realm", "topic").count().collect())
    return time.perf_counter() - started


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
    options.add_argument("--days", type=int, default=7)
    options.add_argument("--master", default="local[*]")
    options.add_argument("--driver-memory", default="4g")
    options.add_argument("--keep", type=Path, help="write logs and report here and keep them")
    args = options.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="eventlog-bench-"))
    logs, out = work / "logs", work / "out"
    try:
        started = time.perf_counter()
        generate(logs, args.events, args.days)
        files = input_files(LocalFiles(), to_url(logs))
        input_bytes = sum(entry.size for entry in files)
        print(f"generated {args.events:,} events, {len(files)} files, "
              f"{input_bytes / 2**20:,.0f} MiB in {time.perf_counter() - started:.1f} s")

        progress = Progress(REPORT_STAGES)
        started = time.perf_counter()
        spark = start_session(Sizing.for_input(input_bytes), args.master, args.driver_memory)
        session_seconds = time.perf_counter() - started
        try:
            cores = spark.sparkContext.defaultParallelism
            bare = bare_read_seconds(spark, logs)
            started = time.perf_counter()
            build_report(spark, logs, out, progress=progress)
            seconds = time.perf_counter() - started
            pid = spark_driver_pid()
            peak = f"{peak_memory_bytes(pid) / 2**20:,.0f} MiB" if pid else "unknown"
        finally:
            spark.stop()
        print(f"events:               {args.events:,}")
        print(f"spark start:          {session_seconds:.1f} s")
        print(f"bare read:            {bare:.1f} s  (schema read + group by realm, topic; first)")
        print(f"report:               {seconds:.1f} s")
        print(f"report / bare read:   {seconds / bare:.2f}")
        print(f"events/s:             {args.events / seconds:,.0f}")
        print(f"events/s per core:    {args.events / seconds / cores:,.0f}  ({cores} cores)")
        print(f"driver JVM peak RSS:  {peak}")
        print(f"report page:          {out / 'report.html'}")
    finally:
        if args.keep is None:
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
