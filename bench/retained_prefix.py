"""Time a prefix subscription with get_retained over many retained topics.

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

from tests.clients import raw_connect  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402


class Endpoint:
    def __init__(self, host: str, port: int) -> None:
        self._address = (host, port, "/")

    def address(self, transport: str):
        return self._address


async def retain_topics(endpoint, count: int, prefix: str) -> float:
    publisher = await raw_connect(endpoint, "rawsocket", "msgpack")
    welcome = await publisher.hello()
    assert welcome[0] == 2, welcome
    started = time.perf_counter()
    for n in range(count):
        options = {"retain": True}
        if n == count - 1:
            options["acknowledge"] = True  # acknowledged only once everything before is stored
        publisher.send([16, n + 1, options, f"{prefix}.sensor{n}", [n, "21.5C"]])
        if n % 2000 == 0:
            await asyncio.sleep(0)
    reply = await publisher.recv(timeout=300)
    assert reply[0] == 17, reply
    elapsed = time.perf_counter() - started
    publisher.close()
    return elapsed


async def subscribe_retained(endpoint, count: int, prefix: str) -> tuple[float, int]:
    subscriber = await raw_connect(endpoint, "rawsocket", "msgpack")
    assert (await subscriber.hello())[0] == 2
    started = time.perf_counter()
    subscriber.send([32, 1, {"match": "prefix", "get_retained": True}, prefix + "."])
    subscribed = await subscriber.recv()
    assert subscribed[0] == 33, subscribed
    received = 0
    while received < count:
        message = await subscriber.recv(timeout=60)
        assert message[0] == 36 and message[3].get("retained") is True, message
        received += 1
    elapsed = time.perf_counter() - started
    subscriber.close()
    return elapsed, received


async def main_async(args, endpoint) -> None:
    prefix = f"bench.retained.run{int(time.time())}"
    publish_time = await retain_topics(endpoint, args.topics, prefix)
    print(f"retained {args.topics} topics in {publish_time:.2f} s "
          f"({args.topics / publish_time:,.0f} publishes/s, last one acknowledged durable)")
    elapsed, received = await subscribe_retained(endpoint, args.topics, prefix)
    print(f"prefix subscription with get_retained: {received} retained events, "
          f"last after {elapsed:.3f} s ({received / elapsed:,.0f} events/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rawsocket", help="HOST:PORT of a running router (realm1)")
    args = parser.parse_args()
    if args.rawsocket:
        host, port = args.rawsocket.rsplit(":", 1)
        asyncio.run(main_async(args, Endpoint(host, int(port))))
        return
    realm = realm_file("realm1", retention={"max_topics": max(args.topics, 100_000)})
    router = RouterProcess(Path(tempfile.mkdtemp(prefix="bench-retained-")), [realm]).start()
    try:
        host, port, _ = router.address("rawsocket")
        asyncio.run(main_async(args, Endpoint(host, port)))
    finally:
        router.stop()


if __name__ == "__main__":
    main()
