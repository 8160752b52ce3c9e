"""AMQP 1.0 fan-out: one publisher, N receiver processes (python-qpid-proton), messages/s.

The publisher sends QoS 1 (unsettled, link modes first) as fast as its credit allows;
each receiver accepts every message. The rate is deliveries over the time from the
first send to the last arrival; on a shared machine the router's CPU microseconds per
delivery (``cpu_us_per_msg``) is the steadier figure. Starts our router from this
checkout unless --broker HOST:PORT is given (--pid: that broker's pid, for its CPU).

    .venv/bin/python bench/amqp_fanout.py --subscribers 4 --messages 5000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proton import Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

from bench.fanout import BrokerMeter, latency_report  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

ADDRESS = "bench.amqp"


class _Receiver(MessagingHandler):
    def __init__(self, url: str, messages: int, ready) -> None:
        super().__init__(prefetch=500)
        self.url, self.messages, self.ready = url, messages, ready
        self.latencies: list[float] = []
        self.last_arrival = 0.0

    def on_start(self, event) -> None:
        connection = event.container.connect(self.url, allowed_mechs="ANONYMOUS")
        event.container.create_receiver(connection, ADDRESS)

    def on_link_opened(self, event) -> None:
        if event.receiver is not None:
            self.ready.put(True)

    def on_message(self, event) -> None:
        self.last_arrival = time.time()
        sent_at = struct.unpack("!d", bytes(event.message.body)[:8])[0]
        self.latencies.append(self.last_arrival - sent_at)
        if len(self.latencies) >= self.messages:
            event.connection.close()


class _Publisher(MessagingHandler):
    def __init__(self, url: str, messages: int) -> None:
        super().__init__()
        self.url, self.messages = url, messages
        self.sent = self.confirmed = 0
        self.first_send = 0.0

    def on_start(self, event) -> None:
        connection = event.container.connect(self.url, allowed_mechs="ANONYMOUS")
        event.container.create_sender(connection, ADDRESS)

    def on_sendable(self, event) -> None:
        if not self.first_send:
            self.first_send = time.time()
        while event.sender.credit and self.sent < self.messages:
            body = struct.pack("!d", time.time()) + b"x" * 56
            event.sender.send(Message(body=body, inferred=True))
            self.sent += 1

    def on_settled(self, event) -> None:
        self.confirmed += 1
        if self.confirmed >= self.messages:
            event.connection.close()


def receiver_main(url: str, messages: int, ready, results) -> None:
    handler = _Receiver(url, messages, ready)
    Container(handler).run()
    results.put((handler.latencies, handler.last_arrival))


def run(url: str, subscribers: int, messages: int, pid: int | None) -> dict:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=receiver_main, args=(url, messages, ready, results))
               for _ in range(subscribers)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    meter = BrokerMeter(pid)
    publisher = _Publisher(url, messages)
    Container(publisher).run()
    latencies: list[float] = []
    last = publisher.first_send
    for _ in workers:
        received, last_arrival = results.get(timeout=300)
        latencies.extend(received)
        last = max(last, last_arrival)
    for worker in workers:
        worker.join()
    elapsed = max(last - publisher.first_send, 1e-6)
    return {"subscribers": subscribers, "delivered": len(latencies),
            "msgs_per_s": len(latencies) / elapsed, **latency_report(latencies),
            **meter.report(len(latencies), unit="msg")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--broker", help="HOST:PORT of a running AMQP broker")
    parser.add_argument("--pid", type=int, help="pid of that broker (CPU, RSS)")
    args = parser.parse_args()
    router = None
    pid = args.pid
    if args.broker:
        url = f"amqp://{args.broker}"
    else:
        router = RouterProcess(Path(tempfile.mkdtemp(prefix="amqp-bench-")),
                               [realm_file("realm1", anonymous_role="anonymous")],
                               listeners=[{"type": "amqp", "host": "127.0.0.1", "port": 0,
                                           "realm": "realm1"}]).start()
        host, port, _ = router.address("amqp")
        url = f"amqp://{host}:{port}"
        pid = router.proc.pid
    try:
        report = run(url, args.subscribers, args.messages, pid)
    finally:
        if router is not None:
            router.stop()
    print(f"{report['subscribers']} receivers, {report['delivered']} deliveries: "
          f"{report['msgs_per_s']:.0f} msgs/s, " +
          ", ".join(f"{key} {value:.1f}" for key, value in report.items()
                    if key not in ("subscribers", "delivered", "msgs_per_s")
                    and isinstance(value, float)))


if __name__ == "__main__":
    main()
