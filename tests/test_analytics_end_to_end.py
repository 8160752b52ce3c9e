"""From WAMP, MQTT and AMQP traffic to report: the event logs, read by the Spark report job.

Besides plain traffic the clients do what an operator wants to find in the report: publishes
the realm denies (each protocol's client gets its error or negative acknowledgement),
messages that expire on arrival, a topic a WAMP subscriber cannot be sent, and MQTT
acknowledgements; every table is checked against the counts the test made itself.
"""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions
from proton import LinkException

from router.mqtt.packets import ReasonCode
from tests.amqp_clients import Send, message, send
from tests.amqp_clients import connect as amqp_connect
from tests.clients import connect, next_item, run
from tests.harness import ROOT, RouterProcess, realm_file
from tests.mqtt_clients import V5, ClientPool, publish_properties

WAMP_EVENTS, MQTT_EVENTS, AMQP_EVENTS, WAMP_SUBSCRIBERS = 12, 7, 5, 3
WAMP_DENIED, MQTT_DENIED, MQTT_EXPIRED = 2, 3, 4
# anonymous clients may do anything under com., nothing under org.
COM_ONLY = [{"uri": "com.", "match": "prefix", "allow": ["publish", "subscribe", "call",
                                                         "register"]}]


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
        with pytest.raises(LinkException):  # one refused attach to a denied address
            connection.create_sender("org.e2e.denied", options=Send(qos=1))
    finally:
        connection.close()


def mqtt_refused_and_expired(router) -> None:
    """MQTT 5 publishes the realm denies (PUBACK 0x87) and ones expiring on arrival."""
    pool = ClientPool(router)
    try:
        client = pool(V5)
        for _ in range(MQTT_DENIED):
            assert client.publish("org/e2e/denied", b"1", qos=1) == ReasonCode.NOT_AUTHORIZED
        for _ in range(MQTT_EXPIRED):
            assert client.publish("com/e2e/expired", b"1", qos=1, properties=publish_properties(
                MessageExpiryInterval=0)) == 0
        # a topic with a "." in a level: the WAMP prefix subscriber cannot be sent it
        assert client.publish("com/e2e/x/a.b", b"1", qos=1) == 0
    finally:
        pool.close()


