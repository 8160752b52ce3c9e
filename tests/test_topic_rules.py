"""Topic-filter permission rules as users meet them over real sockets: a ``home/#`` rule
grants ``home`` and below and not ``homer/x`` on MQTT (paho), WAMP (autobahn) and AMQP
(proton); ``devices/%u/#`` gives each user its own topics; a refusal's log line names the
rule set checked and the nearest rule; ``role add --topic`` writes such a rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions
from proton import LinkException

from router.core.credentials import hash_secret
from tests.auth_helpers import outcome
from tests.amqp_clients import Receive, Send, amqp_listeners, expect_body, message, send
from tests.amqp_clients import connect as amqp_connect
from tests.clients import connect, next_item, run
from tests.harness import ROOT, RouterProcess, realm_file
from tests.mqtt_clients import MqttClient, listeners

NOT_AUTHORIZED = 0x87
SECRETS = {"hank": "hank-secret", "alice": "alice-secret", "bob": "bob-secret"}
ROLES = {
    "home": [{"topic": "home/#", "allow": ["publish", "subscribe"]}],
    "fleet": [{"topic": "devices/%u/#", "allow": ["publish", "subscribe"]},
              {"topic": "clients/%c/#", "allow": ["publish"]}],
}


def realm() -> dict:
    return realm_file("realm1", roles=ROLES, anonymous_role=None, principals={
        "hank": {"role": "home", "ticket": hash_secret(SECRETS["hank"], 1000)},
        "alice": {"role": "fleet", "ticket": hash_secret(SECRETS["alice"], 1000)},
        "bob": {"role": "fleet", "ticket": hash_secret(SECRETS["bob"], 1000)}})


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("topic-rules"), [realm()],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture
def mqtt(router):
    opened: list[MqttClient] = []

    def open_(user: str, client_id: str | None = None) -> MqttClient:
        client = MqttClient(router, username=user, password=SECRETS[user], client_id=client_id)
        opened.append(client)
        assert client.connect().reason_code == 0
        return client

    yield open_
    for client in opened:
        client.close()


def test_mqtt_home_rule_grants_home_and_below_only(mqtt):
    hank = mqtt("hank")
    assert hank.subscribe(("home/#", 1), ("home/+/x", 1), ("home", 1), ("homer/x", 1),
                          ("#", 1), ("+/x", 1), ("$SYS/#", 1)) == [
        1, 1, 1, NOT_AUTHORIZED, NOT_AUTHORIZED, NOT_AUTHORIZED, NOT_AUTHORIZED]
    assert hank.publish("homer/x", b"out", qos=1) == NOT_AUTHORIZED
    assert hank.publish("home", b"in", qos=1) == 0
    hank.expect("home", b"in")


def test_wamp_home_rule_grants_home_and_below_only(router):
    async def scenario():
        hank = await connect(router, authid="hank", ticket=SECRETS["hank"])
        results = {}
        for uri, match in (("home", "exact"), ("home.a.b", "exact"), ("home.", "prefix"),
                           ("home..x", "wildcard"), ("homer.x", "exact"), ("home", "prefix"),
                           ("", "prefix"), (".x", "wildcard")):
            results[uri, match] = await outcome(hank.subscribe(
                lambda *args, **kwargs: None, uri, options=SubscribeOptions(match=match)))
        events = await hank.events("home.kitchen")
        for uri in ("homer.x", "home.kitchen"):
            results["publish", uri] = await outcome(hank.publish(
                uri, uri, options=PublishOptions(acknowledge=True, exclude_me=False)))
        got = await next_item(events)
        await hank.close()
        return results, got[0]

    results, got = run(scenario())
    assert results == {
        ("home", "exact"): "allowed", ("home.a.b", "exact"): "allowed",
        ("home.", "prefix"): "allowed", ("home..x", "wildcard"): "allowed",
        ("homer.x", "exact"): "denied", ("home", "prefix"): "denied",  # 'home' prefix: homer
        ("", "prefix"): "denied", (".x", "wildcard"): "denied",
        ("publish", "homer.x"): "denied", ("publish", "home.kitchen"): "allowed"}
    assert got == ["home.kitchen"]


def test_amqp_home_rule_grants_home_and_below_only(router):
    connection = amqp_connect(router, user="hank", password=SECRETS["hank"])
    try:
        receiver = connection.create_receiver("home/#", credit=10, options=Receive(1))
        send(connection.create_sender("home/kitchen", options=Send(1)), message(b"in", qos=1))
        expect_body(receiver, b"in")
        for address in ("homer/x", "mqtt:#", "prefix:home"):
            with pytest.raises(LinkException, match="unauthorized-access"):
                connection.create_receiver(address, options=Receive(1))
        with pytest.raises(LinkException, match="unauthorized-access"):
            connection.create_sender("homer/x", options=Send(1))
    finally:
        connection.close()


def test_user_and_client_id_patterns_give_each_their_own_topics(router, mqtt):
    alice, bob = mqtt("alice", client_id="car7"), mqtt("bob")
    assert alice.publish("devices/alice/x", b"1", qos=1) == 0
    assert alice.publish("devices/bob/x", b"2", qos=1) == NOT_AUTHORIZED
    assert alice.publish("clients/car7/x", b"3", qos=1) == 0
    assert alice.publish("clients/car8/x", b"4", qos=1) == NOT_AUTHORIZED
    assert bob.publish("devices/bob/x", b"5", qos=1) == 0
    assert bob.publish("devices/alice/x", b"6", qos=1) == NOT_AUTHORIZED
    assert alice.subscribe(("devices/alice/#", 1), ("devices/+/x", 1)) == [1, NOT_AUTHORIZED]
    assert bob.subscribe(("devices/alice/#", 1)) == [NOT_AUTHORIZED]

    async def wamp() -> dict:
        session = await connect(router, authid="alice", ticket=SECRETS["alice"])
        results = {}
        for uri in ("devices.alice.x", "devices.bob.x", "clients.car7.x"):
            try:
                await session.publish(uri, options=PublishOptions(acknowledge=True))
                results[uri] = "allowed"
            except ApplicationError:
                results[uri] = "denied"
        await session.close()
        return results

    assert run(wamp()) == {"devices.alice.x": "allowed", "devices.bob.x": "denied",
                           "clients.car7.x": "denied"}  # a WAMP session has no client id
    connection = amqp_connect(router, user="alice", password=SECRETS["alice"],
                              container_id="car7")
    try:
        connection.create_sender("devices/alice/x", options=Send(1))
        for address in ("devices/bob/x", "clients/car7/x"):  # nor has an AMQP session
            with pytest.raises(LinkException, match="unauthorized-access"):
                connection.create_sender(address, options=Send(1))
    finally:
        connection.close()


def test_a_refusal_log_names_the_rules_checked_and_the_nearest(tmp_path):
    """The issue's case: 'home.' as a WAMP prefix is refused 'home/#'; the log says why."""
    roles = {"user": [{"uri": "home.", "match": "prefix", "allow": ["publish", "subscribe"]}]}
    process = RouterProcess(tmp_path, [realm_file("realm1", roles=roles, principals={
        "hank": {"role": "user", "ticket": hash_secret(SECRETS["hank"], 1000)}},
        anonymous_role=None)], listeners=listeners("realm1", wamp=False)).start()
    client = MqttClient(process, username="hank", password=SECRETS["hank"])
    try:
        assert client.connect().reason_code == 0
        assert client.subscribe(("home/#", 0)) == [NOT_AUTHORIZED]
        line = process.wait_for_log(r"not_authorized")
    finally:
        client.close()
        process.stop()
    assert "may not subscribe 'home/#'" in line
    assert "checked realm 'realm1' role 'user'" in line
    assert "nearest rule: uri 'home.' (prefix) allows publish, subscribe" in line
    assert 'topic rule such as {"topic": "home/#"}' in line


def test_role_add_writes_a_topic_rule(tmp_path):
    process = RouterProcess(tmp_path, [realm_file("realm1")])  # config files only
    command = [sys.executable, "-m", "router", "role", "add", "--realm", "realm1", "--config",
               str(process.config_path), "--role", "sensors", "--topic", "sensors/+/temp",
               "--allow", "publish,subscribe"]
    added = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    assert "may now publish, subscribe on topic 'sensors/+/temp'" in added.stdout
    saved = json.loads((tmp_path / "realms" / "realm1.json").read_text())
    assert saved["roles"]["sensors"] == [{"topic": "sensors/+/temp",
                                          "allow": ["publish", "subscribe"]}]
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "has a rule for topic 'sensors/+/temp'" in again.stderr
    bad = subprocess.run(command[:-4] + ["--topic", "a/#/b", "--allow", "publish"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not an MQTT topic filter" in bad.stderr
    prefix = subprocess.run(command[:-4] + ["--uri", "home", "--match", "prefix", "--allow",
                                            "publish"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert prefix.returncode == 0, prefix.stderr
    assert "a WAMP prefix is a string prefix: 'home' also grants 'homer.x'" in prefix.stdout
    assert "use --topic 'home/#'" in prefix.stdout
