"""WAMP fan-out: one publisher, N subscribers, each in its own process.

Reports delivered events/s, latency p50/p99 (publish timestamp carried in the
payload), and the router's CPU seconds per delivered event and peak RSS read
from /proc. Starts the router from this checkout unless --rawsocket/--websocket
points at a running one (then pass --pid to get CPU and memory figures).

    .venv/bin/python bench/fanout.py --subscribers 10 --events 20000
"""

from __future__ import annotations

import argparse
import asyncio
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


class Endpoint:
    def __init__(self, transport: str, host: str, port: int, path: str = "/ws") -> None:
        self._address = (host, port, path)

    def address(self, transport: str):
        return self._address


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return cpu, peak


def subscriber_main(endpoint, transport, serializer, events, ready, results) -> None:
    async def run():
        client = await raw_connect(endpoint, transport, serializer)
        assert (await client.hello())[0] == 2
        client.send([32, 1, {}, TOPIC])
        assert (await client.recv())[0] == 33
        ready.put(True)
        latencies = []
        while len(latencies) < events:
            message = await client.recv(timeout=120)
            latencies.append(time.time() - message[4][0])
        client.close()
        results.put(latencies)

    asyncio.run(run())


async def publish_all(endpoint, transport, serializer, events: int, rate: float | None) -> float:
    client = await raw_connect(endpoint, transport, serializer)
    assert (await client.hello())[0] == 2
    started = time.perf_counter()
    for n in range(events):
        client.send([16, n + 1, {}, TOPIC, [time.time(), n]])
        if n % 200 == 0:
            await asyncio.sleep(0)
        if rate:
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    client.send([16, events + 1, {"acknowledge": True}, "bench.done"])
    await client.recv(timeout=120)
    return time.perf_counter() - started


def run_scenario(endpoint, transport, serializer, subscribers, events, rate, pid) -> dict:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=subscriber_main,
                           args=(endpoint, transport, serializer, events, ready, results))
               for _ in range(subscribers)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    cpu_before = proc_stats(pid)[0] if pid else None
    started = time.perf_counter()
    asyncio.run(publish_all(endpoint, transport, serializer, events, rate))
    latencies = []
    for _ in workers:
        latencies.extend(results.get(timeout=300))
    elapsed = time.perf_counter() - started
    for worker in workers:
        worker.join()
    delivered = len(latencies)
    report = {"transport": transport, "serializer": serializer, "subscribers": subscribers,
              "delivered": delivered, "events_per_s": delivered / elapsed,
              "p50_ms": statistics.median(latencies) * 1000,
              "p99_ms": statistics.quantiles(latencies, n=100)[98] * 1000}
    if pid:
        cpu_after, peak = proc_stats(pid)
        report["cpu_us_per_event"] = (cpu_after - cpu_before) / delivered * 1e6
        report["peak_rss_mb"] = peak / 2**20
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rate", type=float, help="publish at most this many events/s")
    parser.add_argument("--pairs", default="rawsocket:msgpack,websocket:json",
                        help="comma-separated transport:serializer pairs")
    parser.add_argument("--rawsocket", help="HOST:PORT of a running router")
    parser.add_argument("--websocket", help="HOST:PORT/PATH of a running router")
    parser.add_argument("--pid", type=int, help="pid of the running router (CPU, RSS)")
    parser.add_argument("--no-eventlog", action="store_true",
                        help="start the router with the event log off (to measure its cost)")
    args = parser.parse_args()
    router = None
    if not (args.rawsocket or args.websocket):
        router = RouterProcess(Path(tempfile.mkdtemp(prefix="bench-fanout-")),
                               [realm_file("realm1")],
                               extra_config={"eventlog": {"enabled": not args.no_eventlog}}
                               ).start()
    try:
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
            endpoint = Endpoint(transport, host, port, path)
            report = run_scenario(endpoint, transport, serializer, args.subscribers,
                                  args.events, args.rate, pid)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in report.items()), flush=True)
    finally:
        if router is not None:
            router.stop()


if __name__ == "__main__":
    main()
