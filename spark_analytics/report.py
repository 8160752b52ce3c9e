"""The report job: read the logs once, build each table, write Parquet, CSV, PNGs and HTML."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from spark_analytics import aggregates
from spark_analytics.charts import draw_charts
from spark_analytics.page import render_page
from spark_analytics.progress import Progress
from spark_analytics.reader import read_events, reads_json
from spark_analytics.storage import HadoopFiles, join, to_url, upload_folder
from spark_analytics.tables import write_table

TOP_ROWS = 20
TABLE_JOBS = 4
"""Tables built at the same time (see :func:`build_tables`)."""


class NoEvents(Exception):
    """The logs hold no readable record for the requested realm and dates."""


@dataclass(frozen=True)
class Inputs:
    """What the tables are built from: the records and the records other than publishes (a
    small share of a log), both cached when read from JSON; and the tables built so far
    (cached, small), which some tables are summed from instead of the records."""

    events: DataFrame
    others: DataFrame
    tables: dict[str, DataFrame]


def from_events(build: Callable[[DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.events)


def from_others(build: Callable[[DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.others)


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
              from_events(aggregates.topics), TOP_ROWS),
    TableSpec("publishers", "top publishers", from_events(aggregates.publishers), TOP_ROWS),
    TableSpec("summary", "per-realm totals and percentiles",
              lambda inputs: aggregates.summary(inputs.events, inputs.tables["topics"],
                                                inputs.tables["publishers"]),
              needs=("topics", "publishers")),
    TableSpec("events_per_minute", "events per minute",
              from_events(aggregates.events_per_minute)),
    TableSpec("qos", "QoS split", from_events(aggregates.qos)),
    TableSpec("fanout", "fan-out distribution", from_events(aggregates.fanout)),
    TableSpec("protocols", "protocol mix", from_events(aggregates.protocols)),
    TableSpec("sessions", "session counts and durations",
              from_others(aggregates.sessions)),
    TableSpec("ack_latency", "acknowledgement latency percentiles",
              from_events(aggregates.ack_latency), TOP_ROWS),
    TableSpec("ack_latency_by_protocol", "acknowledgement latency per protocol",
              from_others(aggregates.ack_latency_by_protocol)),
    TableSpec("slowest_consumers", "slowest consumers",
              from_others(aggregates.slowest_consumers), TOP_ROWS),
    TableSpec("refused", "refused and failed operations", from_others(aggregates.refused)),
    TableSpec("drops", "drops by reason", from_others(aggregates.drops)),
    TableSpec("retained_per_hour", "retained store per hour",
              from_others(aggregates.retained_per_hour)),
    TableSpec("subscriptions", "subscribers per pattern",
              from_others(aggregates.subscriptions), TOP_ROWS),
    TableSpec("unreceived_topics", "topics published with no receivers",
              lambda inputs: aggregates.unreceived_topics(inputs.tables["topics"]), TOP_ROWS,
              needs=("topics",)),
    TableSpec("top_topics_per_minute", "traffic over time of the top topics",
              lambda inputs: aggregates.top_topics_per_minute(inputs.events,
                                                              inputs.tables["topics"]),
              needs=("topics",)),
    TableSpec("session_churn", "session churn", from_others(aggregates.session_churn)),
    TableSpec("payload_sizes", "payload-size distribution",
              from_events(aggregates.payload_sizes)),
)
REPORT_STAGES = 1 + len(TABLES) + 2  # read, tables, charts, page


def describe_scope(realm: str | None, since: date | None) -> str:
    scope = f"realm {realm}" if realm else "all realms"
    return f"{scope}, {'since ' + since.isoformat() if since else 'all dates'}"


@contextmanager
def one_shuffle_partition(spark: SparkSession) -> Iterator[None]:
    """Plan the queries started inside on one shuffle partition. The tables are small
    aggregates written as one file each: the input's partition count only adds a sampling
    job to each table's sort and a scheduled task per empty partition (the partial
    aggregation before the shuffle still runs on every input partition)."""
    key = "spark.sql.shuffle.partitions"
    partitions = spark.conf.get(key)
    spark.conf.set(key, "1")
    try:
        yield
    finally:
        spark.conf.set(key, partitions)


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


def build_report(spark: SparkSession, logs: str | os.PathLike, out: str | os.PathLike,
                 realm: str | None = None, since: date | None = None,
                 progress: Progress | None = None) -> str:
    """Write ``out/tables/<name>/{parquet,csv}``, ``out/charts/*.png`` and ``out/report.html``
    (``logs`` and ``out`` are local paths or Hadoop file-system URLs); returns the page's URL.
    Raises :class:`NoEvents` when nothing matched."""
    logs, out = to_url(logs), to_url(out)
    files = HadoopFiles(spark)
    progress = progress or Progress(REPORT_STAGES)
    with progress.stage("reading event logs"):
        events = read_events(spark, files, logs, realm, since).select(*aggregates.USED_COLUMNS)
        # parsing JSON is most of the cost, so JSON records are parsed once and cached;
        # compacted days alone are Parquet, which each table scans again (only the columns
        # it needs) faster than a cache of the records is built and scanned
        parse_once = reads_json(files, logs, realm, since)
        if parse_once:
            events = events.cache()
        records = events.count()
    if records == 0:
        events.unpersist()
        raise NoEvents(f"no event-log records under {logs} ({describe_scope(realm, since)})")
    others = events.where(~aggregates.is_kind("publish"))
    inputs = Inputs(events, others.cache() if parse_once else others, {})
    with one_shuffle_partition(spark):
        rows, total_rows = build_tables(inputs, out, progress)
    for table in (*inputs.tables.values(), inputs.others, events):
        table.unpersist()
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
