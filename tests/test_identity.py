"""Who owns a session: anonymous clients get an authid of the router's choosing, a client id
or durable link held by another principal is refused and its owner left alone, secrets with
NUL bytes are refused; and the will of a connection that was taken over or came back.

realm1: anonymous clients may publish and subscribe under ``public``; alice, bob and carol
(role ``user``) anywhere.
"""

from __future__ import annotations

import socket

import pytest
from autobahn.wamp.types import PublishOptions
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import LinkException

from router.core.credentials import hash_secret, verify_secret
from router.mqtt.packets import Connack, Will
from tests.amqp_clients import Receive, Send, amqp_listeners, connect, expect_body, message, send
from tests.auth_helpers import authenticator, join_fails
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import OPEN_ROLE, RouterProcess
from tests.mqtt_clients import V5, VERSION_IDS, VERSIONS, ClientPool, RawMqtt, unique
from tests.test_auth import router_cli

SECRETS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
NOT_AUTHORIZED = 0x87
BAD_USER_NAME_OR_PASSWORD = 0x86
PUBLIC = [{"uri": "public.", "match": "prefix", "allow": ["publish", "subscribe"],
           "disclose": True}]

version_param = pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS.get)


def identity_realm() -> dict:
    return {"name": "realm1", "anonymous_role": "anonymous",
            "roles": {"anonymous": PUBLIC, "user": OPEN_ROLE},
            "principals": {name: {"role": "user", "ticket": hash_secret(secret, 1000)}
                           for name, secret in SECRETS.items()}}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("identity"), [identity_realm()],
                            listeners=amqp_listeners("realm1")).start()
    yield process
    process.stop()


@pytest.fixture
def clients(router):
    pool = ClientPool(router)
    yield pool
    pool.close()


def login(name: str) -> dict:
    return {"username": name, "password": SECRETS[name]}


def persistent(version: int) -> dict:
    return {"clean": False, "session_expiry": 300 if version == V5 else None}


# --- MQTT: whose session ------------------------------------------------------------------

@version_param
def test_anonymous_client_with_a_principals_client_id_gets_neither_session_nor_role(
        clients, version):
    client_id, topic = unique("carol"), f"private/{unique('carol')}"
    carol = clients(version, client_id=client_id, **persistent(version), **login("carol"))
    assert carol.subscribe((topic, 1)) == [1]
    carol.disconnect()
    assert clients(V5, **login("alice")).publish(topic, b"for carol", 1) == 0

    intruder = clients.new(version, client_id=client_id, **persistent(version))
    connack = intruder.connect()
    assert (connack.reason_code, connack.session_present) == (NOT_AUTHORIZED, False)
    intruder.wait_disconnected()
    # with a client id of its own the anonymous role applies: nothing outside public/
    anonymous = clients(V5)
    assert anonymous.publish(topic, b"denied", 1) == NOT_AUTHORIZED

    again = clients.new(version, client_id=client_id, **persistent(version), **login("carol"))
    assert again.connect().session_present is True
    again.expect(topic, b"for carol")


def test_anonymous_client_named_like_a_principal_gets_no_events_for_it(clients, router):
    topic = f"public/{unique('eligible')}"
    carol = clients(V5, client_id=unique("carol-own"), **login("carol"))
    impostor = clients(V5, client_id="carol")
    for subscriber in (carol, impostor):
        assert subscriber.subscribe((topic, 1)) == [1]

    async def publish() -> None:
        session = await wamp_connect(router)
        uri = topic.replace("/", ".")
        await session.publish(uri, "for carol", options=PublishOptions(
            eligible_authid=["carol"], acknowledge=True))
        await session.publish(uri, "for everyone", options=PublishOptions(acknowledge=True))
        await session.close()

    run(publish())
    for_carol = carol.next_message()
    sentinel = carol.next_message()
    assert b"for carol" in for_carol.payload and b"for everyone" in sentinel.payload
    impostor.expect(topic, sentinel.payload)  # the first it gets: the event for everyone


@version_param
def test_another_principal_cannot_take_a_client_id(clients, version):
    client_id, topic = unique("alice-phone"), f"private/{unique('alice')}"
    alice = clients(version, client_id=client_id, **persistent(version), **login("alice"))
    assert alice.subscribe((topic, 1)) == [1]
    publisher = clients(V5, **login("carol"))

    bob = clients.new(version, client_id=client_id, **persistent(version), **login("bob"))
    assert bob.connect().reason_code == NOT_AUTHORIZED
    assert publisher.publish(topic, b"still connected", 1) == 0
    alice.expect(topic, b"still connected")  # her connection was not touched
    assert not alice.disconnected.is_set()

    alice.disconnect()
    for payload in (b"queued 1", b"queued 2"):
        assert publisher.publish(topic, payload, 1) == 0
    late = clients.new(version, client_id=client_id, clean=True, **login("bob"))
    assert late.connect().reason_code == NOT_AUTHORIZED  # clean start changes nothing

    again = clients.new(version, client_id=client_id, **persistent(version), **login("alice"))
    assert again.connect().session_present is True
    again.expect(topic, b"queued 1")
    again.expect(topic, b"queued 2")


