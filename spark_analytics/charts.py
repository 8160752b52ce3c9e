"""The report's PNG charts, drawn with matplotlib's Agg canvas (no display needed)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from matplotlib import rc_context
from matplotlib.colors import to_rgb
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

Rows = Sequence[Mapping]

TOP_TOPICS = 15
MAX_POINTS = 400
BUCKET_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 240, 360, 720, 1440)
PALETTE = ("#0072b2", "#f28e2b", "#2ca02c", "#d62728", "#8f4fe0", "#17becf", "#999933",
           "#e07b8b", "#6b6b6b", "#000000")
"""Qualitative colours, picked from well-known qualitative palettes (Tableau, Okabe-Ito, Tol)
for the largest smallest difference between any two (CIE76 delta E over 40) and lines that
stay visible on white (no light yellow), then three nudged in lightness so a bar label in
dark or white text (:func:`label_color`) reaches WCAG's 4.5:1 on each: the ten busiest
topics drawn as ten lines must be told apart, which the previous palette's light blue, grey
and teal were not."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")
DASHES = ("-", "--", "-.", ":")
MARKS_PER_LINE = 12
REFUSED_COLOR, DROPPED_COLOR = PALETTE[1], PALETTE[3]
DARK_TEXT, LIGHT_TEXT = "#1d2330", "#ffffff"
DPI = 120
STYLE = {"font.size": 10, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
         "legend.fontsize": 9, "axes.edgecolor": "#9498a0"}


@dataclass(frozen=True)
class Chart:
    title: str
    path: Path
    caption: str
    wide: bool = False
    """Spans the page's width (time lines and long topic names need it)."""


