"""One MQTT client subscribes to 20,000 filters in one SUBSCRIBE (then unsubscribes from
10,000 in one UNSUBSCRIBE) while another client sends PINGREQ after PINGREQ: how long
until the SUBACK (UNSUBACK), and how long the other client waited for its PINGRESPs
meanwhile (the router must keep serving everyone while one packet's work goes on).

Starts the router from this checkout on an ephemeral MQTT port; both clients are raw
sockets driven by the router's own codec (client side), the packets encoded before the
clock starts, so the figures are the router's, not a client library's.

    .venv/bin/python bench/big_subscribe.py --filters 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.mqtt.packets import (Pingreq, Pingresp, Suback, Subscribe,  # noqa: E402
                                 SubscriptionOptions, Unsuback, Unsubscribe)
from tests.harness import RouterProcess  # noqa: E402
from tests.mqtt_clients import V5, RawMqtt, listeners, mqtt_realm  # noqa: E402


class Pinger(threading.Thread):
    """PINGREQ, wait for PINGRESP, again, until stopped: every round trip's seconds."""

    def __init__(self, client: RawMqtt) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.round_trips: list[tuple[float, float]] = []
        """(sent at, round trip) per PINGREQ."""
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            sent = time.perf_counter()
            self.client.send(Pingreq())
            assert isinstance(self.client.recv(timeout=120), Pingresp)
            self.round_trips.append((sent, time.perf_counter() - sent))
            self.halt.wait(0.002)

    def during(self, start: float, end: float) -> list[float]:
        """Round trips of the PINGREQs sent between ``start`` and ``end``."""
        return [trip for sent, trip in self.round_trips if start <= sent <= end]


def timed(client: RawMqtt, packet, answer: type) -> tuple[float, object]:
    data = client.codec.encode(packet)
    started = time.perf_counter()
    client.send_bytes(data)
    reply = client.recv(timeout=600)
    elapsed = time.perf_counter() - started
    assert isinstance(reply, answer), reply
    return elapsed, reply


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def one_round(router: RouterProcess, filters: int, run: int) -> dict:
    pinging, big = RawMqtt(router), RawMqtt(router)
    try:
        pinging.connect_ok(version=V5, client_id=f"pinger{run}")
        big.connect_ok(version=V5, client_id=f"big{run}")
        names = [f"bench/{run}/device/{n}/state" for n in range(filters)]
        pinger = Pinger(pinging)
        pinger.start()
        time.sleep(0.2)  # a few quiet round trips first
        begun = time.perf_counter()
        subscribe_seconds, suback = timed(
            big, Subscribe(1, [(name, SubscriptionOptions(1)) for name in names]), Suback)
        assert suback.reason_codes == [1] * filters, set(suback.reason_codes)
        subscribed = time.perf_counter()
        unsubscribe_seconds, unsuback = timed(big, Unsubscribe(2, names[:filters // 2]),
                                              Unsuback)
        assert unsuback.reason_codes == [0] * (filters // 2), set(unsuback.reason_codes)
        ended = time.perf_counter()
        pinger.halt.set()
        pinger.join(120)
        during_subscribe = pinger.during(begun, subscribed)
        during_unsubscribe = pinger.during(subscribed, ended)
        return {"suback": subscribe_seconds, "unsuback": unsubscribe_seconds,
                "ping_max_sub": max(during_subscribe), "ping_p99_sub": p99(during_subscribe),
                "pings_sub": len(during_subscribe),
                "ping_max_unsub": max(during_unsubscribe),
                "ping_p99_unsub": p99(during_unsubscribe),
                "pings_unsub": len(during_unsubscribe)}
    finally:
        pinging.close()
        big.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filters", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    realm = mqtt_realm("realm1", mqtt={"max_packet_size": 16 * 1024 * 1024,
                                       "max_subscriptions": args.filters})
    with tempfile.TemporaryDirectory() as workdir:
        router = RouterProcess(Path(workdir), [realm], listeners("realm1", wamp=False),
                               extra_config={"eventlog": {"enabled": False}}).start()
        try:
            results = [one_round(router, args.filters, run) for run in range(args.rounds)]
        finally:
            router.stop()
    print(f"{args.filters} filters in one SUBSCRIBE, {args.filters // 2} in one UNSUBSCRIBE; "
          f"median of {args.rounds} rounds (worst in brackets)")
    for key, label, scale in (("suback", "SUBACK after", 1), ("unsuback", "UNSUBACK after", 1),
                              ("ping_max_sub", "other client's max PING round trip "
                                               "during SUBSCRIBE", 1000),
                              ("ping_p99_sub", "… p99", 1000),
                              ("pings_sub", "… PINGs answered meanwhile", None),
                              ("ping_max_unsub", "other client's max PING round trip "
                                                 "during UNSUBSCRIBE", 1000),
                              ("ping_p99_unsub", "… p99", 1000),
                              ("pings_unsub", "… PINGs answered meanwhile", None)):
        values = [result[key] for result in results]
        if scale is None:
            print(f"  {label:<58} {statistics.median(values):>9.0f}  [{min(values)}]")
        elif scale == 1:
            print(f"  {label:<58} {statistics.median(values):>8.3f} s  [{max(values):.3f}]")
        else:
            print(f"  {label:<58} {statistics.median(values) * scale:>7.1f} ms  "
                  f"[{max(values) * scale:.1f}]")


if __name__ == "__main__":
    main()
