"""Webhook throughput: events/s one webhook delivers to a local target, QoS 0 and QoS 1.

Starts the router from this checkout with one webhook on ``bench.`` pointing at an HTTP/1.1
target this script runs (asyncio, keep-alive, answers 204 at once, so the router's side is
what is measured), publishes N events with a lean RawSocket client, the last acknowledged,
and times from the first publish to the N-th request at the target. A webhook sends one
request at a time, so the figure is one connection's request rate.

    .venv/bin/python bench/webhooks.py --events 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.clients import raw_connect  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

PUBLISH, PUBLISHED = 16, 17


class Target:
    """Counts requests; answers each 204 as soon as its body is read."""

    def __init__(self, expected: int) -> None:
        self.count = 0
        self.expected = expected
        self.done = asyncio.get_running_loop().create_future()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                self.count += 1
                if self.count == self.expected and not self.done.done():
                    self.done.set_result(time.perf_counter())
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the router closed its connection (at its shutdown)


async def one_run(qos: int, events: int) -> float:
    target = Target(events)
    server = await asyncio.start_server(target.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    hook = {"name": "bench", "url": f"http://127.0.0.1:{port}/hook", "topic": "bench",
            "match": "prefix", "secret": "bench-secret", "qos": qos, "qos_policy": "exact",
            "max_queue": events + 1}
    with tempfile.TemporaryDirectory() as workdir:
        router = RouterProcess(Path(workdir), [realm_file("realm1", webhooks=[hook])],
                               [{"type": "rawsocket", "host": "127.0.0.1", "port": 0}],
                               extra_config={"eventlog": {"enabled": False}}).start()
        try:
            publisher = await raw_connect(router, "rawsocket", "msgpack", lean=True)
            assert (await publisher.hello())[0] == 2
            started = time.perf_counter()
            for n in range(events):
                options = {"_qos": qos} | ({"acknowledge": True} if n == events - 1 else {})
                publisher.send([PUBLISH, n + 1, options, "bench.orders", [n, "payload"]])
                if n % 500 == 0:
                    await asyncio.sleep(0)
            assert (await publisher.recv(timeout=120))[0] == PUBLISHED
            finished = await asyncio.wait_for(target.done, 600)
            publisher.close()
        finally:
            router.stop()
            server.close()
    return events / (finished - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    for qos in (0, 1):
        rate = await one_run(qos, args.events)
        print(f"webhook QoS {qos}: {args.events} events, {rate:,.0f} events/s "
              f"(load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    asyncio.run(main())