def thousands(value: float, _position: object = None) -> str:
    """Axis numbers with separators, keeping the decimal a small fractional tick needs."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def new_figure(width: float = 6.4, height: float = 3.4) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="both", color="#e6e6e6", linewidth=0.8)
    axes.set_axisbelow(True)
    return figure, axes


def relative_luminance(color: str) -> float:
    """WCAG 2 relative luminance of ``color`` (0 black .. 1 white)."""
    linear = [value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4
              for value in to_rgb(color)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(first: str, second: str) -> float:
    """WCAG 2 contrast ratio of two colours (1 .. 21; text wants 4.5)."""
    lighter, darker = sorted((relative_luminance(first), relative_luminance(second)),
                             reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def label_color(background: str) -> str:
    """Dark or white text, whichever reads better on ``background`` (white on the palette's
    orange or light colours was unreadable)."""
    return max((DARK_TEXT, LIGHT_TEXT), key=lambda text: contrast(text, background))


def line_style(n: int, points: int) -> dict:
    """Colour, dash and marker of the ``n``-th line: each differs from line to line, so lines
    stay apart where colours alone do not (many lines, colour-blind readers, a grey print).
    Long lines get a marker every few points, shifted per line so they do not stack."""
    step = max(1, points // MARKS_PER_LINE)
    return {"color": PALETTE[n % len(PALETTE)], "linestyle": DASHES[n % len(DASHES)],
            "marker": MARKERS[n % len(MARKERS)], "markersize": 4,
            "markevery": (n % step, step)}


def realm_colors(summary: Rows) -> dict[str, str]:
    return {row["realm"]: PALETTE[n % len(PALETTE)] for n, row in enumerate(summary)}


def rate_series(rows: Rows) -> tuple[int, dict[str, tuple[list[datetime], list[float]]]]:
    """Per realm, publishes per minute averaged over buckets of a round number of minutes,
    chosen so a long log still draws as a readable line; minutes without publishes count 0."""
    minutes = [row["minute"] for row in rows]
    first, last = min(minutes), max(minutes)
    span = (last - first) // timedelta(minutes=1) + 1
    bucket = next((size for size in BUCKET_MINUTES if span / size <= MAX_POINTS),
                  BUCKET_MINUTES[-1])
    start = first - timedelta(minutes=(first - datetime.min) // timedelta(minutes=1) % bucket)
    buckets = (last - start) // timedelta(minutes=bucket) + 1
    totals: dict[str, list[int]] = defaultdict(lambda: [0] * buckets)
    for row in rows:
        totals[row["realm"]][(row["minute"] - start) // timedelta(minutes=bucket)] += row["events"]
    times = [start + timedelta(minutes=bucket * n) for n in range(buckets)]
    return bucket, {realm: (times, [count / bucket for count in counts])
                    for realm, counts in totals.items()}


def time_axes(axes: Axes, ylabel: str) -> None:
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes.yaxis.set_major_formatter(FuncFormatter(thousands))
    axes.set_ylabel(ylabel)
    axes.set_xlabel("time (UTC)")
    axes.set_ylim(bottom=0)


def events_per_minute_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    if not tables["events_per_minute"]:
        return None
    bucket, series = rate_series(tables["events_per_minute"])
    colors = realm_colors(tables["summary"])
    figure, axes = new_figure(width=11, height=3.6)
    for realm, (times, rates) in series.items():
        axes.plot(times, rates, label=realm, color=colors[realm], linewidth=1.4,
                  marker="o" if len(times) < 60 else None, markersize=3)
    time_axes(axes, "publishes per minute")
    axes.legend(title="realm", frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    figure.savefig(path)
    averaged = "" if bucket == 1 else f", averaged over {bucket}-minute buckets"
    return Chart("Events per minute", path,
                 f"Publishes per UTC minute{averaged}; one line per realm.", wide=True)


def top_topics_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    top = [row for row in tables["topics"] if row["events"]][:TOP_TOPICS]
    if not top:
        return None
    colors = realm_colors(tables["summary"])
    several_realms = len(tables["summary"]) > 1
    labels = [f"{row['topic']}  ({row['realm']})" if several_realms else row["topic"]
              for row in top]
    figure, axes = new_figure(width=11, height=0.7 + 0.3 * len(top))
    positions = range(len(top))[::-1]
    axes.barh(positions, [row["events"] for row in top],
              color=[colors[row["realm"]] for row in top])
    axes.set_yticks(list(positions), labels)
    for position, row in zip(positions, top):
        axes.annotate(thousands(row["events"]), (row["events"], position), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize=8)
    axes.xaxis.set_major_formatter(FuncFormatter(thousands))
    axes.set_xlabel("publishes")
    axes.grid(axis="y", visible=False)
    axes.margins(x=0.12)
    figure.savefig(path)
    return Chart(f"Top {len(top)} topics", path, "Topics with the most publishes.", wide=True)


def share_bars(rows: Rows, category: Callable[[Mapping], str], count_column: str,
               path: Path, xlabel: str) -> bool:
    """100 % stacked bars, one per realm (top to bottom in the order of ``rows``): how each
    realm's count splits across categories."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows:
        if row[count_column]:
            counts[row["realm"]][category(row)] = row[count_column]
    if not counts:
        return False
    categories = sorted({name for split in counts.values() for name in split})
    realms = list(counts)  # in the rows' order
    figure, axes = new_figure(height=1.2 + 0.45 * len(realms))
    left = [0.0] * len(realms)
    for n, name in enumerate(categories):
        shares = [counts[realm].get(name, 0) / sum(counts[realm].values()) for realm in realms]
        color = PALETTE[n % len(PALETTE)]
        bars = axes.barh(realms, shares, left=left, label=name, color=color)
        axes.bar_label(bars, labels=[f"{share:.0%}" if share >= 0.06 else "" for share in shares],
                       label_type="center", fontsize=8, color=label_color(color))
        left = [start + share for start, share in zip(left, shares)]
    axes.xaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_xlim(0, 1)
    axes.set_xlabel(xlabel)
    axes.invert_yaxis()
    axes.grid(axis="y", visible=False)
    axes.legend(frameon=False, ncols=min(len(categories), 6), loc="lower center",
                bbox_to_anchor=(0.5, 1.0))
    figure.savefig(path)
    return True


def qos_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    if not share_bars(tables["qos"], lambda row: f"QoS {row['qos']}", "events", path,
                      "share of publishes"):
        return None
    return Chart("QoS split", path, "Share of each realm's publishes per QoS level.")


