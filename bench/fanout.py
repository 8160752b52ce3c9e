"""WAMP fan-out: P publishers, N subscribers, each subscriber in its own process.

Reports delivered events/s, latency p50/p99 (publish timestamp carried in the
payload), and the router's CPU seconds per delivered event and peak RSS read
from /proc. Starts the router from this checkout unless --rawsocket/--websocket
points at a running one (then pass --pid to get CPU and memory figures).

    .venv/bin/python bench/fanout.py --subscribers 10 --events 20000
    .venv/bin/python bench/fanout.py --publishers 4 --subscribers 4 --events 5000
    .venv/bin/python bench/fanout.py --match prefix    # subscribers subscribe to "bench."
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.clients import raw_connect  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

TOPIC = "bench.fanout"
DONE_TOPIC = "benchmark.done"  # outside the "bench." prefix that --match subscribes to
PUBLISH_BATCH = 20  # publishes per socket write: a busy publisher, not one syscall per event


class Endpoint:
    def __init__(self, transport: str, host: str, port: int, path: str = "/ws") -> None:
        self._address = (host, port, path)

    def address(self, transport: str):
        return self._address


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its living descendants (a broker's worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(children.get(current, []))
    return tree


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _task_cpu(member: int) -> float:
    """CPU seconds of one process, every thread: ``schedstat``'s nanoseconds where the
    kernel has them (a 10,000-message scenario of Mosquitto is a few 10 ms ticks of
    ``stat``, too coarse for a ratio), else ``stat``'s user + system ticks."""
    tasks = Path(f"/proc/{member}/task")
    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in tasks.iterdir()) / 1e9
    except (OSError, IndexError, ValueError):
        fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its descendants (see :func:`_task_cpu`)."""
    cpu = 0.0
    for member in process_tree(pid):
        try:
            cpu += _task_cpu(member)
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return cpu


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of a process and its descendants, from /proc."""
    peak = 0
    for member in process_tree(pid):
        try:
            peak += _status_kb(member, "VmHWM") * 1024
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return cpu_seconds(pid), peak


def current_rss(pid: int) -> int:
    """Resident bytes now of a process and its descendants."""
    return sum(_status_kb(member, "VmRSS") * 1024 for member in process_tree(pid))


class BrokerMeter:
    """CPU seconds and peak RSS of a broker's process tree over one scenario.

    The kernel's peak-RSS mark is reset at the start (``clear_refs`` 5), so the peak is the
    scenario's own; where that is not permitted it is the process's lifetime peak.
    """

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        if pid:
            for member in process_tree(pid):
                try:
                    Path(f"/proc/{member}/clear_refs").write_text("5")
                except OSError:
                    pass
            self.cpu_before = proc_stats(pid)[0]

    def report(self, delivered: int, unit: str = "event") -> dict:
        """``cpu_us_per_<unit>`` and ``peak_rss_mb``, or nothing without a pid."""
        if not self.pid:
            return {}
        cpu_after, peak = proc_stats(self.pid)
        return {f"cpu_us_per_{unit}": (cpu_after - self.cpu_before) / max(1, delivered) * 1e6,
                "peak_rss_mb": peak / 2**20}


def subscriber_main(endpoint, transport, serializer, events, ready, results,
                    topic=TOPIC, options=None, idle_timeout=120.0) -> None:
    """Subscribe (with ``options``, e.g. match=prefix) and collect latencies of ``events``
    events; gives up after ``idle_timeout`` s without one and reports what it got."""
    async def run():
        client = await raw_connect(endpoint, transport, serializer, lean=True)
        assert (await client.hello())[0] == 2
        client.send([32, 1, options or {}, topic])
        assert (await client.recv())[0] == 33
        ready.put(True)
        latencies, last_arrival = [], 0.0
        while len(latencies) < events:
            try:
                message = await client.recv(timeout=idle_timeout)
            except asyncio.TimeoutError:
                break
            last_arrival = time.time()
            latencies.append(last_arrival - message[4][0])
        client.close()
        results.put((latencies, last_arrival))

    asyncio.run(run())


async def publish_all(endpoint, transport, serializer, events: int, rate: float | None,
                      topic: str = TOPIC) -> float:
    """Publish ``events`` events; the wall-clock time of the first publish."""
    client = await raw_connect(endpoint, transport, serializer, lean=True)
    assert (await client.hello())[0] == 2
    first_publish = time.time()
    started = time.perf_counter()
    for first in range(0, events, PUBLISH_BATCH):
        client.send_many([[16, n + 1, {}, topic, [time.time(), n]]
                          for n in range(first, min(first + PUBLISH_BATCH, events))])
        await asyncio.sleep(0)
        if rate:
            delay = started + (first + PUBLISH_BATCH) / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    client.send([16, events + 1, {"acknowledge": True}, DONE_TOPIC])
    await client.recv(timeout=120)
    return first_publish


