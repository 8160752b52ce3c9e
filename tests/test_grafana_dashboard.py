"""docs/grafana-dashboard.json as an operator imports it: valid JSON, no "No data" on the drops
panel of a healthy router, and never two units on one axis."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import ROOT

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
LAZY_COUNTERS = ("router_messages_dropped_total", "router_incidents_total")
"""Counters of drops and incidents: a panel on them must read 0 before they have a rate."""
UNITS = {"seconds": {"s", "ms"}, "bytes per second": {"Bps", "binBps"},
         "per second": {"ops", "reqps", "cps"}, "bytes": {"bytes", "decbytes"},
         "count": {"short", "none"}}
"""What a query measures -> the Grafana units that show it."""


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]


def measures(expr: str) -> str:
    """What a query measures, from the Prometheus naming rules of the metrics it reads
    (``_seconds``, ``_bytes``, counters ``_total`` under ``rate``)."""
    names = re.findall(r"router_\w+", expr)
    if "histogram_quantile" in expr:
        return "seconds" if all("_seconds_" in name for name in names) else "count"
    if "rate(" in expr:
        if all(name.endswith(("_sum", "_count")) for name in names):  # a histogram's mean
            return "seconds" if all("_seconds_" in name for name in names) else "count"
        return ("bytes per second" if all(name.endswith("_bytes_total") for name in names)
                else "per second")
    if all(name.endswith("_bytes") for name in names):
        return "bytes"
    return "seconds" if all(name.endswith("_seconds") for name in names) else "count"


def unit_and_axis(panel: dict, ref: str) -> tuple[str, str]:
    """The unit and axis side a panel gives the series of query ``ref`` (its defaults, then
    the overrides that match the query)."""
    config = panel["fieldConfig"]
    unit = config["defaults"].get("unit", "short")
    axis = config["defaults"].get("custom", {}).get("axisPlacement", "left")
    for override in config["overrides"]:
        if override["matcher"] != {"id": "byFrameRefID", "options": ref}:
            continue
        for prop in override["properties"]:
            if prop["id"] == "unit":
                unit = prop["value"]
            elif prop["id"] == "custom.axisPlacement":
                axis = prop["value"]
    return unit, "left" if axis == "auto" else axis


def test_drop_and_incident_queries_fall_back_to_zero():
    lazy = [(panel["title"], target["expr"]) for panel in panels()
            for target in panel["targets"] if any(name in target["expr"]
                                                  for name in LAZY_COUNTERS)]
    assert lazy, "the dashboard has no drops panel"
    for title, expr in lazy:
        # "on()": the fallback joins only when the left side is empty, whatever its labels
        assert re.search(r"\bor on\(\) .*vector\(0\)", expr), title


def test_no_panel_mixes_units_on_one_axis():
    for panel in panels():
        axes: dict[str, set[str]] = {}
        for target in panel["targets"]:
            unit, axis = unit_and_axis(panel, target["refId"])
            what = measures(target["expr"])
            assert unit in UNITS[what], (panel["title"], target["refId"], what, unit)
            axes.setdefault(axis, set()).add(unit)
        assert all(len(units) == 1 for units in axes.values()), (panel["title"], axes)


def promql_test(tmp_path: Path, series: list[dict], expr: str, expected: list[dict]) -> None:
    """``promtool test rules``: ``expr`` over ``series`` at 10 minutes gives ``expected``."""
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "10m", "exp_samples": expected}]}]}
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    result = subprocess.run([shutil.which("promtool"), "test", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (apt-get install -y prometheus)")
def test_drops_panel_reads_zero_on_a_healthy_router_and_each_reason_after(tmp_path):
    (expr,) = [target["expr"] for panel in panels() for target in panel["targets"]
               if "router_messages_dropped_total" in target["expr"]]
    dropped = 'router_messages_dropped_total{realm="realm1",protocol="mqtt",reason="%s"}'
    # a router too old to export zeros, or scraped once: the fallback's single 0
    promql_test(tmp_path, [{"series": "router_uptime_seconds", "values": "0+60x10"}], expr,
                [{"labels": '{reason="none"}', "value": 0}])
    # a healthy router: its zeros; drops: their rate, and no fallback beside them
    promql_test(tmp_path, [{"series": dropped % "expired", "values": "0x10"}], expr,
                [{"labels": '{reason="expired"}', "value": 0}])
    promql_test(tmp_path, [{"series": dropped % "expired", "values": "0+6x10"},
                           {"series": dropped % "queue_full", "values": "0x10"}], expr,
                [{"labels": '{reason="expired"}', "value": 0.1},
                 {"labels": '{reason="queue_full"}', "value": 0}])