def protocol_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    """Traffic, not sessions: two bars per realm, its messages published and its deliveries
    split by protocol (40 short MQTT sessions publishing little are not 88 % of anything)."""
    rows = [{"realm": f"{row['realm']}: {what}", "protocol": row["protocol"] or "unknown",
             "messages": row[column]}
            for row in tables["protocols"]
            for column, what in (("events", "published"), ("deliveries", "delivered"))]
    if not share_bars(rows, lambda row: row["protocol"], "messages", path,
                      "share of messages"):
        return None
    return Chart("Protocol mix (traffic)", path, "Share of each realm's messages published "
                 "and delivered per transport protocol (a delivery counts under its "
                 "publisher's protocol); sessions per protocol are in the table below.")


def fanout_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    per_realm = defaultdict(list)
    for row in tables["fanout"]:
        per_realm[row["realm"]].append((row["receivers"], row["publishes"]))
    if not per_realm:
        return None
    colors = realm_colors(tables["summary"])
    summaries = {row["realm"]: row for row in tables["summary"]}
    figure, axes = new_figure()
    for share in (0.5, 0.9, 0.99):
        axes.axhline(share, color="#9498a0", linewidth=0.8, linestyle=":")
    most = max(row["receivers"] for row in tables["fanout"])
    for realm, points in per_realm.items():
        receivers, counts = zip(*points)
        total, running, cumulative = sum(counts), 0, [0.0]
        for count in counts:
            running += count
            cumulative.append(running / total)
        row = summaries[realm]
        # rises from 0 at its fewest receivers, runs on at 100 % to the widest fan-out shown
        axes.step([receivers[0], *receivers, most], [*cumulative, 1.0], where="post",
                  color=colors[realm], linewidth=1.6,
                  label=f"{realm}: p50 {row['receivers_p50']:,} · p90 {row['receivers_p90']:,}"
                        f" · p99 {row['receivers_p99']:,}")
    if most > 20:
        axes.set_xscale("symlog", linthresh=1)
        axes.xaxis.set_major_formatter(FuncFormatter(thousands))
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_xlabel("receivers per publish")
    axes.set_ylabel("publishes with at most that many")
    axes.set_ylim(0, 1.02)
    axes.legend(frameon=False, loc="lower right")
    figure.savefig(path)
    return Chart("Fan-out distribution", path, "Share of publishes delivered to at most N "
                 "receivers; dotted lines mark 50 %, 90 % and 99 %.")


