"""The per-realm event log: layout, rotation, crash tolerance, non-blocking writes, content."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

from autobahn.wamp.types import PublishOptions

from router.core.incidents import EVENTLOG_DROPPED, Incidents
from router.core.uri import EXACT, MQTT, PREFIX, WILDCARD
from router.eventlog.schema import FIELD_NAMES, KINDS, MATCH_KINDS
from router.eventlog.writer import EventLogWriter
from tests.clients import connect, next_item, run
from tests.harness import RouterProcess, realm_file

DAY1 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def read_records(base: Path, realm: str | None = None) -> list[dict]:
    """Every complete record under ``base`` (a torn last line is skipped, as readers must)."""
    records = []
    pattern = f"realm={realm}/date=*/part-*.jsonl" if realm else "realm=*/date=*/part-*.jsonl"
    for path in sorted(base.glob(pattern)):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def test_records_are_partitioned_by_realm_and_utc_date(tmp_path):
    writer = EventLogWriter(tmp_path)
    writer.append("r1", {"ts": DAY1 + 10, "kind": "publish", "topic": "a"})
    writer.append("r1", {"ts": DAY1 + 86_400 + 10, "kind": "publish", "topic": "b"})
    writer.append("r2", {"ts": DAY1 + 20, "kind": "publish", "topic": "c"})
    writer.close()
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jsonl"))
    assert files == ["realm=r1/date=2026-01-01/part-0.jsonl", "realm=r1/date=2026-01-02/part-0.jsonl",
                     "realm=r2/date=2026-01-01/part-0.jsonl"]
    assert [r["topic"] for r in read_records(tmp_path, "r1")] == ["a", "b"]


def test_files_rotate_by_size_and_by_age(tmp_path):
    writer = EventLogWriter(tmp_path, max_file_bytes=200, max_file_age=60, clock=lambda: DAY1)
    for n in range(10):
        writer.append("r", {"ts": DAY1 + n, "kind": "publish", "topic": f"com.example.t{n}"})
    writer.flush()
    writer.close()
    parts = sorted((tmp_path / "realm=r" / "date=2026-01-01").glob("part-*.jsonl"))
    assert len(parts) > 1 and all(p.stat().st_size <= 200 + 80 for p in parts)
    assert [r["topic"] for r in read_records(tmp_path)] == [f"com.example.t{n}" for n in range(10)]

    # the writer reads its clock once per flushed batch: the second batch is 61 s later
    ticks = iter([DAY1, DAY1 + 61])
    aged = EventLogWriter(tmp_path / "aged", max_file_age=60, clock=lambda: next(ticks))
    aged.append("r", {"ts": DAY1, "kind": "publish"})
    aged.flush()
    aged.append("r", {"ts": DAY1 + 61, "kind": "publish"})
    aged.close()
    assert len(list((tmp_path / "aged").rglob("part-*.jsonl"))) == 2


def test_a_restart_never_appends_to_a_torn_file(tmp_path):
    folder = tmp_path / "realm=r" / "date=2026-01-01"
    folder.mkdir(parents=True)
    (folder / "part-0.jsonl").write_text('{"ts": 1767225600, "kind": "publish"}\n{"ts": 17672')
    writer = EventLogWriter(tmp_path)
    writer.append("r", {"ts": DAY1 + 5, "kind": "subscribe"})
    writer.close()
    assert (folder / "part-0.jsonl").read_text().endswith('{"ts": 17672')
    assert (folder / "part-1.jsonl").read_text().count("\n") == 1
    assert [r["kind"] for r in read_records(tmp_path)] == ["publish", "subscribe"]


class DiskFile:
    """A new file the writer opens, for a test's disk to change how its writes go."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb")

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class GatedFile(DiskFile):
    """A file whose writes wait until the test opens the gate: a disk that stalls."""

    def __init__(self, path: Path, gate: threading.Event, entered: threading.Event) -> None:
        super().__init__(path)
        self._gate = gate
        self._entered = entered

    def write(self, data: bytes) -> int:
        self._entered.set()
        assert self._gate.wait(30), "the test never released the disk"
        return super().write(data)