def test_report_numbers_match_the_traffic_sent(tmp_path):
    listeners = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                 {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                 {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
    router = RouterProcess(tmp_path / "node", [realm_file("realm1", {"anonymous": COM_ONLY})],
                           listeners=listeners,
                           extra_config={"eventlog": {"flush_interval": 0.1}}).start()

    async def wamp_traffic():
        subscribers = [await connect(router) for _ in range(WAMP_SUBSCRIBERS)]
        queues = [await s.events("com.e2e.wamp") for s in subscribers]
        mqtt_listener = await connect(router)
        mqtt_events = await mqtt_listener.events("com.e2e.mqtt")
        await mqtt_listener.events("com.e2e.x", match="prefix")
        publisher = await connect(router)
        for n in range(WAMP_EVENTS):
            await publisher.publish("com.e2e.wamp", n, options=PublishOptions(
                acknowledge=True, retain=n % 4 == 0))
        for _ in range(WAMP_DENIED):
            with pytest.raises(ApplicationError, match="not_authorized"):
                await publisher.publish("org.e2e.denied", 1,
                                        options=PublishOptions(acknowledge=True))
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
            await asyncio.to_thread(acknowledging.subscribe, ("com/e2e/amqp", 1))
            await asyncio.to_thread(amqp_publish_qos2, router, "com.e2e.amqp", AMQP_EVENTS)
            for _ in range(AMQP_EVENTS):  # paho acknowledges each before handing it over
                await asyncio.to_thread(acknowledging.next_message)
            await asyncio.to_thread(mqtt_refused_and_expired, router)
            await finish(listener, events, others)

        mqtt_pool = ClientPool(router)
        acknowledging = mqtt_pool(V5)
        try:
            run(scenario(), timeout=120)
        finally:
            mqtt_pool.close()
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
    check_new_tables(out, topics)


def check_new_tables(out, topics: dict) -> None:
    """The operator's questions, answered with the numbers this test made."""
    # only concrete topics that were published to: no pattern, no "/" form, no denied topic
    assert {topic for _, topic in topics} == {"com.e2e.wamp", "com.e2e.mqtt", "com.e2e.amqp",
                                              "com.e2e.expired", "com/e2e/x/a.b"}
    refused = {(row["protocol"], row["operation"], row["reason"]): int(row["refused"])
               for row in table(out, "refused")}
    assert refused == {("wamp", "publish", "not_authorized"): WAMP_DENIED,
                       ("mqtt", "publish", "not_authorized"): MQTT_DENIED,
                       ("amqp", "publish", "not_authorized"): 1}
    drops = {(row["protocol"], row["reason"]): int(row["dropped"]) for row in table(out, "drops")}
    assert drops == {("mqtt", "expired"): MQTT_EXPIRED, ("wamp", "unrepresentable"): 1}
    unreceived = {row["topic"]: int(row["unreceived"]) for row in table(out, "unreceived_topics")}
    assert unreceived == {"com.e2e.expired": MQTT_EXPIRED}
    by_protocol = {row["protocol"]: row for row in table(out, "ack_latency_by_protocol")}
    assert int(by_protocol["mqtt"]["acks"]) == AMQP_EVENTS
    assert float(by_protocol["mqtt"]["latency_ms_max"]) >= 0
    (slowest,) = [row for row in table(out, "slowest_consumers") if row["protocol"] == "mqtt"]
    assert int(slowest["acks"]) == AMQP_EVENTS
    subscriptions = {(row["pattern"], row["match"]): int(row["subscribes"])
                     for row in table(out, "subscriptions")}
    assert subscriptions[("com.e2e.wamp", "exact")] == WAMP_SUBSCRIBERS
    assert subscriptions[("com.e2e.x", "prefix")] == 1
    assert subscriptions[("com.e2e.amqp", "exact")] == 1
    over_time = table(out, "top_topics_per_minute")
    assert sum(int(row["events"]) for row in over_time if row["topic"] == "com.e2e.wamp") == \
        WAMP_EVENTS
    (summary,) = table(out, "summary")
    churn = table(out, "session_churn")
    assert sum(int(row["joined"]) for row in churn) == int(summary["sessions"])
    assert sum(int(row["left"]) for row in churn) == int(summary["sessions"])
    sizes = table(out, "payload_sizes")
    assert sum(int(row["publishes"]) for row in sizes) == int(summary["events"])
    retained = table(out, "retained_per_hour")
    assert sum(int(row["sets"]) for row in retained) == len(range(0, WAMP_EVENTS, 4))


def test_report_right_after_traffic_counts_the_part_the_router_still_writes(tmp_path):
    """The router keeps its part open (rotation 300 s): the report reads it as it is, a line
    still being written included (it must not count), and says it did."""
    router = RouterProcess(tmp_path / "node", [realm_file("realm1")],
                           extra_config={"eventlog": {"flush_interval": 0.1}}).start()
    logs = tmp_path / "node" / "data" / "eventlog"
    publishes = 200

    async def traffic():
        publisher = await connect(router)
        for n in range(publishes):
            await publisher.publish("com.open.part", n, options=PublishOptions(acknowledge=True))
        await publisher.close()

    try:
        run(traffic())
        open_part = wait_for_records(logs, '"kind":"session_leave"', 1)  # the last record
        records = open_part.read_text().count("\n")
        # another realm's part caught mid-line by the read: whole lines count, the torn one not
        other = logs / "realm=other" / open_part.parent.name / ".part-0.jsonl"
        other.parent.mkdir(parents=True)
        record = {"ts": time.time(), "kind": "publish", "topic": "com.other", "qos": 0,
                  "payload_bytes": 3, "receivers": 0}
        other.write_text(json.dumps(record) + "\n" + json.dumps(record)[:20])
        out = tmp_path / "report"
        result = subprocess.run([sys.executable, "-m", "spark_analytics", "report",
                                 "--logs", str(logs), "--out", str(out)], cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
    finally:
        assert router.stop() == 0
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 still being written by the router" in result.stderr, result.stderr
    topics = {(row["realm"], row["topic"]): int(row["events"]) for row in table(out, "topics")}
    assert topics == {("realm1", "com.open.part"): publishes, ("other", "com.other"): 1}
    summary = {row["realm"]: int(row["records"]) for row in table(out, "summary")}
    assert summary == {"realm1": records, "other": 1}  # every record, joins and leaves too
    assert not (out / "_open-parts").exists()  # the copies read are removed


def wait_for_records(logs, text: str, count: int, timeout: float = 30.0):
    """realm1's open part once ``text`` is in it ``count`` times (the writer thread writes
    within a flush interval or so of the record)."""
    deadline = time.monotonic() + timeout
    while True:
        for part in logs.glob("realm=realm1/date=*/.part-*.jsonl"):
            if part.read_text().count(text) >= count:
                return part
        assert time.monotonic() < deadline, f"{count} × {text} not written in time"
        time.sleep(0.05)
