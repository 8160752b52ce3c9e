"""The report job: read the logs once, build each table, write Parquet, CSV, PNGs and HTML."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from spark_analytics import aggregates
from spark_analytics.charts import draw_charts
from spark_analytics.page import render_page
from spark_analytics.progress import Progress
from spark_analytics.reader import read_events
from spark_analytics.storage import HadoopFiles, join, to_url, upload_folder
from spark_analytics.tables import write_table

TOP_ROWS = 20


class NoEvents(Exception):
    """The logs hold no readable record for the requested realm and dates."""


@dataclass(frozen=True)
class Inputs:
    """What the tables are built from, each cached: the records; the publish cube
    (:func:`aggregates.publish_cube`) that serves every publish table without a new scan; and
    the records other than publishes (a small share of a log), for the tables about those."""

    events: DataFrame
    cube: DataFrame
    others: DataFrame


def from_events(build: Callable[[DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.events)


def from_others(build: Callable[[DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.others)


def from_cube(build: Callable[[DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.cube)


def from_both(
        build: Callable[[DataFrame, DataFrame], DataFrame]) -> Callable[[Inputs], DataFrame]:
    return lambda inputs: build(inputs.events, inputs.cube)


@dataclass(frozen=True)
class TableSpec:
    name: str
    label: str
    build: Callable[[Inputs], DataFrame]
    shown_rows: int | None = None
    """How many rows the page and charts need (None: all; the files always hold all)."""


TABLES = (
    TableSpec("summary", "per-realm totals and percentiles", from_both(aggregates.summary)),
    TableSpec("topics", "topics: volume, peak minute, QoS, retention, fan-out",
              from_both(aggregates.topics), TOP_ROWS),
    TableSpec("events_per_minute", "events per minute", from_cube(aggregates.events_per_minute)),
    TableSpec("qos", "QoS split", from_cube(aggregates.qos)),
    TableSpec("fanout", "fan-out distribution", from_cube(aggregates.fanout)),
    TableSpec("publishers", "top publishers", from_cube(aggregates.publishers), TOP_ROWS),
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
              from_cube(aggregates.unreceived_topics), TOP_ROWS),
    TableSpec("top_topics_per_minute", "traffic over time of the top topics",
              from_cube(aggregates.top_topics_per_minute)),
    TableSpec("session_churn", "session churn", from_others(aggregates.session_churn)),
    TableSpec("payload_sizes", "payload-size distribution", from_cube(aggregates.payload_sizes)),
)
REPORT_STAGES = 1 + len(TABLES) + 2  # read, tables, charts, page


def describe_scope(realm: str | None, since: date | None) -> str:
    scope = f"realm {realm}" if realm else "all realms"
    return f"{scope}, {'since ' + since.isoformat() if since else 'all dates'}"


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
        # parsing JSON is most of the cost: the records are parsed once, and the tables share
        # two cached passes over them (the publish cube and the non-publish records)
        events = (read_events(spark, files, logs, realm, since)
                  .select(*aggregates.USED_COLUMNS).cache())
        records = events.count()
    if records == 0:
        events.unpersist()
        raise NoEvents(f"no event-log records under {logs} ({describe_scope(realm, since)})")
    rows: dict[str, list[dict]] = {}
    total_rows: dict[str, int] = {}
    cube = aggregates.publish_cube(events).cache()
    others = events.where(~aggregates.is_kind("publish")).cache()
    inputs = Inputs(events, cube, others)
    built: list[DataFrame] = [cube, others]
    for spec in TABLES:
        with progress.stage(spec.label):
            table = spec.build(inputs).cache()
            built.append(table)
            write_table(table, join(out, "tables", spec.name))
            shown = table if spec.shown_rows is None else table.limit(spec.shown_rows)
            rows[spec.name] = [row.asDict() for row in shown.collect()]
            total_rows[spec.name] = len(rows[spec.name]) if spec.shown_rows is None \
                else table.count()
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