def test_a_stalled_disk_never_blocks_the_caller(tmp_path):
    gate, entered = threading.Event(), threading.Event()
    writer = EventLogWriter(tmp_path, opener=lambda path: GatedFile(path, gate, entered))
    writer.append("r", {"ts": DAY1, "kind": "publish", "topic": "first"})
    writer.flush()
    assert entered.wait(10), "the writer thread never started writing"
    # The writer thread is now stuck inside write(); the caller must still make progress.
    for n in range(1000):
        writer.append("r", {"ts": DAY1 + n, "kind": "publish", "topic": f"t{n}"})
        if n % 100 == 0:
            writer.flush()
    assert not gate.is_set()
    gate.set()
    writer.close()
    assert len(read_records(tmp_path)) == 1001


def test_a_writer_too_far_behind_drops_records_and_counts_them(tmp_path):
    gate, entered = threading.Event(), threading.Event()
    writer = EventLogWriter(tmp_path, opener=lambda path: GatedFile(path, gate, entered),
                            max_queued_records=100)
    writer.incidents = Incidents()
    writer.append("r", {"ts": DAY1, "kind": "publish", "topic": "first"})
    writer.flush()
    assert entered.wait(10), "the writer thread never started writing"
    for n in range(1000):  # the disk is stuck: only 99 more fit under the bound
        writer.append("r", {"ts": DAY1 + n, "kind": "publish", "topic": f"t{n}"})
        if n % 100 == 0:
            writer.flush()
    gate.set()
    writer.close()
    assert len(read_records(tmp_path)) == 100
    assert writer.incidents.total(EVENTLOG_DROPPED) == 901


def test_schema_lists_every_kind_the_router_writes():
    assert set(KINDS) >= {"publish", "retained_set", "retained_clear", "subscribe",
                          "unsubscribe", "session_join", "session_leave"}
    assert len(FIELD_NAMES) == len(set(FIELD_NAMES))
    assert set(MATCH_KINDS) == {EXACT, PREFIX, WILDCARD, MQTT}  # every match the core has


def test_router_logs_what_clients_did(tmp_path):
    router = RouterProcess(tmp_path, [realm_file("realm1"), realm_file("open")],
                           extra_config={"eventlog": {"flush_interval": 0.1, "realms": {
                               "open": {"payloads": True, "kinds": ["publish"]}}}}).start()

    async def traffic():
        subscribers = [await connect(router, "rawsocket", "msgpack") for _ in range(3)]
        queues = [await s.events("com.log.fanout", get_retained=True) for s in subscribers]
        publisher = await connect(router, "websocket", "json")
        for n in range(5):
            await publisher.publish("com.log.fanout", n, options=PublishOptions(acknowledge=True))
        await publisher.publish("com.log.kept", "state",
                                options=PublishOptions(acknowledge=True, retain=True))
        for q in queues:
            for _ in range(5):
                await next_item(q)
        other = await connect(router, realm="open")
        await other.publish("com.log.secret", "contents", options=PublishOptions(acknowledge=True))
        # a map with a binary key (MessagePack) has no JSON form: its publish went unanswered
        binary = await connect(router, "rawsocket", "msgpack", realm="open")
        await binary.publish("com.log.binary", {b"k": 1}, options=PublishOptions(acknowledge=True))
        for client in subscribers + [publisher, other, binary]:
            await client.close()

    try:
        run(traffic())
    finally:
        assert router.stop() == 0  # a clean stop writes what is buffered
    records = read_records(router.workdir / "data" / "eventlog", "realm1")
    publishes = [r for r in records if r["kind"] == "publish"]
    assert [r["receivers"] for r in publishes if r["topic"] == "com.log.fanout"] == [3] * 5
    assert all(r["payload_bytes"] > 0 and r["protocol"] == "wamp.websocket" and "payload" not in r
               for r in publishes)
    kept, = [r for r in publishes if r["topic"] == "com.log.kept"]
    assert kept["retain"] is True
    assert [r["publication"] for r in records if r["kind"] == "retained_set"] == [kept["publication"]]
    subscribes = [r for r in records if r["kind"] == "subscribe"]
    assert len(subscribes) == 3 and all(r["get_retained"] and r["match"] == "exact"
                                        and r["pattern"] == r["topic"] == "com.log.fanout"
                                        for r in subscribes)
    joins = [r for r in records if r["kind"] == "session_join"]
    leaves = [r for r in records if r["kind"] == "session_leave"]
    assert len(joins) == len(leaves) == 4
    assert all(r["duration"] >= 0 and r["authmethod"] == "anonymous" for r in leaves)
    assert all(set(r) <= set(FIELD_NAMES) for r in records)
    opened = read_records(router.workdir / "data" / "eventlog", "open")
    assert [r["kind"] for r in opened] == ["publish", "publish"]
    assert "b'k'" in opened[1]["payload"]
    assert json.loads(opened[0]["payload"]) == [["contents"], None]