@version_param
def test_same_principal_still_takes_its_session_over(clients, version):
    client_id, topic = unique("alice-again"), f"private/{unique('alice')}"
    alice = clients(version, client_id=client_id, **persistent(version), **login("alice"))
    assert alice.subscribe((topic, 1)) == [1]
    second = clients.new(version, client_id=client_id, **persistent(version), **login("alice"))
    assert second.connect().session_present is True
    alice.wait_disconnected()
    assert clients(V5, **login("carol")).publish(topic, b"to the new connection", 1) == 0
    second.expect(topic, b"to the new connection")


# --- AMQP: whose durable link -------------------------------------------------------------

def test_another_principal_cannot_take_a_durable_link(router):
    address, container, link = (f"com.durable.{unique('t')}", unique("container"),
                                unique("durable"))
    opened = []
    try:
        alice = connect(router, "alice", SECRETS["alice"], container_id=container)
        opened.append(alice)
        receiver = alice.create_receiver(address, credit=10, name=link,
                                         options=Receive(1, durable=True))
        publisher = connect(router, "carol", SECRETS["carol"])
        opened.append(publisher)
        sender = publisher.create_sender(address, options=Send(1))

        bob = connect(router, "bob", SECRETS["bob"], container_id=container)
        opened.append(bob)
        with pytest.raises(LinkException) as refused:
            bob.create_receiver(address, credit=10, name=link, options=Receive(1, durable=True))
        assert "amqp:unauthorized-access" in str(refused.value)
        send(sender, message(b"still attached", qos=1))
        expect_body(receiver, b"still attached")

        alice.close()  # the link stays, detached, queueing
        send(sender, message(b"queued", qos=1))
        bob = connect(router, "bob", SECRETS["bob"], container_id=container)
        opened.append(bob)
        with pytest.raises(LinkException) as refused:
            bob.create_receiver(address, credit=10, name=link, options=Receive(1, durable=True))
        assert "amqp:unauthorized-access" in str(refused.value)

        alice = connect(router, "alice", SECRETS["alice"], container_id=container)
        opened.append(alice)
        receiver = alice.create_receiver(address, credit=10, name=link,
                                         options=Receive(1, durable=True))
        expect_body(receiver, b"queued")
    finally:
        for connection in opened:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass


def test_anonymous_amqp_clients_get_an_authid_of_their_own(router):
    """Two anonymous AMQP connections get two authids of the router's (a WAMP subscriber
    reads them as the publisher's), not one shared 'anonymous' a principal could be named."""
    uri = f"public.{unique('who')}"

    async def scenario() -> list[str]:
        observer = await wamp_connect(router)
        events = await observer.events(uri)
        authids = []
        for _ in range(2):
            amqp = connect(router)
            try:
                send(amqp.create_sender(uri, options=Send(1)), message(b"hi", qos=1))
            finally:
                amqp.close()
            details = (await next_item(events))[2]
            authids.append(details.publisher_authid)
        await observer.close()
        return authids

    first, second = run(scenario())
    assert first != second and first.startswith("anonymous-") and second.startswith(
        "anonymous-")


def test_anonymous_wamp_client_cannot_pick_its_authid(router):
    async def scenario():
        session = await wamp_connect(router, authid="carol", authmethods=["anonymous"])
        details = await session.joined
        await session.close()
        return details.authid

    assert run(scenario()).startswith("anonymous-")


# --- secrets with NUL bytes ---------------------------------------------------------------

def test_secret_with_a_trailing_nul_does_not_verify():
    stored = hash_secret("alice-secret", 1000)
    assert verify_secret("alice-secret", stored)
    assert not verify_secret("alice-secret\0", stored)
    assert not verify_secret("alice-secret\0\0\0", stored)


@version_param
def test_mqtt_password_with_a_nul_is_refused(router, version):
    raw = RawMqtt(router, source="127.0.0.7")  # failed logins back off per host
    try:
        connack = raw.connect(version, client_id=unique("nul"), username="alice",
                              password=b"alice-secret\0")
        assert isinstance(connack, Connack)
        assert connack.reason_code == BAD_USER_NAME_OR_PASSWORD  # 3.1.1: return code 4
    finally:
        raw.close()


def test_wamp_ticket_with_a_nul_is_refused(router):
    reason = run(join_fails(router, authenticator("ticket", authid="alice",
                                                  ticket="alice-secret\0"),
                            source="127.0.0.8"))
    assert reason.reason == "wamp.error.authentication_failed"


