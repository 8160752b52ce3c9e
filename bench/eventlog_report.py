"""Time the Spark event-log report on N records written exactly as the router writes them.

The records come from the router's own :class:`RealmEventLog` (the schema's record builders)
through its :class:`EventLogWriter` (its encoding, its default 300 s part rotation and UTC
day folders), driven by a simulated clock: a realistic mix of publishes to Zipf-popular
topics, acks naming their topic, retained set/clear/expire/evict, subscriptions (exact,
prefix, MQTT filters), sessions joining and leaving, refusals and incident counts.

Then, in one Spark session and in this order, it times the operator's whole path:

1. the bare read: every JSON part with the writer's schema, grouped by realm and topic (the
   baseline issue 17 defines; run first, so it also pays the JVM's warm-up);
2. the report on the raw JSON parts (what a report of today's, still open, day costs);
3. ``compact`` of every closed day into rollups and Parquet records (run once per day, e.g.
   from cron);
4. the report after compaction, merging the days' stored rollups (what every later report
   costs).

It prints each time, each report's ratio to the bare read and the Spark driver JVM's peak
resident memory after each step. The figure the issue's goal (report / bare read <= 1.5)
is judged on is step 4's ratio: the issue allows a layout other than thousands of small
JSON parts, compacting closed days is the documented daily routine, and a report is run
far more often than a day is compacted. Steps 2 and 3 are printed so nothing is hidden.

    .venv/bin/python bench/eventlog_report.py --events 1000000 [--work DIR]

With ``--work DIR`` the log and the reports stay in DIR, and a later run with the same
``--events``/``--days`` reuses the log (removing the earlier run's compaction first).

``--fresh`` times what an operator's command costs instead, each in a new process (Python,
the JVM and Spark started from nothing, as cron or a shell starts them): the bare read, then
``python -m spark_analytics report`` on the same log, and prints their wall times and CPU
seconds (each process with its Spark JVM), the ratios and the load average; with
``--compact`` it runs ``python -m spark_analytics compact`` first (untimed) so both read the
compacted log. That pair, in the same run, is the figure issue 28
judges (fresh report <= 1.5 x fresh bare read).

    .venv/bin/python bench/eventlog_report.py --events 3000000 --work DIR --fresh
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.core.peer import Subscription  # noqa: E402
from router.core.incidents import NOT_AUTHORIZED, QUEUE_FULL, SLOW_CONSUMER  # noqa: E402
from router.core.model import Publication, SessionInfo  # noqa: E402
from router.core.uri import EXACT, MQTT, PREFIX  # noqa: E402
from router.eventlog.realm_log import RealmEventLog, RealmLogSettings  # noqa: E402
from router.eventlog.schema import KINDS  # noqa: E402
from router.eventlog.writer import EventLogWriter  # noqa: E402
from spark_analytics.progress import Progress  # noqa: E402
from spark_analytics.compact import compact_logs  # noqa: E402
from spark_analytics.reader import COMPACTED, event_ddl, input_files  # noqa: E402
from spark_analytics.storage import LocalFiles, to_url  # noqa: E402
from spark_analytics.report import REPORT_STAGES, build_report  # noqa: E402
from spark_analytics.rollups import ROLLUPS_FOLDER  # noqa: E402
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


def bare_read_process(logs: Path, master: str, driver_memory: str) -> None:
    """The bare read as a command of its own (``--bare-read LOGS``), sized as the command
    line sizes a report."""
    files = input_files(LocalFiles(), to_url(logs))
    spark = start_session(Sizing.for_files(files), master, driver_memory)
    try:
        print(f"bare read query: {bare_read_seconds(spark, logs):.1f} s", file=sys.stderr)
    finally:
        spark.stop()


def fresh_comparison(logs: Path, out: Path, args: argparse.Namespace) -> None:
    """Time the bare read and the command line's report, each in a process of its own."""
    here = Path(__file__).resolve()
    spark_options = ["--master", args.master, "--driver-memory", args.driver_memory]
    if args.compact:
        subprocess.run([sys.executable, "-m", "spark_analytics", "compact", "--logs", str(logs),
                        *spark_options], cwd=here.parent.parent, check=True,
                       stdout=subprocess.DEVNULL)
    shutil.rmtree(out, ignore_errors=True)
    commands = {"bare read": [sys.executable, str(here), "--bare-read", str(logs),
                              *spark_options],
                "report": [sys.executable, "-m", "spark_analytics", "report", "--logs",
                           str(logs), "--out", str(out), *spark_options]}
    seconds, cpu = {}, {}
    for label, command in commands.items():
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=here.parent.parent, stdout=subprocess.DEVNULL)
        cpu[label] = process_tree_cpu(process)
        seconds[label] = time.perf_counter() - started
        if process.returncode:
            raise subprocess.CalledProcessError(process.returncode, command)
        print(f"{label + ' (fresh process):':<30}{seconds[label]:.1f} s, CPU {cpu[label]:.1f} s"
              f"  (load before: {load})", flush=True)
    print(f"ratio report / bare read:     {seconds['report'] / seconds['bare read']:.2f}"
          f"  <- issue 28's figure (<= 1.5); CPU "
          f"{cpu['report'] / cpu['bare read']:.2f}; load after: "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


def process_tree_cpu(process: subprocess.Popen) -> float:
    """Wait for ``process``; returns the CPU seconds (user + system) it and its descendants
    used (the Spark JVM is pyspark's child), sampled from /proc every 0.2 s, each process at its
    last sample: steadier than wall time on a shared machine, where the load moves wall times
    by several times."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    while process.poll() is None:
        children: dict[int, list[int]] = {}
        seconds: dict[int, float] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(stat.parent.name)
            children.setdefault(int(fields[1]), []).append(pid)
            seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
        todo = [process.pid]
        while todo:
            pid = todo.pop()
            used[pid] = max(used.get(pid, 0.0), seconds.get(pid, 0.0))
            todo.extend(children.get(pid, ()))
        time.sleep(0.2)
    return sum(used.values())


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def prepare_log(work: Path, events: int, days: int) -> str:
    """Generate the log under ``work/logs``, or reuse the one an earlier run left there for
    the same events and days (without its compaction, which this run times again)."""
    logs, marker = work / "logs", work / "generated"
    wanted = f"events={events} days={days}"
    if logs.is_dir() and marker.is_file() and marker.read_text() == wanted:
        for folder in (COMPACTED, ROLLUPS_FOLDER):
            shutil.rmtree(logs / folder, ignore_errors=True)
        return "reused"
    shutil.rmtree(logs, ignore_errors=True)
    seconds = timed(lambda: generate(logs, events, days))
    marker.write_text(wanted)
    return f"generated in {seconds:.1f} s"


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
    options.add_argument("--work", type=Path,
                         help="keep the log and the reports here (and reuse the log next time)")
    options.add_argument("--fresh", action="store_true",
                         help="time the bare read and the command line's report, each in a "
                              "new process")
    options.add_argument("--compact", action="store_true",
                         help="with --fresh: compact the log first (untimed)")
    options.add_argument("--bare-read", type=Path, metavar="LOGS", help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.bare_read:
        bare_read_process(args.bare_read, args.master, args.driver_memory)
        return

    work = args.work or Path(tempfile.mkdtemp(prefix="eventlog-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    try:
        how = prepare_log(work, args.events, args.days)
        files = input_files(LocalFiles(), to_url(logs))
        json_bytes = sum(entry.size for entry in files)
        print(f"log: {args.events:,} events, {len(files)} JSON parts, "
              f"{json_bytes / 2**20:,.0f} MiB ({how})", flush=True)
        if args.fresh:
            fresh_comparison(logs, work / "out-fresh", args)
            return

        started = time.perf_counter()
        spark = start_session(Sizing.for_files(files), args.master, args.driver_memory)
        session_seconds = time.perf_counter() - started
        pid = spark_driver_pid()
        cores = spark.sparkContext.defaultParallelism
        peaks: list[str] = []

        def step(label: str, work: Callable[[], object]) -> float:
            seconds = timed(work)
            peak = f"{peak_memory_bytes(pid) / 2**20:,.0f} MiB" if pid else "unknown"
            peaks.append(f"  after {label + ':':<22}{peak}")
            print(f"{label}: {seconds:.1f} s", file=sys.stderr, flush=True)
            return seconds

        try:
            bare = step("bare read", lambda: bare_read_seconds(spark, logs))
            on_json = step("report on JSON", lambda: build_report(
                spark, logs, work / "out-json", progress=Progress(REPORT_STAGES)))
            compact = step("compact", lambda: compact_logs(spark, logs))
            parquet = input_files(LocalFiles(), to_url(logs))
            parquet_bytes = sum(entry.size for entry in parquet)
            compacted = step("report after compact", lambda: build_report(
                spark, logs, work / "out-parquet", progress=Progress(REPORT_STAGES)))
        finally:
            spark.stop()
        print(f"events:                     {args.events:,}")
        print(f"JSON parts:                 {len(files):,} files, {json_bytes / 2**20:,.0f} MiB")
        print(f"Parquet after compact:      {len(parquet):,} files, "
              f"{parquet_bytes / 2**20:,.0f} MiB")
        print(f"spark start:                {session_seconds:.1f} s")
        print(f"bare read (JSON):           {bare:.1f} s  (schema read + group by realm, topic)")
        print(f"report on JSON:             {on_json:.1f} s  ratio {on_json / bare:.2f}")
        print(f"compact:                    {compact:.1f} s  ratio {compact / bare:.2f}")
        print(f"report after compact:       {compacted:.1f} s  ratio {compacted / bare:.2f}"
              "  <- the goal's figure (<= 1.5)")
        print(f"compact + report:           {compact + compacted:.1f} s  "
              f"ratio {(compact + compacted) / bare:.2f}")
        print(f"events/s, report after compact: {args.events / compacted:,.0f} "
              f"({cores} cores)")
        print("driver JVM peak RSS (VmHWM, grows only):")
        print("\n".join(peaks))
        print(f"report pages:               {work / 'out-json' / 'report.html'}, "
              f"{work / 'out-parquet' / 'report.html'}")
    finally:
        if args.work is None:
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
