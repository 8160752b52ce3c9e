"""Shared subscriptions, black box: MQTT ``$share/{group}/{filter}`` (3.1.1 and 5.0), WAMP
``x_shared_group`` and AMQP ``x-shared-group`` members in one load-balanced group.

Every test counts what each member received and checks the group got every message
exactly once. "Nothing more arrived" is shown by an end marker on a topic each member
also subscribes to normally: it arrives behind anything the router sent before it.
"""

from __future__ import annotations

import pytest
from proton import symbol
from proton.utils import LinkDetached

from router.mqtt.packets import (Disconnect, Puback, Publish, Suback, Subscribe,
                                 SubscriptionOptions, Unsuback, Unsubscribe)
from tests.amqp_clients import Receive, amqp_listeners, body_bytes
from tests.amqp_clients import connect as amqp_connect
from tests.clients import raw_connect, run
from tests.harness import RouterProcess
from tests.mqtt_clients import (SECRETS, V5, V311, ClientPool, RawMqtt, mqtt_realm, options,
                                unique)

END = b"end"
COUNT = 12


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("shared"), [mqtt_realm("realm1")],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


class SharedReceive(Receive):
    """A receiver link that joins a shared group with the ``x-shared-group`` property."""

    def __init__(self, group: str, qos: int = 1, durable: bool = False) -> None:
        super().__init__(qos, durable=durable)
        self.group = group

    def apply(self, link) -> None:
        super().apply(link)
        link.properties = {symbol("x-shared-group"): self.group}


def payloads(count: int = COUNT) -> list[bytes]:
    return [f"m{i}".encode() for i in range(count)]


def mqtt_share(client) -> list[bytes]:
    """What an MQTT member received before the end marker."""
    return [message.payload for message in client.collect_until(END)]


def assert_exactly_once(shares: list[list[bytes]], sent: list[bytes]) -> None:
    """Together the members got every message once; each member got some."""
    everything = [payload for share in shares for payload in share]
    assert sorted(everything) == sorted(sent), shares
    assert all(shares), f"a member got nothing: {shares}"


# --- announcements -------------------------------------------------------------------------


def test_connack_announces_shared_subscriptions(clients):
    connack = clients.new(V5).connect()
    assert connack.reason_code == 0
    assert connack.properties.SharedSubscriptionAvailable == 1


def test_welcome_announces_x_shared_group(router):
    async def scenario():
        client = await raw_connect(router, "websocket")
        welcome = await client.hello()
        client.close()
        return welcome

    welcome = run(scenario())
    assert welcome[0] == 2
    assert welcome[2]["roles"]["broker"]["features"]["x_shared_group"] is True


