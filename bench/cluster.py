"""Engine cost: one node embedded vs one node on Redis vs two nodes on Redis.

Starts its own redis-server (free port, nothing saved) and router nodes from this checkout.
Scenario ``fanout`` (default): one WAMP publisher on node 1; the subscribers (each its own
process) all on node 1, or split over both nodes in the two-node case. Reports delivered
events/s and the CPU seconds per delivered event of the routers (all nodes) and of
redis-server.

Scenario ``persistent``: MQTT persistent sessions (clean session 0, QoS 1 subscriptions,
each its own process) on the last node, one QoS 1 publisher on node 1 (the same node when
there is one) keeping ``--window`` messages unacknowledged. Every delivery is queued in the
session's store (SQLite embedded, Redis otherwise) and the PUBACK waits for it: reports
delivered messages/s, the publisher's PUBACK latency p50/p99 and the CPU per delivery.

    .venv/bin/python bench/cluster.py --subscribers 10 --events 5000
    .venv/bin/python bench/cluster.py --scenario persistent --subscribers 4 --events 5000
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import paho.mqtt.client as mqtt

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


MQTT_TOPIC = "bench/persistent"


def _mqtt(client_id: str, clean: bool) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                       protocol=mqtt.MQTTv311, clean_session=clean)


def persistent_subscriber(address: tuple[str, int], client_id: str, messages: int, ready,
                          results, timeout: float = 120.0) -> None:
    """A persistent session's client (its own process): ``(distinct messages, last
    arrival)`` once it has every message (QoS 0 probes do not count)."""
    seen: set[int] = set()
    last = [0.0]
    done, subscribed = threading.Event(), threading.Event()

    def on_message(client, userdata, message) -> None:
        if len(message.payload) >= 8:
            seen.add(struct.unpack("!Q", message.payload[:8])[0])
            last[0] = time.time()
            if len(seen) >= messages:
                done.set()

    client = _mqtt(client_id, clean=False)
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    client.connect(*address, keepalive=60)
    client.loop_start()
    client.subscribe(MQTT_TOPIC, qos=1)
    subscribed.wait(30)
    ready.put(True)
    done.wait(timeout)
    client.disconnect()
    client.loop_stop()
    results.put((len(seen), last[0]))


def mqtt_interest_known(publisher_node: RouterProcess, node: RouterProcess) -> None:
    """QoS 0 probes on ``publisher_node`` until a client on ``node`` gets one: then
    ``publisher_node`` knows the subscriptions made on ``node`` before."""
    arrived, subscribed = threading.Event(), threading.Event()
    listener = _mqtt(f"bench-listener-{time.monotonic_ns()}", clean=True)
    listener.on_message = lambda *args: arrived.set()
    listener.on_subscribe = lambda *args: subscribed.set()
    publisher = _mqtt(f"bench-probe-{time.monotonic_ns()}", clean=True)
    for client, at in ((listener, node), (publisher, publisher_node)):
        client.connect(*at.address("mqtt")[:2], keepalive=60)
        client.loop_start()
    listener.subscribe(MQTT_TOPIC, qos=0)
    subscribed.wait(30)
    while not arrived.wait(0.05):
        publisher.publish(MQTT_TOPIC, b"probe", qos=0)
    for client in (listener, publisher):
        client.disconnect()
        client.loop_stop()


def measure_persistent(nodes: list[RouterProcess], subscribers: int, messages: int,
                       window: int, redis_pid: int | None, name: str) -> dict:
    """Persistent QoS 1 subscribers on ``nodes[-1]``, the publisher on ``nodes[0]``."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    tag = f"{name.replace(' ', '').replace(',', '-')}-{time.monotonic_ns()}"
    workers = [ctx.Process(target=persistent_subscriber,
                           args=(nodes[-1].address("mqtt")[:2], f"bench-{tag}-{i}", messages,
                                 ready, results))
               for i in range(subscribers)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    credit = threading.Semaphore(window)
    sent_at: dict[int, float] = {}
    acked_at: dict[int, float] = {}
    """Packet id -> when it was published / acknowledged (ids are not reused: fewer
    than 65,535 messages)."""

    def on_publish(client, userdata, mid, reason_code, properties) -> None:
        acked_at[mid] = time.time()
        credit.release()

    publisher = _mqtt(f"bench-pub-{tag}", clean=True)
    publisher.max_inflight_messages_set(window)
    publisher.on_publish = on_publish
    publisher.connect(*nodes[0].address("mqtt")[:2], keepalive=60)
    publisher.loop_start()
    if len(nodes) > 1:
        mqtt_interest_known(nodes[0], nodes[-1])
    pids = [node.proc.pid for node in nodes] + ([redis_pid] if redis_pid else [])
    cpu_before = [proc_stats(pid)[0] for pid in pids]
    first = time.time()
    for number in range(messages):
        credit.acquire()
        started = time.time()
        sent_at[publisher.publish(MQTT_TOPIC, struct.pack("!Q", number) + b"x" * 56,
                                  qos=1).mid] = started
    distinct, last = 0, first
    for _ in workers:
        count, arrival = results.get(timeout=240)
        distinct += count
        last = max(last, arrival)
    for worker in workers:
        worker.join(timeout=10)
    publisher.disconnect()
    publisher.loop_stop()
    cpu = [proc_stats(pid)[0] - before for pid, before in zip(pids, cpu_before)]
    delivered = max(1, distinct)
    latency = latency_report([acked_at[mid] - started for mid, started in sent_at.items()
                              if mid in acked_at])
    report = {"setup": name, "subscribers": subscribers, "delivered": distinct,
              "lost": subscribers * messages - distinct,
              "msgs_per_s": distinct / max(last - first, 1e-6),
              "puback_p50_ms": latency["p50_ms"], "puback_p99_ms": latency["p99_ms"],
              "router_cpu_us_per_msg": sum(cpu[:len(nodes)]) / delivered * 1e6}
    if redis_pid:
        report["redis_cpu_us_per_msg"] = cpu[-1] / delivered * 1e6
    return report


def start_nodes(base: Path, count: int, redis_url: str | None,
                listeners: list[dict] | None = None) -> list[RouterProcess]:
    nodes = []
    for index in range(count):
        extra = {"eventlog": {"enabled": False}}
        if redis_url is not None:
            extra["engine"] = {"type": "redis", "url": redis_url, "node": f"n{index + 1}"}
        nodes.append(RouterProcess(base / f"n{index + 1}", [realm_file("realm1")],
                                   listeners=listeners, extra_config=extra).start())
    return nodes


def run_setups(prefix: str, setups: tuple[tuple[str, int, bool], ...],
               measure_one: Callable[[str, list[RouterProcess], int | None], dict],
               listeners: list[dict] | None = None) -> None:
    """Start a redis-server, then each setup's ``(name, nodes, on Redis)`` nodes in turn
    (with ``listeners``, or the harness's); print what ``measure_one(name, nodes, redis pid
    or None)`` reports."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    redis = RedisServer(base)
    try:
        for index, (name, count, on_redis) in enumerate(setups):
            nodes = start_nodes(base / f"setup{index}", count, redis.url if on_redis else None,
                                listeners)
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
    parser.add_argument("--scenario", choices=("fanout", "persistent"), default="fanout")
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--events", type=int, default=5000,
                        help="events (fanout) or messages (persistent) published")
    parser.add_argument("--window", type=int, default=100,
                        help="persistent: QoS 1 messages the publisher has unacknowledged")
    args = parser.parse_args()
    setups = (("embedded, 1 node", 1, False), ("redis, 1 node", 1, True),
              ("redis, 2 nodes", 2, True))
    if args.scenario == "persistent":
        run_setups("bench-persistent-", setups,
                   lambda name, nodes, redis_pid: measure_persistent(
                       nodes, args.subscribers, args.events, args.window, redis_pid, name),
                   [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}])
        return
    run_setups("bench-cluster-", setups,
               lambda name, nodes, redis_pid: measure(nodes, args.subscribers, args.events,
                                                      redis_pid, name))


if __name__ == "__main__":
    main()
