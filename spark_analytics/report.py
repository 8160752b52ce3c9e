"""The report job: read the logs once, build each table, write Parquet, CSV, PNGs and HTML."""

from __future__ import annotations

import os
import tempfile
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


class NoEvents(Exception):
    """The logs hold no readable record for the requested realm and dates."""


@dataclass(frozen=True)
class Inputs:
    """What the tables are built from: the records and the records other than publishes (a
    small share of a log), both cached when read from JSON; and, always cached, the two
    publish aggregates more than one table sums from (:func:`aggregates.topic_minutes`,
    :func:`aggregates.publisher_topics`). Every other table aggregates the records directly:
    a scan is cheap, a big intermediate to shuffle and cache is not."""

    events: DataFrame
    others: DataFrame
    topic_minutes: DataFrame
    publisher_topics: DataFrame


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


TABLES = (
    TableSpec("summary", "per-realm totals and percentiles",
              lambda inputs: aggregates.summary(inputs.events, inputs.publisher_topics)),
    TableSpec("topics", "topics: volume, peak minute, QoS, retention, fan-out",
              lambda inputs: aggregates.topics(inputs.events, inputs.topic_minutes), TOP_ROWS),
    TableSpec("events_per_minute", "events per minute",
              from_events(aggregates.events_per_minute)),
    TableSpec("qos", "QoS split", from_events(aggregates.qos)),
    TableSpec("fanout", "fan-out distribution", from_events(aggregates.fanout)),
    TableSpec("publishers", "top publishers",
              lambda inputs: aggregates.publishers(inputs.publisher_topics), TOP_ROWS),
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
              from_events(aggregates.unreceived_topics), TOP_ROWS),
    TableSpec("top_topics_per_minute", "traffic over time of the top topics",
              lambda inputs: aggregates.top_topics_per_minute(inputs.topic_minutes)),
    TableSpec("session_churn", "session churn", from_others(aggregates.session_churn)),
    TableSpec("payload_sizes", "payload-size distribution",
              from_events(aggregates.payload_sizes)),
)
REPORT_STAGES = 2 + len(TABLES) + 2  # read, intermediates, tables, charts, page


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


def build_tables(inputs: Inputs, out: str, built: list[DataFrame], progress: Progress
                 ) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Write each table (cached, added to ``built``); returns the rows the page shows and
    each table's row count."""
    rows: dict[str, list[dict]] = {}
    total_rows: dict[str, int] = {}
    for spec in TABLES:
        with progress.stage(spec.label):
            table = spec.build(inputs).cache()
            built.append(table)
            write_table(table, join(out, "tables", spec.name))
            shown = table if spec.shown_rows is None else table.limit(spec.shown_rows)
            rows[spec.name] = [row.asDict() for row in shown.collect()]
            # a count is one more job: only when the shown rows may not be all of them
            total_rows[spec.name] = table.count() if len(rows[spec.name]) == spec.shown_rows \
                else len(rows[spec.name])
    return rows, total_rows


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
    with progress.stage("shared intermediates"):
        others = events.where(~aggregates.is_kind("publish"))
        inputs = Inputs(events, others.cache() if parse_once else others,
                        aggregates.topic_minutes(events).cache(),
                        aggregates.publisher_topics(events).cache())
        built: list[DataFrame] = [inputs.others, inputs.topic_minutes, inputs.publisher_topics]
        # built now, with the session's shuffle partitions (they are as big as the input)
        for shared in built:
            if shared.is_cached:
                shared.count()
    with one_shuffle_partition(spark):
        rows, total_rows = build_tables(inputs, out, built, progress)
    for table in (*built, events):
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