def test_principal_add_refuses_a_secret_with_a_nul(tmp_path):
    process = RouterProcess(tmp_path, [identity_realm()])
    config = str(process.config_path)
    for method in ("ticket", "wampcra"):
        refused = router_cli("principal", "add", "--realm", "realm1", "--config", config,
                             "--authid", "dave", "--role", "user", "--method", method,
                             stdin="dave-secret\0\n")
        assert refused.returncode == 2 and "NUL" in refused.stderr
    refused = router_cli("hash-secret", stdin="dave-secret\0\n")
    assert refused.returncode == 2 and "NUL" in refused.stderr
    assert "dave" not in (tmp_path / "realms" / "realm1.json").read_text()
    named = router_cli("principal", "add", "--realm", "realm1", "--config", config,
                       "--authid", "anonymous-1f", "--role", "user", "--method", "ticket",
                       stdin="x-secret\n")
    assert named.returncode == 2 and "anonymous-" in named.stderr
    # an empty name, or one with a newline (it forged log lines), was written as given
    for authid, why in (("", "empty"), ("eve\nadmin", "control character")):
        named = router_cli("principal", "add", "--realm", "realm1", "--config", config,
                           "--authid", authid, "--role", "user", "--method", "ticket",
                           stdin="x-secret\n")
        assert named.returncode == 2 and why in named.stderr
    assert '"": {' not in (tmp_path / "realms" / "realm1.json").read_text()
    assert "eve" not in (tmp_path / "realms" / "realm1.json").read_text()


@pytest.mark.parametrize("authid,why", [("anonymous-1f", "anonymous-"), ("", "empty"),
                                        ("eve\tx", "control character")])
def test_a_realm_file_refuses_a_principal_name_no_client_may_have(tmp_path, authid, why):
    realm = identity_realm()
    realm["principals"][authid] = realm["principals"]["bob"]
    process = RouterProcess(tmp_path, [realm])
    checked = router_cli("check-config", "--config", str(process.config_path), stdin="")
    assert checked.returncode != 0 and why in checked.stderr


# --- wills: takeover and reconnect --------------------------------------------------------

@pytest.mark.parametrize("old_clean", [True, False], ids=["old-clean", "old-persistent"])
@pytest.mark.parametrize("new_clean", [True, False], ids=["new-clean", "new-persistent"])
@version_param
def test_will_of_a_taken_over_connection_is_published(clients, version, old_clean,
                                                       new_clean):
    client_id, topic = unique("will"), f"public/will/{unique('t')}"
    observer = clients(V5)
    assert observer.subscribe((topic, 1)) == [1]
    expiry = {"session_expiry": 300} if version == V5 else {}
    old = clients(version, client_id=client_id, clean=old_clean,
                  will={"topic": topic, "payload": b"taken over", "qos": 1},
                  **({} if old_clean else expiry))
    new = clients.new(version, client_id=client_id, clean=new_clean,
                      **({} if new_clean else expiry))
    assert new.connect().reason_code == 0
    old.wait_disconnected()
    observer.expect(topic, b"taken over")


def test_pending_will_is_cancelled_by_a_new_connection_with_clean_start(router, clients):
    """Session expiry 30 s, will delay 2 s; the client comes back at once with clean start
    1: its will is never published. A second client, gone just after, with the same delay
    shows when it would have been: its will is the first message the observer gets."""
    topic = f"public/will/{unique('t')}"
    observer = clients(V5)
    assert observer.subscribe((f"{topic}/#", 1)) == [1]
    client_id = unique("back")
    delayed = {"session_expiry_interval": 30}

    def will(name: str) -> Will:
        return Will(f"{topic}/{name}", name.encode(), 1, False, {"will_delay_interval": 2})

    gone = RawMqtt(router)
    try:
        gone.connect_ok(V5, client_id=client_id, will=will("came-back"), properties=delayed)
        gone.sock.shutdown(socket.SHUT_WR)
        gone.wait_closed()  # the router has seen the connection go: its will waits 2 s
    finally:
        gone.close()
    back = clients(V5, client_id=client_id, clean=True)
    witness = RawMqtt(router)
    try:
        witness.connect_ok(V5, client_id=unique("witness"), will=will("witness"),
                           properties=delayed)
    finally:
        witness.close()
    observer.expect(f"{topic}/witness", b"witness")
    assert not back.disconnected.is_set()


def test_will_with_a_delay_is_not_published_on_takeover(router, clients):
    """A takeover is a new connection for the client id before the delay passed."""
    topic = f"public/will/{unique('t')}"
    observer = clients(V5)
    assert observer.subscribe((f"{topic}/#", 1)) == [1]
    client_id = unique("delayed")
    properties = Properties(PacketTypes.WILLMESSAGE)
    properties.WillDelayInterval = 1
    old = clients.new(V5, client_id=client_id, session_expiry=30,
                      will={"topic": f"{topic}/taken", "payload": b"taken", "qos": 1,
                            "properties": properties})
    assert old.connect().reason_code == 0
    new = clients(V5, client_id=client_id, clean=False, session_expiry=30)
    old.wait_disconnected()
    witness = RawMqtt(router)
    try:
        witness.connect_ok(V5, client_id=unique("witness"), properties={
            "session_expiry_interval": 30}, will=Will(f"{topic}/witness", b"witness", 1, False,
                                                       {"will_delay_interval": 1}))
    finally:
        witness.close()
    observer.expect(f"{topic}/witness", b"witness")
    assert not new.disconnected.is_set()
