"""The report's HTML page: summary first, then charts, then the top rows of each table.

The page references the PNGs by relative path, so the ``--out`` folder opens from disk and
can be copied anywhere as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from pathlib import Path

from spark_analytics.charts import Chart

Rows = Sequence[Mapping]
Format = Callable[[object], str]


def count(value: object) -> str:
    return f"{value:,}"


def decimal(value: object) -> str:
    return f"{value:,.1f}"


def share(value: object) -> str:
    return f"{value:.1%}"


def milliseconds(value: object) -> str:
    return f"{value:,.1f} ms"


SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(value: object) -> str:
    amount, unit = float(value), 0
    while amount >= 1024 and unit < len(SIZE_UNITS) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{amount:,.0f} B" if unit == 0 else f"{amount:,.1f} {SIZE_UNITS[unit]}"


def duration(value: object) -> str:
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def minute(value: datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M}"


def day_minute(value: datetime) -> str:
    """A minute within the report's range, whose year the page's header already gives."""
    return f"{value:%b %d %H:%M}"


def text(value: object) -> str:
    return str(value)


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    format: Format = text
    numeric: bool = True

    def cell(self, row: Mapping) -> str:
        value = row[self.key]
        shown = "—" if value is None else self.format(value)
        return f'<td class="{"num" if self.numeric else "txt"}">{escape(shown)}</td>'


def label(key: str, title: str) -> Column:
    return Column(key, title, text, numeric=False)


@dataclass(frozen=True)
class TableView:
    name: str
    title: str
    note: str
    columns: tuple[Column, ...]
    empty: str = ""
    """What the page says when the table has no rows (a table whose absence is news: no
    drops); without it an empty table is left out."""


LATENCY_COLUMNS = (
    Column("acks", "acks", count), Column("latency_ms_p50", "p50", milliseconds),
    Column("latency_ms_p90", "p90", milliseconds), Column("latency_ms_p99", "p99", milliseconds),
    Column("latency_ms_max", "max", milliseconds))

TABLE_VIEWS = (
    TableView("summary", "Realms", "One row per realm.", (
        label("realm", "realm"), Column("events", "events", count), Column("bytes", "bytes", size),
        Column("topics", "topics", count), Column("publishers", "publishers", count),
        Column("sessions", "sessions", count), Column("receivers_p50", "fan-out p50", count),
        Column("receivers_p99", "fan-out p99", count), Column("acks", "acks", count),
        Column("ack_latency_ms_p50", "ack p50", milliseconds),
        Column("ack_latency_ms_p99", "ack p99", milliseconds),
        Column("first_seen", "first", minute, numeric=False),
        Column("last_seen", "last", minute, numeric=False))),
    TableView("topics", "Topics", "Topics that were published to, busiest first. \"per min\" "
              "is the topic's publishes over its own active span (its first to its last "
              "publish, at least one minute), not over the report's range; peak is its "
              "busiest UTC minute; \"no receiver\" counts publishes nobody got. The files "
              "also hold each topic's QoS split.", (
        label("realm", "realm"), label("topic", "topic"), Column("events", "events", count),
        Column("bytes", "bytes", size), Column("events_per_minute", "per min", decimal),
        Column("peak_minute_events", "peak", count),
        Column("peak_minute", "peak minute", day_minute, numeric=False),
        Column("unreceived", "no receiver", count),
        Column("retained_share", "retained", share),
        Column("retained_set", "ret. set", count), Column("retained_clear", "ret. clear", count),
        Column("receivers_p50", "fan-out p50", count), Column("receivers_p99", "p99", count))),
    TableView("publishers", "Top publishers", "By authid, busiest first.", (
        label("realm", "realm"), label("authid", "authid"), Column("events", "events", count),
        Column("share", "share of realm", share), Column("bytes", "bytes", size),
        Column("topics", "topics", count))),
    TableView("protocols", "Protocol mix", "Traffic per protocol, busiest first: messages "
              "published over it, their deliveries (counted under the publisher's protocol: "
              "the log does not say the receivers'), and, apart from traffic, the sessions "
              "that joined over it.", (
        label("realm", "realm"), label("protocol", "protocol"),
        Column("messages", "messages", count), Column("events", "published", count),
        Column("deliveries", "delivered", count), Column("sessions", "sessions joined", count))),
    TableView("sessions", "Sessions", "Durations come from session_leave records.", (
        label("realm", "realm"), Column("joined", "joined", count), Column("left", "left", count),
        Column("authids", "authids", count), Column("duration_mean", "mean", duration),
        Column("duration_p50", "p50", duration), Column("duration_p90", "p90", duration),
        Column("duration_p99", "p99", duration), Column("duration_max", "max", duration))),
    TableView("ack_latency", "Acknowledgement latency", "Per topic of the acknowledged "
              "publication; an empty topic means the ack names only a publication whose "
              "publish is outside the range read.", (
        label("realm", "realm"), label("topic", "topic"), *LATENCY_COLUMNS)),
    TableView("ack_latency_by_protocol", "Acknowledgement latency per protocol",
              "By the acknowledging client's protocol.", (
        label("realm", "realm"), label("protocol", "protocol"), *LATENCY_COLUMNS)),
    TableView("slowest_consumers", "Slowest consumers", "Acknowledging sessions, highest p99 "
              "latency first.", (
        label("realm", "realm"), Column("session", "session", text), label("authid", "authid"),
        label("protocol", "protocol"), *LATENCY_COLUMNS)),
    TableView("refused", "Refused and failed operations", "Publishes, subscribes, registers "
              "and calls the router refused (the client got an error or a negative ack), and "
              "refusal incidents (invalid topics, unsupported values, refused connections).", (
        label("realm", "realm"), label("protocol", "protocol"), label("operation", "operation"),
        label("reason", "reason"), Column("refused", "refused", count)),
              empty="No refused or failed operations in this period."),
    TableView("drops", "Drops", "Messages not delivered to a receiver, by reason.", (
        label("realm", "realm"), label("protocol", "protocol"), label("reason", "reason"),
        Column("dropped", "dropped", count)), empty="No drops in this period."),
    TableView("retained_per_hour", "Retained store per hour", "Sets, clears, expiries and "
              "evictions per UTC hour; net is the running sum of sets minus removals since the "
              "start of the range read.", (
        label("realm", "realm"), Column("hour", "hour", minute, numeric=False),
        Column("sets", "sets", count), Column("clears", "clears", count),
        Column("expires", "expiries", count), Column("evicts", "evictions", count),
        Column("net_changes", "net", count))),
    TableView("subscriptions", "Subscribers per pattern", "Most subscribed patterns first.", (
        label("realm", "realm"), label("pattern", "pattern"), label("match", "match"),
        Column("subscribes", "subscribes", count), Column("unsubscribes", "unsubscribes", count),
        Column("sessions", "sessions", count))),
    TableView("unreceived_topics", "Topics published with no receivers", "Publishes that "
              "reached nobody (no subscriber, or none eligible).", (
        label("realm", "realm"), label("topic", "topic"), Column("unreceived", "unreceived", count),
        Column("events", "events", count), Column("unreceived_share", "share", share))),
)

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330;
       margin: 0; background: #f6f7f9; }
main { max-width: 1240px; margin: 0 auto; padding: 28px 24px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 12px; }
.sub { color: #5b6472; margin: 0 0 20px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 12px; }
.card { background: #fff; border-radius: 10px; padding: 14px 16px; box-shadow: 0 1px 2px #0001; }
.card .value { font-size: 24px; font-weight: 650; }
.card .what { color: #5b6472; font-size: 13px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 16px; }
figure { background: #fff; border-radius: 10px; margin: 0; padding: 14px 16px;
         box-shadow: 0 1px 2px #0001; }
figure.wide { grid-column: 1 / -1; }
figure img { width: 100%; height: auto; display: block; }
figcaption { color: #5b6472; font-size: 13px; }
figcaption b { color: #1d2330; font-size: 15px; display: block; }
.table { background: #fff; border-radius: 10px; padding: 6px 4px; overflow-x: auto;
         box-shadow: 0 1px 2px #0001; display: inline-block; max-width: calc(100% - 8px); }
table { border-collapse: collapse; font-size: 13px; }
th { text-align: left; color: #5b6472; font-weight: 600; border-bottom: 2px solid #e3e6ea; }
th, td { padding: 5px 10px; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #f8f9fb; }
.note { color: #5b6472; font-size: 13px; margin: -6px 0 10px; }
.none { background: #fff; border-radius: 10px; padding: 10px 16px; display: inline-block;
        box-shadow: 0 1px 2px #0001; margin: 0; }
a { color: #3553b5; }
"""


