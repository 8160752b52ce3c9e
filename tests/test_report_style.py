"""The analytics page's legibility, without Spark: lines that can be told apart, bar labels
that can be read, and an empty drops table that says so."""

from __future__ import annotations

import itertools
import math

from matplotlib.colors import to_rgb

from spark_analytics.charts import PALETTE, contrast, label_color, line_style
from spark_analytics.page import TABLE_VIEWS, table_section

TOPIC_LINES = 10  # spark_analytics.aggregates.TOP_TOPICS_OVER_TIME (that module needs pyspark)


def lab(color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour."""
    linear = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in to_rgb(color)]
    r, g, b = linear
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_the_top_topic_lines_differ_in_colour_dash_and_marker():
    styles = [line_style(n, points=30) for n in range(TOPIC_LINES)]
    colors = [style["color"] for style in styles]
    assert len(set(colors)) == TOPIC_LINES
    assert len({style["marker"] for style in styles}) == TOPIC_LINES
    assert len({style["linestyle"] for style in styles}) > 1
    # clearly different colours, not merely different hex codes (the old palette's light blue
    # and grey were 31 apart)
    closest = min(math.dist(lab(a), lab(b)) for a, b in itertools.combinations(PALETTE, 2))
    assert closest >= 40


def test_bar_labels_read_on_every_palette_colour():
    for color in PALETTE:
        assert contrast(label_color(color), color) >= 4.5, color
    assert label_color("#efb118") != "#ffffff"  # the old yellow bars' white labels


def test_an_empty_drops_table_says_none_and_other_empty_tables_are_left_out():
    views = {view.name: view for view in TABLE_VIEWS}
    drops = table_section(views["drops"], [], 0)
    assert "<h2>Drops</h2>" in drops and "No drops in this period." in drops
    assert table_section(views["subscriptions"], [], 0) == ""
