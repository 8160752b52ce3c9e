"""The Spark event-log analytics as a user checks them: the report's numbers against what was
logged, the page and its charts, the --realm/--since filters, and a stream that resumes from
its checkpoint without counting anything twice.

The logs are written here in the router's layout with the schema's field names, including a
torn last line per file (a crash mid-write), which must not count.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from collections import Counter
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from router.eventlog.schema import FIELD_NAMES
from spark_analytics.class_archive import CACHE_ENV
from spark_analytics.compact import compact_logs
from spark_analytics.reader import input_files, read_events, read_json_events
from spark_analytics.report import REPORT_STAGES, NoEvents, build_report, report_inputs
from spark_analytics.session import Sizing, start_session
from spark_analytics.storage import HadoopFiles, LocalFiles, to_url
from spark_analytics.stream import run_stream
from tests.harness import ROOT

DAY_1 = date(2026, 3, 1)
DAY_2 = date(2026, 3, 2)
CHARTS = ("events_per_minute", "top_topics", "qos", "protocols", "fanout", "ack_latency",
          "top_topics_over_time", "session_churn", "payload_sizes")


def at(day: date, hour: int, minute: int, second: float = 0.0) -> float:
    moment = datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone.utc)
    return (moment + timedelta(seconds=second)).timestamp()


def write_part(logs: Path, realm: str, day: date, part: int, records: list[dict],
               node: str | None = None) -> None:
    """One part file as the router writes it (a cluster's node one folder deeper), ending
    in a line torn by a crash."""
    folder = logs / f"realm={realm}" / f"date={day.isoformat()}"
    if node is not None:
        folder = folder / f"node={node}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for record in records:
        assert set(record) <= set(FIELD_NAMES), set(record) - set(FIELD_NAMES)
        lines.append(json.dumps({name: record[name] for name in FIELD_NAMES if name in record}))
    torn = json.dumps({"ts": records[-1]["ts"], "kind": "publish", "topic": records[-1].get(
        "topic", "torn.topic"), "qos": 0, "payload_bytes": 999, "receivers": 7})
    (folder / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n" + torn[:len(torn) // 2])


def publish(ts: float, topic: str, authid: str, protocol: str, *, publication: int,
            qos: int = 0, retain: bool = False, payload_bytes: int = 10,
            receivers: int = 1) -> dict:
    return {"ts": ts, "kind": "publish", "topic": topic, "publication": publication,
            "session": zlib.crc32(authid.encode()), "authid": authid, "authrole": "user",
            "protocol": protocol, "qos": qos, "retain": retain, "payload_bytes": payload_bytes,
            "receivers": receivers}


def session_records(day: date, session: int, authid: str, protocol: str,
                    seconds: float) -> list[dict]:
    fields = {"session": session, "authid": authid, "authrole": "user", "protocol": protocol,
              "authmethod": "ticket"}
    return [dict(fields, ts=at(day, 9, 0), kind="session_join"),
            dict(fields, ts=at(day, 9, 0, seconds), kind="session_leave", duration=seconds)]


def alpha_day_1() -> list[dict]:
    """sensor.temp: receivers 1..100 (a known fan-out distribution), 40 publishes in 10:00 and
    60 in 10:01, QoS 60/30/10, a quarter retained, 40 acks of 1..40 ms; sensor.hum: 20 more."""
    temp = [publish(at(DAY_1, 10, 0, 0.5 * n) if n < 40 else at(DAY_1, 10, 1, 0.5 * (n - 40)),
                    "sensor.temp", "thermo", "wamp.websocket", publication=1000 + n,
                    qos=0 if n < 60 else 1 if n < 90 else 2, retain=n % 4 == 0,
                    payload_bytes=10 + n, receivers=n + 1) for n in range(100)]
    humidity = [publish(at(DAY_1, 10, 5, n), "sensor.hum", "hygro", "mqtt", publication=2000 + n,
                        payload_bytes=50, receivers=3) for n in range(20)]
    retained = ([{"ts": at(DAY_1, 10, 2), "kind": "retained_set", "topic": "sensor.temp",
                  "publication": 1000 + n} for n in range(0, 100, 4)]
                + [{"ts": at(DAY_1, 10, 3), "kind": "retained_clear", "topic": "sensor.temp"}] * 2
                + [{"ts": at(DAY_1, 10, 4), "kind": "retained_expire", "topic": "sensor.hum"}])
    subscribes = [{"ts": at(DAY_1, 9, 30), "kind": "subscribe", "topic": "sensor.temp",
                   "pattern": "sensor.temp", "session": n, "authid": "viewer", "match": "exact",
                   "subscription": 7, "get_retained": True} for n in range(3)]
    # patterns and a topic only subscribed to: none of them is a row of the topics table
    subscribes += [{"ts": at(DAY_1, 9, 31), "kind": "subscribe", "pattern": pattern,
                    "session": 5, "authid": "viewer", "match": match, "subscription": 8 + n}
                   for n, (pattern, match) in enumerate((("sensor.", "prefix"),
                                                         ("sensor..x", "wildcard"),
                                                         ("sensor/#", "mqtt")))]
    subscribes.append({"ts": at(DAY_1, 9, 32), "kind": "subscribe", "topic": "sensor.idle",
                       "pattern": "sensor.idle", "session": 5, "authid": "viewer",
                       "match": "exact", "subscription": 11})
    acks = [{"ts": at(DAY_1, 10, 2), "kind": "ack", "publication": 1060 + n, "session": 1,
             "qos": 1, "latency_ms": float(n + 1)} for n in range(40)]
    sessions = (session_records(DAY_1, 1, "thermo", "wamp.websocket", 60)
                + session_records(DAY_1, 2, "hygro", "mqtt", 120)
                + session_records(DAY_1, 3, "viewer", "wamp.websocket", 300))
    return sorted(subscribes + sessions + temp + humidity + retained + acks,
                  key=lambda record: record["ts"])


def alpha_day_2() -> list[dict]:
    return [publish(at(DAY_2, 8, 0, n), "sensor.wind", "anemo", "wamp.rawsocket",
                    publication=3000 + n, qos=1, receivers=5) for n in range(10)]


def beta(day: date, count: int) -> list[dict]:
    return [publish(at(day, 12, 0, n), "chat.room", "chatter", "wamp.rawsocket",
                    publication=4000 + n + day.day * 100, payload_bytes=100, receivers=2)
            for n in range(count)]


def topic_acks(day: date, topic: str, latencies: list[float]) -> list[dict]:
    """Acks that name their topic rather than their publication (the writer does both)."""
    return [{"ts": at(day, 12, 1), "kind": "ack", "topic": topic, "session": 9, "qos": 1,
             "latency_ms": latency} for latency in latencies]


def read_table(folder: Path) -> list[dict[str, str]]:
    """A result table as a user opens it: the one CSV file in ``folder/csv``."""
    (part,) = (folder / "csv").glob("part-*.csv")
    with part.open(newline="") as file:
        return list(csv.DictReader(file))


def topic_row(report: Path, realm: str, topic: str) -> dict[str, str]:
    return by_key(read_table(report / "tables" / "topics"), "realm", "topic")[(realm, topic)]


def by_key(rows: list[dict[str, str]], *keys: str) -> dict[tuple, dict[str, str]]:
    return {tuple(row[key] for key in keys): row for row in rows}


@pytest.fixture(scope="module")
def spark():
    session = start_session(Sizing(shuffle_partitions=1, quick_jit=True), driver_memory="1g")
    yield session
    session.stop()


def logged_parts() -> dict[tuple[str, date], list[dict]]:
    """The records of each (realm, day) in the logs every report test reads."""
    return {("alpha", DAY_1): alpha_day_1(), ("alpha", DAY_2): alpha_day_2(),
            ("beta", DAY_1): beta(DAY_1, 30) + topic_acks(DAY_1, "chat.room", [3.0, 5.0, 7.0]),
            ("beta", DAY_2): beta(DAY_2, 5)}


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Two realms over two days; returns the folder and every (untorn) record written."""
    logs = tmp_path_factory.mktemp("eventlog")
    records = []
    for (realm, day), part_records in logged_parts().items():
        write_part(logs, realm, day, 0, part_records)
        records.extend(dict(record, realm=realm, date=day.isoformat()) for record in part_records)
    return logs, records


@pytest.fixture(scope="module", autouse=True)
def filtered_cli_report(logged, tmp_path_factory):
    """``python -m spark_analytics report --realm alpha --since <day 2>``, started when the
    module starts: it runs its own JVM, so it overlaps with the in-process tests."""
    out = tmp_path_factory.mktemp("cli-report")
    # a first report: its JVM writes the class archive (here, not in the user's cache)
    cache = tmp_path_factory.mktemp("class-archive")
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_analytics", "report", "--logs", str(logged[0]),
         "--out", str(out), "--realm", "alpha", "--since", DAY_2.isoformat()],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, CACHE_ENV: str(cache)})
    yield out, process, cache
    process.kill()
    process.communicate()