def card(value: str, what: str) -> str:
    return (f'<div class="card"><div class="value">{escape(value)}</div>'
            f'<div class="what">{escape(what)}</div></div>')


def summary_cards(realms: Rows) -> str:
    def total(key: str) -> int:
        return sum(row[key] for row in realms)
    return '<div class="cards">' + "".join((
        card(count(total("events")), "events published"),
        card(size(total("bytes")), "payload bytes"),
        card(count(total("topics")), "topics with publishes"),
        card(count(total("sessions")), "sessions joined"),
        card(count(total("acks")), "acknowledgements"),
        card(count(total("records")), "log records read"),
    )) + "</div>"


def time_range(realms: Rows) -> str:
    first = min(row["first_seen"] for row in realms)
    last = max(row["last_seen"] for row in realms)
    return f"{first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC"


def figure(chart: Chart, out: Path) -> str:
    source = chart.path.relative_to(out).as_posix()
    opening = '<figure class="wide">' if chart.wide else "<figure>"
    return (f"{opening}<figcaption><b>{escape(chart.title)}</b>"
            f"{escape(chart.caption)}</figcaption>"
            f'<img src="{escape(source)}" alt="{escape(chart.title)}"></figure>')


def table_section(view: TableView, rows: Rows, total_rows: int) -> str:
    if not rows:
        return (f'<h2>{escape(view.title)}</h2><p class="none">{escape(view.empty)}</p>'
                if view.empty else "")
    head = "".join(f'<th class="{"num" if column.numeric else "txt"}">{escape(column.label)}</th>'
                   for column in view.columns)
    body = "".join("<tr>" + "".join(column.cell(row) for column in view.columns) + "</tr>"
                   for row in rows)
    shown = f"all {total_rows:,} rows" if len(rows) == total_rows else \
        f"top {len(rows):,} of {total_rows:,} rows"
    return (f"<h2>{escape(view.title)}</h2>"
            f'<p class="note">{escape(view.note)} Showing {shown}; full table: '
            f'<a href="tables/{view.name}/csv/">CSV</a>, '
            f'<a href="tables/{view.name}/parquet/">Parquet</a>.</p>'
            f'<div class="table"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def render_page(tables: Mapping[str, Rows], total_rows: Mapping[str, int], charts: Sequence[Chart],
                out: Path, scope: str) -> str:
    """The whole report as one HTML document; ``scope`` says which logs were read."""
    realms = tables["summary"]
    realm_names = ", ".join(row["realm"] for row in realms)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Event-log report</title><style>{STYLE}</style></head>
<body><main>
<h1>Event-log report</h1>
<p class="sub">{escape(time_range(realms))} · {len(realms)} realm{"s" if len(realms) != 1 else ""}:
{escape(realm_names)} · {escape(scope)}</p>
{summary_cards(realms)}
<h2>Charts</h2>
<div class="charts">{"".join(figure(chart, out) for chart in charts)}</div>
{"".join(table_section(view, tables[view.name], total_rows[view.name]) for view in TABLE_VIEWS)}
</main></body></html>
"""
