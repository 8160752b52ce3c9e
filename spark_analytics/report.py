"""The report job: read the logs once, build each table, write Parquet, CSV, PNGs and HTML."""

from __future__ import annotations

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
from spark_analytics.tables import write_table

TOP_ROWS = 20


class NoEvents(Exception):
    """The logs hold no readable record for the requested realm and dates."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    label: str
    build: Callable[[DataFrame], DataFrame]
    shown_rows: int | None = None
    """How many rows the page and charts need (None: all; the files always hold all)."""


TABLES = (
    TableSpec("summary", "per-realm totals and percentiles", aggregates.summary),
    TableSpec("topics", "topics: volume, peak minute, QoS, retention, fan-out",
              aggregates.topics, TOP_ROWS),
    TableSpec("events_per_minute", "events per minute", aggregates.events_per_minute),
    TableSpec("qos", "QoS split", aggregates.qos),
    TableSpec("fanout", "fan-out distribution", aggregates.fanout),
    TableSpec("publishers", "top publishers", aggregates.publishers, TOP_ROWS),
    TableSpec("protocols", "protocol mix", aggregates.protocols),
    TableSpec("sessions", "session counts and durations", aggregates.sessions),
    TableSpec("ack_latency", "acknowledgement latency percentiles", aggregates.ack_latency,
              TOP_ROWS),
    TableSpec("ack_latency_by_protocol", "acknowledgement latency per protocol",
              aggregates.ack_latency_by_protocol),
    TableSpec("slowest_consumers", "slowest consumers", aggregates.slowest_consumers, TOP_ROWS),
    TableSpec("refused", "refused and failed operations", aggregates.refused),
    TableSpec("drops", "drops by reason", aggregates.drops),
    TableSpec("retained_per_hour", "retained store per hour", aggregates.retained_per_hour),
    TableSpec("subscriptions", "subscribers per pattern", aggregates.subscriptions, TOP_ROWS),
    TableSpec("unreceived_topics", "topics published with no receivers",
              aggregates.unreceived_topics, TOP_ROWS),
    TableSpec("top_topics_per_minute", "traffic over time of the top topics",
              aggregates.top_topics_per_minute),
    TableSpec("session_churn", "session churn", aggregates.session_churn),
    TableSpec("payload_sizes", "payload-size distribution", aggregates.payload_sizes),
)
REPORT_STAGES = 1 + len(TABLES) + 2  # read, tables, charts, page


def describe_scope(realm: str | None, since: date | None) -> str:
    scope = f"realm {realm}" if realm else "all realms"
    return f"{scope}, {'since ' + since.isoformat() if since else 'all dates'}"


def build_report(spark: SparkSession, logs: Path, out: Path, realm: str | None = None,
                 since: date | None = None, progress: Progress | None = None) -> Path:
    """Write ``out/tables/<name>/{parquet,csv}``, ``out/charts/*.png`` and ``out/report.html``;
    returns the page's path. Raises :class:`NoEvents` when nothing matched."""
    progress = progress or Progress(REPORT_STAGES)
    with progress.stage("reading event logs"):
        # every table reads the parsed records; parsing JSON once is most of the cost
        events = read_events(spark, logs, realm, since).select(*aggregates.USED_COLUMNS).cache()
        records = events.count()
    if records == 0:
        events.unpersist()
        raise NoEvents(f"no event-log records under {logs} ({describe_scope(realm, since)})")
    rows: dict[str, list[dict]] = {}
    total_rows: dict[str, int] = {}
    built: list[DataFrame] = []
    for spec in TABLES:
        with progress.stage(spec.label):
            table = spec.build(events).cache()
            built.append(table)
            write_table(table, out / "tables" / spec.name)
            shown = table if spec.shown_rows is None else table.limit(spec.shown_rows)
            rows[spec.name] = [row.asDict() for row in shown.collect()]
            total_rows[spec.name] = len(rows[spec.name]) if spec.shown_rows is None \
                else table.count()
    for table in (*built, events):
        table.unpersist()
    with progress.stage("charts"):
        charts = draw_charts(rows, out / "charts")
    with progress.stage("HTML page"):
        page = out / "report.html"
        page.write_text(render_page(rows, total_rows, charts, out, describe_scope(realm, since)),
                        encoding="utf-8")
    return page