def ack_latency_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    realms = [row for row in tables["summary"] if row["acks"]]
    if not realms:
        return None
    figure, axes = new_figure(height=1.4 + 0.5 * len(realms))
    width = 0.26
    for n, suffix in enumerate(("p50", "p90", "p99")):
        positions = [index + (n - 1) * width for index in range(len(realms))]
        bars = axes.barh(positions, [row[f"ack_latency_ms_{suffix}"] for row in realms],
                         height=width, label=suffix, color=PALETTE[n])
        axes.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    axes.set_yticks(range(len(realms)), [row["realm"] for row in realms])
    axes.invert_yaxis()
    axes.set_xlabel("milliseconds from delivery to acknowledgement")
    axes.grid(axis="y", visible=False)
    axes.margins(x=0.1)
    axes.legend(frameon=False, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    figure.savefig(path)
    return Chart("Acknowledgement latency", path,
                 "Latency percentiles of QoS ≥ 1 acknowledgements.")


def top_topics_over_time_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    series: dict[str, tuple[list[datetime], list[int]]] = defaultdict(lambda: ([], []))
    several_realms = len(tables["summary"]) > 1
    for row in tables["top_topics_per_minute"]:
        name = f"{row['topic']} ({row['realm']})" if several_realms else row["topic"]
        series[name][0].append(row["minute"])
        series[name][1].append(row["events"])
    if not series:
        return None
    figure, axes = new_figure(width=11, height=4.2)
    # busiest first: the legend reads as a ranking and the busiest lines get the first styles
    ranked = sorted(series.items(), key=lambda item: (-sum(item[1][1]), item[0]))
    for n, (name, (times, counts)) in enumerate(ranked):
        axes.plot(times, counts, label=name, linewidth=1.4, **line_style(n, len(times)))
    time_axes(axes, "publishes per minute")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # whole publishes, not 2.5
    axes.legend(title="topic (busiest first)", frameon=False, loc="upper left",
                bbox_to_anchor=(1, 1), handlelength=3.2)
    figure.savefig(path)
    return Chart("Top topics over time", path, "Publishes per UTC minute of the busiest "
                 "topics: which topic drives a peak.", wide=True)


def session_churn_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    rows = tables["session_churn"]
    if not rows:
        return None
    figure, axes = new_figure(width=11, height=3.2)
    for n, (column, what) in enumerate((("joined", "joined"), ("left", "left"))):
        totals: dict[datetime, int] = defaultdict(int)
        for row in rows:
            totals[row["minute"]] += row[column]
        times = sorted(totals)
        axes.plot(times, [totals[time] for time in times], label=what, color=PALETTE[n],
                  linewidth=1.2, marker="o" if len(times) < 60 else None, markersize=3)
    time_axes(axes, "sessions per minute")
    axes.legend(frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    figure.savefig(path)
    return Chart("Session churn", path, "Sessions joining and leaving per UTC minute, all "
                 "realms: reconnect storms show as matching spikes.", wide=True)


def payload_size_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in tables["payload_sizes"]:
        counts[row["protocol"] or "unknown"][row["size_from"]] += row["publishes"]
    if not counts:
        return None
    buckets = sorted({bucket for split in counts.values() for bucket in split})
    figure, axes = new_figure()
    width = 0.8 / len(counts)
    for n, (protocol, split) in enumerate(sorted(counts.items())):
        axes.bar([index + n * width for index in range(len(buckets))],
                 [split.get(bucket, 0) for bucket in buckets], width=width, label=protocol,
                 color=PALETTE[n % len(PALETTE)])
    axes.set_xticks([index + 0.4 - width / 2 for index in range(len(buckets))],
                    [size_label(bucket) for bucket in buckets], rotation=45)
    axes.yaxis.set_major_formatter(FuncFormatter(thousands))
    axes.set_xlabel("payload size from (up to twice that)")
    axes.set_ylabel("publishes")
    axes.grid(axis="x", visible=False)
    axes.legend(frameon=False)
    figure.savefig(path)
    return Chart("Payload sizes", path, "Publishes per payload-size bucket and protocol.")


def size_label(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} GiB"


def problems_chart(tables: Mapping[str, Rows], path: Path) -> Chart | None:
    totals: dict[str, int] = defaultdict(int)
    for row in tables["refused"]:
        totals[f"refused {row['operation']}: {row['reason']} ({row['protocol']})"] += row["refused"]
    for row in tables["drops"]:
        totals[f"dropped: {row['reason']} ({row['protocol']})"] += row["dropped"]
    if not totals:
        return None
    shown = sorted(totals.items(), key=lambda item: -item[1])[:TOP_TOPICS]
    figure, axes = new_figure(width=11, height=0.7 + 0.3 * len(shown))
    positions = range(len(shown))[::-1]
    axes.barh(positions, [n for _, n in shown],
              color=[DROPPED_COLOR if name.startswith("dropped") else REFUSED_COLOR
                     for name, _ in shown])
    axes.set_yticks(list(positions), [name for name, _ in shown])
    axes.xaxis.set_major_formatter(FuncFormatter(thousands))
    axes.set_xlabel("operations refused / messages dropped")
    axes.grid(axis="y", visible=False)
    figure.savefig(path)
    return Chart("Refusals and drops", path, "What the router refused (orange) and what it "
                 "could not deliver (red), by reason and protocol.", wide=True)


CHARTS = {
    "events_per_minute": events_per_minute_chart,
    "top_topics": top_topics_chart,
    "qos": qos_chart,
    "protocols": protocol_chart,
    "fanout": fanout_chart,
    "ack_latency": ack_latency_chart,
    "top_topics_over_time": top_topics_over_time_chart,
    "session_churn": session_churn_chart,
    "payload_sizes": payload_size_chart,
    "problems": problems_chart,
}


def draw_charts(tables: Mapping[str, Rows], folder: Path) -> list[Chart]:
    """Every chart the data supports (a log without acks gets no latency chart)."""
    folder.mkdir(parents=True, exist_ok=True)
    with rc_context(STYLE):
        drawn = [draw(tables, folder / f"{name}.png") for name, draw in CHARTS.items()]
    return [chart for chart in drawn if chart is not None]