# --- MQTT members ----------------------------------------------------------------------------


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("versions", [(V5, V5), (V311, V5)], ids=["mqtt5", "mqtt311+mqtt5"])
def test_mqtt_members_share_every_message_once(clients, qos, versions):
    base, group = unique("share"), unique("g")
    end_topic = f"{base}_end"
    members = [clients(version) for version in versions]
    for member in members:
        assert member.subscribe((f"$share/{group}/{base}/#", qos), (end_topic, 0)) == [qos, 0]
    publisher = clients(V5)
    sent = payloads()
    for index, payload in enumerate(sent):
        publisher.publish(f"{base}/x/{index}", payload, qos)
    publisher.publish(end_topic, END, 1)
    shares = [mqtt_share(member) for member in members]
    assert_exactly_once(shares, sent)
    assert [len(share) for share in shares] == [COUNT // 2, COUNT // 2], "not round robin"


def test_normal_and_shared_subscription_of_one_client_both_deliver(clients):
    base, group = unique("both"), unique("g")
    member = clients(V5)
    assert member.subscribe((f"$share/{group}/{base}", 1), (base, 1)) == [1, 1]
    clients(V5).publish(base, b"twice", 1)
    assert [member.next_message().payload for _ in range(2)] == [b"twice", b"twice"]


def test_shared_subscription_gets_no_retained_message_on_subscribe(clients):
    base, group = unique("retained"), unique("g")
    publisher = clients(V5)
    publisher.publish(base, b"old", 1, retain=True)
    member = clients(V5)
    assert member.subscribe((f"$share/{group}/{base}", options(1))) == [1]
    publisher.publish(base, b"live", 1)
    message = member.next_message()
    assert message.payload == b"live", "the retained message went to a shared subscription"
    normal = clients(V5)
    normal.subscribe((base, 1))
    assert normal.next_message().payload == b"old"  # a normal subscription does get it


def raw_subscribe(router, version: int, *topic_filters: str):
    """The router's answer to one SUBSCRIBE of ``topic_filters`` (paho refuses to send
    invalid ones; the raw client sends them as a broken client would)."""
    client = RawMqtt(router)
    try:
        client.connect_ok(version, unique("raw"))
        client.send(Subscribe(1, [(topic_filter, SubscriptionOptions(0))
                                  for topic_filter in topic_filters]))
        return client.recv()
    finally:
        client.close()


@pytest.mark.parametrize("version", [V5, V311], ids=["mqtt5", "mqtt311"])
def test_invalid_share_names_are_refused(router, version):
    bad = ["$share//a", "$share/g/", "$share/g"]
    suback = raw_subscribe(router, version, *bad, f"$share/{unique('g')}/a/+")
    assert isinstance(suback, Suback), suback
    assert suback.reason_codes == [0x8F if version == V5 else 0x80] * len(bad) + [0]


@pytest.mark.parametrize("share_name", ["g+", "g#"])
def test_wildcard_in_a_share_name_is_a_malformed_filter(router, share_name):
    """As for any filter with a wildcard inside a level: DISCONNECT 0x8F (as Mosquitto)."""
    answer = raw_subscribe(router, V5, f"$share/{share_name}/a")
    assert isinstance(answer, Disconnect) and answer.reason_code == 0x8F, answer


def test_no_local_on_a_shared_subscription_is_a_protocol_error(router):
    client = RawMqtt(router)
    try:
        client.connect_ok(V5, unique("nolocal"))
        client.send(Subscribe(1, [("$share/g/a", SubscriptionOptions(0, no_local=True))]))
        packet = client.recv()
        assert isinstance(packet, Disconnect) and packet.reason_code == 0x82, packet
    finally:
        client.close()


def test_unacknowledged_messages_of_a_leaving_member_go_to_another(clients, router):
    """A 3.1.1 clean-session member that reads PUBLISH but never sends PUBACK disconnects:
    the other member gets those messages (QoS 1 allows the second copy)."""
    base, group = unique("handover"), unique("g")
    silent = RawMqtt(router)
    try:
        silent.connect_ok(V311, unique("silent"))
        silent.send(Subscribe(1, [(f"$share/{group}/{base}", SubscriptionOptions(1))]))
        assert isinstance(silent.recv(), Suback)
        publisher = clients(V5)
        sent = [b"h0", b"h1", b"h2"]
        for payload in sent:  # the only member: all three are in flight to it
            publisher.publish(base, payload, 1)
        received = [silent.recv() for _ in sent]
        assert [(type(p), p.payload) for p in received] == [(Publish, p) for p in sent]
        heir = clients(V5)
        assert heir.subscribe((f"$share/{group}/{base}", 1)) == [1]
    finally:
        silent.drop()
    assert sorted(heir.next_message().payload for _ in sent) == sent
    publisher.publish(base, b"after", 1)  # the group goes on with the remaining member
    assert heir.next_message().payload == b"after"


def test_unsubscribing_member_hands_over_what_it_was_not_sent_yet(clients, router):
    """Receive maximum 1: the first message is in flight, the others wait in the member's
    queue. On UNSUBSCRIBE the waiting ones go to the other member; the one in flight is
    completed by the client that has it (MQTT 3.10.4), so nothing arrives twice."""
    base, group = unique("unsub"), unique("g")
    end_topic, shared_filter = f"{base}_end", f"$share/{group}/{base}"
    narrow = RawMqtt(router)
    try:
        narrow.connect_ok(V5, unique("narrow"), properties={"receive_maximum": 1})
        narrow.send(Subscribe(1, [(shared_filter, SubscriptionOptions(1)),
                                  (end_topic, SubscriptionOptions(0))]))
        assert isinstance(narrow.recv(), Suback)
        publisher = clients(V5)
        for payload in (b"u0", b"u1", b"u2"):
            publisher.publish(base, payload, 1)
        in_flight = narrow.recv()
        assert (type(in_flight), in_flight.payload) == (Publish, b"u0")
        other = clients(V5)
        assert other.subscribe((shared_filter, 1), (end_topic, 0)) == [1, 0]
        narrow.send(Unsubscribe(2, [shared_filter]))
        assert isinstance(narrow.recv(), Unsuback)
        narrow.send(Puback(in_flight.packet_id))
        publisher.publish(end_topic, END, 1)
        assert sorted(mqtt_share(other)) == [b"u1", b"u2"]
        after = narrow.recv()
        assert (type(after), after.payload) == (Publish, END), after
    finally:
        narrow.close()


def test_messages_go_to_online_members_while_a_persistent_member_is_away(clients):
    base, group, client_id = unique("away"), unique("g"), unique("away")
    end_topic, shared_filter = f"{base}_end", f"$share/{group}/{base}"
    persistent = dict(username="alice", password=SECRETS["alice"], client_id=client_id,
                      clean=False, session_expiry=300)
    away = clients(V5, **persistent)
    assert away.subscribe((shared_filter, 1), (end_topic, 1)) == [1, 1]
    online = clients(V5)
    assert online.subscribe((shared_filter, 1), (end_topic, 0)) == [1, 0]
    away.disconnect()
    publisher = clients(V5)
    sent = payloads(4)
    for payload in sent:
        publisher.publish(base, payload, 1)
    publisher.publish(end_topic, END, 1)
    assert mqtt_share(online) == sent
    back = clients.new(V5, **persistent)
    assert back.connect().session_present
    assert mqtt_share(back) == [], "messages were queued to the member that was away"


def test_unacknowledged_events_of_a_leaving_wamp_member_go_to_another(clients, router):
    """A WAMP member with acknowledged delivery (_qos 1) that never answers EVENT_RECEIVED
    leaves: an MQTT member of the group gets the event."""
    base, group = unique("wamphandover"), unique("g")
    heir = clients(V5)

    async def scenario() -> None:
        wamp = await raw_connect(router, "websocket")
        await wamp.hello()
        wamp.send([32, 1, {"x_shared_group": group, "_qos": 1}, base])
        assert (await wamp.recv())[0] == 33
        clients(V5).publish(base, b'"w1"', 1)
        event = await wamp.recv()
        assert (event[0], event[3].get("x_acknowledged_delivery"), event[4]) == \
            (36, True, ["w1"]), event
        assert heir.subscribe((f"$share/{group}/{base}", 1)) == [1]
        wamp.close()  # no EVENT_RECEIVED

    run(scenario())
    assert heir.next_message().payload == b'"w1"'


def test_unaccepted_messages_of_a_closed_amqp_link_go_to_another_member(clients, router):
    base, group = unique("amqphandover"), unique("g")
    connection = amqp_connect(router)
    try:
        receiver = connection.create_receiver(base, credit=10, options=SharedReceive(group))
        clients(V5).publish(base, b"a1", 1)
        assert body_bytes(receiver.receive(timeout=10)) == b"a1"  # never accepted
        heir = clients(V5)
        assert heir.subscribe((f"$share/{group}/{base}", 1)) == [1]
        receiver.close()
        assert heir.next_message().payload == b"a1"
    finally:
        connection.close()


def test_invalid_amqp_shared_group_is_refused(router):
    connection = amqp_connect(router)
    try:
        with pytest.raises(LinkDetached, match="x-shared-group"):
            connection.create_receiver(unique("t"), options=SharedReceive("a+b"))
    finally:
        connection.close()


def test_wamp_shared_group_must_be_a_valid_name(router):
    async def scenario() -> list:
        client = await raw_connect(router, "websocket")
        await client.hello()
        client.send([32, 1, {"x_shared_group": "a/b"}, "com.x"])
        return await client.recv()

    answer = run(scenario())
    assert answer[0] == 3 and answer[2] == "wamp.error.protocol_violation", answer


# --- one group, three protocols --------------------------------------------------------------


def test_mqtt_wamp_and_amqp_members_form_one_group(router, clients):
    base, group = unique("mixed"), unique("g")
    end_topic = f"{base}_end"
    amqp = amqp_connect(router)

    async def scenario() -> None:
        wamp = await raw_connect(router, "websocket")
        try:
            assert (await wamp.hello())[0] == 2
            wamp.send([32, 1, {"x_shared_group": group}, base])
            wamp.send([32, 2, {}, end_topic])
            subscribed = [await wamp.recv(), await wamp.recv()]
            assert [message[0] for message in subscribed] == [33, 33], subscribed
            shared_id = subscribed[0][2]
            mqtt = clients(V5)
            assert mqtt.subscribe((f"$share/{group}/{base}", 1), (end_topic, 0)) == [1, 0]
            shared = amqp.create_receiver(base, credit=COUNT, options=SharedReceive(group))
            assert shared.link.remote_properties == {symbol("x-shared-group"): group}
            end = amqp.create_receiver(end_topic, credit=1, options=Receive(0))
            publisher = clients(V5)
            sent = payloads()
            for payload in sent:
                publisher.publish(base, payload, 1)
            publisher.publish(end_topic, END, 1)
            mqtt_got = mqtt_share(mqtt)
            assert body_bytes(end.receive(timeout=10)) == END
            amqp_got = []
            while shared.fetcher.has_message:
                amqp_got.append(body_bytes(shared.receive(timeout=1)))
                shared.accept()
            wamp_got = []
            while True:
                event = await wamp.recv()
                assert event[0] == 36, event
                if event[1] != shared_id:
                    assert event[4] == [END], event
                    break
                wamp_got.append(event[4][0])  # not JSON: a binary argument
            assert_exactly_once([mqtt_got, wamp_got, amqp_got], sent)
        finally:
            wamp.close()

    try:
        run(scenario())
    finally:
        amqp.close()


# --- persistence -----------------------------------------------------------------------------


def group_size(router, topic: str, group: str) -> int:
    """Members of ``group`` on ``topic``, as the WAMP subscription meta API tells."""
    async def scenario() -> int:
        client = await raw_connect(router, "websocket")
        try:
            await client.hello()
            client.send([48, 1, {}, "wamp.subscription.match", [topic]])
            ids = (await client.recv())[3][0] or []
            for request, subscription_id in enumerate(ids, 2):
                client.send([48, request, {}, "wamp.subscription.get", [subscription_id]])
                if (await client.recv())[3][0].get("x_shared_group") == group:
                    client.send([48, 99, {}, "wamp.subscription.count_subscribers",
                                 [subscription_id]])
                    return (await client.recv())[3][0]
            return 0
        finally:
            client.close()

    return run(scenario())


def test_persistent_members_survive_a_restart(tmp_path):
    """An MQTT persistent session and an AMQP durable link in one group: after a restart the
    group has both again, and what is published while both are away is queued to them in
    turn."""
    router = RouterProcess(tmp_path, [mqtt_realm("realm1")],
                           listeners=amqp_listeners("realm1")).start()
    base, group = unique("durable"), unique("g")
    container, link_name = unique("container"), unique("link")
    persistent = dict(username="alice", password=SECRETS["alice"], client_id=unique("member"),
                      clean=False, session_expiry=300)

    def attach_amqp():
        connection = amqp_connect(router, container_id=container)
        return connection, connection.create_receiver(
            base, credit=10, name=link_name, options=SharedReceive(group, durable=True))

    pool = ClientPool(router)
    try:
        member = pool(V5, **persistent)
        assert member.subscribe((f"$share/{group}/{base}", 1)) == [1]
        member.disconnect()
        attach_amqp()[0].close()
        assert group_size(router, base, group) == 2
        assert router.stop() == 0
        router.start()
        assert group_size(router, base, group) == 2
        publisher = pool(V5)
        for payload in (b"p0", b"p1"):
            publisher.publish(base, payload, 1)
        back = pool.new(V5, **persistent)
        assert back.connect().session_present
        connection, receiver = attach_amqp()
        try:
            got_amqp = body_bytes(receiver.receive(timeout=10))
            receiver.accept()
        finally:
            connection.close()
        assert sorted([back.next_message().payload, got_amqp]) == [b"p0", b"p1"]
    finally:
        pool.close()
        router.stop()


def test_wamp_meta_get_shows_the_group(router):
    base, group = unique("meta"), unique("g")

    async def scenario() -> dict:
        client = await raw_connect(router, "websocket")
        try:
            await client.hello()
            client.send([32, 1, {"x_shared_group": group}, base])
            subscription_id = (await client.recv())[2]
            client.send([48, 2, {}, "wamp.subscription.get", [subscription_id]])
            result = await client.recv()
            assert result[0] == 50, result
            return result[3][0]
        finally:
            client.close()

    details = run(scenario())
    assert (details["uri"], details["x_shared_group"]) == (base, group)

