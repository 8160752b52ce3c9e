"""N retained QoS 1 publishes, then a '#' subscriber over them: the broker's CPU per
message in each phase, ours against Mosquitto in one run (brokers alternating per round).

Phase 1: ``--publishers`` paho clients publish ``--messages`` retained QoS 1 messages on
distinct topics, each with at most ``--inflight`` unacknowledged (1: every PUBACK waits for
its own commit, the figure of issue 28; paho's default is 20). Our PUBACK means the
retained message is committed to SQLite; Mosquitto runs with ``persistence false`` and
keeps them in memory. Phase 2: one MQTT 3.1.1 client subscribes to '#' (QoS 0) and
receives them all. CPU is the broker's whole process (every thread), in nanoseconds
(``bench.fanout.cpu_seconds``); the publish phase's is also split between the process's
main thread (ours: the reactor; Mosquitto: all of it) and its other threads (ours: the
SQLite writer, which commits and syncs what the PUBACKs promise).

    .venv/bin/python bench/retained_qos1.py --messages 10000 --inflight 1 --rounds 3
    .venv/bin/python bench/retained_qos1.py --inflight 20 --publishers 4 --broker ours
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paho.mqtt.client as mqtt  # noqa: E402

from bench.compare import MosquittoBroker, OurRouter, ensure_mosquitto  # noqa: E402
from bench.fanout import cpu_seconds  # noqa: E402
from bench.mqtt_fanout import retained_arrivals  # noqa: E402


def publish_retained(host: str, port: int, count: int, publishers: int, inflight: int,
                     timeout: float = 600.0) -> None:
    """``count`` retained QoS 1 messages on distinct topics from ``publishers`` clients in
    parallel; returns once every PUBACK is in."""
    def one(index: int) -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-rq1-{index}",
                             protocol=mqtt.MQTTv311, clean_session=True)
        client.max_inflight_messages_set(inflight)
        client.max_queued_messages_set(0)
        client.connect(host, port, keepalive=60)
        client.loop_start()
        try:
            infos = [client.publish(f"bench/rq1/p{index}/sensor{n}", b"21.5C", qos=1,
                                    retain=True) for n in range(index, count, publishers)]
            for info in infos:
                info.wait_for_publish(timeout)
                # paho returns from the wait at the timeout: a publish never acknowledged
                # would otherwise count as done in the publishes/s and CPU per message
                if not info.is_published():
                    raise RuntimeError(f"publisher {index}: a retained publish was not "
                                       f"acknowledged within {timeout:g} s")
        finally:
            client.disconnect()
            client.loop_stop()

    with ThreadPoolExecutor(publishers) as pool:
        list(pool.map(one, range(publishers)))  # re-raises a publisher's error


def main_thread_seconds(pid: int) -> float:
    """CPU seconds of the process's main thread alone (``schedstat``'s nanoseconds)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def run_once(broker, count: int, publishers: int, inflight: int) -> dict:
    host, port, _ = broker.address("mqtt")
    before, started = cpu_seconds(broker.pid), time.perf_counter()
    main_before = main_thread_seconds(broker.pid)
    publish_retained(host, port, count, publishers, inflight)
    published, took = cpu_seconds(broker.pid), time.perf_counter() - started
    main = main_thread_seconds(broker.pid) - main_before
    arrivals = retained_arrivals(host, port, count, idle_timeout=10.0)
    delivered = cpu_seconds(broker.pid)
    return {"publish us/msg": (published - before) / count * 1e6,
            "main thread": main / count * 1e6,
            "other threads": (published - before - main) / count * 1e6,
            "publishes/s": count / took,
            "deliver us/msg": (delivered - published) / max(1, len(arrivals)) * 1e6,
            "delivered/s": len(arrivals) / arrivals[-1] if arrivals else 0.0,
            "lost": count - len(arrivals),
            "total us/msg": (delivered - before) / count * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", choices=("both", "ours", "mosquitto"), default="both")
    args = parser.parse_args()
    executable = None
    if args.broker != "ours":
        executable, why = ensure_mosquitto()
        if executable is None:
            sys.exit(f"mosquitto: {why}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-rq1-"))
    results: dict[str, list[dict]] = {}
    for number in range(args.rounds):
        for name in ("ours", "mosquitto"):
            if args.broker not in ("both", name):
                continue
            here = workdir / f"{name}{number}"
            broker = (OurRouter(here, mqtt=True) if name == "ours"
                      else MosquittoBroker(executable, here))
            try:
                report = run_once(broker, args.messages, args.publishers, args.inflight)
            finally:
                broker.stop()
            print(f"round {number + 1} {name}: " + ", ".join(
                f"{key} {value:,.1f}" for key, value in report.items()), flush=True)
            results.setdefault(name, []).append(report)
    print(f"\n{args.messages:,} retained QoS 1, {args.publishers} publisher(s), inflight "
          f"{args.inflight}; medians of {args.rounds} round(s)")
    keys = list(next(iter(results.values()))[0])
    print("| broker | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for name, reports in results.items():
        print(f"| {name} | " + " | ".join(
            f"{statistics.median(r[key] for r in reports):,.1f}" for key in keys) + " |")


if __name__ == "__main__":
    main()
