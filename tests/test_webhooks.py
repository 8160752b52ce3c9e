"""Webhooks out: a realm's events POSTed to a real HTTP server the test runs, from a real
router process, published by autobahn (WAMP) and paho (MQTT) clients."""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from autobahn.wamp.types import PublishOptions

from router.config import ConfigError, load_config
from tests.auth_helpers import make_certs
from tests.clients import Sessions, next_item, run
from tests.harness import (OPEN_ROLE, ROOT, RedisServer, RouterProcess, free_port,
                           realm_file, redis_cluster)
from tests.metrics_scrape import scrape, value
from tests.mqtt_clients import MqttClient, publish_properties

TIMEOUT = 30.0
URL = "http://127.0.0.1:9/hook"
"""A URL nothing answers (the discard port), for configurations that are only loaded."""
SECRET = "hook-secret"


@dataclass
class Received:
    """One request the target got, and the status it answered (None: it never answered)."""

    headers: dict[str, str]
    body: bytes
    status: int | None = None

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Target:
    """A webhook target: an HTTP/1.1 server on 127.0.0.1 that records every request and
    answers 500 to the first ``failures`` of them, or holds them unanswered while
    ``hanging``."""

    def __init__(self, port: int = 0, failures: int = 0, hanging: bool = False,
                 certs: dict[str, Path] | None = None) -> None:
        """``certs`` (tests.auth_helpers.make_certs): serve HTTPS with its server pair."""
        self.requests: list[Received] = []
        self.failures = failures
        self.release = threading.Event()
        if not hanging:
            self.release.set()
        self._changed = threading.Condition()
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                received = Received(dict(self.headers.items()), self.rfile.read(length))
                with target._changed:
                    target.requests.append(received)
                    fail = target.failures > 0
                    target.failures -= fail
                    target._changed.notify_all()
                target.release.wait()
                received.status = 500 if fail else 204
                self.send_response(received.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with target._changed:
                    target._changed.notify_all()

            def log_message(self, *args) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.scheme = "http"
        if certs is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certs["cert"], certs["key"])
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://localhost:{self.port}/hook"

    def accepted(self) -> list[Received]:
        with self._changed:
            return [r for r in self.requests if r.status is not None and r.status < 300]

    def wait(self, condition, what: str, timeout: float = TIMEOUT) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout):
                raise AssertionError(f"the target never saw {what}; it got "
                                     f"{[(r.status, r.body[:80]) for r in self.requests]}")

    def wait_accepted(self, n: int, timeout: float = TIMEOUT) -> list[Received]:
        self.wait(lambda: sum(1 for r in self.requests
                              if r.status is not None and r.status < 300) >= n,
                  f"{n} accepted request(s)", timeout)
        return self.accepted()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def targets():
    made: list[Target] = []

    def make(**kwargs) -> Target:
        made.append(Target(**kwargs))
        return made[-1]

    yield make
    for target in made:
        target.stop()


def hook(url: str, **extra) -> dict:
    """A webhook entry on the topics under ``hook.`` (MQTT ``hook/...``), retrying fast."""
    entry = {"name": "orders", "url": url, "topic": "hook", "match": "prefix",
             "secret": SECRET, "min_backoff": 0.05, "max_backoff": 0.2}
    entry.update(extra)
    return entry


def start_router(tmp_path: Path, *webhooks: dict, roles: dict | None = None,
                 **realm_extra) -> RouterProcess:
    realm = realm_file("realm1", roles=roles, uri_check="loose", webhooks=list(webhooks),
                       **realm_extra)
    listeners = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                 {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                 {"type": "metrics", "host": "127.0.0.1", "port": 0}]
    return RouterProcess(tmp_path, [realm], listeners).start()


def mqtt_client(router: RouterProcess) -> MqttClient:
    client = MqttClient(router)
    client.connect()
    return client


def publish_numbered(router: RouterProcess, topic: str, count: int) -> None:
    """Publish ``{"n": 0}`` … ``{"n": count - 1}`` on the MQTT ``topic`` at QoS 1, each
    acknowledged (so each is queued by the webhook, durably at its QoS 1)."""
    publisher = mqtt_client(router)
    try:
        for n in range(count):
            publisher.publish(topic, json.dumps({"n": n}).encode(), qos=1)
    finally:
        publisher.close()


