"""An MQTT bridge's throughput: messages/s from a publisher on the edge router, through its
bridge, to a subscriber on a Mosquitto; and the catch-up after an outage (the messages
queued while Mosquitto was stopped, sent when it is back).

    .venv/bin/python bench/bridge.py --messages 5000 --qos 1

Starts Mosquitto (Debian's /usr/sbin/mosquitto) and the router from this checkout on free
ports; prints one line per phase with the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paho.mqtt.client as mqtt  # noqa: E402

from tests.harness import OPEN_ROLE, RouterProcess, realm_file  # noqa: E402
from tests.mosquitto_broker import MosquittoBroker  # noqa: E402


class Counter:
    """A paho subscriber that counts messages until it has ``expected``."""

    def __init__(self, port: int, qos: int, client_id: str) -> None:
        self.count = 0
        self.expected = 0
        self.done = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv311, clean_session=False)
        self.client.on_message = self._message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        self.client.subscribe("cloud/#", qos=qos)
        assert subscribed.wait(10), "no SUBACK"

    def _message(self, client, userdata, message) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.done.set()

    def expect(self, n: int) -> None:
        self.expected, self.count = n, 0
        self.done.clear()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publish(port: int, qos: int, messages: int) -> None:
    """Publish ``messages`` and wait until the router acknowledged each."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-pub",
                         protocol=mqtt.MQTTv311)
    client.max_inflight_messages_set(100)
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    infos = [client.publish("m/x", b"x" * 64, qos) for _ in range(messages)]
    for info in infos:
        info.wait_for_publish(60)
    client.disconnect()
    client.loop_stop()


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--qos", type=int, default=1, choices=(0, 1, 2))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        (base / "mosquitto").mkdir()
        broker = MosquittoBroker(base / "mosquitto").start()
        realm = realm_file("realm1", roles={"anonymous": OPEN_ROLE, "bridge": OPEN_ROLE})
        edge = RouterProcess(base / "edge", [realm], listeners=[
            {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}],
            extra_config={"eventlog": {"enabled": False}, "bridges": [{
                "name": "cloud", "realm": "realm1", "host": "127.0.0.1", "port": broker.port,
                "role": "bridge", "reconnect_min": 0.2, "reconnect_max": 1,
                "topics": [{"topic": "m/#", "remote_prefix": "cloud/", "qos": 2}]}]})
        try:
            edge.start()
            edge.wait_for_log("bridge cloud: connected to ", 20)
            port = edge.address("mqtt")[1]
            counter = Counter(broker.port, args.qos, "bench-sub")
            counter.expect(args.messages)
            started = time.monotonic()
            publish(port, args.qos, args.messages)
            assert counter.done.wait(120), f"{counter.count} of {args.messages} arrived"
            seconds = time.monotonic() - started
            print(f"live: {args.messages} QoS {args.qos} messages edge -> bridge -> mosquitto "
                  f"in {seconds:.2f} s: {args.messages / seconds:,.0f} msg/s ({load()})")
            if args.qos:
                counter.close()
                broker.stop()
                publish(port, args.qos, args.messages)  # queued by the bridge, on disk
                broker.start()
                started = time.monotonic()
                counter = Counter(broker.port, args.qos, "bench-sub")
                counter.expect(args.messages)
                assert counter.done.wait(120), f"{counter.count} of {args.messages} arrived"
                seconds = time.monotonic() - started
                print(f"catch-up: {args.messages} queued QoS {args.qos} messages delivered "
                      f"{seconds:.2f} s after mosquitto came back (reconnect back-off "
                      f"included): {args.messages / seconds:,.0f} msg/s ({load()})")
            counter.close()
        finally:
            edge.stop()
            broker.stop()


if __name__ == "__main__":
    main()
