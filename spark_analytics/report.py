"""The report job: merge the logs' rollups, build each table, write Parquet, CSV, PNGs, HTML."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from spark_analytics import aggregates
from spark_analytics.charts import draw_charts
from spark_analytics.page import render_page
from spark_analytics.progress import Progress
from spark_analytics.reader import (compacted_days, compaction_markers, day_of, json_parts,
                                    read_json_events)
from spark_analytics.rollups import (Rollup, all_rollups, merged, read_stored_rollup,
                                     stored_rollup_files)
from spark_analytics.storage import Entry, Files, HadoopFiles, join, to_url, upload_folder
from spark_analytics.tables import write_table

TOP_ROWS = 20
TABLE_JOBS = 8
"""Tables built at the same time (see :func:`build_tables`). Over merged rollups a table is
mostly driver work (planning, code generation, scheduling a few small jobs), so more tables
than cores keep the cores busy: at 10M records after compact, 8 took 25-38 s where 4 took
31-45 s on 2 cores (12: no better)."""


class NoEvents(Exception):
    """The logs hold no readable record for the requested realm and dates."""


@dataclass(frozen=True)
class Inputs:
    """What the tables are built from: the merged rollups (queries; the few that several
    tables read are cached, see :data:`SHARED_ROLLUPS`) and the tables built so far (cached,
    small), which some tables are finished from."""

    rollups: aggregates.Rollups
    tables: dict[str, DataFrame]


def from_rollups(build: Callable[[aggregates.Rollups], DataFrame]
                 ) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.rollups)


@dataclass(frozen=True)
class TableSpec:
    name: str
    label: str
    build: Callable[[Inputs], DataFrame]
    shown_rows: int | None = None
    """How many rows the page and charts need (None: all; the files always hold all)."""
    needs: tuple[str, ...] = ()
    """Tables ``build`` reads from ``Inputs.tables``: they come before it in ``TABLES``."""


TABLES = (
    TableSpec("topics", "topics: volume, peak minute, QoS, retention, fan-out",
              from_rollups(aggregates.topics), TOP_ROWS),
    TableSpec("publishers", "top publishers", from_rollups(aggregates.publishers), TOP_ROWS),
    TableSpec("summary", "per-realm totals and percentiles",
              lambda inputs: aggregates.summary(inputs.rollups, inputs.tables["topics"],
                                                inputs.tables["publishers"]),
              needs=("topics", "publishers")),
    TableSpec("events_per_minute", "events per minute",
              from_rollups(aggregates.events_per_minute)),
    TableSpec("qos", "QoS split", from_rollups(aggregates.qos)),
    TableSpec("fanout", "fan-out distribution", from_rollups(aggregates.fanout)),
    TableSpec("protocols", "protocol mix", from_rollups(aggregates.protocols)),
    TableSpec("sessions", "session counts and durations", from_rollups(aggregates.sessions)),
    TableSpec("ack_latency", "acknowledgement latency percentiles",
              from_rollups(aggregates.ack_latency), TOP_ROWS),
    TableSpec("ack_latency_by_protocol", "acknowledgement latency per protocol",
              from_rollups(aggregates.ack_latency_by_protocol)),
    TableSpec("slowest_consumers", "slowest consumers",
              from_rollups(aggregates.slowest_consumers), TOP_ROWS),
    TableSpec("refused", "refused and failed operations", from_rollups(aggregates.refused)),
    TableSpec("drops", "drops by reason", from_rollups(aggregates.drops)),
    TableSpec("retained_per_hour", "retained store per hour",
              from_rollups(aggregates.retained_per_hour)),
    TableSpec("subscriptions", "subscribers per pattern",
              from_rollups(aggregates.subscriptions), TOP_ROWS),
    TableSpec("unreceived_topics", "topics published with no receivers",
              lambda inputs: aggregates.unreceived_topics(inputs.tables["topics"]), TOP_ROWS,
              needs=("topics",)),
    TableSpec("top_topics_per_minute", "traffic over time of the top topics",
              lambda inputs: aggregates.top_topics_per_minute(inputs.rollups,
                                                              inputs.tables["topics"]),
              needs=("topics",)),
    TableSpec("session_churn", "session churn", from_rollups(aggregates.session_churn)),
    TableSpec("payload_sizes", "payload-size distribution",
              from_rollups(aggregates.payload_sizes)),
)
REPORT_STAGES = 1 + len(TABLES) + 2  # read, tables, charts, page
OPEN_PARTS = "_open-parts"
"""The folder under the report's output where the parts the router has open are copied for
the read (deleted when the report ends)."""
SHARED_ROLLUPS = ("realms", "realm_minutes", "publish_mix", "incidents")
"""Rollups more than one table reads: cached once merged (the others are merged by the
table that reads them, whose rows are cached)."""


def describe_scope(realm: str | None, since: date | None) -> str:
    scope = f"realm {realm}" if realm else "all realms"
    return f"{scope}, {'since ' + since.isoformat() if since else 'all dates'}"


@contextmanager
def session_setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """The session's ``key`` set to ``value`` inside the block, restored after it."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


