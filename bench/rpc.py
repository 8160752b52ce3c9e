"""WAMP RPC: one callee, C concurrent callers (each its own process, one call at a time).

Reports completed calls/s, call latency p50/p99 (CALL sent to RESULT received), the
router's CPU seconds per call and peak RSS from /proc, and the clients' own CPU per call
(callers and callee, each timing its calls with ``time.process_time``): on a 2-core machine
the clients share the cores with the router, so when they cost more per call than the router
the calls/s say more about them than about the router. Starts the router from this
checkout unless --rawsocket/--websocket points at a running one (then pass --pid).

    .venv/bin/python bench/rpc.py --callers 4 --calls 2000
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fanout import (BrokerMeter, add_target_arguments, format_report,  # noqa: E402
                          latency_report, wamp_targets)
from tests.clients import raw_connect  # noqa: E402

PROCEDURE = "bench.echo"
REGISTER, REGISTERED, INVOCATION, YIELD, CALL, RESULT = 64, 65, 68, 70, 48, 50


class _AnsweringQueue:
    """Stands in for the callee's receive queue: answers an INVOCATION as it is decoded, in
    the connection's receive callback, and queues anything else. The callee serves every
    caller, so its cost per call is one loop's: no task switch and queue hop per call."""

    def __init__(self, client) -> None:
        self.client = client
        self.queue: asyncio.Queue = asyncio.Queue()
        self.first_invocation_cpu: float | None = None

    def put_nowait(self, message) -> None:
        if message is not None and message[0] == INVOCATION:
            if self.first_invocation_cpu is None:
                self.first_invocation_cpu = time.process_time()
            self.client.send([YIELD, message[1], {}, message[4] if len(message) > 4 else []])
        else:
            self.queue.put_nowait(message)


def callee_main(endpoint, transport, serializer, ready, stop, cpu) -> None:
    """Register PROCEDURE and answer every INVOCATION with its arguments until ``stop``;
    puts on ``cpu`` its CPU seconds from the first INVOCATION on."""
    async def run():
        client = await raw_connect(endpoint, transport, serializer, lean=True)
        assert (await client.hello())[0] == 2
        client.send([REGISTER, 1, {}, PROCEDURE])
        assert (await client.recv())[0] == REGISTERED
        answering = client.received = _AnsweringQueue(client)
        ready.put(True)
        while not stop.is_set():
            await asyncio.sleep(0.2)
        first = answering.first_invocation_cpu
        cpu.put(time.process_time() - first if first is not None else 0.0)
        client.close()

    asyncio.run(run())


def caller_main(endpoint, transport, serializer, calls, timeout, ready, go, results) -> None:
    """Make ``calls`` calls one after another; report their latencies and CPU seconds."""
    async def run():
        client = await raw_connect(endpoint, transport, serializer, lean=True)
        assert (await client.hello())[0] == 2
        ready.put(True)
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 60)
        latencies = []
        cpu_before = time.process_time()
        deadline = time.perf_counter() + timeout
        for n in range(calls):
            sent = time.perf_counter()
            client.send([CALL, n + 1, {}, PROCEDURE, [n, "payload"]])
            try:
                reply = await client.recv(timeout=max(0.1, deadline - sent))
            except asyncio.TimeoutError:
                break
            assert reply[0] == RESULT and reply[1] == n + 1, reply
            latencies.append(time.perf_counter() - sent)
        cpu = time.process_time() - cpu_before
        client.close()
        results.put((latencies, cpu))

    asyncio.run(run())


def run_rpc(endpoint, transport, serializer, callers, calls, pid, timeout=120.0,
            callee_endpoint=None) -> dict:
    """``callers`` processes each make ``calls`` sequential calls to one callee (connected
    to ``callee_endpoint``, another node of a cluster, if given)."""
    ctx = mp.get_context("spawn")
    ready, results, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    callee_cpu = ctx.Queue()
    callee = ctx.Process(target=callee_main, args=(callee_endpoint or endpoint, transport,
                                                   serializer, ready, stop, callee_cpu))
    workers = [ctx.Process(target=caller_main, args=(endpoint, transport, serializer, calls,
                                                     timeout, ready, go, results))
               for _ in range(callers)]
    callee.start()
    try:
        ready.get(timeout=60)
        for worker in workers:
            worker.start()
        for _ in workers:
            ready.get(timeout=60)
        meter = BrokerMeter(pid)
        started = time.perf_counter()
        go.set()
        latencies, client_cpu = [], 0.0
        for _ in workers:
            caller_latencies, caller_cpu = results.get(timeout=timeout + 60)
            latencies.extend(caller_latencies)
            client_cpu += caller_cpu
        elapsed = time.perf_counter() - started
        stop.set()
        client_cpu += callee_cpu.get(timeout=10)
    finally:
        stop.set()
        for process in workers + [callee]:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    completed = len(latencies)
    report = {"transport": transport, "serializer": serializer, "callers": callers,
              "calls": completed, "failed": callers * calls - completed,
              "calls_per_s": completed / elapsed, **latency_report(latencies)}
    report.update(meter.report(completed, unit="call"))
    report["client_cpu_us_per_call"] = client_cpu / max(1, completed) * 1e6
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2000, help="calls per caller")
    add_target_arguments(parser)
    args = parser.parse_args()
    with wamp_targets(args) as targets:
        for transport, serializer, endpoint, pid in targets:
            print(format_report(run_rpc(endpoint, transport, serializer, args.callers,
                                        args.calls, pid)), flush=True)


if __name__ == "__main__":
    main()
