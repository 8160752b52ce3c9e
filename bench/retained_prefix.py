"""Time subscriptions with get_retained: a prefix subscription over many retained topics,
and exact subscriptions one topic at a time.

Starts the router from this checkout (or uses --rawsocket HOST:PORT of a running one),
retains N events under one prefix, then subscribes with match=prefix and
get_retained=true and measures the time from SUBSCRIBE to the last retained EVENT, with
a lean raw client, with autobahn's own client on RawSocket and (own router, or --mqtt)
with paho on MQTT ``#``: events delivered, seconds to the last one and the router's peak
RSS during each subscription (issue 24: all 100,000, the last within 3 s).

    .venv/bin/python bench/retained_prefix.py --topics 100000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fanout import BrokerMeter, Endpoint  # noqa: E402
from bench.mqtt_fanout import retained_arrivals  # noqa: E402
from tests.clients import connect, raw_connect  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

SUBSCRIBE, SUBSCRIBED, EVENT, PUBLISH, PUBLISHED = 32, 33, 36, 16, 17


async def retain_topics(endpoint, count: int, prefix: str, transport: str = "rawsocket",
                        serializer: str = "msgpack", qos: int = 0,
                        value: str = "21.5C") -> float:
    """Retain one event ``[n, value]`` on each of ``prefix``.sensor0 .. sensor<count-1>
    (published at ``qos``, the router's ``_qos`` option: what MQTT and AMQP receivers get)."""
    publisher = await raw_connect(endpoint, transport, serializer, lean=True)
    welcome = await publisher.hello()
    assert welcome[0] == 2, welcome
    started = time.perf_counter()
    for n in range(count):
        options = {"retain": True, "_qos": qos} if qos else {"retain": True}
        if n == count - 1:
            options["acknowledge"] = True  # acknowledged only once everything before is stored
        publisher.send([PUBLISH, n + 1, options, f"{prefix}.sensor{n}", [n, value]])
        if n % 2000 == 0:
            await asyncio.sleep(0)
    reply = await publisher.recv(timeout=300)
    assert reply[0] == PUBLISHED, reply
    elapsed = time.perf_counter() - started
    publisher.close()
    return elapsed


async def subscribe_retained(endpoint, count: int, prefix: str, transport: str = "rawsocket",
                             serializer: str = "msgpack",
                             idle_timeout: float = 60.0) -> tuple[float, list[float]]:
    """Prefix-subscribe with get_retained; (seconds to the last retained event, arrival time
    of each after SUBSCRIBE). Stops after ``idle_timeout`` s without an event."""
    subscriber = await raw_connect(endpoint, transport, serializer, lean=True)
    assert (await subscriber.hello())[0] == 2
    started = time.perf_counter()
    subscriber.send([SUBSCRIBE, 1, {"match": "prefix", "get_retained": True}, prefix + "."])
    subscribed = await subscriber.recv()
    assert subscribed[0] == SUBSCRIBED, subscribed
    arrivals: list[float] = []
    while len(arrivals) < count:
        try:
            message = await subscriber.recv(timeout=idle_timeout)
        except asyncio.TimeoutError:
            break
        assert message[0] == EVENT and message[3].get("retained") is True, message
        arrivals.append(time.perf_counter() - started)
    subscriber.close()
    return (arrivals[-1] if arrivals else 0.0), arrivals


async def subscribe_exact(endpoint, count: int, prefix: str, transport: str = "rawsocket",
                          serializer: str = "msgpack",
                          timeout: float = 5.0) -> tuple[float, list[float]]:
    """Subscribe with get_retained to each of the first ``count`` topics, one at a time;
    (total seconds, SUBSCRIBE-to-retained-EVENT time per topic that delivered one)."""
    subscriber = await raw_connect(endpoint, transport, serializer, lean=True)
    assert (await subscriber.hello())[0] == 2
    latencies: list[float] = []
    started = time.perf_counter()
    for n in range(count):
        sent = time.perf_counter()
        subscriber.send([SUBSCRIBE, n + 1, {"get_retained": True}, f"{prefix}.sensor{n}"])
        assert (await subscriber.recv(timeout=timeout))[0] == SUBSCRIBED
        try:
            message = await subscriber.recv(timeout=timeout)
        except asyncio.TimeoutError:
            continue
        assert message[0] == EVENT and message[3].get("retained") is True, message
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    subscriber.close()
    return elapsed, latencies


async def subscribe_autobahn(endpoint, count: int, prefix: str,
                             idle_timeout: float = 60.0) -> tuple[float, int]:
    """The same subscription with autobahn's own client on RawSocket (msgpack);
    (seconds from SUBSCRIBE to the last retained event, how many arrived)."""
    client = await connect(endpoint, "rawsocket", "msgpack")
    arrivals: list[float] = []
    done = asyncio.get_running_loop().create_future()

    def on_event(*args, details=None, **kwargs):
        if details.retained:
            arrivals.append(time.perf_counter() - started)
        if len(arrivals) == count and not done.done():
            done.set_result(None)

    from autobahn.wamp.types import SubscribeOptions
    started = time.perf_counter()
    await client.subscribe(on_event, prefix + ".", options=SubscribeOptions(
        match="prefix", get_retained=True, details=True))
    while not done.done():
        seen = len(arrivals)
        try:
            await asyncio.wait_for(asyncio.shield(done), idle_timeout)
        except asyncio.TimeoutError:
            if len(arrivals) == seen:
                break
    await client.close()
    return (arrivals[-1] if arrivals else 0.0), len(arrivals)


def report(name: str, count: int, result: tuple[float, int], meter: BrokerMeter,
           client_cpu: float) -> None:
    """One line per client: what arrived, when the last did, what it cost both sides
    (``client_cpu``: this process's CPU seconds, which says when the client is the limit)."""
    seconds, delivered = result
    figures = meter.report(delivered)
    print(f"{name}: delivered {delivered:,} of {count:,}, last after {seconds:.3f} s"
          + (f", router peak RSS {figures['peak_rss_mb']:.0f} MiB, router CPU "
             f"{figures['cpu_us_per_event']:.1f} us/event" if figures else "")
          + f", client CPU {client_cpu:.2f} s")


async def main_async(args, endpoint, pid: int | None) -> None:
    prefix = f"bench.retained.run{int(time.time())}"
    publish_time = await retain_topics(endpoint, args.topics, prefix)
    print(f"retained {args.topics} topics in {publish_time:.2f} s "
          f"({args.topics / publish_time:,.0f} publishes/s, last one acknowledged durable)")
    meter, cpu = BrokerMeter(pid), time.process_time()
    elapsed, arrivals = await subscribe_retained(endpoint, args.topics, prefix)
    report("lean RawSocket client, prefix + get_retained", args.topics,
           (elapsed, len(arrivals)), meter, time.process_time() - cpu)
    meter, cpu = BrokerMeter(pid), time.process_time()
    result = await subscribe_autobahn(endpoint, args.topics, prefix)
    report("autobahn RawSocket client, prefix + get_retained", args.topics, result, meter,
           time.process_time() - cpu)
    if args.mqtt:
        host, port = args.mqtt.rsplit(":", 1)
        meter, cpu = BrokerMeter(pid), time.process_time()
        arrivals = await asyncio.to_thread(retained_arrivals, host, int(port), args.topics, 60.0)
        report("paho MQTT '#'", args.topics, (arrivals[-1] if arrivals else 0.0, len(arrivals)),
               meter, time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rawsocket", help="HOST:PORT of a running router (realm1)")
    parser.add_argument("--mqtt", help="HOST:PORT of that router's MQTT listener (realm1); "
                        "its '#' must cover only the retained topics this run sets")
    parser.add_argument("--pid", type=int, help="pid of that router (peak RSS)")
    args = parser.parse_args()
    if args.rawsocket:
        host, port = args.rawsocket.rsplit(":", 1)
        asyncio.run(main_async(args, Endpoint("rawsocket", host, int(port), "/"), args.pid))
        return
    # room for the router's own $SYS topics too: all of the run's topics stay retained
    realm = realm_file("realm1", retention={"max_topics": max(args.topics, 100_000) + 1000})
    listeners = [{"type": "rawsocket", "host": "127.0.0.1", "port": 0},
                 {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
    router = RouterProcess(Path(tempfile.mkdtemp(prefix="bench-retained-")), [realm],
                           listeners=listeners).start()
    try:
        host, port, _ = router.address("rawsocket")
        mqtt_host, mqtt_port, _ = router.address("mqtt")
        args.mqtt = f"{mqtt_host}:{mqtt_port}"
        asyncio.run(main_async(args, Endpoint("rawsocket", host, port, "/"), router.proc.pid))
    finally:
        router.stop()


if __name__ == "__main__":
    main()
