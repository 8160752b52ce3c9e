"""From WAMP, MQTT and AMQP traffic to report: the event logs, read by the Spark report job."""

from __future__ import annotations

import asyncio
import csv
import subprocess
import sys
import threading

import paho.mqtt.client as mqtt
from autobahn.wamp.types import PublishOptions

from tests.amqp_clients import Send, message, send
from tests.amqp_clients import connect as amqp_connect
from tests.clients import connect, next_item, run
from tests.harness import ROOT, RouterProcess, realm_file

WAMP_EVENTS, MQTT_EVENTS, AMQP_EVENTS, WAMP_SUBSCRIBERS = 12, 7, 5, 3


def table(out, name: str) -> list[dict[str, str]]:
    (part,) = (out / "tables" / name / "csv").glob("part-*.csv")
    with part.open(newline="") as file:
        return list(csv.DictReader(file))


def mqtt_publish_qos1(router, topic: str, count: int) -> None:
    host, port, _ = router.address("mqtt")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="e2e-publisher")
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect(host, port)
    client.loop_start()
    try:
        assert connected.wait(10)
        for n in range(count):
            client.publish(topic, f'[{n}]', qos=1).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def amqp_publish_qos2(router, address: str, count: int) -> None:
    connection = amqp_connect(router)
    try:
        sender = connection.create_sender(address, options=Send(qos=2))
        for n in range(count):
            send(sender, message(f"[{n}]".encode(), qos=2))
    finally:
        connection.close()


def test_report_numbers_match_the_traffic_sent(tmp_path):
    listeners = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                 {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                 {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
    router = RouterProcess(tmp_path / "node", [realm_file("realm1")], listeners=listeners,
                           extra_config={"eventlog": {"flush_interval": 0.1}}).start()

    async def wamp_traffic():
        subscribers = [await connect(router) for _ in range(WAMP_SUBSCRIBERS)]
        queues = [await s.events("com.e2e.wamp") for s in subscribers]
        mqtt_listener = await connect(router)
        mqtt_events = await mqtt_listener.events("com.e2e.mqtt")
        publisher = await connect(router)
        for n in range(WAMP_EVENTS):
            await publisher.publish("com.e2e.wamp", n, options=PublishOptions(
                acknowledge=True, retain=n % 4 == 0))
        for q in queues:
            for _ in range(WAMP_EVENTS):
                await next_item(q)
        return mqtt_listener, mqtt_events, subscribers + [publisher]

    async def finish(listener, events, others):
        for _ in range(MQTT_EVENTS):
            await next_item(events)
        for client in others + [listener]:
            await client.close()

    try:
        async def scenario():
            listener, events, others = await wamp_traffic()
            await asyncio.to_thread(mqtt_publish_qos1, router, "com/e2e/mqtt", MQTT_EVENTS)
            await asyncio.to_thread(amqp_publish_qos2, router, "com.e2e.amqp", AMQP_EVENTS)
            await finish(listener, events, others)

        run(scenario(), timeout=120)
    finally:
        assert router.stop() == 0

    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "spark_analytics", "report",
                             "--logs", str(tmp_path / "node" / "data" / "eventlog"),
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    topics = {(row["realm"], row["topic"]): row for row in table(out, "topics")}
    wamp_row, mqtt_row = topics[("realm1", "com.e2e.wamp")], topics[("realm1", "com.e2e.mqtt")]
    assert int(wamp_row["events"]) == WAMP_EVENTS
    assert [int(wamp_row[f"qos{q}"]) for q in (0, 1, 2)] == [WAMP_EVENTS, 0, 0]
    assert int(wamp_row["retained_set"]) == len(range(0, WAMP_EVENTS, 4))
    assert float(wamp_row["retained_share"]) == len(range(0, WAMP_EVENTS, 4)) / WAMP_EVENTS
    assert int(wamp_row["subscribes"]) == WAMP_SUBSCRIBERS
    assert int(mqtt_row["events"]) == MQTT_EVENTS
    assert [int(mqtt_row[f"qos{q}"]) for q in (0, 1, 2)] == [0, MQTT_EVENTS, 0]
    amqp_row = topics[("realm1", "com.e2e.amqp")]
    assert int(amqp_row["events"]) == AMQP_EVENTS
    assert [int(amqp_row[f"qos{q}"]) for q in (0, 1, 2)] == [0, 0, AMQP_EVENTS]
    fanout = [row for row in table(out, "fanout") if row["realm"] == "realm1"]
    assert {int(row["receivers"]) for row in fanout} >= {WAMP_SUBSCRIBERS, 1}
    protocols = {row["protocol"] for row in table(out, "protocols")}
    assert {"wamp.websocket", "mqtt", "amqp"} <= protocols
    assert (out / "report.html").exists()