def one_shuffle_partition(spark: SparkSession) -> AbstractContextManager[None]:
    """Plan the queries started inside on one shuffle partition. The tables are small
    aggregates written as one file each: the input's partition count only adds a sampling
    job to each table's sort and a scheduled task per empty partition (the partial
    aggregation before the shuffle still runs on every input partition)."""
    return session_setting(spark, "spark.sql.shuffle.partitions", "1")


@contextmanager
def planned_for_many_small_queries(spark: SparkSession) -> Iterator[None]:
    """Plan the queries started inside without adaptive execution and without whole-stage
    code generation. A report is dozens of distinct queries (15 rollups, 19 tables, each
    written twice and collected) run once each in a new JVM: compiling each plan's generated
    Java (Janino, then the JIT) cost more than it saved, and adaptive execution, with nothing
    to coalesce on one shuffle partition, only cut each query into more jobs to plan. Measured
    in fresh processes, 2 cores (bench/eventlog_report.py's logs): 3M records on JSON 101.1 s
    wall / 109.1 s CPU with whole-stage codegen, 67.6 s / 106.2 s without (load 1.4-5.1);
    10M after ``compact`` 81.6 s / 65.3 s with it, 53.2 s / 61.7 s without (load 3-9.6)."""
    with (session_setting(spark, "spark.sql.adaptive.enabled", "false"),
          session_setting(spark, "spark.sql.codegen.wholeStage", "false")):
        yield


def interpreted_over_stored_rollups(spark: SparkSession, records: DataFrame | None
                                    ) -> AbstractContextManager[None]:
    """When the report reads stored rollups only (``records`` None: every day compacted),
    evaluate the queries' expressions interpreted, not as generated Java compiled by Janino.
    The rollups are a few MiB: the ~340 distinct projections, predicates and orderings of a
    report's queries cost more to compile (and to JIT the compiler) than they ever saved
    there. Over JSON records (millions of rows scanned by each rollup) they are kept."""
    if records is not None:
        return nullcontext()
    return session_setting(spark, "spark.sql.codegen.factoryMode", "NO_CODEGEN")


UNCOMPRESSED_CACHE_BYTES_PER_JSON_BYTE = 0.65
"""The records' uncompressed cache per byte of JSON parts read (3M records: 459 MiB of 712)."""
UNCOMPRESSED_CACHE_SHARE = 0.75
"""The share of the driver's storage memory the records may fill uncompressed."""


def records_cache(spark: SparkSession, json_bytes: int) -> AbstractContextManager[None]:
    """How the records are cached: without Spark's columnar compression when they fit the
    driver's memory so (a local master; else compressed, as Spark does by default).

    Choosing a column's encoding puts every value of every 10,000-row batch in a hash map of
    boxed values (up to 32,767 distinct, and a publication's id is nearly always new): a
    JFR profile of a report over 3M records put a third of building the cache there.
    Uncompressed, the records take about twice the memory; past the driver's storage they
    would spill to disk and be read back by every rollup."""
    compress = "true"
    if spark.sparkContext.master.startswith("local"):
        # a local master's one block manager: (memory for caching, of which free)
        storage = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().valuesIterator(
            ).next()._1()
        uncompressed = json_bytes * UNCOMPRESSED_CACHE_BYTES_PER_JSON_BYTE
        if uncompressed <= storage * UNCOMPRESSED_CACHE_SHARE:
            compress = "false"
    return session_setting(spark, "spark.sql.inMemoryColumnarStorage.compressed", compress)


def build_table(spec: TableSpec, inputs: Inputs, out: str) -> tuple[list[dict], int]:
    """Write one table (cached, into ``inputs.tables``); returns the rows the page shows and
    the table's row count."""
    table = inputs.tables[spec.name] = spec.build(inputs).cache()
    write_table(table, join(out, "tables", spec.name))
    shown = table if spec.shown_rows is None else table.limit(spec.shown_rows)
    rows = [row.asDict() for row in shown.collect()]
    # a count is one more job: only when the shown rows may not be all of them
    return rows, table.count() if len(rows) == spec.shown_rows else len(rows)


