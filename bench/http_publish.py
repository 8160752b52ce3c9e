"""HTTP: publish requests/s from one keep-alive client, ours vs Crossbar.io's HTTP bridge, and
Server-Sent Events fan-out events/s.

Publish: one ``http.client`` connection (HTTP/1.1 keep-alive) POSTs ``--requests`` events one
after the other (each waits for its answer) to our router's ``POST /publish`` and to
Crossbar.io's ``publisher`` web service; one lean WAMP subscriber (its own process) on each
broker counts what arrived and the publish-to-event latency. Crossbar's bridge always
publishes acknowledged, so ours runs twice: plain, and with ``"acknowledge": true`` (the
like-for-like figure). SSE: ``--readers`` processes each hold one ``GET /subscribe`` stream
while one lean WAMP publisher sends ``--events`` events; events/s = events received by all
readers / time from the first publish to the last arrival (Crossbar has no SSE).

    .venv/bin/python bench/http_publish.py
    .venv/bin/python bench/http_publish.py --requests 3000 --readers 8 --events 5000 --rounds 3

Installs Crossbar.io into bench/.venv-crossbar when missing (as bench/compare.py does); every
process it starts is stopped on the way out.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402
from urllib.parse import quote  # noqa: E402

from bench.compare import CrossbarNode, ensure_crossbar, free_port, loadavg  # noqa: E402
from bench.fanout import (BrokerMeter, Endpoint, collect_results, latency_report,  # noqa: E402
                          publish_all, stop_workers, subscriber_main)
from tests.harness import RouterProcess, realm_file  # noqa: E402

PUBLISH_TOPIC = "bench.http"
SSE_TOPIC = "bench.sse"
WARMUP_REQUESTS = 200
SSE_MAX_QUEUED = 100_000
"""Events a stream may hold while its reader is behind (default 1,000): a benchmark reader
that falls behind for a moment is measured, not disconnected."""
IDLE_TIMEOUT = 20.0
"""A reader or subscriber gives up after this long without an event."""


class OurHttpRouter:
    """Our router from this checkout: RawSocket and an ``http`` listener, event log off."""

    name = "ours"

    def __init__(self, workdir: Path) -> None:
        self.http_port = free_port()
        listeners = [{"type": "rawsocket", "host": "127.0.0.1", "port": 0},
                     {"type": "http", "host": "127.0.0.1", "port": self.http_port,
                      "realm": "realm1", "sse_max_queued": SSE_MAX_QUEUED}]
        self.router = RouterProcess(workdir, [realm_file("realm1")], listeners=listeners,
                                    extra_config={"eventlog": {"enabled": False}}).start()
        self.pid = self.router.proc.pid
        self.rawsocket = Endpoint("rawsocket", *self.router.address("rawsocket"))

    def stop(self) -> None:
        self.router.stop()


class CrossbarHttp:
    """Crossbar.io with its HTTP bridge ``publisher`` at ``/publish`` (role anonymous)."""

    name = "crossbar"

    def __init__(self, executable: Path, workdir: Path) -> None:
        self.node = CrossbarNode(executable, workdir, web_paths={
            "publish": {"type": "publisher", "realm": "realm1", "role": "anonymous"}})
        self.pid = self.node.pid
        self.http_port = self.node.ports["websocket"][0]
        self.rawsocket = Endpoint("rawsocket", *self.node.address("rawsocket"))

    def stop(self) -> None:
        self.node.stop()


def event_body(options: dict) -> Callable[[int], bytes]:
    """The JSON body of request ``n``: the send time first, so subscribers get a latency."""
    def body(n: int) -> bytes:
        return json.dumps({"topic": PUBLISH_TOPIC, "args": [time.time(), n], **options}).encode()
    return body


def post_sequentially(port: int, body_of: Callable[[int], bytes], requests: int) -> dict:
    """POST ``requests`` bodies to ``/publish`` over one keep-alive connection, each after
    the previous answer; requests/s over the timed part (after a warm-up) and failures."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    failures, first_failure = 0, ""
    try:
        started = 0.0
        for n in range(WARMUP_REQUESTS + requests):
            if n == WARMUP_REQUESTS:
                started = time.perf_counter()
            connection.request("POST", "/publish", body=body_of(n), headers=headers)
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200:
                failures += 1
                first_failure = first_failure or f"{response.status} {answer[:200]!r}"
        elapsed = time.perf_counter() - started
    finally:
        connection.close()
    return {"requests/s": requests / elapsed, "failed": failures, "first failure": first_failure}