@pytest.fixture(scope="module")
def report(spark, logged, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    build_report(spark, logged[0], out)
    return out


def test_topic_counts_bytes_qos_and_retention_match_the_log(report, logged):
    published = [record for record in logged[1] if record["kind"] == "publish"]
    topics = by_key(read_table(report / "tables" / "topics"), "realm", "topic")
    expected_topics = {(record["realm"], record["topic"]) for record in published}
    assert {key for key, row in topics.items() if int(row["events"])} == expected_topics
    for key in expected_topics:
        mine = [record for record in published if (record["realm"], record["topic"]) == key]
        row = topics[key]
        assert int(row["events"]) == len(mine), key
        assert int(row["bytes"]) == sum(record["payload_bytes"] for record in mine), key
        qos = Counter(record["qos"] for record in mine)
        assert [int(row[f"qos{level}"]) for level in (0, 1, 2)] == [qos[0], qos[1], qos[2]], key
        retained = sum(record["retain"] for record in mine)
        assert float(row["retained_share"]) == pytest.approx(retained / len(mine)), key
    kinds = Counter((record["topic"], record["kind"]) for record in logged[1]
                    if record["realm"] == "alpha" and record["kind"].startswith("retained_"))
    temp, humidity = topics[("alpha", "sensor.temp")], topics[("alpha", "sensor.hum")]
    assert int(temp["retained_set"]) == kinds[("sensor.temp", "retained_set")] == 25
    assert int(temp["retained_clear"]) == kinds[("sensor.temp", "retained_clear")] == 2
    assert int(humidity["retained_expire"]) == 1
    assert int(temp["subscribes"]) == 3


def test_every_whole_record_counts_and_torn_lines_do_not(report, logged):
    summary = by_key(read_table(report / "tables" / "summary"), "realm")
    written = Counter(record["realm"] for record in logged[1])
    assert {realm: int(row["records"]) for (realm,), row in summary.items()} == written


def test_peak_minute_and_rate(report):
    temp = topic_row(report, "alpha", "sensor.temp")
    assert temp["peak_minute"].startswith("2026-03-01T10:01")
    assert int(temp["peak_minute_events"]) == 60
    # 100 publishes from 10:00:00 to 10:01:29.5: over the topic's own span, not 2 calendar minutes
    assert float(temp["events_per_minute"]) == pytest.approx(100 * 60 / 89.5)
    wind = topic_row(report, "alpha", "sensor.wind")  # 10 publishes in 9 s: at least a minute
    assert float(wind["events_per_minute"]) == pytest.approx(10.0)


def test_topics_are_only_topics_published_to(report):
    topics = {row["topic"] for row in read_table(report / "tables" / "topics")}
    assert topics == {"sensor.temp", "sensor.hum", "sensor.wind", "chat.room"}
    patterns = by_key(read_table(report / "tables" / "subscriptions"), "pattern", "match")
    assert {key: int(row["subscribes"]) for key, row in patterns.items()} == {
        ("sensor.temp", "exact"): 3, ("sensor.", "prefix"): 1, ("sensor..x", "wildcard"): 1,
        ("sensor/#", "mqtt"): 1, ("sensor.idle", "exact"): 1}
    assert int(patterns[("sensor.temp", "exact")]["sessions"]) == 3


def test_fanout_percentiles_of_a_known_distribution(report, logged):
    temp = topic_row(report, "alpha", "sensor.temp")
    assert [int(temp[f"receivers_{p}"]) for p in ("p50", "p90", "p99")] == [50, 90, 99]
    fanout = by_key(read_table(report / "tables" / "fanout"), "realm", "receivers")
    beta_receivers = Counter(record["receivers"] for record in logged[1]
                             if record["realm"] == "beta" and record["kind"] == "publish")
    assert {int(receivers): int(row["publishes"]) for (realm, receivers), row in fanout.items()
            if realm == "beta"} == beta_receivers


def test_top_publisher_sessions_protocols_and_ack_latency(report):
    publishers = read_table(report / "tables" / "publishers")
    assert (publishers[0]["realm"], publishers[0]["authid"], publishers[0]["events"]) == \
        ("alpha", "thermo", "100")
    sessions = by_key(read_table(report / "tables" / "sessions"), "realm")[("alpha",)]
    assert (int(sessions["joined"]), int(sessions["left"])) == (3, 3)
    assert float(sessions["duration_p50"]) == 120.0
    assert float(sessions["duration_mean"]) == pytest.approx(160.0)
    protocols = by_key(read_table(report / "tables" / "protocols"), "realm", "protocol")
    assert int(protocols[("alpha", "wamp.websocket")]["sessions"]) == 2
    assert int(protocols[("alpha", "mqtt")]["events"]) == 20
    assert int(protocols[("alpha", "mqtt")]["deliveries"]) == 20 * 3
    assert int(protocols[("alpha", "wamp.websocket")]["deliveries"]) == sum(range(1, 101))
    acks = by_key(read_table(report / "tables" / "ack_latency"), "realm", "topic")
    temp_acks = acks[("alpha", "sensor.temp")]
    assert (int(temp_acks["acks"]), float(temp_acks["latency_ms_p50"])) == (40, 20.0)
    chat_acks = acks[("beta", "chat.room")]
    assert (int(chat_acks["acks"]), float(chat_acks["latency_ms_p50"])) == (3, 5.0)
    summary = by_key(read_table(report / "tables" / "summary"), "realm")
    assert float(summary[("alpha",)]["ack_latency_ms_p50"]) == 20.0
    assert int(summary[("beta",)]["acks"]) == 3


def test_tables_come_as_parquet_too(report, spark):
    for name in ("summary", "topics", "events_per_minute", "qos", "fanout", "publishers",
                 "protocols", "sessions", "ack_latency"):
        folder = report / "tables" / name
        assert spark.read.parquet(str(folder / "parquet")).count() == len(read_table(folder))


def test_page_shows_summary_and_references_every_chart(report, logged):
    page = (report / "report.html").read_text(encoding="utf-8")
    for chart in CHARTS:
        png = report / "charts" / f"{chart}.png"
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), chart
        assert f'src="charts/{chart}.png"' in page, chart
    publishes = sum(record["kind"] == "publish" for record in logged[1])
    assert f"{publishes:,}" in page
    assert "2026-03-01 09:00 – 2026-03-02 12:00 UTC" in page
    assert "sensor.temp" in page and "thermo" in page
    # nothing was dropped: the page says so rather than leaving the table out
    assert "<h2>Drops</h2>" in page and "No drops in this period." in page