def test_closed_parts_are_visible_and_parts_left_open_by_a_crash_are_recovered(tmp_path):
    writer = EventLogWriter(tmp_path)
    writer.append("r", {"ts": DAY1, "kind": "publish", "topic": "open"})
    writer.flush()
    folder = tmp_path / "realm=r" / "date=2026-01-01"
    writer.close()
    assert [p.name for p in folder.iterdir()] == ["part-0.jsonl"]

    (folder / ".part-1.jsonl").write_text('{"ts": 1767225600, "kind": "subscribe"}\n{"ts"')
    EventLogWriter(tmp_path).close()  # a writer starting after a crash
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.jsonl", "part-1.jsonl"]
    assert [r["kind"] for r in read_records(tmp_path)] == ["publish", "subscribe"]


def test_a_cluster_node_writes_under_its_own_node_folder_and_recovers_it(tmp_path):
    """Two nodes of one cluster write the same realm and day into one tree, never into
    the same file; a node restarting after a crash recovers its open part there."""
    for node in ("n1", "n2"):
        writer = EventLogWriter(tmp_path, node=node)
        writer.append("r", {"ts": DAY1 + 1, "kind": "publish", "topic": node})
        writer.close()
    day = tmp_path / "realm=r" / "date=2026-01-01"
    assert sorted(str(p.relative_to(day)) for p in day.rglob("*.jsonl")) == [
        "node=n1/part-0.jsonl", "node=n2/part-0.jsonl"]

    (day / "node=n1" / ".part-1.jsonl").write_text('{"ts": 1767225600, "kind": "subscribe"}\n')
    EventLogWriter(tmp_path, node="n1").close()  # n1 starting after a crash
    assert sorted(p.name for p in (day / "node=n1").iterdir()) == ["part-0.jsonl",
                                                                   "part-1.jsonl"]


class RecordingReactor:
    """The two reactor calls the writer makes: ``callFromThread`` runs at once (on the writer
    thread) and ``callLater`` is recorded for the test to fire."""

    def __init__(self) -> None:
        self.later: list[tuple[float, object]] = []
        self.asked = threading.Event()

    def callFromThread(self, function, *args) -> None:
        function(*args)

    def callLater(self, delay: float, function):
        self.later.append((delay, function))
        self.asked.set()
        return _Pending()


class _Pending:
    def active(self) -> bool:
        return False


def test_an_idle_part_is_closed_by_the_age_check_the_writer_asks_for(tmp_path):
    now = [DAY1]
    reactor = RecordingReactor()
    writer = EventLogWriter(tmp_path, max_file_age=60, clock=lambda: now[0])
    writer.start(reactor)
    writer.append("r", {"ts": DAY1, "kind": "publish", "topic": "idle"})
    writer.flush()
    assert reactor.asked.wait(10), "the writer never asked for an age check"
    (delay, check), = reactor.later
    assert delay == 60  # when the part comes of age, not a polling interval
    folder = tmp_path / "realm=r" / "date=2026-01-01"
    assert [p.name for p in folder.iterdir()] == [".part-0.jsonl"]
    now[0] = DAY1 + 60
    check()  # no record follows: the check alone closes the part
    writer.close()
    assert [p.name for p in folder.iterdir()] == ["part-0.jsonl"]