async def publish_concurrently(endpoint, transport, serializer, publishers: int, events: int,
                               rate: float | None) -> float:
    """``publishers`` sessions, each publishing ``events`` events at once; the wall-clock
    time of the first publish."""
    return min(await asyncio.gather(*(publish_all(endpoint, transport, serializer, events, rate)
                                      for _ in range(publishers))))


def latency_report(latencies: list[float]) -> dict:
    """p50 and p99 in milliseconds (zero when nothing arrived)."""
    if len(latencies) < 2:
        return {"p50_ms": 0.0, "p99_ms": 0.0}
    return {"p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": statistics.quantiles(latencies, n=100)[98] * 1000}


def collect_results(results, workers: int, first_publish: float,
                    timeout: float) -> tuple[list[float], float]:
    """Every receiver process's (latencies, last arrival) from ``results``: all latencies,
    and the last arrival of any (``first_publish`` if none arrived)."""
    latencies, last_delivery = [], first_publish
    for _ in range(workers):
        received, last_arrival = results.get(timeout=timeout)
        latencies.extend(received)
        last_delivery = max(last_delivery, last_arrival)
    return latencies, last_delivery


def stop_workers(workers) -> None:
    """Join each process, killing one that has not ended within 10 s."""
    for worker in workers:
        worker.join(timeout=10)
        if worker.is_alive():
            worker.kill()


def run_scenario(endpoint, transport, serializer, subscribers, events, rate, pid,
                 publishers=1, match=None, idle_timeout=120.0) -> dict:
    """``publishers`` sessions each publish ``events`` events to ``subscribers`` processes.

    With ``match="prefix"`` the subscribers subscribe to the topic's prefix ("bench.").
    """
    topic, options = (TOPIC, {}) if match is None else (TOPIC.split(".")[0] + ".",
                                                        {"match": match})
    expected = publishers * events
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=subscriber_main,
                           args=(endpoint, transport, serializer, expected, ready, results,
                                 topic, options, idle_timeout))
               for _ in range(subscribers)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=60)
        meter = BrokerMeter(pid)
        first_publish = asyncio.run(asyncio.wait_for(
            publish_concurrently(endpoint, transport, serializer, publishers, events, rate),
            timeout=idle_timeout + 60))
        latencies, last_delivery = collect_results(results, len(workers), first_publish,
                                                   idle_timeout + 180)
        elapsed = max(last_delivery - first_publish, 1e-6)
    finally:
        stop_workers(workers)
    delivered = len(latencies)
    report = {"transport": transport, "serializer": serializer, "publishers": publishers,
              "subscribers": subscribers, "delivered": delivered,
              "lost": subscribers * expected - delivered,
              "events_per_s": delivered / elapsed, **latency_report(latencies)}
    report.update(meter.report(delivered))
    return report


def format_report(report: dict) -> str:
    """One ``key=value`` line, floats with two decimals."""
    return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in report.items())


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """--pairs, --rawsocket, --websocket, --pid: which router and which transports."""
    parser.add_argument("--pairs", default="rawsocket:msgpack,websocket:json",
                        help="comma-separated transport:serializer pairs")
    parser.add_argument("--rawsocket", help="HOST:PORT of a running router")
    parser.add_argument("--websocket", help="HOST:PORT/PATH of a running router")
    parser.add_argument("--pid", type=int, help="pid of the running router (CPU, RSS)")


@contextlib.contextmanager
def wamp_targets(args, eventlog: bool = True):
    """Yield (transport, serializer, endpoint, pid) per --pairs entry: the running router
    given by --rawsocket/--websocket/--pid, or a router from this checkout started here."""
    router = None
    if not (args.rawsocket or args.websocket):
        router = RouterProcess(Path(tempfile.mkdtemp(prefix="bench-wamp-")),
                               [realm_file("realm1")],
                               extra_config={"eventlog": {"enabled": eventlog}}).start()
    try:
        targets = []
        for pair in args.pairs.split(","):
            transport, serializer = pair.split(":")
            if router is not None:
                host, port, path = router.address(transport)
                pid = router.proc.pid
            else:
                given = args.rawsocket if transport == "rawsocket" else args.websocket
                hostport, _, path = given.partition("/")
                host, port = hostport.rsplit(":", 1)
                port, path, pid = int(port), "/" + path, args.pid
            targets.append((transport, serializer, Endpoint(transport, host, port, path), pid))
        yield targets
    finally:
        if router is not None:
            router.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--events", type=int, default=20000,
                        help="events per publisher")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--match", choices=["prefix", "wildcard"],
                        help="subscribe with this match policy instead of exact")
    parser.add_argument("--rate", type=float, help="each publisher: at most this many events/s")
    add_target_arguments(parser)
    parser.add_argument("--no-eventlog", action="store_true",
                        help="start the router with the event log off (to measure its cost)")
    args = parser.parse_args()
    with wamp_targets(args, eventlog=not args.no_eventlog) as targets:
        for transport, serializer, endpoint, pid in targets:
            report = run_scenario(endpoint, transport, serializer, args.subscribers,
                                  args.events, args.rate, pid, args.publishers, args.match)
            print(format_report(report), flush=True)


if __name__ == "__main__":
    main()