def wait_metric(router: RouterProcess, name: str, expected: float, at_least: bool = False,
                **labels: str) -> dict:
    """Scrape until ``name`` has the value ``expected`` (or more, ``at_least``): a bounded
    loop of real scrapes."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        samples = scrape(router)
        found = value(samples, name, **labels)
        if found == expected or (at_least and found > expected):
            return samples
        assert time.monotonic() < deadline, f"{name} never reached {expected}"
        time.sleep(0.05)


def router_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m router ARGS`` as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def check_signature(request: Received) -> None:
    """The signature header is the HMAC-SHA256 of ``<timestamp>.<body>`` under the secret."""
    stamp = request.headers["X-Webhook-Timestamp"]
    expected = hmac.new(SECRET.encode(), stamp.encode() + b"." + request.body,
                        hashlib.sha256).hexdigest()
    assert request.headers["X-Webhook-Signature"] == f"sha256={expected}"


def test_wamp_and_mqtt_events_reach_the_target_signed(tmp_path, targets):
    target = targets()
    disclosed = {"uri": "hook.wamp", "match": "exact", "allow": ["publish"], "disclose": True}
    router = start_router(tmp_path, hook(target.url),
                          roles={"anonymous": OPEN_ROLE + [disclosed]})
    mqtt = mqtt_client(router)
    try:
        async def scenario():
            async with Sessions(router) as sessions:
                publisher = await sessions()
                await publisher.publish("hook.wamp", 1, "two", key="value",
                                        options=_ack())
                await publisher.publish("other.topic", "not for the hook", options=_ack())

        run(scenario())
        first = target.wait_accepted(1)[0]
        mqtt.publish("hook/mqtt/json", b'{"n": 3}', qos=1)
        second = target.wait_accepted(2)[1]
        mqtt.publish("hook/mqtt/raw", b"\x00\xff", qos=1)
        third = target.wait_accepted(3)[2]
    finally:
        mqtt.close()
    for request in (first, second, third):
        check_signature(request)
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["X-Webhook-Id"] == request.event["id"]
    assert first.event["topic"] == "hook.wamp"
    assert first.event["mqtt_topic"] == "hook/wamp"
    assert (first.event["args"], first.event["kwargs"]) == ([1, "two"], {"key": "value"})
    assert first.event["publisher_authrole"] == "anonymous"
    assert first.event["qos"] == 1  # the default qos 1 and policy "maximum"
    assert second.event["topic"] == "hook.mqtt.json"
    assert (second.event["args"], second.event["kwargs"]) == ([], {"n": 3})
    assert "publisher" not in second.event  # not disclosed
    assert third.event["args"] == ["\x00AP8="]  # binary as WAMP's JSON carries it
    assert len({r.event["id"] for r in (first, second, third)}) == 3
    assert len(target.requests) == 3  # other.topic was not sent


def _ack() -> PublishOptions:
    return PublishOptions(acknowledge=True)


def test_an_https_target_is_reached_when_its_certificate_chains_to_the_ca(tmp_path, targets):
    certs = make_certs(tmp_path / "certs")
    target = targets(certs=certs)
    trusted = hook(target.url, name="trusted", ca=str(certs["ca"]))
    untrusted = hook(target.url, name="untrusted", min_backoff=60, max_backoff=60)
    router = start_router(tmp_path / "router", trusted, untrusted)
    publish_numbered(router, "hook/tls", 1)
    accepted = target.wait_accepted(1)
    check_signature(accepted[0])
    assert accepted[0].event["webhook"] == "trusted"
    # the other one does not trust the test CA: its handshake fails, nothing is sent
    wait_metric(router, "router_webhook_failed_requests_total", 1, realm="realm1",
                webhook="untrusted")
    assert [r.event["webhook"] for r in target.requests] == ["trusted"]


def test_a_failing_target_gets_every_qos1_event_once_in_order(tmp_path, targets):
    target = targets(failures=5)
    router = start_router(tmp_path, hook(target.url))
    publish_numbered(router, "hook/order", 10)
    accepted = target.wait_accepted(10)
    assert [r.event["kwargs"]["n"] for r in accepted] == list(range(10))
    assert len({r.event["id"] for r in accepted}) == 10
    # the first event was tried six times, with the same id, then taken
    assert [r.headers["X-Webhook-Attempt"] for r in target.requests[:6]] == \
        ["1", "2", "3", "4", "5", "6"]
    assert {r.headers["X-Webhook-Id"] for r in target.requests[:6]} == {accepted[0].event["id"]}
    assert len(target.requests) == 15
    labels = {"realm": "realm1", "webhook": "orders"}
    samples = wait_metric(router, "router_webhook_delivered_total", 10, **labels)
    assert value(samples, "router_webhook_failed_requests_total", **labels) == 5
    assert value(samples, "router_webhook_up", **labels) == 1
    assert value(samples, "router_webhook_queued_events", **labels) == 0


@pytest.mark.parametrize("stop", ["kill9", "sigterm"])
def test_queued_events_are_sent_after_a_restart(tmp_path, targets, stop):
    port = free_port()  # the target is down until the router has been stopped and restarted
    router = start_router(tmp_path, hook(f"http://127.0.0.1:{port}/hook"))
    publish_numbered(router, "hook/durable", 5)
    if stop == "kill9":
        router.kill9()
    else:
        assert router.stop() == 0
    router.start()
    assert any("webhook orders: 5 event(s) restored" in line for line in router.log_lines)
    target = targets(port=port)
    accepted = target.wait_accepted(5)
    assert [r.event["kwargs"]["n"] for r in accepted] == list(range(5))
    for request in accepted:
        check_signature(request)
    router.stop()


def test_on_redis_one_node_sends_every_event_of_the_cluster_across_its_kill9(tmp_path,
                                                                             targets):
    """Node a runs the webhook; node b's publications reach it through Redis, each
    acknowledged only once queued there; a kill -9 of node a loses none."""
    port = free_port()  # the target is down until node a has been killed and restarted
    webhook = hook(f"http://127.0.0.1:{port}/hook", node="a")

    def start_node(base: Path, redis: RedisServer, name: str) -> RouterProcess:
        listeners = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
                     {"type": "metrics", "host": "127.0.0.1", "port": 0}]
        engine = {"type": "redis", "url": redis.url, "node": name}
        return RouterProcess(base / name, [realm_file("realm1", webhooks=[webhook])],
                             listeners, extra_config={"engine": engine}).start()

    with redis_cluster(tmp_path, start_node, ("a", "b")) as (_, nodes):
        publish_numbered(nodes["b"], "hook/cluster", 4)
        publisher = mqtt_client(nodes["a"])
        try:
            publisher.publish("hook/cluster", b'{"n": 4}', qos=1)
        finally:
            publisher.close()
        assert value(scrape(nodes["a"]), "router_webhook_queued_events", realm="realm1",
                     webhook="orders") == 5
        assert not any(name.startswith("router_webhook") for name, _ in scrape(nodes["b"]))
        nodes["a"].kill9()
        nodes["a"].start()
        target = targets(port=port)
        accepted = target.wait_accepted(5)
    assert [r.event["kwargs"]["n"] for r in accepted] == list(range(5))
    assert len(target.requests) == 5  # one node sent them, once each


@pytest.mark.parametrize("qos, reason", [(1, "queue_full"), (0, "slow_consumer")])
def test_the_queue_bound_drops_and_counts(tmp_path, qos, reason):
    port = free_port()  # nothing listens: every request is refused, backing off for long
    router = start_router(tmp_path, hook(f"http://127.0.0.1:{port}/hook", max_queue=3,
                                         min_backoff=60, max_backoff=60, qos=qos,
                                         qos_policy="minimum"))
    publish_numbered(router, "hook/bound", 10)
    labels = {"realm": "realm1", "webhook": "orders"}
    samples = wait_metric(router, "router_webhook_up", 0, **labels)  # its refusal came back
    assert value(samples, "router_webhook_queued_events", **labels) == 3
    assert value(samples, "router_webhook_dropped_total", **labels) == 7
    assert value(samples, "router_messages_dropped_total", realm="realm1", protocol="webhook",
                 reason=reason) == 7
    status = router_cli("status", "--url", router.urls["metrics"], "--interval", "0.1")
    assert status.returncode == 0, status.stdout + status.stderr
    assert ("  webhook orders: down, queued 3, delivered 0, failed requests 1, "
            "dropped 7") in status.stdout.splitlines(), status.stdout


def test_an_event_is_given_up_after_max_attempts(tmp_path, targets):
    target = targets(failures=2)
    router = start_router(tmp_path, hook(target.url, max_attempts=2, topic="hook/+/attempts",
                                         match="mqtt"))
    publisher = mqtt_client(router)
    try:
        publisher.publish("hook/a/attempts", b'{"n": 0}', qos=1)
        publisher.publish("hook/b/not-matched", b'{"n": 1}', qos=1)
        publisher.publish("hook/b/attempts", b'{"n": 2}', qos=1)
        accepted = target.wait_accepted(1)
    finally:
        publisher.close()
    assert [r.event["kwargs"]["n"] for r in accepted] == [2]
    assert [r.event["kwargs"]["n"] for r in target.requests] == [0, 0, 2]
    samples = wait_metric(router, "router_webhook_dropped_total", 1, realm="realm1",
                          webhook="orders")
    assert value(samples, "router_messages_dropped_total", realm="realm1", protocol="webhook",
                 reason="unacknowledged") == 1


def test_the_queue_of_a_webhook_no_longer_configured_is_deleted(tmp_path, targets):
    port = free_port()
    router = start_router(tmp_path, hook(f"http://127.0.0.1:{port}/hook"))
    publish_numbered(router, "hook/stale", 3)
    router.stop()
    target = targets(port=port)
    realm = router.realms[0]
    realm["webhooks"] = [hook(target.url, name="renamed")]
    router.write_config()
    router.start()
    assert any("3 queued webhook event(s) deleted" in line for line in router.log_lines)
    publisher = mqtt_client(router)
    try:
        publisher.publish("hook/fresh", b'{"n": 9}', qos=1)
        accepted = target.wait_accepted(1)
    finally:
        publisher.close()
    assert [r.event["kwargs"]["n"] for r in accepted] == [9]
    assert accepted[0].event["webhook"] == "renamed"
    assert len(target.requests) == 1
    router.stop()


def test_a_webhook_acts_as_its_principal(tmp_path, targets):
    """A webhook with an ``authid`` is a receiver of that principal: eligibility lists by
    authid and authrole decide for it as for a client of the principal."""
    target = targets()
    roles = {"anonymous": OPEN_ROLE,
             "service": [{"uri": "hook.public", "match": "prefix", "allow": ["subscribe"]}]}
    router = start_router(tmp_path, hook(target.url, topic="hook.public", authid="svc"),
                          roles=roles, principals={"svc": {"role": "service"}})

    async def scenario():
        async with Sessions(router) as sessions:
            publisher = await sessions()
            for n, eligibility in enumerate([{"exclude_authid": ["svc"]},
                                             {"eligible_authrole": ["other"]},
                                             {"eligible_authid": ["svc"]},
                                             {"eligible_authrole": ["service"]}]):
                await publisher.publish("hook.public.x", n,
                                        options=PublishOptions(acknowledge=True, **eligibility))

    run(scenario())
    accepted = target.wait_accepted(2)
    assert [r.event["args"] for r in accepted] == [[2], [3]]
    assert len(target.requests) == 2


def test_a_webhook_is_a_session_and_a_role_change_stops_it(tmp_path, targets):
    target = targets()
    service = [{"uri": "hook", "match": "prefix", "allow": ["subscribe"]}]
    stats = {"uri": "wamp.router.", "match": "prefix", "allow": ["call"]}
    roles = {"anonymous": OPEN_ROLE + [stats], "service": service, "service2": service}
    router = start_router(tmp_path, hook(target.url, authid="svc"), roles=roles,
                          principals={"svc": {"role": "service"}})

    async def sessions_meta():
        async with Sessions(router) as sessions:
            operator = await sessions()
            figures = await operator.call("wamp.router.stats")
            assert figures["clients/connected"] == 1  # the operator: a webhook is no client
            return [await operator.call("wamp.session.get", session)
                    for session in await operator.call("wamp.session.list")]

    webhook = next(d for d in run(sessions_meta()) if d["transport"].get("type") == "webhook")
    assert (webhook["authid"], webhook["authrole"], webhook["authmethod"]) == \
        ("svc", "service", "webhook")
    assert webhook["transport"]["url"] == target.url
    router.realms[0]["principals"]["svc"]["role"] = "service2"
    router.write_config()
    result = router_cli("reload", "--config", str(router.config_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the principal 'svc' now has the role 'service2'" in result.stdout
    router.wait_for_log(r"webhook orders stopped")
    assert value(scrape(router), "router_webhook_up", realm="realm1", webhook="orders") == 0
    assert not any(d["transport"].get("type") == "webhook" for d in run(sessions_meta()))


def test_an_event_that_expires_while_queued_is_dropped(tmp_path, targets):
    port = free_port()
    router = start_router(tmp_path, hook(f"http://127.0.0.1:{port}/hook"))
    publisher = mqtt_client(router)
    try:
        publisher.publish("hook/expiring", b'{"n": 0}', qos=1,
                          properties=publish_properties(MessageExpiryInterval=1))
        publisher.publish("hook/lasting", b'{"n": 1}', qos=1)
    finally:
        publisher.close()
    samples = wait_metric(router, "router_messages_dropped_total", 1, realm="realm1",
                          protocol="webhook", reason="expired")
    assert value(samples, "router_webhook_queued_events", realm="realm1", webhook="orders") == 1
    target = targets(port=port)
    accepted = target.wait_accepted(1)
    assert [r.event["kwargs"]["n"] for r in accepted] == [1]


def test_a_changed_webhook_needs_a_restart(tmp_path):
    router = start_router(tmp_path, hook(URL))
    router.realms[0]["webhooks"] = [hook(URL, max_queue=5)]
    router.write_config()
    result = router_cli("reload", "--config", str(router.config_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "needs a restart: realm realm1: 'webhooks' changed" in result.stdout


def test_a_request_without_an_answer_in_time_is_sent_again(tmp_path, targets):
    target = targets(hanging=True)
    router = start_router(tmp_path, hook(target.url, timeout=0.5))
    publish_numbered(router, "hook/timeout", 1)
    labels = {"realm": "realm1", "webhook": "orders"}
    wait_metric(router, "router_webhook_failed_requests_total", 1, at_least=True, **labels)
    target.release.set()  # the target answers from now on
    samples = wait_metric(router, "router_webhook_delivered_total", 1, **labels)
    assert value(samples, "router_webhook_queued_events", **labels) == 0
    assert len(target.requests) >= 2
    assert len({r.headers["X-Webhook-Id"] for r in target.requests}) == 1


def test_a_hanging_target_never_holds_up_other_subscribers(tmp_path, targets):
    target = targets(hanging=True)
    router = start_router(tmp_path, hook(target.url, timeout=120))
    publisher = mqtt_client(router)
    try:
        async def scenario():
            async with Sessions(router) as sessions:
                subscriber = await sessions()
                events = await subscriber.events("hook", match="prefix")
                for n in range(50):
                    publisher.publish("hook/isolated", json.dumps({"n": n}).encode(), qos=1)
                return [(await next_item(events))[1]["n"] for _ in range(50)]

        got = run(scenario())
    finally:
        publisher.close()
    assert got == list(range(50))
    # all that while, the webhook's first request was still unanswered
    target.wait(lambda: len(target.requests) == 1, "its first request")
    assert target.requests[0].status is None
    labels = {"realm": "realm1", "webhook": "orders"}
    assert value(scrape(router), "router_webhook_queued_events", **labels) == 50


def write_realm(tmp_path: Path, webhooks: list, engine: dict | None = None,
                **realm_extra) -> Path:
    realm = realm_file("realm1", uri_check="loose", webhooks=webhooks, **realm_extra)
    (tmp_path / "realms").mkdir(exist_ok=True)
    (tmp_path / "realms" / "realm1.json").write_text(json.dumps(realm))
    config = {"realms": ["realm1"],
              "listeners": [{"type": "websocket", "host": "127.0.0.1", "port": 0}]}
    if engine is not None:
        config["engine"] = engine
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


@pytest.mark.parametrize("entry, key, problem", [
    ({"name": "a", "topic": "hook"}, "webhooks[0].url", "is required"),
    ({"name": "a", "url": "ftp://x/y", "topic": "hook"}, "webhooks[0].url",
     "must be an http:// or https:// URL"),
    ({"name": "a", "url": "http://u:p@x/y", "topic": "hook"}, "webhooks[0].url",
     "must not hold credentials"),
    ({"name": "a", "url": URL, "topic": "hook", "qos": 2}, "webhooks[0].qos", "must be 0 or 1"),
    ({"name": "a b", "url": URL, "topic": "hook"}, "webhooks[0].name", "must be 1 to 64"),
    ({"name": "a", "url": URL, "topic": "hook", "retries": 3}, "webhooks[0].retries",
     "unknown key"),
    ({"name": "a", "url": URL, "topic": "hook", "max_queue": 0}, "webhooks[0].max_queue",
     "must be positive"),
    ({"name": "a", "url": URL, "topic": "hook", "min_backoff": 5, "max_backoff": 1},
     "webhooks[0].max_backoff", "must be at least min_backoff"),
    ({"name": "a", "url": URL, "topic": "a b"}, "webhooks[0].topic", "is not a valid"),
    ({"name": "a", "url": URL, "topic": "hook", "authid": "nobody"}, "webhooks[0].authid",
     "'nobody' is not a principal"),
    ({"name": "a", "url": URL, "topic": "hook", "ca": "ca.pem"}, "webhooks[0].ca",
     "applies to an https:// url only"),
    ({"name": "a", "url": "https://x/y", "topic": "hook", "ca": "missing.pem"},
     "webhooks[0].ca", "cannot read CA certificates"),
    ({"name": "a", "url": URL, "topic": "hook", "headers": {"X-A": 1}},
     "webhooks[0].headers.X-A", "header name with a one-line string"),
], ids=["no-url", "scheme", "credentials", "qos", "name", "unknown", "bound", "backoff", "topic",
        "authid", "ca-http", "ca-missing", "header"])
def test_a_bad_webhook_is_refused_at_load(tmp_path, entry, key, problem):
    path = write_realm(tmp_path, [entry])
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert error.value.key == key
    assert problem in error.value.problem


def test_two_webhooks_of_one_name_are_refused(tmp_path):
    path = write_realm(tmp_path, [hook(URL), hook(URL, topic="other")])
    with pytest.raises(ConfigError, match=r"webhooks\[1\]\.name: 'orders' names another"):
        load_config(path)


REDIS = {"type": "redis", "url": "redis://127.0.0.1:6379/0", "node": "a"}


@pytest.mark.parametrize("engine, entry, problem", [
    (REDIS, hook(URL), r"webhooks\[0\]\.node: is required on the redis engine"),
    (None, hook(URL, node="a"), r"webhooks\[0\]\.node: applies to the redis engine only"),
], ids=["redis-without-node", "embedded-with-node"])
def test_the_node_of_a_webhook_is_named_on_redis_only(tmp_path, engine, entry, problem):
    path = write_realm(tmp_path, [entry], engine=engine)
    with pytest.raises(ConfigError, match=problem):
        load_config(path)


@pytest.mark.parametrize("who", ["anonymous", "principal"])
def test_a_webhook_its_role_may_not_subscribe_is_refused(tmp_path, who):
    limited = [{"uri": "hook.public", "match": "prefix", "allow": ["subscribe"]}]
    roles = {"anonymous": OPEN_ROLE, "limited": limited}
    extra = {"authid": "svc"} if who == "principal" else {}
    principals = {"svc": {"role": "limited"}}
    anonymous = "limited" if who == "anonymous" else "anonymous"
    path = write_realm(tmp_path, [hook(URL, topic="hook.private", **extra)], roles=roles,
                       principals=principals, anonymous_role=anonymous)
    result = router_cli("check-config", "--config", str(path))
    assert result.returncode != 0
    assert ("webhooks[0].topic: role 'limited' may not subscribe to 'hook.private'"
            in result.stderr), result.stderr
    # the same webhook on what the role covers loads
    path = write_realm(tmp_path, [hook(URL, topic="hook.public.orders", **extra)],
                       roles=roles, principals=principals, anonymous_role=anonymous)
    assert load_config(path).realms["realm1"].webhooks[0].topic == "hook.public.orders"


def test_an_anonymous_webhook_needs_an_anonymous_role(tmp_path):
    path = write_realm(tmp_path, [hook(URL)], anonymous_role=None)
    with pytest.raises(ConfigError, match="webhooks\\[0\\].authid: is required"):
        load_config(path)