def test_an_idle_routers_part_closes_within_its_rotation_time_plus_a_second(tmp_path):
    """A part the router opened closes on its own, with no record after it: a reader of
    closed parts sees the records of an idle router."""
    age = 1.0
    router = RouterProcess(tmp_path, [realm_file("realm1")], extra_config={
        "eventlog": {"flush_interval": 0.1, "max_file_age": age}}).start()
    day = router.workdir / "data" / "eventlog" / "realm=realm1"

    def seen(pattern: str, timeout: float = 30.0) -> float:
        """When a file matching ``pattern`` first appears (polled every 10 ms)."""
        deadline = time.monotonic() + timeout
        while not list(day.glob(pattern)):
            assert time.monotonic() < deadline, f"no {pattern} within {timeout}s"
            time.sleep(0.01)
        return time.monotonic()

    async def one_publish():
        client = await connect(router, "websocket", "json")
        await client.publish("com.log.once", 1, options=PublishOptions(acknowledge=True))
        await client.close()

    try:
        run(one_publish())
        opened = seen("date=*/*part-0.jsonl")  # open (or closed already)
        closed = seen("date=*/part-0.jsonl")
    finally:
        assert router.stop() == 0
    assert closed - opened <= age + 1.0, f"closed {closed - opened:.2f} s after it was seen open"
    assert "com.log.once" in [r.get("topic") for r in read_records(router.workdir / "data"
                                                                    / "eventlog")]


class FullDisk(DiskFile):
    """A file whose writes fail with ENOSPC until the test makes room."""

    room = threading.Event()

    def write(self, data: bytes) -> int:
        if not FullDisk.room.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_batch_a_full_disk_refuses_is_counted_and_the_writer_goes_on(tmp_path):
    """A batch failing with OSError was logged as a bug and never counted as written: the
    backlog stayed up for good, so after max_queued_records more every record was dropped,
    the disk's room back or not. It is counted as dropped, and later batches are written."""
    FullDisk.room.clear()
    writer = EventLogWriter(tmp_path, opener=FullDisk, max_queued_records=10)
    writer.incidents = Incidents()
    for n in range(5):
        writer.append("r", {"ts": DAY1 + n, "kind": "publish", "topic": f"lost{n}"})
    writer.flush()
    deadline = time.monotonic() + 30
    while writer.backlog and time.monotonic() < deadline:
        time.sleep(0.01)  # the writer thread settles the batch
    assert writer.backlog == 0
    assert writer.incidents.totals[("r", "eventlog", EVENTLOG_DROPPED)] == 5
    FullDisk.room.set()
    for n in range(10):  # as many as max_queued_records: none dropped
        writer.append("r", {"ts": DAY1 + 10 + n, "kind": "publish", "topic": f"kept{n}"})
    writer.close()
    assert writer.incidents.totals[("r", "eventlog", EVENTLOG_DROPPED)] == 5
    assert [r["topic"] for r in read_records(tmp_path)] == [f"kept{n}" for n in range(10)]


def test_a_record_orjson_cannot_write_costs_neither_its_batch_nor_the_backlog(tmp_path):
    """A lone surrogate (an HTTP publish's JSON topic "a.\\ud800") made orjson raise for the
    whole batch: the other clients' records in it were lost, and, never counted as written,
    they stayed in the backlog for good (at max_queued_records every later record is
    dropped). It is written with the surrogate escaped, as JSON can."""
    writer = EventLogWriter(tmp_path)
    writer.append("r", {"ts": DAY1, "kind": "publish", "topic": "before"})
    writer.append("r", {"ts": DAY1 + 1, "kind": "publish", "topic": "a.\ud800"})
    writer.append("r", {"ts": DAY1 + 2, "kind": "publish", "topic": "after"})
    writer.close()
    assert [r["topic"] for r in read_records(tmp_path)] == ["before", "a.\ud800", "after"]
    assert writer.backlog == 0