def publish_scenario(broker, requests: int, options: dict) -> dict:
    """HTTP publishes to ``broker`` with a WAMP subscriber counting what arrives."""
    expected = WARMUP_REQUESTS + requests
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    subscriber = ctx.Process(target=subscriber_main, args=(
        broker.rawsocket, "rawsocket", "msgpack", expected, ready, results, PUBLISH_TOPIC,
        None, IDLE_TIMEOUT))
    subscriber.start()
    try:
        ready.get(timeout=60)
        meter = BrokerMeter(broker.pid)
        report = post_sequentially(broker.http_port, event_body(options), requests)
        report.update(meter.report(requests, "request"))
        latencies, _ = results.get(timeout=IDLE_TIMEOUT + 120)
    finally:
        stop_workers([subscriber])
    report.update({"delivered": len(latencies), "lost": expected - len(latencies),
                   **latency_report(latencies)})
    return report


SEND_TIME = re.compile(rb'"args":\[([0-9.e+-]+),')
"""The publisher's send time, the first argument of every event."""


def sse_reader_main(port: int, events: int, ready, results, idle_timeout: float) -> None:
    """Hold one SSE stream on ``SSE_TOPIC``; report the latencies of ``events`` events (or
    of what came before ``idle_timeout`` s without one) and the last arrival time.

    It reads the socket in large blocks and finds the events with one regular expression
    over the complete frames (the chunked encoding's size lines fall between frames), so
    that on two cores the Python reader keeps up with the router instead of being what is
    measured."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=idle_timeout)
    sock.sendall(f"GET /subscribe?topic={quote(SSE_TOPIC)} HTTP/1.1\r\nHost: bench\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    pending = b""
    while b"\r\n\r\n" not in pending:
        pending += sock.recv(65536)
    head, _, pending = pending.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        ready.put(status.decode("latin-1"))
        sock.close()
        return
    ready.put(True)
    latencies, last_arrival = [], 0.0
    try:
        while len(latencies) < events:
            block = sock.recv(1 << 20)
            if not block:
                break
            last_arrival = time.time()
            pending += block
            complete = pending.rfind(b"\n\n") + 2
            if complete > 1:
                latencies.extend(last_arrival - float(sent)
                                 for sent in SEND_TIME.findall(pending, 0, complete))
                pending = pending[complete:]
    except TimeoutError:
        pass
    finally:
        sock.close()
        results.put((latencies, last_arrival))


def sse_scenario(broker: OurHttpRouter, readers: int, events: int) -> dict:
    """``readers`` SSE streams, one lean WAMP publisher of ``events`` events."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=sse_reader_main,
                           args=(broker.http_port, events, ready, results, IDLE_TIMEOUT))
               for _ in range(readers)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            answer = ready.get(timeout=60)
            if answer is not True:
                raise RuntimeError(f"GET /subscribe answered {answer}")
        wait_for_sse_subscribers(broker, readers)
        meter = BrokerMeter(broker.pid)
        first_publish = asyncio.run(publish_all(broker.rawsocket, "rawsocket", "msgpack",
                                                events, None, SSE_TOPIC))
        latencies, last_delivery = collect_results(results, len(workers), first_publish,
                                                   IDLE_TIMEOUT + 120)
    finally:
        stop_workers(workers)
    delivered = len(latencies)
    report = {"events/s": delivered / max(last_delivery - first_publish, 1e-6),
              "delivered": delivered, "lost": readers * events - delivered,
              **latency_report(latencies)}
    report.update(meter.report(delivered, "event"))
    return report


