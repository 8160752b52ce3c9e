"""Engine cost: one node embedded vs one node on Redis vs two nodes on Redis.

Starts its own redis-server (free port, nothing saved) and router nodes from this checkout.
One WAMP publisher on node 1; the subscribers (each its own process) all on node 1, or
split over both nodes in the two-node case. Reports delivered events/s and the CPU
seconds per delivered event of the routers (all nodes) and of redis-server.

    .venv/bin/python bench/cluster.py --subscribers 10 --events 5000
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fanout import (Endpoint, format_report, latency_report, proc_stats,  # noqa: E402
                          publish_concurrently, subscriber_main)
from tests.clients import raw_connect  # noqa: E402
from tests.harness import RedisServer, RouterProcess, realm_file  # noqa: E402

TRANSPORT, SERIALIZER = "rawsocket", "msgpack"
PROBE_TOPIC = "probe.interest"


def endpoint(node: RouterProcess) -> Endpoint:
    return Endpoint(TRANSPORT, *node.address(TRANSPORT))


async def interest_known(publisher_node: RouterProcess, subscriber_node: RouterProcess) -> None:
    """Publish probes on the publisher's node until a subscriber on the other node gets one:
    then the publisher's node knows every subscription made there before."""
    listener = await raw_connect(endpoint(subscriber_node), TRANSPORT, SERIALIZER, lean=True)
    publisher = await raw_connect(endpoint(publisher_node), TRANSPORT, SERIALIZER, lean=True)
    for client in (listener, publisher):
        await client.hello()
    listener.send([32, 1, {}, PROBE_TOPIC])
    await listener.recv()
    for request in range(1, 1000):
        publisher.send([16, request, {}, PROBE_TOPIC, []])
        try:
            await listener.recv(timeout=0.05)
            break
        except asyncio.TimeoutError:
            continue
    for client in (listener, publisher):
        client.close()


def measure(nodes: list[RouterProcess], subscribers: int, events: int, redis_pid: int | None,
            name: str) -> dict:
    """Subscribers round-robin over ``nodes``, one publisher on ``nodes[0]``."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=subscriber_main,
                           args=(endpoint(nodes[i % len(nodes)]), TRANSPORT, SERIALIZER,
                                 events, ready, results, "bench.fanout", {}, 30.0))
               for i in range(subscribers)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    if len(nodes) > 1:
        asyncio.run(interest_known(nodes[0], nodes[1]))
    pids = [node.proc.pid for node in nodes] + ([redis_pid] if redis_pid else [])
    cpu_before = [proc_stats(pid)[0] for pid in pids]
    first = asyncio.run(publish_concurrently(endpoint(nodes[0]), TRANSPORT, SERIALIZER, 1,
                                             events, None))
    latencies, last = [], first
    for _ in workers:
        received, arrival = results.get(timeout=240)
        latencies.extend(received)
        last = max(last, arrival)
    for worker in workers:
        worker.join(timeout=10)
    cpu = [proc_stats(pid)[0] - before for pid, before in zip(pids, cpu_before)]
    delivered = max(1, len(latencies))
    report = {"setup": name, "subscribers": subscribers, "delivered": len(latencies),
              "lost": subscribers * events - len(latencies),
              "events_per_s": len(latencies) / max(last - first, 1e-6),
              **latency_report(latencies),
              "router_cpu_us_per_event": sum(cpu[:len(nodes)]) / delivered * 1e6}
    if redis_pid:
        report["redis_cpu_us_per_event"] = cpu[-1] / delivered * 1e6
    return report


def start_nodes(base: Path, count: int, redis_url: str | None) -> list[RouterProcess]:
    nodes = []
    for index in range(count):
        extra = {"eventlog": {"enabled": False}}
        if redis_url is not None:
            extra["engine"] = {"type": "redis", "url": redis_url, "node": f"n{index + 1}"}
        nodes.append(RouterProcess(base / f"n{index + 1}", [realm_file("realm1")],
                                   extra_config=extra).start())
    return nodes


def run_setups(prefix: str, setups: tuple[tuple[str, int, bool], ...],
               measure_one: Callable[[str, list[RouterProcess], int | None], dict]) -> None:
    """Start a redis-server, then each setup's ``(name, nodes, on Redis)`` nodes in turn;
    print what ``measure_one(name, nodes, redis pid or None)`` reports."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    redis = RedisServer(base)
    try:
        for index, (name, count, on_redis) in enumerate(setups):
            nodes = start_nodes(base / f"setup{index}", count, redis.url if on_redis else None)
            try:
                report = measure_one(name, nodes, redis.proc.pid if on_redis else None)
                print(format_report(report), flush=True)
            finally:
                for node in nodes:
                    node.stop()
    finally:
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    run_setups("bench-cluster-", (("embedded, 1 node", 1, False), ("redis, 1 node", 1, True),
                                  ("redis, 2 nodes", 2, True)),
               lambda name, nodes, redis_pid: measure(nodes, args.subscribers, args.events,
                                                      redis_pid, name))


if __name__ == "__main__":
    main()
