"""A closed connection is freed when it closes, not by the cycle collector, and a queued
message is not one more object for the collector to scan per receiver.

Objects in a reference cycle outlive their last use until a full collection; the router
makes full collections rare (they stop the reactor for as long as they take to scan every
object a busy node holds), so a connection in a cycle would keep its protocol objects,
session and transport buffers long after it closed. Over real sockets, for every
listener type: sessions that log in and are closed by the client, and silent connections
that the router closes at its handshake timeout. The router runs with
tests/garbage_probe on its path, which keeps whatever the collector finds and reports it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from router.mqtt.packets import Puback, Publish, Suback, Subscribe, SubscriptionOptions
from tests.amqp_clients import connect as amqp_connect
from tests.clients import raw_connect, run
from tests.harness import RouterProcess
from tests.mqtt_clients import V5, V311, ClientPool, RawMqtt
from tests.test_limits import (ALL_LISTENERS, RawWamp, listeners, open_socket, realm,
                               wait_all_closed)
from tests.test_session_memory import MESSAGES, PAYLOAD

PROBE = Path(__file__).resolve().parent / "garbage_probe"
TIMEOUT = 10.0
CONNECTION_TYPES = {
    "Server", "ConnectionFlow", "Gate", "HeldTransport",
    "RouterWebSocketProtocol", "RouterRawSocketProtocol", "WampSession",
    "MqttTcpProtocol", "MqttWebSocketProtocol", "MqttConnection", "MqttSession",
    "AmqpTcpProtocol", "AmqpConnection", "SaslServer",
}
"""What one client connection is made of, in every protocol."""


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("garbage")
    report = workdir / "garbage.json"
    with pytest.MonkeyPatch.context() as patch:  # the router process only
        patch.setenv("ROUTER_TEST_GARBAGE", str(report))
        patch.setenv("PYTHONPATH", os.pathsep.join(
            [str(PROBE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        process = RouterProcess(workdir, [realm()], listeners(handshake_timeout=1.0)).start()
    process.report = report
    process.reports = 0
    yield process
    process.stop()


def garbage_after_closes(router) -> dict[str, int]:
    """The router's collector report once no connection object is alive any more (the
    router may take a moment to notice the closes): what the collector had to find."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        report = request_report(router)
        if not CONNECTION_TYPES & set(report["live"]) or time.monotonic() > deadline:
            assert not CONNECTION_TYPES & set(report["live"]), {
                name: report["live"][name] for name in CONNECTION_TYPES & set(report["live"])}
            return report["garbage"]


def request_report(router) -> dict:
    """A new report (each one has the next number)."""
    os.kill(router.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if router.report.exists():
            report = json.loads(router.report.read_text())
            if report["dump"] > router.reports:
                router.reports = report["dump"]
                return report
        time.sleep(0.02)  # polling for the report file, not timing the router
    raise AssertionError("the router wrote no garbage report")


def connection_garbage(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after.get(name, 0) - before.get(name, 0) for name in CONNECTION_TYPES
            if after.get(name, 0) > before.get(name, 0)}


def test_sessions_closed_by_their_clients_leave_no_cycles(router):
    before = garbage_after_closes(router)
    for _ in range(3):
        wamp = RawWamp(router)
        wamp.send([1, "realm1", {"roles": {"subscriber": {}, "publisher": {}}}])
        assert wamp.recv()[0] == 2  # WELCOME
        # a retained event outlives its publisher's connection, and so does the publisher's
        # SessionInfo that it keeps: with the peer's text, not the connection; and the
        # store's writer, done with the write, keeps nothing of the acknowledgement
        wamp.send([16, 2, {"retain": True, "acknowledge": True}, "com.garbage.kept", ["x"]])
        assert wamp.recv()[0] == 17  # PUBLISHED
        wamp.send([32, 1, {}, "com.garbage.topic"])  # SUBSCRIBE
        assert wamp.recv()[0] == 33
        wamp.close()

        async def websocket_session() -> None:
            client = await raw_connect(router, "websocket")
            assert (await client.hello())[0] == 2
            client.close()
            await client.closed
        run(websocket_session())

        for version in (V311, V5):
            mqtt = RawMqtt(router)
            mqtt.connect_ok(version, client_id="")
            mqtt.send(Subscribe(1, [("garbage/topic", SubscriptionOptions(1))]))
            assert isinstance(mqtt.recv(), Suback)
            # (as WAMP's above: the retained event keeps its publisher's info, whose peer
            # is the TCP connection itself until the connection is lost)
            mqtt.send(Publish("garbage/kept", b"x", 1, True, False, 2))
            assert isinstance(mqtt.recv(), Puback)
            mqtt.close()

        amqp = amqp_connect(router)
        amqp.create_receiver("com.garbage.topic")
        amqp.close()
    after = garbage_after_closes(router)
    assert connection_garbage(before, after) == {}


def test_connections_closed_at_the_handshake_timeout_leave_no_cycles(router):
    before = garbage_after_closes(router)
    socks = [open_socket(router, kind) for kind in ALL_LISTENERS for _ in range(2)]
    wait_all_closed(socks, TIMEOUT)
    after = garbage_after_closes(router)
    assert connection_garbage(before, after) == {}


def publish_qos1(router, topic: str, count: int) -> None:
    publisher = RawMqtt(router)
    publisher.connect_ok(V311, client_id="garbage-publisher")
    codec = publisher.codec
    publisher.send_bytes(b"".join(codec.encode(Publish(topic, PAYLOAD, 1, False, False, i))
                                  for i in range(1, count + 1)))
    for packet_id in range(1, count + 1):
        assert isinstance(publisher.recv(), Puback)
    publisher.close()


def test_queued_messages_are_not_objects_for_the_collector_each(router):
    """Each message goes to two sessions: an offline one, whose queue keeps it, and an
    online one, which got it (so its wire bytes are cached with it). The queue holds
    the messages themselves: no object per queued delivery, no tracked cache per message."""
    topic = "com/garbage/q"
    pool = ClientPool(router)
    try:
        pool(V311, client_id="garbage-offline", clean=False).subscribe((topic, 1))
        pool.close()
        online = pool(V311, client_id="garbage-online")
        online.subscribe((topic, 1))
        before = request_report(router)["tracked"]
        publish_qos1(router, topic, MESSAGES)
        for _ in range(MESSAGES):
            online.next_message()
        deadline = time.monotonic() + TIMEOUT
        while True:  # until the online client's acknowledgements are all in
            tracked = request_report(router)["tracked"]
            grown = {name: tracked.get(name, 0) - before.get(name, 0)
                     for name in ("StoredMessage", "list", "dict")}
            if grown["list"] < MESSAGES / 100 or time.monotonic() > deadline:
                break
        assert grown["StoredMessage"] >= MESSAGES, grown
        assert grown["list"] < MESSAGES / 100, grown
        assert grown["dict"] < MESSAGES / 100, grown
    finally:
        pool.close()
        pool(V311, client_id="garbage-offline", clean=True).disconnect()  # queue discarded
        pool.close()