def build_tables(inputs: Inputs, out: str, progress: Progress
                 ) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Write every table; returns the rows the page shows and each table's row count.

    The tables are built by concurrent Spark jobs: each is a few small jobs (aggregate,
    write Parquet, write CSV, collect) whose planning and scheduling on the driver, one after
    the other, left the cores idle for most of a report over a compacted log. A table that
    needs others waits for them; they were submitted before it, so they never wait for it."""
    futures: dict[str, Future] = {}

    def build(spec: TableSpec) -> tuple[list[dict], int]:
        for name in spec.needs:
            futures[name].result()
        with progress.task(spec.label):
            return build_table(spec, inputs, out)

    with ThreadPoolExecutor(TABLE_JOBS) as pool:
        for spec in TABLES:
            futures[spec.name] = pool.submit(build, spec)
        results = {name: future.result() for name, future in futures.items()}
    return ({name: rows for name, (rows, _) in results.items()},
            {name: count for name, (_, count) in results.items()})


def report_inputs(files: Files, logs: str, realm: str | None, since: date | None
                  ) -> list[Entry]:
    """The files a report reads: the JSON parts of the days not compacted, and the markers
    and stored rollups of the others (never their records)."""
    markers = compaction_markers(files, logs, realm, since)
    compacted = [day_of(marker.parent_names) for marker in markers]
    return [*json_parts(files, logs, realm, since, compacted), *markers,
            *stored_rollup_files(files, logs, realm, compacted)]


def read_rollups(spark: SparkSession, files: Files, logs: str, realm: str | None,
                 since: date | None, snapshot: str
                 ) -> tuple[dict[str, DataFrame], DataFrame | None]:
    """Every rollup merged over the days in scope: the stored rollups of compacted days with
    the rollups of the JSON parts of the others (the parts the router has open included,
    copied into ``snapshot``). Returns the merged rollups (queries, each run by the tables
    that read it; the few that several tables read are cached) and the JSON records, parsed
    once and cached (None when every day is compacted): unpersist them once the tables are
    built."""
    compacted = compacted_days(files, logs, realm, since)
    records = None
    parts = json_parts(files, logs, realm, since, compacted)
    if parts or not compacted:
        with records_cache(spark, sum(entry.size for entry in parts)):
            records = read_json_events(spark, logs, compacted, realm, since,
                                       snapshot).select(*aggregates.USED_COLUMNS).cache()
            records.count()

    def plan(rollup: Rollup) -> DataFrame:
        parts = [read_stored_rollup(spark, logs, rollup, compacted)] if compacted else []
        if records is not None:
            parts.append(rollup.compute(records))
        rows = merged(rollup, parts)
        return rows.cache() if rollup.name in SHARED_ROLLUPS else rows

    # planning is driver work in the JVM (listing, analysis), one rollup per thread at a time;
    # on one shuffle partition, as the tables, since a shared rollup's cache is planned here
    with ThreadPoolExecutor(TABLE_JOBS) as pool, one_shuffle_partition(spark):
        rollups = dict(zip((rollup.name for rollup in all_rollups()),
                           pool.map(plan, all_rollups())))
    return rollups, records


def unpersist(frames: Iterable[DataFrame]) -> None:
    for frame in frames:
        frame.unpersist()


def build_report(spark: SparkSession, logs: str | os.PathLike, out: str | os.PathLike,
                 realm: str | None = None, since: date | None = None,
                 progress: Progress | None = None) -> str:
    """Write ``out/tables/<name>/{parquet,csv}``, ``out/charts/*.png`` and ``out/report.html``
    (``logs`` and ``out`` are local paths or Hadoop file-system URLs); returns the page's URL.
    The parts the router is still writing are read too, as they are when the read starts.
    Raises :class:`NoEvents` when nothing matched."""
    logs, out = to_url(logs), to_url(out)
    files = HadoopFiles(spark)
    progress = progress or Progress(REPORT_STAGES)
    snapshot = join(out, OPEN_PARTS)
    try:
        with planned_for_many_small_queries(spark):
            return _build_report(spark, files, logs, out, realm, since, progress, snapshot)
    finally:
        files.delete(snapshot)


def _build_report(spark: SparkSession, files: HadoopFiles, logs: str, out: str,
                  realm: str | None, since: date | None, progress: Progress,
                  snapshot: str) -> str:
    with progress.stage("reading event logs"):
        rollups, records = read_rollups(spark, files, logs, realm, since, snapshot)
        read = [records] if records is not None else []
        with one_shuffle_partition(spark), interpreted_over_stored_rollups(spark, records):
            count = sum(row["records"] for row in rollups["realms"].select("records").collect())
    if count == 0:
        unpersist([*rollups.values(), *read])
        raise NoEvents(f"no event-log records under {logs} ({describe_scope(realm, since)})")
    inputs = Inputs(rollups, {})
    with one_shuffle_partition(spark), interpreted_over_stored_rollups(spark, records):
        rows, total_rows = build_tables(inputs, out, progress)
    unpersist([*inputs.tables.values(), *rollups.values(), *read])
    # charts and page are drawn on the driver into a local folder, then copied to ``out``
    # through Hadoop's file system, like the tables
    with tempfile.TemporaryDirectory(prefix="spark-analytics-page-") as drawn:
        local = Path(drawn)
        with progress.stage("charts"):
            charts = draw_charts(rows, local / "charts")
        with progress.stage("HTML page"):
            (local / "report.html").write_text(
                render_page(rows, total_rows, charts, local, describe_scope(realm, since)),
                encoding="utf-8")
            upload_folder(files, local, out)
    return join(out, "report.html")