def wait_for_sse_subscribers(broker: OurHttpRouter, readers: int, timeout: float = 30.0) -> None:
    """Until ``GET /subscriptions`` shows ``readers`` sessions on the SSE topic (a stream's
    headers may come before its subscription is in place)."""
    deadline = time.monotonic() + timeout
    while True:
        connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=10)
        connection.request("GET", "/subscriptions")
        listing = json.loads(connection.getresponse().read())
        connection.close()
        subscribers = sum(len(entry["subscribers"]) for entry in listing["subscriptions"]
                          if entry["uri"] == SSE_TOPIC)
        if subscribers >= readers:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{subscribers} of {readers} SSE readers subscribed "
                               f"after {timeout:.0f} s")
        time.sleep(0.1)


def median_report(rounds: list[dict]) -> dict:
    """Per numeric metric the median over rounds (lost and failed: the worst round)."""
    combined = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
        if values:
            combined[key] = (max(values) if key in ("lost", "failed")
                             else statistics.median(values))
    return combined


def table(rows: list[tuple[str, str, dict, dict | None]]) -> str:
    """Markdown: scenario, metric, ours, Crossbar, ours/Crossbar."""
    lines = ["| scenario | metric | ours | crossbar | ours/crossbar |", "|---|---|---:|---:|---:|"]
    for scenario, metric, ours, theirs in rows:
        mine = ours.get(metric)
        other = theirs.get(metric) if theirs else None
        ratio = f"{mine / other:.2f}" if mine is not None and other else "-"
        lines.append(f"| {scenario} | {metric} | {_number(mine)} | {_number(other)} | {ratio} |")
    return "\n".join(lines)


def _number(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if isinstance(value, int) or abs(value) >= 100 else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="timed POSTs per run")
    parser.add_argument("--readers", type=int, default=8, help="SSE streams")
    parser.add_argument("--events", type=int, default=5000, help="events to the SSE readers")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per figure, brokers alternating; the table shows medians")
    args = parser.parse_args()
    print(f"load average before: {loadavg()}", flush=True)
    crossbar, why = ensure_crossbar()
    if crossbar is None:
        print(f"Crossbar.io column skipped: {why}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-http-"))
    results: dict[str, list[dict]] = {}

    def record(name: str, report: dict) -> None:
        results.setdefault(name, []).append(report)
        print(f"    {name}: " + ", ".join(
            f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in report.items()
            if v != ""), flush=True)

    try:
        for number in range(1, args.rounds + 1):
            print(f"=== round {number} of {args.rounds}", flush=True)
            ours = OurHttpRouter(workdir / f"ours{number}")
            try:
                record("ours publish", publish_scenario(ours, args.requests, {}))
                record("ours publish acknowledged",
                       publish_scenario(ours, args.requests, {"acknowledge": True}))
                record("ours sse", sse_scenario(ours, args.readers, args.events))
            finally:
                ours.stop()
            if crossbar:
                theirs = CrossbarHttp(crossbar, workdir / f"crossbar{number}")
                try:
                    record("crossbar publish", publish_scenario(theirs, args.requests, {}))
                finally:
                    theirs.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    combined = {name: median_report(rounds) for name, rounds in results.items()}
    theirs = combined.get("crossbar publish")
    rows = []
    for name, label in (("ours publish", "publish (ours plain, Crossbar acknowledged)"),
                        ("ours publish acknowledged", "publish, both acknowledged")):
        for metric in ("requests/s", "p50_ms", "p99_ms", "cpu_us_per_request", "lost"):
            rows.append((label, metric, combined[name], theirs))
    for metric in ("events/s", "p50_ms", "p99_ms", "cpu_us_per_event", "lost"):
        rows.append((f"SSE fan-out 1->{args.readers} (ours only)", metric,
                     combined["ours sse"], None))
    print(f"\n{args.rounds} round(s), medians; {args.requests} POSTs per run, "
          f"{args.readers} SSE readers x {args.events} events; pid {os.getpid()}")
    print(table(rows))
    print(f"load average after: {loadavg()}", flush=True)


if __name__ == "__main__":
    main()