def test_cli_report_keeps_only_the_chosen_realm_and_dates(filtered_cli_report):
    out, process, cache = filtered_cli_report
    stdout, stderr = process.communicate(timeout=220)
    assert process.returncode == 0, stderr
    assert stdout.strip() == str(out / "report.html")
    assert [path.suffix for path in cache.iterdir()] == [".jsa"], "the class archive is kept"
    assert f"[1/{REPORT_STAGES}] reading event logs" in stderr
    assert f"[{REPORT_STAGES}/{REPORT_STAGES}] HTML page" in stderr
    topics = read_table(out / "tables" / "topics")
    assert [(row["realm"], row["topic"], row["events"]) for row in topics] == \
        [("alpha", "sensor.wind", str(len(alpha_day_2())))]
    assert [row["realm"] for row in read_table(out / "tables" / "summary")] == ["alpha"]
    assert "realm alpha, since 2026-03-02" in (out / "report.html").read_text(encoding="utf-8")


def test_cli_report_says_when_nothing_matches(logged, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "spark_analytics", "report", "--logs", str(logged[0]),
         "--out", str(tmp_path), "--realm", "nosuchrealm"],
        cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert "no event-log files" in run.stderr


def test_cli_stream_once_says_when_there_is_nothing_to_read(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "spark_analytics", "stream", "--once", "--logs", str(tmp_path),
         "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "checkpoint")],
        cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert f"no event-log files under {tmp_path}" in run.stderr
    # a part the router still writes is read once closed: said, not counted as input
    folder = tmp_path / "realm=r" / "date=2026-03-01"
    folder.mkdir(parents=True)
    (folder / ".part-0.jsonl").write_text('{"ts": 1772323200, "kind": "publish"}\n')
    run = subprocess.run(
        [sys.executable, "-m", "spark_analytics", "stream", "--once", "--logs", str(tmp_path),
         "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "checkpoint")],
        cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert "1 part(s) still being written by the router, read once closed" in run.stderr


def test_stream_keeps_to_its_realm_and_dates(spark, logged, tmp_path):
    out = tmp_path / "out"
    run_stream(spark, logged[0], out, tmp_path / "checkpoint", once=True, progress=io.StringIO(),
               realm="alpha", since=DAY_2)
    totals = by_key(read_table(out / "topic_totals"), "realm", "topic")
    assert {key: int(row["events"]) for key, row in totals.items()} == {
        ("alpha", "sensor.wind"): len(alpha_day_2())}


def test_stream_restart_counts_every_record_once(spark, tmp_path):
    logs, out, checkpoint = tmp_path / "logs", tmp_path / "out", tmp_path / "checkpoint"

    def run() -> int:
        """One ``stream --once``; returns how many rows its topic_totals batches read."""
        batches = io.StringIO()
        run_stream(spark, logs, out, checkpoint, once=True, watermark_minutes=10,
                   progress=batches)
        return sum(int(count.replace(",", "")) for count in
                   re.findall(r"^\[topic_totals\] batch \d+: ([\d,]+) records", batches.getvalue(),
                              re.MULTILINE))

    def totals() -> dict[tuple, int]:
        return {key: int(row["events"])
                for key, row in by_key(read_table(out / "topic_totals"), "realm", "topic").items()}

    def publishes(records: list[dict], realm: str) -> Counter:
        return Counter((realm, record["topic"]) for record in records
                       if record["kind"] == "publish")

    first = alpha_day_1()
    write_part(logs, "alpha", DAY_1, 0, first)
    assert run() >= len(first)
    assert totals() == publishes(first, "alpha")

    # hours later: a new part in the same folder and a new realm
    later = [dict(record, ts=record["ts"] + 3 * 3600) for record in first
             if record["kind"] == "publish"]
    chat = beta(DAY_1, 30)
    write_part(logs, "alpha", DAY_1, 1, later)
    write_part(logs, "beta", DAY_1, 0, chat)
    # the restart resumes: it reads only the two new files (each may end in a torn line) ...
    assert len(later) + len(chat) <= run() <= len(later) + len(chat) + 2
    # ... and the totals still cover every record exactly once
    assert totals() == publishes(first, "alpha") + publishes(later, "alpha") + \
        publishes(chat, "beta")

    # the first part's minutes are past the watermark now: final, and each there once
    minutes = [row for row in spark.read.parquet(str(out / "events_per_minute")).collect()
               if row["minute"] < datetime(2026, 3, 1, 11)]
    assert Counter((row["topic"], row["minute"]) for row in minutes).most_common(1)[0][1] == 1
    written = Counter((record["topic"], datetime.fromtimestamp(record["ts"], timezone.utc)
                       .replace(second=0, microsecond=0, tzinfo=None))
                      for record in first if record["kind"] == "publish")
    assert {(row["topic"], row["minute"]): row["events"] for row in minutes} == written


def test_compacted_days_give_the_same_tables(spark, logged, report, tmp_path):
    """``compact`` turns the closed days into Parquet (not a day with a part still open), and
    a report over the mix of Parquet and JSON holds the same rows as over the JSON alone."""
    logs = tmp_path / "logs"
    shutil.copytree(logged[0], logs)
    (logs / "realm=alpha" / f"date={DAY_2.isoformat()}" / ".part-1.jsonl").write_text("")
    written = compact_logs(spark, logs, today=DAY_2 + timedelta(days=1))
    assert sorted(written) == [("alpha", DAY_1.isoformat()), ("beta", DAY_1.isoformat()),
                               ("beta", DAY_2.isoformat())]
    assert compact_logs(spark, logs, today=DAY_2 + timedelta(days=1)) == []
    # listed alike before a session (local folders) and through Hadoop's file system
    listed = [entry.name for entry in input_files(LocalFiles(), to_url(logs))]
    assert listed == [entry.name for entry in input_files(HadoopFiles(spark), to_url(logs))]
    assert all(name.endswith((".parquet", ".jsonl")) for name in listed)
    assert len([name for name in listed if name.endswith(".parquet")]) == 3
    # a report reads the JSON of the day left and the compacted days' rollups, of its realm
    for realm, days in (("beta", 2), (None, 3)):
        read = report_inputs(LocalFiles(), to_url(logs), realm, None)
        assert sum(entry.name == "_COMPACTED" for entry in read) == days
        assert all(f"realm={realm}/" in entry.url for entry in read if realm)
        assert any("/_rollups/" in entry.url for entry in read)
    assert [entry.name for entry in report_inputs(LocalFiles(), to_url(logs), "alpha", DAY_2)
            ] == [".part-1.jsonl", "part-0.jsonl"]
    assert_same_tables(spark, logs, report, tmp_path / "report")


def test_a_compacted_day_without_a_record_is_reported_as_such(spark, tmp_path):
    """A day whose only line is torn compacts to no records: a report over it says there
    are no records, not that there are no files (it reads the day's marker)."""
    logs = tmp_path / "logs"
    folder = logs / "realm=alpha" / f"date={DAY_1.isoformat()}"
    folder.mkdir(parents=True)
    (folder / "part-0.jsonl").write_text('{"ts": 1772323200, "ki')
    assert compact_logs(spark, logs, today=DAY_2) == [("alpha", DAY_1.isoformat())]
    assert [entry.name for entry in report_inputs(LocalFiles(), to_url(logs), None, None)
            ] == ["_COMPACTED"]
    with pytest.raises(NoEvents, match="no event-log records"):
        build_report(spark, logs, tmp_path / "out")


def assert_same_tables(spark, logs: Path, report: Path, out: Path) -> None:
    """A report over ``logs`` holds the same rows in every table as ``report``."""
    build_report(spark, logs, out)

    def rows(folder: Path, table: str) -> list[tuple]:
        return sorted(tuple(sorted(row.items())) for row in read_table(folder / "tables" / table))
    for table in sorted(path.name for path in (report / "tables").iterdir()):
        assert rows(out, table) == rows(report, table), table


def test_a_clusters_node_folders_are_read_and_compacted_as_one_log(spark, report, tmp_path):
    """The same records split between two nodes' folders (a cluster's layout) give the same
    report as one node's, and ``compact`` merges both nodes' parts of a day, keeping ``node``."""
    logs = tmp_path / "logs"
    for (realm, day), records in logged_parts().items():
        for number, node in enumerate(("n1", "n2")):
            write_part(logs, realm, day, 0, records[number::2], node=node)
    assert_same_tables(spark, logs, report, tmp_path / "report")

    assert len(compact_logs(spark, logs, today=DAY_2 + timedelta(days=1))) == 4
    files = HadoopFiles(spark)
    assert all(entry.name.endswith(".parquet") for entry in input_files(files, to_url(logs)))
    nodes = Counter(row["node"] for row in read_events(spark, files, to_url(logs)).collect())
    assert nodes == {node: sum(len(records[number::2]) for records in logged_parts().values())
                     for number, node in enumerate(("n1", "n2"))}


def test_a_day_a_crash_left_half_compacted_is_compacted_again(spark, logged, report, tmp_path):
    """Only a day with its marker counts as compacted: one whose rollups were cut short (no
    marker yet) is read from its JSON, and the next ``compact`` does it again."""
    logs = tmp_path / "logs"
    shutil.copytree(logged[0], logs)
    today = DAY_2 + timedelta(days=1)
    assert len(compact_logs(spark, logs, today=today)) == 4
    day = f"date={DAY_1.isoformat()}"
    (logs / "_parquet" / "realm=alpha" / day / "_COMPACTED").unlink()
    shutil.rmtree(logs / "_rollups" / "topics" / "realm=alpha" / day)
    assert_same_tables(spark, logs, report, tmp_path / "half")
    assert compact_logs(spark, logs, today=today) == [("alpha", DAY_1.isoformat())]
    assert_same_tables(spark, logs, report, tmp_path / "again")


def test_percentiles_over_more_values_than_a_sketch_keeps(spark, tmp_path):
    """3,000 ack latencies a day over two days, one compacted and one still JSON: the merged
    percentiles stay within the documented 0.3 % of rank (here 0.5 %, 30 values)."""
    logs = tmp_path / "logs"
    per_day = 3000
    for number, day in enumerate((DAY_1, DAY_2)):
        latencies = [float(number + 2 * n) for n in range(per_day)]  # odd and even ms apart
        write_part(logs, "gamma", day, 0, topic_acks(day, "load.topic", latencies))
    assert compact_logs(spark, logs, today=DAY_2) == [("gamma", DAY_1.isoformat())]
    build_report(spark, logs, tmp_path / "report")
    row = by_key(read_table(tmp_path / "report" / "tables" / "ack_latency"),
                 "realm", "topic")[("gamma", "load.topic")]
    assert int(row["acks"]) == 2 * per_day
    values = 2 * per_day  # every latency 0..5999 ms once: the rank of v ms is v + 1
    for suffix, share in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert abs(float(row[f"latency_ms_{suffix}"]) - share * values) <= 0.005 * values, suffix


def test_open_parts_are_read_as_they_are_and_a_part_closed_meanwhile_once(spark, tmp_path):
    """A part the router still writes (``.part-<n>.jsonl``, a line cut short at its end) is
    read through its copy; one that closed after it was copied is in the listing of closed
    parts made next, and its copy is not read as well."""
    logs = tmp_path / "logs"
    records = [publish(at(DAY_1, 10, n), "open.topic", "a", "mqtt", publication=n)
               for n in range(6)]
    write_part(logs, "delta", DAY_1, 0, records[:2])  # closed, before the read
    folder = logs / "realm=delta" / f"date={DAY_1.isoformat()}"
    (folder / ".part-1.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in records[2:5]) + '{"ts": 1, "kin')
    # renamed as it closed, between the copy and the listing: both names in this snapshot
    write_part(logs, "delta", DAY_1, 2, records[5:])
    shutil.copy(folder / "part-2.jsonl", folder / ".part-2.jsonl")
    snapshot = to_url(tmp_path / "snapshot")
    events = read_json_events(spark, to_url(logs), [], snapshot=snapshot)
    assert sorted(row["publication"] for row in events.collect()) == list(range(6))
    assert sorted(entry.name for entry in input_files(LocalFiles(), to_url(logs))) == [
        ".part-1.jsonl", ".part-2.jsonl", "part-0.jsonl", "part-2.jsonl"]


def fleet() -> list[dict]:
    """40 short MQTT sessions that publish one check-in each, reaching nobody, beside two WAMP
    sessions publishing to ten topics for 30 minutes, each publish reaching 3 receivers:
    MQTT holds 95 % of the sessions and a few per cent of the traffic."""
    records = []
    for n in range(40):
        records += session_records(DAY_1, 100 + n, f"truck{n}", "mqtt", 5)
        records.append(publish(at(DAY_1, 9, 0, 1 + n * 0.01), "fleet.checkin", f"truck{n}",
                               "mqtt", publication=10_000 + n, receivers=0))
    records += session_records(DAY_1, 1, "dispatch", "wamp.websocket", 3600)
    records += session_records(DAY_1, 2, "tracker", "wamp.websocket", 3600)
    publication = 0
    for minute in range(30):
        for topic in range(10):
            # steady rates a step apart, and one topic's burst that makes the realm's peak
            burst = 12 if topic == 3 and 12 <= minute < 16 else 0
            for n in range(1 + topic + (minute + topic) % 3 + burst):
                publication += 1
                records.append(publish(at(DAY_1, 9, 10 + minute, n), f"fleet.zone{topic}.gps",
                                       "dispatch" if topic % 2 else "tracker",
                                       "wamp.websocket", publication=publication,
                                       qos=publication % 3 and 1, receivers=3))
    return sorted(records, key=lambda record: record["ts"])


def test_protocol_mix_counts_traffic_not_sessions(spark, tmp_path):
    """The protocol mix is messages published and delivered per protocol (the sessions beside
    them, labelled as such): 40 MQTT sessions publishing 40 unreceived messages are not the
    bulk of a realm whose two WAMP sessions publish the rest."""
    logs, out = tmp_path / "logs", tmp_path / "report"
    records = fleet()
    write_part(logs, "fleet", DAY_1, 0, records)
    build_report(spark, logs, out)
    rows = read_table(out / "tables" / "protocols")
    wamp = [record for record in records
            if record["kind"] == "publish" and record["protocol"] == "wamp.websocket"]
    assert [(row["protocol"], int(row["sessions"]), int(row["events"]), int(row["deliveries"]),
             int(row["messages"])) for row in rows] == [
        ("wamp.websocket", 2, len(wamp), 3 * len(wamp), 4 * len(wamp)),
        ("mqtt", 40, 40, 0, 40)]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Protocol mix (traffic)" in page and "sessions joined" in page
    assert "No drops in this period." in page
    assert (out / "charts" / "top_topics_over_time.png").exists()
