"""MQTT fan-out at QoS 0, 1 and 2 against any broker: messages/s, latency, losses;
and a '#' subscription over N retained messages (--retained N).

One publisher, N subscriber processes (paho-mqtt). The publish time travels in the
payload. Starts our router from this checkout unless --broker HOST:PORT is given
(e.g. a mosquitto started with `mosquitto -p 1884`); --pid adds the broker's CPU
seconds per delivered message and peak RSS from /proc.

    .venv/bin/python bench/mqtt_fanout.py --subscribers 4 --messages 5000
    .venv/bin/python bench/mqtt_fanout.py --qos "" --retained 10000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paho.mqtt.client as mqtt  # noqa: E402

from bench.fanout import BrokerMeter, format_report, latency_report  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

TOPIC = "bench/mqtt"


def _client(name: str) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name,
                       protocol=mqtt.MQTTv311, clean_session=True)


def subscriber_main(host, port, qos, messages, index, ready, results,
                    timeout=120.0) -> None:
    received: list[float] = []
    seen: set[int] = set()
    last_arrival = [0.0]
    done = threading.Event()
    subscribed = threading.Event()

    def on_message(client, userdata, message):
        sent_at, number = struct.unpack("!dQ", message.payload[:16])
        last_arrival[0] = time.time()
        received.append(last_arrival[0] - sent_at)
        seen.add(number)
        if len(seen) >= messages:
            done.set()

    client = _client(f"bench-sub-{index}-{qos}")
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    client.connect(host, port, keepalive=60)
    client.loop_start()
    client.subscribe(TOPIC, qos=qos)
    subscribed.wait(30)
    ready.put(True)
    done.wait(timeout)
    client.disconnect()
    client.loop_stop()
    results.put((received, len(seen), last_arrival[0]))


def run_qos(host, port, qos, subscribers, messages, pid, timeout=120.0) -> dict:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=subscriber_main,
                           args=(host, port, qos, messages, i, ready, results, timeout))
               for i in range(subscribers)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    publisher = _client(f"bench-pub-{qos}")
    publisher.max_inflight_messages_set(100)
    publisher.max_queued_messages_set(0)
    publisher.connect(host, port, keepalive=60)
    publisher.loop_start()
    meter = BrokerMeter(pid)
    first_publish = time.time()
    infos = [publisher.publish(TOPIC, struct.pack("!dQ", time.time(), n) + b"x" * 48, qos=qos)
             for n in range(messages)]
    for info in infos:
        info.wait_for_publish(timeout)
    latencies, distinct, last_delivery = [], [], first_publish
    for _ in workers:
        received, count, last_arrival = results.get(timeout=timeout + 60)
        latencies.extend(received)
        distinct.append(count)
        last_delivery = max(last_delivery, last_arrival)
    elapsed = max(last_delivery - first_publish, 1e-6)  # not the clients' disconnects
    publisher.disconnect()
    publisher.loop_stop()
    for worker in workers:
        worker.join()
    report = {"qos": qos, "subscribers": subscribers, "delivered": len(latencies),
              "lost": subscribers * messages - sum(distinct),
              "duplicates": len(latencies) - sum(distinct),
              "msgs_per_s": len(latencies) / elapsed,
              **latency_report(latencies)}
    report.update(meter.report(len(latencies), unit="msg"))
    return report


def retained_arrivals(host, port, count, idle_timeout=10.0) -> list[float]:
    """Subscribe to '#' (QoS 0, MQTT 3.1.1) and wait for ``count`` messages with the retain
    flag; their arrival times after SUBSCRIBE (fewer after ``idle_timeout`` s of silence)."""
    arrivals: list[float] = []
    done = threading.Event()
    started = 0.0

    def on_message(client, userdata, message):
        if message.retain:
            arrivals.append(time.perf_counter() - started)
        if len(arrivals) >= count:
            done.set()

    subscriber = _client("bench-retain-sub")
    subscriber.on_message = on_message
    subscriber.connect(host, port, keepalive=60)
    subscriber.loop_start()
    started = time.perf_counter()
    subscriber.subscribe("#", qos=0)
    while not done.wait(idle_timeout):
        if not arrivals or time.perf_counter() - started - arrivals[-1] > idle_timeout:
            break
    subscriber.disconnect()
    subscriber.loop_stop()
    return arrivals


def run_retained_wildcard(host, port, count, pid, idle_timeout=10.0) -> dict:
    """Retain ``count`` messages on distinct topics, then subscribe to '#' and time the
    retained messages from SUBSCRIBE (a fresh broker: '#' also gets any older ones)."""
    publisher = _client("bench-retain-pub")
    publisher.max_inflight_messages_set(100)
    publisher.max_queued_messages_set(0)
    publisher.connect(host, port, keepalive=60)
    publisher.loop_start()
    infos = [publisher.publish(f"bench/retained/sensor{n}", b"21.5C", qos=1, retain=True)
             for n in range(count)]
    for info in infos:
        info.wait_for_publish(120)
    publisher.disconnect()
    publisher.loop_stop()
    meter = BrokerMeter(pid)
    arrivals = retained_arrivals(host, port, count, idle_timeout)
    received = len(arrivals)
    report = {"retained": count, "delivered": received, "lost": count - received,
              "seconds_to_last": arrivals[-1] if arrivals else 0.0,
              "msgs_per_s": received / arrivals[-1] if arrivals else 0.0,
              **latency_report(arrivals)}
    report.update(meter.report(received, unit="msg"))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--qos", default="0,1,2", help='comma-separated levels ("" for none)')
    parser.add_argument("--retained", type=int, default=0,
                        help="then time a '#' subscription over this many retained messages")
    parser.add_argument("--broker", help="HOST:PORT of a running MQTT broker")
    parser.add_argument("--pid", type=int, help="pid of that broker (CPU, RSS)")
    args = parser.parse_args()
    router = None
    if args.broker:
        host, port = args.broker.rsplit(":", 1)
        port, pid = int(port), args.pid
    else:
        router = RouterProcess(
            Path(tempfile.mkdtemp(prefix="bench-mqtt-")), [realm_file("realm1")],
            listeners=[{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}],
            extra_config={"eventlog": {"enabled": False}}).start()
        host, port, _ = router.address("mqtt")
        pid = router.proc.pid
    try:
        for qos in (int(q) for q in args.qos.split(",") if q):
            report = run_qos(host, port, qos, args.subscribers, args.messages, pid)
            print(format_report(report), flush=True)
        if args.retained:
            print(format_report(run_retained_wildcard(host, port, args.retained, pid)),
                  flush=True)
    finally:
        if router is not None:
            router.stop()


if __name__ == "__main__":
    main()
