"""The metrics listener, black box: known traffic on WAMP, MQTT and AMQP, then exact deltas
in what a Prometheus scrape of ``/metrics`` over HTTP shows, and who may scrape it."""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from autobahn.wamp.types import PublishOptions

from router.config import ConfigError, load_config
from router.core.incidents import DROP_REASONS
from router.metrics.collector import DROP_PROTOCOLS
from router.status import duration
from tests.amqp_clients import Receive, Send, message, received, send, settle
from tests.amqp_clients import connect as amqp_connect
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import RouterProcess
from tests.metrics_scrape import check_byte_counts, delta, fetch, scrape
from tests.mqtt_clients import SECRETS, MqttClient, RawMqtt, listeners, mqtt_realm, unique

TOKEN = "scrape-secret"

def metrics_listener(**extra) -> dict:
    return {"type": "metrics", "host": "127.0.0.1", "port": 0, **extra}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(
        tmp_path_factory.mktemp("metrics"), [mqtt_realm("realm1")],
        listeners=listeners("realm1") + [
            {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
            metrics_listener()]).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A router whose metrics need a bearer token, on a path of its own."""
    process = RouterProcess(
        tmp_path_factory.mktemp("metrics-auth"), [mqtt_realm("realm1")],
        listeners=[{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                   metrics_listener(path="/prom", auth={"bearer_token": TOKEN})]).start()
    yield process
    process.stop()


def test_mqtt_qos1_to_two_subscribers_counts_received_and_delivered(router):
    topic = f"com/metrics/{unique('t')}"
    subscribers = [MqttClient(router) for _ in range(2)]
    publisher = MqttClient(router)
    try:
        for client in subscribers + [publisher]:
            client.connect()
        for client in subscribers:
            client.subscribe((topic, 1))
        before = scrape(router)
        for n in range(10):
            publisher.publish(topic, f"m{n}".encode(), qos=1)
        for client in subscribers:
            got = [client.next_message().payload for _ in range(10)]
            assert got == [f"m{n}".encode() for n in range(10)]
        after = scrape(router)
    finally:
        for client in subscribers + [publisher]:
            client.close()
    mqtt1 = {"realm": "realm1", "protocol": "mqtt", "qos": "1"}
    assert delta(before, after, "router_messages_received_total", **mqtt1) == 10
    assert delta(before, after, "router_messages_delivered_total", **mqtt1) == 20
    for other in ("wamp", "amqp"):
        assert delta(before, after, "router_messages_delivered_total",
                     **dict(mqtt1, protocol=other)) == 0
    assert delta(before, after, "router_delivery_latency_seconds_count", realm="realm1") == 10
    # 10 PUBLISH packets of >= 2 + len(topic) bytes each way, at the least
    assert delta(before, after, "router_received_bytes_total", protocol="mqtt") >= 10 * len(topic)
    assert delta(before, after, "router_sent_bytes_total", protocol="mqtt") >= 20 * len(topic)


def test_a_shared_group_counts_one_delivery_per_publication(router):
    topic = f"com/metrics/{unique('g')}"
    members = [MqttClient(router) for _ in range(2)]
    publisher = MqttClient(router)
    try:
        for client in members + [publisher]:
            client.connect()
        for client in members:
            client.subscribe((f"$share/counted/{topic}", 1))
        before = scrape(router)
        for n in range(10):
            publisher.publish(topic, f"m{n}".encode(), qos=1)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            for client in members:  # either member may be the one that gets each
                with contextlib.suppress(queue.Empty):
                    got.append(client.messages.get(timeout=0.05).payload)
        after = scrape(router)
    finally:
        for client in members + [publisher]:
            client.close()
    assert sorted(got) == sorted(f"m{n}".encode() for n in range(10))
    mqtt1 = {"realm": "realm1", "protocol": "mqtt", "qos": "1"}
    assert delta(before, after, "router_messages_received_total", **mqtt1) == 10
    assert delta(before, after, "router_messages_delivered_total", **mqtt1) == 10


def test_byte_counters_match_what_the_client_wrote_and_read(router):
    check_byte_counts(router, RawMqtt(router))


def test_wamp_publishes_and_sessions(router):
    topic = f"com.metrics.{unique('w')}"
    before = scrape(router)

    async def scenario():
        subscriber = await wamp_connect(router, "rawsocket", "msgpack")
        publisher = await wamp_connect(router)
        events = await subscriber.events(topic)
        for n in range(3):
            await publisher.publish(topic, n, options=PublishOptions(acknowledge=True))
        got = [(await next_item(events))[0] for _ in range(3)]
        during = scrape(router)
        await subscriber.close()
        await publisher.close()
        return got, during

    got, during = run(scenario())
    assert got == [[0], [1], [2]]
    wamp0 = {"realm": "realm1", "protocol": "wamp", "qos": "0"}
    assert delta(before, during, "router_messages_received_total", **wamp0) == 3
    assert delta(before, during, "router_messages_delivered_total", **wamp0) == 3
    assert delta(before, during, "router_sessions", realm="realm1", protocol="wamp") == 2
    assert delta(before, during, "router_sessions_opened_total",
                 realm="realm1", protocol="wamp") == 2
    assert delta(before, during, "router_connections", protocol="wamp") == 2
    assert delta(before, during, "router_connections_opened_total", protocol="wamp") == 2


def test_amqp_sender_to_amqp_and_mqtt_receivers(router):
    topic = f"com.metrics.{unique('a')}"
    connection = amqp_connect(router)
    watcher = MqttClient(router)
    try:
        watcher.connect()
        watcher.subscribe((topic.replace(".", "/"), 0))
        receiver = connection.create_receiver(topic, credit=10, options=Receive(1))
        sender = connection.create_sender(topic, options=Send(1))
        before = scrape(router)
        for n in range(4):
            send(sender, message(f"a{n}", qos=1))
        for n in range(4):
            msg, delivery = received(receiver)
            settle(receiver, delivery)
            assert watcher.next_message().payload == f"a{n}".encode()
        after = scrape(router)
    finally:
        watcher.close()
        connection.close()
    amqp1 = {"realm": "realm1", "protocol": "amqp", "qos": "1"}
    assert delta(before, after, "router_messages_received_total", **amqp1) == 4
    assert delta(before, after, "router_messages_delivered_total", **amqp1) == 4
    # labelled by the publication's QoS, on the receiver's protocol
    assert delta(before, after, "router_messages_delivered_total",
                 **dict(amqp1, protocol="mqtt")) == 4


def test_retained_topics_failed_logins_and_password_checks(router):
    client = MqttClient(router)
    before = scrape(router)
    try:
        client.connect()
        client.publish(f"com/metrics/{unique('r')}", b"kept", qos=1, retain=True)
        intruder = MqttClient(router, username="alice", password="wrong")
        info = intruder.connect()
        assert info.reason_code != 0
        intruder.close()
        after = scrape(router)
    finally:
        client.close()
    assert delta(before, after, "router_retained_topics", realm="realm1") == 1
    assert delta(before, after, "router_retained_bytes", realm="realm1") > 0
    assert delta(before, after, "router_login_failures_total", protocol="mqtt") == 1
    assert delta(before, after, "router_password_checks_total", protocol="mqtt") == 1


def test_every_drop_reason_is_exported_from_start(router):
    """A dashboard's rate() of drops reads 0 on a healthy router, not "No data": each known
    reason has its series, at 0 until it happens."""
    samples = scrape(router)
    exported = {dict(labels)["reason"] for name, labels in samples
                if name == "router_messages_dropped_total" and dict(labels)["realm"] == "realm1"}
    assert exported >= set(DROP_REASONS)
    for reason in DROP_REASONS:  # a reason that is no client protocol's has its own label
        for protocol in DROP_PROTOCOLS.get(reason, ("wamp", "mqtt", "amqp")):
            assert ("router_messages_dropped_total", frozenset(
                {"realm": "realm1", "protocol": protocol, "reason": reason}.items())) in samples


def test_promtool_accepts_the_exposition(router):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    status, text = fetch(router)
    assert status == 200
    result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bearer_token_is_required_when_configured(guarded):
    assert fetch(guarded)[0] == 401
    assert fetch(guarded, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert fetch(guarded, headers={"Authorization": f"Basic {TOKEN}"})[0] == 401
    status, text = fetch(guarded, headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "router_uptime_seconds" in text
    assert fetch(guarded, path="/metrics",
                 headers={"Authorization": f"Bearer {TOKEN}"})[0] == 404


def test_basic_auth_listener_config(tmp_path):
    process = RouterProcess(
        tmp_path, [mqtt_realm("realm1")],
        listeners=[{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                   metrics_listener(auth={"basic": {"username": "prom", "password": "pw"}})])
    process.start()
    try:
        good = base64.b64encode(b"prom:pw").decode()
        bad = base64.b64encode(b"prom:nope").decode()
        assert fetch(process, headers={"Authorization": f"Basic {bad}"})[0] == 401
        assert fetch(process, headers={"Authorization": f"Basic {good}"})[0] == 200
    finally:
        process.stop()


@pytest.mark.parametrize("auth,key", [
    ({}, "bearer_token"),
    ({"bearer_token": "t", "basic": {"username": "u", "password": "p"}}, "bearer_token"),
    ({"basic": {"username": "u:x", "password": "p"}}, "basic.username"),
    ({"bearer_token": ""}, "bearer_token"),
    ({"token": "t"}, "token"),
])
def test_metrics_auth_config_errors_name_the_key(tmp_path, auth, key):
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")],
                            listeners=[metrics_listener(port=9100, auth=auth)])
    with pytest.raises(ConfigError) as caught:
        load_config(process.config_path)
    assert f"listeners[0].auth.{key}" in str(caught.value)


def test_shipped_config_enables_metrics_and_sys():
    config = load_config("config.json")
    metrics = [listener for listener in config.listeners if listener.type == "metrics"]
    assert [(m.host, m.port, m.path) for m in metrics] == [("127.0.0.1", 9100, "/metrics")]
    assert config.sys_interval > 0
    assert json.loads(open("config.json").read())["sys_interval"] == config.sys_interval


def test_status_command_summarizes_a_running_router(router):
    client = MqttClient(router)
    try:
        client.connect()
        result = subprocess.run(
            [sys.executable, "-m", "router", "status", "--url", router.urls["metrics"],
             "--interval", "0.2", "--config", "no-such-config.json"],
            capture_output=True, text=True, timeout=30)
    finally:
        client.close()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"router at {router.urls['metrics']}: up ")
    assert "realm realm1:" in lines
    sessions = next(line for line in lines if line.startswith("  sessions: "))
    assert "mqtt 1" in sessions or "mqtt 2" in sessions  # this client (+ a lingering one)
    assert any(line.startswith("  messages/s: in ") for line in lines)


def test_status_reads_in_human_units_and_says_what_it_counts(tmp_path):
    """A fresh router: uptime and the rate's interval as a person reads them, AMQP sessions
    explained beside its connections, and no client retained topic counted for the router's
    own $SYS figures."""
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")], listeners=listeners("realm1") + [
        {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
        metrics_listener()]).start()
    connection = amqp_connect(process)
    try:
        for topic in ("com.status.a", "com.status.b"):
            connection.create_receiver(topic, credit=10, options=Receive(1))
        result = subprocess.run(
            [sys.executable, "-m", "router", "status", "--url", process.urls["metrics"],
             "--interval", "0.25", "--config", "no-such-config.json"],
            capture_output=True, text=True, timeout=30)
    finally:
        connection.close()
        process.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(rf"router at {re.escape(process.urls['metrics'])}: up \d+ s", lines[0])
    assert "connections (network, all realms): wamp 0, mqtt 0, amqp 1, http 0" in lines
    assert ("  sessions: wamp 0, mqtt 0, amqp 3, http 0 (an AMQP connection is one session, "
            "and one more per receiving link)") in lines
    assert any(re.fullmatch(r"  messages/s: in \d+\.\d, out \d+\.\d \(over the last "
                            r"0\.\d s\)", line) for line in lines), lines
    retained = next(line for line in lines if line.startswith("  retained topics: "))
    assert re.fullmatch(r"  retained topics: 0 \(and \d+ of the router's own \$SYS topics\)",
                        retained), retained


def test_status_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (0, 59.9, 60, 1034, 3599, 3600, 3 * 3600 + 5 * 60,
                                  86_400 * 2 + 4 * 3600 + 59)] == [
        "0 s", "59 s", "1 min", "17 min", "59 min", "1 h 00 min", "3 h 05 min", "2 d 4 h"]


def test_status_command_uses_the_token_and_says_when_refused(guarded):
    command = [sys.executable, "-m", "router", "status", "--url", guarded.urls["metrics"],
               "--interval", "0", "--config", "no-such-config.json"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "401" in refused.stdout
    allowed = subprocess.run(command + ["--token", TOKEN], capture_output=True, text=True,
                             timeout=30)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_json_log_lines_carry_realm_protocol_and_peer(tmp_path):
    process = RouterProcess(tmp_path, [mqtt_realm("realm1")], listeners=listeners("realm1"),
                            extra_config={"login_backoff": {"after_failures": 0}},
                            run_args=["--log-format", "json"]).start()
    try:
        intruder = MqttClient(process, username="alice", password="wrong")
        assert intruder.connect().reason_code != 0
        intruder.close()
        login = json.loads(process.wait_for_log(r"login_failed"))
        limited = MqttClient(process, username="limited", password=SECRETS["limited"])
        limited.connect()
        assert limited.subscribe(("forbidden/x", 0)) == [0x87]
        limited.close()
        refusal = json.loads(process.wait_for_log(r"not_authorized"))
    finally:
        process.stop()
    entries = [json.loads(text) for text in process.log_lines]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    assert "realm" not in login  # a login has no realm yet
    assert login["protocol"] == "mqtt" and login["logger"] == "router.incidents"
    assert "from 127.0.0.1" in login["message"]
    assert refusal["realm"] == "realm1" and refusal["protocol"] == "mqtt"
    assert "forbidden/x" in refusal["message"]


def base_name(sample: str) -> str:
    """A sample's metric family as docs/metrics.md names it (counters with ``_total``)."""
    return re.sub(r"_(bucket|sum|count)$", "", sample)


def test_docs_and_dashboard_name_exactly_the_exposed_metrics(router):
    status, text = fetch(router)
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    documented = set(re.findall(r"^\| `(router_\w+)`", Path("docs/metrics.md").read_text(),
                                re.MULTILINE))
    assert documented == exposed
    dashboard = json.loads(Path("docs/grafana-dashboard.json").read_text())
    plotted = {base_name(name) for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"router_\w+", target["expr"])}
    assert plotted and plotted <= exposed
