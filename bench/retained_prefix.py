"""Time subscriptions with get_retained: a prefix subscription over many retained topics,
and exact subscriptions one topic at a time.

Starts the router from this checkout (or uses --rawsocket HOST:PORT of a running one),
retains N events under one prefix, then subscribes with match=prefix and
get_retained=true and measures the time from SUBSCRIBE to the last retained EVENT.

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

from bench.fanout import Endpoint  # noqa: E402
from tests.clients import raw_connect  # noqa: E402
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


async def main_async(args, endpoint) -> None:
    prefix = f"bench.retained.run{int(time.time())}"
    publish_time = await retain_topics(endpoint, args.topics, prefix)
    print(f"retained {args.topics} topics in {publish_time:.2f} s "
          f"({args.topics / publish_time:,.0f} publishes/s, last one acknowledged durable)")
    elapsed, arrivals = await subscribe_retained(endpoint, args.topics, prefix)
    received = len(arrivals)
    print(f"prefix subscription with get_retained: {received} retained events, "
          f"last after {elapsed:.3f} s ({received / max(elapsed, 1e-9):,.0f} events/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rawsocket", help="HOST:PORT of a running router (realm1)")
    args = parser.parse_args()
    if args.rawsocket:
        host, port = args.rawsocket.rsplit(":", 1)
        asyncio.run(main_async(args, Endpoint("rawsocket", host, int(port), "/")))
        return
    realm = realm_file("realm1", retention={"max_topics": max(args.topics, 100_000)})
    router = RouterProcess(Path(tempfile.mkdtemp(prefix="bench-retained-")), [realm]).start()
    try:
        host, port, _ = router.address("rawsocket")
        asyncio.run(main_async(args, Endpoint("rawsocket", host, port, "/")))
    finally:
        router.stop()


if __name__ == "__main__":
    main()
