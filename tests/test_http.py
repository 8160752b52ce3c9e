"""The ``http`` listener over real sockets: publish to WAMP (autobahn), MQTT (paho) and AMQP
(proton) receivers, calls to an autobahn callee, retained events, history, Server-Sent
Events, logins and refusals (see docs/http.md)."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from urllib.parse import quote

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from autobahn.wamp.types import CallResult, RegisterOptions

from router.config import ConfigError, load_config
from router.core.credentials import hash_secret
from router.core.topic import display
from router.http.api import _path_topic, openapi_document
from tests import amqp_clients
from tests.auth_helpers import client_context, make_certs
from tests.clients import connect, next_item, run
from tests.harness import OPEN_ROLE, ROOT, RouterProcess
from tests.http_clients import EventReader, basic, bearer, request
from tests.metrics_scrape import scrape, value
from tests.mqtt_clients import MqttClient, unique

SECRETS = {"alice": "alice-secret", "op": "operator-secret", "nobody": "nobody-secret"}
OPERATOR = OPEN_ROLE + [
    {"uri": "wamp.retained.", "match": "prefix", "allow": ["call"]},
    {"uri": "wamp.admin.", "match": "prefix", "allow": ["call"]},
    {"uri": "wamp.router.", "match": "prefix", "allow": ["call"]},
]


def http_realm() -> dict:
    """Anonymous and alice may do anything outside wamp.*; op also administers; nobody may
    only publish on ``nobody.only`` (so every route refuses it)."""
    principals = {name: {"role": role, "ticket": hash_secret(SECRETS[name], 1000)}
                  for name, role in (("alice", "user"), ("op", "operator"),
                                     ("nobody", "nobody"))}
    return {"name": "realm1", "anonymous_role": "anonymous", "uri_check": "loose",
            "roles": {"anonymous": OPEN_ROLE, "user": OPEN_ROLE, "operator": OPERATOR,
                      "nobody": [{"uri": "nobody.only", "match": "exact",
                                  "allow": ["publish"]}]},
            "principals": principals,
            "history": [{"uri": "hist.", "match": "prefix", "limit": 100}]}


def http_listeners(**http_keys) -> list[dict]:
    return [{"type": "http", "host": "127.0.0.1", "port": 0, "realm": "realm1",
             "max_message_size": 4096, **http_keys},
            {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
            {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
            {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("http"), [http_realm()],
                            listeners=http_listeners(sse_max_queued=50)).start()
    yield process
    process.stop()


OP = basic("op", SECRETS["op"])


# publish -------------------------------------------------------------------------------

def test_a_json_publish_reaches_wamp_mqtt_and_amqp_receivers(router):
    topic = unique("pub").replace("-", "_")
    mqtt = MqttClient(router)
    mqtt.connect()
    mqtt.subscribe((topic.replace(".", "/") + "/x", 0))
    amqp = amqp_clients.connect(router)
    receiver = amqp.create_receiver(f"{topic}.x", options=amqp_clients.Receive(qos=0))

    async def scenario():
        session = await connect(router)
        events = await session.events(f"{topic}.x")
        reply = await asyncio.to_thread(
            request, router, "POST", "/publish",
            {"topic": f"{topic}.x", "args": [21.5], "kwargs": {"unit": "C"}})
        assert reply.status == 200, reply.body
        args, kwargs, _ = await next_item(events)
        assert args == [21.5] and kwargs == {"unit": "C"}
        await session.close()
        return reply.json["publication"]

    try:
        publication = run(scenario())
        assert type(publication) is int
        # args and kwargs reach MQTT as {"args": [...], "kwargs": {...}} JSON and AMQP as
        # that map in an amqp-value, as a WAMP publication's do (docs/mqtt-and-amqp.md)
        expected = {"args": [21.5], "kwargs": {"unit": "C"}}
        assert json.loads(mqtt.next_message().payload) == expected
        assert receiver.receive(timeout=10).body == expected
    finally:
        mqtt.close()
        amqp.close()


def test_a_raw_text_body_reaches_mqtt_unchanged_and_wamp_mapped(router):
    name = unique("raw")
    mqtt = MqttClient(router)
    mqtt.connect()
    mqtt.subscribe((f"{name}/temp", 1))

    async def scenario():
        session = await connect(router)
        events = await session.events(f"{name}.temp")
        reply = await asyncio.to_thread(
            request, router, "POST", f"/publish?mqtt_topic={name}/temp&qos=1",
            None, {"Content-Type": "text/plain"}, b"21.5")
        assert reply.status == 200, reply.body
        args, kwargs, _ = await next_item(events)
        assert args == [21.5] and not kwargs  # JSON text maps to args, as an MQTT payload
        await session.close()

    try:
        run(scenario())
        message = mqtt.next_message()
        assert message.payload == b"21.5" and message.qos == 1
        assert message.properties.ContentType == "text/plain"
    finally:
        mqtt.close()


def test_a_binary_body_reaches_amqp_and_mqtt_as_the_same_bytes(router):
    name = unique("bin")
    payload = bytes(range(256))
    mqtt = MqttClient(router)
    mqtt.connect()
    mqtt.subscribe((f"{name}/blob", 0))
    amqp = amqp_clients.connect(router)
    receiver = amqp.create_receiver(f"{name}/blob", options=amqp_clients.Receive(qos=0))
    try:
        reply = request(router, "POST", f"/publish?mqtt_topic={name}/blob", None,
                        {"Content-Type": "application/octet-stream"}, payload)
        assert reply.status == 200, reply.body
        assert mqtt.next_message().payload == payload
        assert amqp_clients.body_bytes(receiver.receive(timeout=10)) == payload
    finally:
        mqtt.close()
        amqp.close()


def test_a_retained_event_with_a_message_expiry_is_gone_after_it(router):
    topic = unique("expiring").replace("-", "_")
    reply = request(router, "POST", "/publish", {"topic": topic, "args": [1], "retain": True,
                                                 "expires_in": 1})
    assert reply.status == 200
    assert request(router, "GET", f"/retained/{topic}").status == 200
    deadline = time.monotonic() + 20
    while request(router, "GET", f"/retained/{topic}").status == 200:
        assert time.monotonic() < deadline, "the retained event outlived its expiry"
    assert request(router, "POST", "/publish", {"topic": topic, "expires_in": -1}).status == 400


def test_an_expiry_further_off_than_a_wire_can_say_is_delivered_with_the_longest(router):
    # the longest expires_in, 2**32 - 1 s (MQTT 5's longest message expiry interval), is
    # more milliseconds than AMQP's 32-bit ttl holds: AMQP gets its largest value; the
    # message was lost (an encoding error) for AMQP receivers
    name = unique("far")
    mqtt = MqttClient(router)
    mqtt.connect()
    mqtt.subscribe((f"{name}/t", 1))
    amqp = amqp_clients.connect(router)
    receiver = amqp.create_receiver(f"{name}/t", credit=10,
                                    options=amqp_clients.Receive(qos=1))
    try:
        reply = request(router, "POST", "/publish", {"mqtt_topic": f"{name}/t", "args": [1],
                                                     "qos": 1, "expires_in": 0xFFFFFFFF})
        assert reply.status == 200, reply.body
        message = mqtt.next_message()
        assert message.payload == b"1"
        assert message.properties.MessageExpiryInterval > 0xFFFFFFFF - 60
        message, delivery = amqp_clients.received(receiver)
        assert message.body == 1 and message.ttl == 0xFFFFFFFF / 1000
        amqp_clients.settle(receiver, delivery)
    finally:
        mqtt.close()
        amqp.close()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e12", "1" + "0" * 400])
def test_a_not_finite_or_too_long_expiry_or_retained_ttl_is_refused(router, value):
    # a NaN retained TTL made `retained list` fail for the whole realm (its JSON cannot say
    # NaN) and, at the top of the expiry heap, would stop every retained event's expiry;
    # an integer no float holds was answered 503 with a traceback logged at ERROR
    topic = unique("nan").replace("-", "_")
    for key in ("expires_in", "retain_ttl"):
        body = f'{{"topic": "{topic}", "args": [1], "retain": true, "{key}": {value}}}'
        reply = request(router, "POST", "/publish", None,
                        {"Content-Type": "application/json"}, body.encode())
        assert reply.status == 400, (key, reply.body)
    assert request(router, "GET", f"/retained/{topic}").status == 404


@given(st.lists(st.text(st.sampled_from("ab.[]/\"#"), max_size=4), min_size=1, max_size=3))
def test_a_listed_topic_name_in_a_path_is_that_topic(levels):
    """What GET /retained lists (:func:`display`) names the same topic in a path: a name
    beginning with '[' read as a JSON list was another topic, or refused."""
    topic = tuple(levels)
    assert _path_topic(display(topic)) == topic


def test_a_path_topic_with_a_lone_surrogate_is_refused(router):
    # the refusal named it, and encoding that name failed: a 500 with a traceback
    answer = request(router, "GET", "/retained/" + quote('["\\ud800"]', safe=""))
    assert answer.status == 400 and "surrogate" in answer.json["message"]


def test_deleting_a_listed_one_level_mqtt_topic_with_a_dot_deletes_that_topic(router):
    # the MQTT topic "x.y" (one level) and the URI x.y (two levels) were both listed as
    # "x.y", and DELETE /retained/x.y (the console's Delete of either) purged the URI's
    name = unique("dot").replace("-", "_")
    mqtt = MqttClient(router)
    mqtt.connect()
    try:
        mqtt.publish(f"{name}.mqtt", b"one level", qos=1, retain=True)
    finally:
        mqtt.close()
    assert request(router, "POST", "/publish", {"topic": f"{name}.mqtt", "args": ["two levels"],
                                                "retain": True}).status == 200
    listed = request(router, "GET", f"/retained?prefix={name}").json["topics"]
    by_name = {event["topic"]: event for event in listed}
    assert len(by_name) == 2, listed
    one_level = by_name[json.dumps([f"{name}.mqtt"])]
    deleted = request(router, "DELETE", "/retained/" + quote(one_level["topic"], safe=""),
                      headers=OP)
    assert deleted.json == {"purged": 1}
    assert [event["args"] for event in request(
        router, "GET", f"/retained?prefix={name}").json["topics"]] == [["two levels"]]


def test_eligibility_lists_choose_the_receivers(router):
    topic = unique("elig").replace("-", "_")

    async def scenario():
        alice = await connect(router, authid="alice", ticket=SECRETS["alice"])
        other = await connect(router)
        to_alice = await alice.events(topic)
        to_other = await other.events(topic)
        reply = await asyncio.to_thread(request, router, "POST", "/publish",
                                        {"topic": topic, "args": ["only alice"],
                                         "eligible_authid": ["alice"]})
        assert reply.status == 200
        reply = await asyncio.to_thread(request, router, "POST", "/publish",
                                        {"topic": topic, "args": ["all but alice"],
                                         "exclude": [alice.session_id]})
        assert reply.status == 200
        assert (await next_item(to_alice))[0] == ["only alice"]
        assert (await next_item(to_other))[0] == ["all but alice"]
        await alice.close()
        await other.close()

    run(scenario())


def test_bad_publishes_are_400_and_oversize_413(router):
    malformed = request(router, "POST", "/publish", raw=b"{not json",
                        headers={"Content-Type": "application/json"})
    assert malformed.status == 400 and malformed.json["error"] == "wamp.error.invalid_argument"
    assert request(router, "POST", "/publish", {"args": [1]}).status == 400
    assert request(router, "POST", "/publish", {"topic": "a.b", "qos": 3}).status == 400
    assert request(router, "POST", "/publish", {"topic": "a.b", "bogus": 1}).status == 400
    big = request(router, "POST", "/publish", {"topic": "a.b", "args": ["x" * 5000]})
    assert big.status == 413 and big.json["error"] == "wamp.error.payload_size_exceeded"
    reserved = request(router, "POST", "/publish", {"topic": "wamp.x", "args": [1]})
    assert reserved.status == 403 and reserved.json["error"] == "wamp.error.not_authorized"
    # JSON's "\ud800" is a lone surrogate: no MQTT topic, log or store can write it (MQTT
    # receivers failed with a traceback each), so no topic of a loose realm either
    surrogate = request(router, "POST", "/publish", raw=b'{"topic": "a.\\ud800", "args": [1]}',
                        headers={"Content-Type": "application/json"})
    assert surrogate.status == 400 and surrogate.json["error"] == "wamp.error.invalid_uri"


def test_acknowledged_retained_publish_survives_kill9(tmp_path):
    process = RouterProcess(tmp_path, [http_realm()], listeners=http_listeners()).start()
    try:
        reply = request(process, "POST", "/publish",
                        {"topic": "durable.reading", "args": [7], "retain": True,
                         "acknowledge": True})
        assert reply.status == 200
        publication = reply.json["publication"]
        process.kill9()
        process.start()
        kept = request(process, "GET", "/retained/durable.reading")
        assert kept.status == 200, kept.body
        assert kept.json["args"] == [7] and kept.json["publication"] == publication
    finally:
        process.stop()


# call ----------------------------------------------------------------------------------

def test_a_call_reaches_an_autobahn_callee_and_progressive_results_come_as_ndjson(router):
    procedure = unique("proc").replace("-", "_")

    async def scenario():
        callee = await connect(router)

        async def add(a, b, details=None):
            if details is not None and details.progress:
                details.progress(a)
                details.progress(b)
            return a + b

        async def fail():
            from autobahn.wamp.exception import ApplicationError
            raise ApplicationError("com.example.oops", "it went wrong")

        await callee.register(add, f"{procedure}.add",
                              options=RegisterOptions(details_arg="details"))
        await callee.register(fail, f"{procedure}.fail")
        plain = await asyncio.to_thread(request, router, "POST", "/call",
                                        {"procedure": f"{procedure}.add", "args": [2, 3]})
        assert plain.status == 200 and plain.json == {"args": [5]}
        streamed = await asyncio.to_thread(
            request, router, "POST", "/call", {"procedure": f"{procedure}.add", "args": [2, 3]},
            {"Accept": "application/x-ndjson"})
        assert streamed.status == 200
        assert streamed.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in streamed.body.splitlines()]
        assert lines == [{"args": [2]}, {"args": [3]}, {"args": [5]}]
        failed = await asyncio.to_thread(request, router, "POST", "/call",
                                         {"procedure": f"{procedure}.fail"})
        assert failed.status == 502
        assert failed.json["error"] == "com.example.oops"
        assert failed.json["message"] == "it went wrong"
        await callee.close()

    run(scenario())
    missing = request(router, "POST", "/call", {"procedure": "no.such.procedure"})
    assert missing.status == 404 and missing.json["error"] == "wamp.error.no_such_procedure"


def test_a_call_that_outlives_its_timeout_is_504(router):
    procedure = unique("slow").replace("-", "_")

    async def scenario():
        callee = await connect(router)
        never: asyncio.Future = asyncio.get_running_loop().create_future()

        async def slow():
            return await never

        await callee.register(slow, procedure)
        reply = await asyncio.to_thread(request, router, "POST", "/call",
                                        {"procedure": procedure, "timeout": 0.3})
        assert reply.status == 504 and reply.json["error"] == "wamp.error.timeout"
        never.cancel()
        await callee.close()

    run(scenario())
    assert request(router, "POST", "/call", {"procedure": "a.b", "timeout": 10_000}).status == 400


# retained ------------------------------------------------------------------------------

def test_retained_list_get_and_delete_by_topic_prefix_and_mqtt_filter(router):
    base = unique("ret").replace("-", "_")
    for topic, value in ((f"{base}.kitchen.temp", 21), (f"{base}.hall.temp", 19),
                         (f"{base}.hall.light", "on"), (f"{base}x.other", 0)):
        assert request(router, "POST", "/publish", {"topic": topic, "args": [value],
                                                    "retain": True}).status == 200
    listed = request(router, "GET", f"/retained?prefix={base}.")
    assert [event["topic"] for event in listed.json["topics"]] == [
        f"{base}.hall.light", f"{base}.hall.temp", f"{base}.kitchen.temp"]
    first = request(router, "GET", f"/retained?prefix={base}.&limit=2")
    assert len(first.json["topics"]) == 2 and first.json["next"] == f"{base}.hall.temp"
    second = request(router, "GET", f"/retained?prefix={base}.&limit=2&cursor={first.json['next']}")
    assert [e["topic"] for e in second.json["topics"]] == [f"{base}.kitchen.temp"]
    assert second.json["next"] is None
    filtered = request(router, "GET", f"/retained?filter={base}/%2B/temp")
    assert [e["args"] for e in filtered.json["topics"]] == [[19], [21]]
    one = request(router, "GET", f"/retained/{base}/kitchen/temp")  # MQTT form in the path
    assert one.status == 200 and one.json["args"] == [21]
    # deleting is the operator's (wamp.retained.purge), as over WAMP
    refused = request(router, "DELETE", f"/retained/{base}.kitchen.temp")
    assert refused.status == 403 and refused.json["error"] == "wamp.error.not_authorized"
    deleted = request(router, "DELETE", f"/retained/{base}.kitchen.temp", headers=OP)
    assert deleted.status == 200 and deleted.json == {"purged": 1}
    gone = request(router, "GET", f"/retained/{base}.kitchen.temp")
    assert gone.status == 404 and gone.json["error"] == "wamp.error.no_such_retained"
    purged = request(router, "DELETE", f"/retained?prefix={base}.hall", headers=OP)
    assert purged.json == {"purged": 2}
    assert request(router, "GET", f"/retained?prefix={base}.").json["topics"] == []
    assert request(router, "GET", f"/retained/{base}x.other").status == 200
    assert request(router, "GET", "/retained?filter=a/%23/b").status == 400


# history -------------------------------------------------------------------------------

def test_history_reads_what_get_events_gives(router):
    topic = f"hist.{unique('h').replace('-', '_')}"
    for n in range(4):
        request(router, "POST", "/publish", {"topic": topic, "args": [n]})
    every = request(router, "GET", f"/history?topic={topic}", headers=OP)
    assert every.status == 200
    assert [event["args"] for event in every.json["events"]] == [[0], [1], [2], [3]]
    latest = request(router, "GET", f"/history?topic={topic}&limit=2&reverse=true", headers=OP)
    assert [event["args"] for event in latest.json["events"]] == [[3], [2]]
    assert request(router, "GET", f"/history?topic={topic}&limit=x").status == 400


# Server-Sent Events ----------------------------------------------------------------------

def test_sse_sends_retained_then_live_and_resumes_after_last_event_id(router):
    topic = f"hist.{unique('sse').replace('-', '_')}"
    request(router, "POST", "/publish", {"topic": f"{topic}.a", "args": ["kept"],
                                         "retain": True})
    reader = EventReader(router, f"/subscribe?prefix={topic}.&get_retained=true")
    try:
        assert reader.wait_status() == 200
        retained = reader.next()
        assert retained.event == "retained" and retained.data["args"] == ["kept"]
        request(router, "POST", "/publish", {"topic": f"{topic}.b", "args": ["live 1"]})
        live = reader.next()
        assert live.event == "message" and live.data["topic"] == f"{topic}.b"
        assert live.data["args"] == ["live 1"] and live.id
    finally:
        reader.close()
    for n in (2, 3):  # published while nobody listens
        request(router, "POST", "/publish", {"topic": f"{topic}.b", "args": [f"live {n}"]})
    resumed = EventReader(router, f"/subscribe?prefix={topic}.",
                          headers={"Last-Event-ID": live.id})
    try:
        assert [resumed.next().data["args"] for _ in range(2)] == [["live 2"], ["live 3"]]
        request(router, "POST", "/publish", {"topic": f"{topic}.b", "args": ["live 4"]})
        assert resumed.next().data["args"] == ["live 4"]
    finally:
        resumed.close()


def test_an_sse_subscriber_counts_as_a_session_and_a_subscription(router):
    topic = unique("counted").replace("-", "_")
    reader = EventReader(router, f"/subscribe?topic={topic}")
    try:
        assert reader.wait_status() == 200
        request(router, "POST", "/publish", {"topic": topic, "args": [1]})
        reader.next()  # subscribed for sure
        sessions = request(router, "GET", "/sessions?limit=1000").json
        assert sessions["by_protocol"].get("http", 0) >= 1
        assert any(s["protocol"] == "http" and s["subscriptions"] == 1
                   for s in sessions["sessions"])
        subscriptions = request(router, "GET", "/subscriptions?limit=1000").json
        mine = [s for s in subscriptions["subscriptions"] if s["uri"] == topic]
        assert len(mine) == 1 and len(mine[0]["subscribers"]) == 1
    finally:
        reader.close()


def test_a_kicked_sse_stream_ends_with_a_closed_event(router):
    topic = unique("kicked").replace("-", "_")
    reader = EventReader(router, f"/subscribe?topic={topic}")
    try:
        assert reader.wait_status() == 200
        request(router, "POST", "/publish", {"topic": topic, "args": [1]})
        reader.next()
        listed = request(router, "GET", "/subscriptions?limit=1000").json["subscriptions"]
        (session_id,) = [s["subscribers"] for s in listed if s["uri"] == topic][0]
        assert request(router, "DELETE", f"/sessions/{session_id}", headers=OP).status == 200
        closed = reader.next()
        assert closed.event == "closed" and closed.data["reason"] == "wamp.close.killed"
        assert reader.closed.wait(10) and reader.frames.get(timeout=10) is None
    finally:
        reader.close()


def test_a_stopped_sse_reader_is_cut_at_its_bound_while_another_gets_every_event(router):
    topic = unique("slow").replace("-", "_")
    stopped = EventReader(router, f"/subscribe?topic={topic}", read=False, receive_buffer=4096)
    reading = EventReader(router, f"/subscribe?topic={topic}")
    try:
        assert reading.wait_status() == 200
        before = _incidents(router, "disconnected")
        padding = "x" * 3000
        count = 0
        while _incidents(router, "disconnected") == before:
            count += 1
            assert count < 5000, "the stopped reader was never cut"
            request(router, "POST", "/publish", {"topic": topic, "args": [count, padding]})
            assert reading.next().data["args"][0] == count
    finally:
        stopped.close()
        reading.close()


def _incidents(router, reason: str) -> int:
    totals = request(router, "GET", "/incidents", headers=OP).json["totals"]
    return sum(item["count"] for item in totals
               if item["reason"] == reason and item["protocol"] == "http")


# operators ---------------------------------------------------------------------------

def test_operators_see_sessions_stats_and_incidents_and_kick_a_session(router):
    async def scenario():
        session = await connect(router, authid="alice", ticket=SECRETS["alice"])
        session_id = session.session_id
        listed = await asyncio.to_thread(request, router, "GET", "/sessions?limit=1000")
        mine = [s for s in listed.json["sessions"] if s["session"] == session.session_id]
        assert mine and mine[0]["authid"] == "alice" and mine[0]["protocol"].startswith("wamp")
        stats = await asyncio.to_thread(request, router, "GET", "/stats", None, OP)
        assert stats.status == 200 and stats.json["sessions"]["wamp"] >= 1
        assert stats.json["received"]["http"] >= 1 and stats.json["queued"]["wamp"] == 0
        # the session meta API's prefix (OPEN_ROLE's wamp.session.) does not close sessions
        refused = await asyncio.to_thread(request, router, "DELETE", f"/sessions/{session_id}")
        assert refused.status == 403
        kicked = await asyncio.to_thread(request, router, "DELETE", f"/sessions/{session_id}",
                                         None, OP)
        assert kicked.status == 200
        await asyncio.wait_for(asyncio.shield(session.disconnected), 10)
        again = await asyncio.to_thread(request, router, "DELETE", f"/sessions/{session_id}",
                                        None, OP)
        assert again.status == 404 and again.json["error"] == "wamp.error.no_such_session"

    run(scenario())
    incidents = request(router, "GET", "/incidents", headers=OP)
    assert incidents.status == 200 and isinstance(incidents.json["recent"], list)


# logins and refusals -------------------------------------------------------------------

ROUTE_REQUESTS = [
    ("POST", "/publish", {"topic": "a.b", "args": [1]}),
    ("POST", "/call", {"procedure": "wamp.session.count"}),
    ("GET", "/retained?prefix=a.", None),
    ("GET", "/retained/a.b", None),
    ("DELETE", "/retained/a.b", None),
    ("DELETE", "/retained?prefix=a.", None),
    ("GET", "/history?topic=hist.x", None),
    ("GET", "/subscribe?topic=a.b", None),
    ("GET", "/sessions", None),
    ("DELETE", "/sessions/1", None),
    ("GET", "/subscriptions", None),
    ("GET", "/stats", None),
    ("GET", "/incidents", None),
]


@pytest.mark.parametrize("method,path,body", ROUTE_REQUESTS,
                         ids=[f"{m} {p.split('?')[0]}" for m, p, _ in ROUTE_REQUESTS])
def test_a_principal_without_the_permission_gets_403_and_bad_credentials_401(
        router, method, path, body):
    refused = request(router, method, path, body, basic("nobody", SECRETS["nobody"]))
    assert refused.status == 403, refused.body
    assert refused.json["error"] == "wamp.error.not_authorized"
    wrong = request(router, method, path, body, basic("alice", "wrong"))
    assert wrong.status == 401 and "www-authenticate" in wrong.headers
    assert request(router, method, path, body, bearer("wrt_unknown")).status == 401


def cli(router: RouterProcess, *args: str) -> subprocess.CompletedProcess:
    """``python -m router ARGS --config <the router's>`` as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "router", *args, "--config",
                           str(router.config_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_a_cli_token_logs_in_as_its_principal_until_revoked(router):
    def token_cli(*args: str) -> subprocess.CompletedProcess:
        return cli(router, "token", *args)

    created = token_cli("create", "--realm", "realm1", "--principal", "op")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("wrt_")
    stored = (router.workdir / "data" / "http_tokens.json").read_text()
    assert token not in stored
    deadline = time.monotonic() + 20  # the router looks at the file again within 2 s
    while (status := request(router, "GET", "/stats", headers=bearer(token)).status) == 401:
        assert time.monotonic() < deadline, "the new token never worked"
    assert status == 200  # op's role: wamp.router.stats
    token_id = token_cli("list").stdout.splitlines()[1].split()[0]
    assert token_cli("revoke", "--id", token_id).returncode == 0
    deadline = time.monotonic() + 20  # the router looks at the file again within 2 s
    while request(router, "GET", "/stats", headers=bearer(token)).status != 401:
        assert time.monotonic() < deadline, "the revoked token still works"
    assert token_cli("create", "--realm", "realm1", "--principal", "ghost").returncode == 1


# the Basic login cache ------------------------------------------------------------------

ALICE = basic("alice", SECRETS["alice"])


def metered_router(workdir, realm: dict | None = None, **http_keys) -> RouterProcess:
    """A router with the http listener (``http_keys``) and a metrics listener to count its
    password checks on."""
    listeners = http_listeners(**http_keys) + [{"type": "metrics", "host": "127.0.0.1",
                                                "port": 0}]
    return RouterProcess(workdir, [realm or http_realm()], listeners=listeners).start()


def password_checks(router: RouterProcess) -> float:
    return value(scrape(router), "router_password_checks_total", protocol="http")


def statuses(router: RouterProcess, headers: dict, count: int, path: str = "/retained?prefix=a.") \
        -> set[int]:
    return {request(router, "GET", path, headers=headers).status for _ in range(count)}


def test_a_good_basic_login_is_checked_once_and_a_wrong_ticket_every_time(tmp_path):
    process = metered_router(tmp_path)
    try:
        assert password_checks(process) == 0
        assert statuses(process, ALICE, 20) == {200}
        assert password_checks(process) == 1
        # right after the good ticket: wrong ones are checked, each of them, and refused
        assert statuses(process, basic("alice", SECRETS["alice"] + "x"), 3) == {401}
        assert statuses(process, basic("alice", ""), 1) == {401}
        assert password_checks(process) == 5
        assert statuses(process, ALICE, 5) == {200}
        assert password_checks(process) == 5
        # another principal is checked on its own
        assert statuses(process, OP, 2, "/stats") == {200}
        assert password_checks(process) == 6
    finally:
        process.stop()


def test_a_changed_ticket_or_role_applies_at_once_despite_the_cache(tmp_path):
    realm = http_realm()
    process = metered_router(tmp_path, realm)
    try:
        assert statuses(process, ALICE, 2) == {200}
        assert statuses(process, OP, 2, "/stats") == {200}
        realm["principals"]["alice"]["ticket"] = hash_secret("alice-new", 1000)
        realm["principals"]["op"]["role"] = "user"
        (process.workdir / "realms" / "realm1.json").write_text(json.dumps(realm))
        reloaded = cli(process, "reload")
        assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
        checked = password_checks(process)
        assert statuses(process, ALICE, 2) == {401}
        assert password_checks(process) == checked + 2
        assert statuses(process, basic("alice", "alice-new"), 2) == {200}
        forbidden = request(process, "GET", "/stats", headers=OP)  # op's cached ticket
        assert forbidden.status == 403 and forbidden.json["error"] == "wamp.error.not_authorized"
        del realm["principals"]["alice"]
        (process.workdir / "realms" / "realm1.json").write_text(json.dumps(realm))
        assert cli(process, "reload").returncode == 0
        assert statuses(process, basic("alice", "alice-new"), 2) == {401}
    finally:
        process.stop()


def test_with_login_cache_ttl_0_every_basic_request_is_checked(tmp_path):
    process = metered_router(tmp_path, login_cache_ttl=0)
    try:
        assert statuses(process, ALICE, 4) == {200}
        assert password_checks(process) == 4
    finally:
        process.stop()


def test_a_remembered_login_is_checked_again_after_login_cache_ttl(tmp_path):
    process = metered_router(tmp_path, login_cache_ttl=0.5)
    try:
        remembered_until = time.monotonic() + 0.5  # at least: the check ends after this
        assert statuses(process, ALICE, 1) == {200}
        deadline = time.monotonic() + 30
        while password_checks(process) == 1:
            assert time.monotonic() < deadline, "the login was never checked again"
            assert statuses(process, ALICE, 1) == {200}
        assert time.monotonic() >= remembered_until
        assert password_checks(process) == 2
    finally:
        process.stop()


def test_at_login_cache_size_the_least_recently_used_login_is_checked_again(tmp_path):
    process = metered_router(tmp_path, login_cache_size=1)
    try:
        assert statuses(process, ALICE, 2) == {200}
        assert statuses(process, OP, 2, "/stats") == {200}  # alice's entry goes
        assert password_checks(process) == 2
        assert statuses(process, ALICE, 2) == {200}
        assert password_checks(process) == 3
    finally:
        process.stop()


@pytest.mark.parametrize("key,bad,expected", [
    ("login_cache_ttl", -1, "must not be negative"),
    ("login_cache_ttl", "60", "must be int or float"),
    ("login_cache_size", 0, "must be positive"),
    ("login_cache_size", -3, "must be positive"),
    ("login_cache_size", 1.5, "must be int"),
])
def test_bad_login_cache_values_are_refused_naming_the_key(tmp_path, key, bad, expected):
    process = RouterProcess(tmp_path, [http_realm()], listeners=http_listeners(**{key: bad}))
    with pytest.raises(ConfigError) as caught:
        load_config(process.config_path)
    assert f"listeners[0].{key}" in str(caught.value) and expected in str(caught.value)


def test_the_listener_serves_its_openapi_file_and_json_errors_for_unknown_routes(router):
    served = request(router, "GET", "/openapi.json", headers=basic("alice", "wrong"))
    assert served.status == 200 and served.body == openapi_document()
    missing = request(router, "GET", "/nowhere")
    assert missing.status == 404 and missing.json["error"] == "wamp.error.not_found"
    wrong_method = request(router, "PUT", "/publish", {"topic": "a.b"})
    assert wrong_method.status == 405 and wrong_method.headers["allow"] == "POST"


def test_connection_caps_and_the_stream_bound_answer_503(tmp_path):
    process = RouterProcess(tmp_path, [http_realm()], listeners=http_listeners(
        max_streams=1, max_connections_per_host=2)).start()
    try:
        first = EventReader(process, "/subscribe?topic=a.b")
        assert first.wait_status() == 200
        second = request(process, "GET", "/subscribe?topic=a.b")
        assert second.status == 503 and second.json["error"] == "wamp.error.unavailable"
        third = EventReader(process, "/subscribe?topic=a.b")  # over max_connections_per_host
        try:
            assert third.wait_status() == 503
        finally:
            third.close()
        first.close()  # its place is free again once the router sees the close
        deadline = time.monotonic() + 20
        while request(process, "GET", "/stats", headers=OP).json["event_streams"]:
            assert time.monotonic() < deadline, "a closed stream still counts"
        again = EventReader(process, "/subscribe?topic=a.b")
        try:
            assert again.wait_status() == 200
        finally:
            again.close()
    finally:
        process.stop()


def test_without_an_anonymous_role_a_request_without_credentials_is_401(tmp_path):
    realm = dict(http_realm(), anonymous_role=None)
    process = RouterProcess(tmp_path, [realm], listeners=http_listeners()).start()
    try:
        refused = request(process, "GET", "/retained?prefix=a.")
        assert refused.status == 401 and "www-authenticate" in refused.headers
        assert request(process, "GET", "/retained?prefix=a.",
                       headers=basic("alice", SECRETS["alice"])).status == 200
    finally:
        process.stop()


def test_an_https_listener_serves_the_api_over_tls(tmp_path):
    certs = make_certs(tmp_path / "certs")
    listener = dict(http_listeners()[0], tls={"cert": str(certs["cert"]),
                                              "key": str(certs["key"])})
    process = RouterProcess(tmp_path / "node", [http_realm()], listeners=[listener]).start()
    try:
        assert process.urls["http"].startswith("https://")
        host, port, _ = process.address("http")
        connection = http.client.HTTPSConnection(host, port, timeout=10,
                                                 context=client_context(certs))
        try:
            connection.request("POST", "/publish", body=json.dumps(
                {"topic": "secure.x", "args": [1], "retain": True}),
                headers={"Content-Type": "application/json", **basic("alice",
                                                                     SECRETS["alice"])})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            assert type(json.loads(response.read())["publication"]) is int
        finally:
            connection.close()
    finally:
        process.stop()


def _inline(schema, document: dict):
    """``schema`` as JSON Schema: its ``#/...`` references replaced by what they name, and
    OpenAPI 3.0's ``nullable`` as a type that admits null."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            target = document
            for part in schema["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return _inline(target, document)
        inlined = {key: _inline(value, document) for key, value in schema.items()
                   if key != "nullable"}
        if schema.get("nullable"):
            inlined["type"] = [schema["type"], "null"]
        return inlined
    if isinstance(schema, list):
        return [_inline(item, document) for item in schema]
    return schema


@pytest.mark.parametrize("path", ["/stats", "/incidents", "/sessions", "/subscriptions",
                                  "/retained?prefix=", "/history?prefix=hist."])
def test_answers_have_the_shape_the_openapi_file_gives(router, path):
    document = json.loads(openapi_document())
    schema = _inline(document["paths"][path.split("?")[0]]["get"]["responses"]["200"]
                     ["content"]["application/json"]["schema"], document)
    request(router, "POST", "/publish", {"topic": "hist.shape", "args": [1], "retain": True})
    reply = request(router, "GET", path, headers=OP)
    assert reply.status == 200, reply.body
    jsonschema.validate(reply.json, schema)
