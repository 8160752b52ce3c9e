"""bench/soak.py, briefly, end to end: every kind of client runs against a real router,
the script stops by itself, leaves no router behind and prints its summary with a
verdict per goal (it measures; the verdicts themselves are not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.harness import ROOT


def test_a_short_soak_measures_every_client_and_prints_its_summary():
    result = subprocess.run(
        [sys.executable, "bench/soak.py", "--duration", "6", "--warmup", "1", "--baseline", "2",
         "--idle", "40", "--flood-rate", "6"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = result.stdout
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^router RSS MB: idle [\d.]+ \| start [\d.]+ \| peak [\d.]+ \| "
                     r"before leave [\d.]+ \| after leave \+5s [\d.]+ \| end [\d.]+$", out, re.M)
    rates = re.search(r"^healthy delivered/s, baseline -> soak \(kept\): (.*)$", out, re.M)
    assert rates, out
    baseline = dict(re.findall(r"([\w-]+) (\d+) -> \d+", rates[1]))
    assert set(baseline) == {"wamp", "mqtt-qos0", "mqtt-qos1", "amqp"}
    assert all(int(rate) > 0 for rate in baseline.values()), rates[1]
    assert "client processes that exited early: none" in out
    assert re.search(r"^stopped readers closed by the router before they left: .*amqp .*"
                     r"wamp-rawsocket .*wamp-websocket .*mqtt-qos0 .*mqtt-qos1", out, re.M)
    flood = re.search(r"^login flood: (\d+) attempts: (.*)$", out, re.M)
    assert flood and int(flood[1]) > 0 and "accepted" not in flood[2], out
    assert re.search(r"^router log, failed logins: .*\d", out, re.M)
    assert re.search(r"^latency pair ms, login flood: p50 [\d.]+ / p99 [\d.]+ / max [\d.]+",
                     out, re.M)
    assert len(re.findall(r"^GOAL .* (PASS|FAIL|n/a ) \(", out, re.M)) == 5
    router_pid = int(re.search(r"router pid (\d+)", out)[1])
    assert not Path(f"/proc/{router_pid}").exists()
