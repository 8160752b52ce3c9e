"""Subscription work in proportion to the packet, and per-session bounds, black box.

A client that subscribes to 20,000 filters in one SUBSCRIBE must not stop the router
from serving everyone else meanwhile (issue 24, item 6), and what one session or
connection may hold is bounded, with each protocol's refusal (item 7).

Timing: the tests assert what holds whatever the machine's load. Another client's
PINGREQs are answered *while* the big packet is handled (several round trips begin and
end between SUBSCRIBE and SUBACK, which a router busy with the packet in one go cannot
do), and each of them is short against the packet's own time (both stretch alike on a
loaded machine). The absolute figures the issue asks for (round trip under 100 ms,
SUBACK within 2 s) are measured by ``bench/big_subscribe.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from autobahn.wamp.exception import ApplicationError
from proton import Terminus
from proton.utils import LinkDetached

from router.mqtt.packets import (Pingreq, Pingresp, Publish, Puback, Suback, Subscribe,
                                 SubscriptionOptions)
from tests.amqp_clients import Receive, Send, amqp_listeners, connect
from tests.clients import Sessions, next_item, run
from tests.harness import RouterProcess
from tests.metrics_scrape import delta, scrape
from tests.mqtt_clients import (V5, V311, ClientPool, RawMqtt, listeners, mqtt_realm, options,
                                unique)

BIG = 20_000
MQTT_CAP, WAMP_SUBSCRIPTIONS, WAMP_REGISTRATIONS, AMQP_LINKS, WAMP_CALLS = 3, 2, 2, 2, 2


@pytest.fixture(scope="module")
def big_router(tmp_path_factory):
    """Room for one session with 20,000 subscriptions (the default cap is 10,000)."""
    realm = mqtt_realm("realm1", mqtt={"max_subscriptions": BIG})
    process = RouterProcess(tmp_path_factory.mktemp("big"), [realm],
                            listeners("realm1", wamp=False)).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """Small caps on every protocol, and a metrics listener to see them counted."""
    realm = mqtt_realm("realm1", mqtt={"max_subscriptions": MQTT_CAP},
                       wamp={"max_subscriptions": WAMP_SUBSCRIPTIONS,
                             "max_registrations": WAMP_REGISTRATIONS,
                             "max_pending_calls": WAMP_CALLS},
                       amqp={"max_links": AMQP_LINKS})
    process = RouterProcess(
        tmp_path_factory.mktemp("caps"), [realm],
        amqp_listeners("realm1") + [{"type": "metrics", "host": "127.0.0.1", "port": 0}]).start()
    yield process
    process.stop()


@pytest.fixture
def mqtt(big_router):
    pool = ClientPool(big_router)
    yield pool
    pool.close()


@pytest.fixture
def capped(router):
    pool = ClientPool(router)
    yield pool
    pool.close()


class Pinger(threading.Thread):
    """Another client: PINGREQ after PINGREQ, each round trip's (start, end) recorded."""

    def __init__(self, router) -> None:
        super().__init__(daemon=True)
        self.client = RawMqtt(router)
        self.client.connect_ok(version=V5, client_id=unique("pinger"))
        self.trips: list[tuple[float, float]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                sent = time.monotonic()
                self.client.send(Pingreq())
                assert isinstance(self.client.recv(timeout=60), Pingresp)
                self.trips.append((sent, time.monotonic()))
                self.halt.wait(0.001)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        self.client.close()
        assert self.error is None, self.error

    def within(self, start: float, end: float) -> list[float]:
        """Round trips that began after ``start`` and ended before ``end``."""
        return [back - sent for sent, back in self.trips if sent >= start and back <= end]


def _assert_served_meanwhile(pinger: Pinger, start: float, end: float, least: int) -> None:
    trips = pinger.within(start, end)
    assert len(trips) >= least, \
        f"only {len(trips)} PING round trips of another client fit in the {end - start:.3f} s"
    # a frozen router answers no PING until the packet is done (max trip ~ end - start); the
    # pinger shares the test process's GIL with the client decoding 20,000 codes, so one trip
    # took 0.71 s of 2.03 s on a loaded machine: half the packet's time still tells them apart
    assert max(trips) < (end - start) / 2, \
        f"another client waited {max(trips):.3f} s of the packet's {end - start:.3f} s"


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_big_subscribe_and_unsubscribe_leave_other_clients_served(big_router, mqtt, transport):
    """Item 6: 20,000 filters in one SUBSCRIBE (33 s of a frozen router before), then
    10,000 in one UNSUBSCRIBE (6.2 s): all granted, and another client's PINGs answered
    all along."""
    client = mqtt(V5, transport, client_id=unique("big"), clean=False, session_expiry=60)
    names = [f"big/{n}/state" for n in range(BIG)]
    pinger = Pinger(big_router)
    pinger.start()
    try:
        started = time.monotonic()
        codes = client.subscribe(*[(name, options(1)) for name in names], timeout=120)
        subscribed = time.monotonic()
        assert codes == [1] * BIG
        _assert_served_meanwhile(pinger, started, subscribed, least=5)
        assert client.unsubscribe(*names[:BIG // 2], timeout=120) == [0] * (BIG // 2)
        unsubscribed = time.monotonic()
        assert len(pinger.within(subscribed, unsubscribed)) >= 1
    finally:
        pinger.stop()
    # what is left works: the kept half delivers, the removed half does not
    client.publish(names[0], b"gone", qos=1)
    client.publish(names[-1], b"kept", qos=1)
    assert client.next_message().payload == b"kept"


def test_packets_after_a_big_subscribe_wait_for_it(big_router):
    """The SUBSCRIBE's work spans reactor turns; the same client's next packets are
    handled after it, in order: SUBACK, then PINGRESP, then its PUBLISH, routed to the
    subscriptions the SUBSCRIBE made."""
    client = RawMqtt(big_router)
    try:
        client.connect_ok(version=V5, client_id=unique("ordered"))
        names = [f"ordered/{n}" for n in range(BIG)]
        subscribe = client.codec.encode(
            Subscribe(1, [(name, SubscriptionOptions(1)) for name in names]))
        publish = client.codec.encode(Publish(names[-1], b"after", 1, False, False, 2))
        client.send_bytes(subscribe + client.codec.encode(Pingreq()) + publish)
        suback = client.recv(timeout=120)
        assert isinstance(suback, Suback) and suback.reason_codes == [1] * BIG
        assert isinstance(client.recv(timeout=60), Pingresp)
        rest = {type(client.recv()), type(client.recv())}  # PUBACK and our own PUBLISH back
        assert rest == {Puback, Publish}
    finally:
        client.close()


def test_a_big_subscribe_with_a_bad_last_filter_changes_nothing(big_router):
    """Its filters are decoded over reactor turns, all before any is applied: a malformed
    packet closes the connection and leaves the persistent session as it was."""
    client_id, names = unique("malformed"), [f"malformed/{n}" for n in range(BIG)]
    client = RawMqtt(big_router)
    try:
        client.connect_ok(version=V311, client_id=client_id, clean=False)
        client.send_bytes(client.codec.encode(
            Subscribe(1, [(name, SubscriptionOptions(1)) for name in names + ["bad/#/x"]])))
        client.wait_closed(timeout=60)
    finally:
        client.close()
    again = RawMqtt(big_router)
    try:
        assert again.connect_ok(version=V311, client_id=client_id, clean=False).session_present
        sentinel = unique("sentinel")
        again.send(Subscribe(2, [(sentinel, SubscriptionOptions(0))]))
        assert isinstance(again.recv(), Suback)
        again.send(Publish(names[0], b"not subscribed"))
        again.send(Publish(sentinel, b"sentinel"))
        received = again.recv()
        assert isinstance(received, Publish) and received.payload == b"sentinel", received
    finally:
        again.close()


# --- caps (item 7) ---------------------------------------------------------------------------


@pytest.mark.parametrize("version, refusal", [(V311, 0x80), (V5, 0x97)],
                         ids=["mqtt311", "mqtt5"])
def test_mqtt_subscriptions_per_session_are_capped(router, capped, version, refusal):
    before = scrape(router)
    client = capped(version)
    prefix = unique("cap")
    filters = [f"{prefix}/{n}" for n in range(MQTT_CAP + 2)]
    codes = client.subscribe(*[(name, 1) for name in filters])
    assert codes == [1] * MQTT_CAP + [refusal] * 2
    # the same filter again replaces a subscription: not one more
    assert client.subscribe((filters[0], 0)) == [0]
    assert client.subscribe((f"{prefix}/+", 0)) == [refusal]
    # the bound is on what is held: room again after an UNSUBSCRIBE
    client.unsubscribe(filters[1])
    assert client.subscribe((f"{prefix}/+", 0)) == [0]
    assert delta(before, scrape(router), "router_incidents_total", realm="realm1",
                 protocol="mqtt", reason="over_limit") == 3


def test_wamp_subscriptions_and_registrations_per_session_are_capped(router):
    async def scenario():
        before = scrape(router)
        async with Sessions(router) as open_session:
            session = await open_session()
            prefix = f"com.cap.{unique('wamp')}"
            for n in range(WAMP_SUBSCRIPTIONS):
                await session.subscribe(lambda *args: None, f"{prefix}.topic{n}")
            with pytest.raises(ApplicationError) as refused:
                await session.subscribe(lambda *args: None, f"{prefix}.over")
            assert refused.value.error == "wamp.error.limit_exceeded"
            kept = []
            for n in range(WAMP_REGISTRATIONS):
                kept.append(await session.register(lambda: n, f"{prefix}.proc{n}"))
            with pytest.raises(ApplicationError) as refused:
                await session.register(lambda: None, f"{prefix}.over")
            assert refused.value.error == "wamp.error.limit_exceeded"
            await kept[0].unregister()  # room again
            await session.register(lambda: "again", f"{prefix}.again")
            assert await session.call(f"{prefix}.again") == "again"
        assert delta(before, scrape(router), "router_incidents_total", realm="realm1",
                     protocol="wamp", reason="over_limit") == 2

    run(scenario())


def test_wamp_calls_in_progress_per_session_are_capped(router):
    # a caller's calls to a callee that answers late were held without bound: 100,000 of
    # them (1 KB of arguments each) grew the router by 184 MB
    async def scenario():
        before = scrape(router)
        async with Sessions(router) as open_session:
            callee, caller = await open_session(), await open_session()
            procedure = f"com.cap.{unique('calls')}"
            reached: asyncio.Queue[asyncio.Future] = asyncio.Queue()

            def late() -> asyncio.Future:
                answer = asyncio.get_running_loop().create_future()
                reached.put_nowait(answer)
                return answer

            await callee.register(late, procedure)
            pending = [asyncio.ensure_future(caller.call(procedure)) for _ in range(WAMP_CALLS)]
            answers = [await next_item(reached) for _ in range(WAMP_CALLS)]  # at the callee
            with pytest.raises(ApplicationError) as refused:
                await caller.call(procedure)
            assert refused.value.error == "wamp.error.limit_exceeded"
            answers[0].set_result("first")
            assert await pending[0] == "first"  # room again
            again = asyncio.ensure_future(caller.call(procedure))
            answers.append(await next_item(reached))
            for answer in answers[1:]:
                answer.set_result("later")
            assert [await pending[1], await again] == ["later", "later"]
        assert delta(before, scrape(router), "router_incidents_total", realm="realm1",
                     protocol="wamp", reason="over_limit") == 1

    run(scenario())


def test_amqp_links_per_connection_are_capped(router):
    before = scrape(router)
    connection = connect(router)
    try:
        address = f"com.cap.{unique('amqp')}"
        connection.create_receiver(address, credit=10, name=unique("in"), options=Receive(1))
        sender = connection.create_sender(address, name=unique("out"), options=Send(1))
        with pytest.raises(LinkDetached) as refused:
            connection.create_receiver(address, credit=10, name=unique("in"),
                                       options=Receive(1))
        assert "amqp:resource-limit-exceeded" in str(refused.value)
        with pytest.raises(LinkDetached):
            connection.create_sender(address, name=unique("out"), options=Send(1))
        sender.close()  # room again
        connection.create_sender(address, name=unique("out"), options=Send(1))
    finally:
        connection.close()
    assert delta(before, scrape(router), "router_incidents_total", realm="realm1",
                 protocol="amqp", reason="over_limit") == 2


def test_a_refused_amqp_link_is_attached_without_a_terminus_then_detached(router):
    """AMQP 1.0 2.6.3: refusing a link is an attach without source (target), then a detach
    carrying the error."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    from tests.amqp_clients import url

    seen: list = []

    class Probe(MessagingHandler):
        def on_start(self, event):
            connection = event.container.connect(url(router), allowed_mechs="ANONYMOUS",
                                                 allow_insecure_mechs=True)
            for n in range(AMQP_LINKS + 1):
                event.container.create_receiver(connection, f"com.cap.probe{n}", name=f"l{n}")

        def on_link_error(self, event):
            link = event.link
            seen.append((link.name, link.remote_source.type, link.remote_condition.name))
            event.connection.close()

    container = Container(Probe())
    container.timeout = 10
    container.run()
    assert seen == [(f"l{AMQP_LINKS}", Terminus.UNSPECIFIED, "amqp:resource-limit-exceeded")]
