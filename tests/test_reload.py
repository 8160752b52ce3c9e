"""Live reload (issue 25): ``python -m router reload`` and SIGHUP apply changed roles,
principals and anonymous roles to a running router without dropping the sessions that
may stay; the realm-file commands that go with it (principal list|remove|passwd,
role list|remove, role add for a missing anonymous_role)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest
from autobahn.wamp.types import PublishOptions
from proton import Delivery, Endpoint
from proton.utils import LinkDetached

from router.core.credentials import hash_secret, verify_secret
from tests.amqp_clients import Receive, Send, expect_body, message, send
from tests.amqp_clients import connect as amqp_connect
from tests.clients import TIMEOUT, JoinFailed, connect, next_item, raw_connect, run
from tests.harness import OPEN_ROLE, ROOT, RouterProcess, realm_file
from tests.mqtt_clients import MqttClient

ALL = ["publish", "subscribe", "call", "register"]
META = [rule for rule in OPEN_ROLE if rule["uri"].startswith("wamp.")]
NOT_AUTHORIZED = 0x87


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def realm1(anonymous_rules: list[dict], principals: dict | None = None) -> dict:
    """Anonymous sessions get ``anonymous_rules``; role ``user`` may do anything outside
    ``wamp.``; ``alice`` (password ``alice-secret``) has it."""
    return realm_file("realm1", roles={"anonymous": anonymous_rules, "user": OPEN_ROLE},
                      principals=principals if principals is not None else {
                          "alice": {"role": "user", "ticket": hash_secret("alice-secret", 1000)}})


def split_rules(*prefixes: str) -> list[dict]:
    return [{"uri": prefix, "match": "prefix", "allow": ALL} for prefix in prefixes] + META


LISTENERS = [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
             {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
             {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]


@pytest.fixture
def router(tmp_path):
    process = RouterProcess(tmp_path, [realm1(split_rules("com.", "org."))], LISTENERS).start()
    yield process
    if process.proc.poll() is None:
        process.stop()


def reload(router: RouterProcess) -> str:
    """``python -m router reload`` as an operator runs it; its output."""
    result = cli("reload", "--config", str(router.config_path))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def realm_path(router: RouterProcess):
    return router.workdir / "realms" / "realm1.json"


def test_reload_adds_a_user_and_sighup_removes_one_while_another_session_stays(router):
    """bob, added with the CLI and ``reload``, logs in over WAMP and MQTT; removed with the
    CLI and SIGHUP, both his sessions are closed (GOODBYE wamp.close.killed, DISCONNECT
    0x87), while an anonymous subscriber stays connected and keeps receiving."""
    config = str(router.config_path)
    mqtt_bob = MqttClient(router, username="bob", password="bob-secret")

    async def scenario():
        watcher = await connect(router)
        events = await watcher.events("com.watch")
        with pytest.raises(JoinFailed):
            await connect(router, authid="bob", ticket="bob-secret")
        added = await asyncio.to_thread(
            cli, "principal", "add", "--realm", "realm1", "--config", config, "--authid", "bob",
            "--role", "user", "--method", "ticket", stdin="bob-secret\n")
        assert added.returncode == 0, added.stderr
        assert f"python -m router reload --config {config}" in added.stdout
        assert "principals +bob" in await asyncio.to_thread(reload, router)
        bob = await connect(router, authid="bob", ticket="bob-secret")
        assert (await asyncio.to_thread(mqtt_bob.connect)).reason_code == 0

        removed = await asyncio.to_thread(cli, "principal", "remove", "--realm", "realm1",
                                          "--config", config, "--authid", "bob")
        assert removed.returncode == 0, removed.stderr
        router.proc.send_signal(signal.SIGHUP)
        line = await asyncio.to_thread(router.wait_for_log, r"reload: applied: .*principals -bob")
        assert "2 session(s) closed" in line, line
        left = await asyncio.wait_for(asyncio.shield(bob.left), TIMEOUT)
        assert left.reason == "wamp.close.killed"
        assert await asyncio.to_thread(mqtt_bob.wait_disconnected) == NOT_AUTHORIZED
        with pytest.raises(JoinFailed):
            await connect(router, authid="bob", ticket="bob-secret")

        publisher = await connect(router)
        await publisher.publish("com.watch", "after", options=PublishOptions(acknowledge=True))
        args, _, _ = await next_item(events)
        assert args == ["after"]
        assert watcher.is_attached()
        await publisher.close()
        await watcher.close()

    try:
        run(scenario())
    finally:
        mqtt_bob.close()


def test_a_permission_taken_from_a_role_revokes_what_its_sessions_hold(router):
    """Anonymous loses ``org.``: a WAMP subscriber and callee get UNSUBSCRIBED /
    UNREGISTERED with request 0, an MQTT subscriber stops getting ``org/+`` (and stays
    connected), an AMQP link on ``org.news`` is detached with amqp:unauthorized-access;
    what they hold on ``com.`` keeps working, and the role's publishes on ``org.`` are
    refused from then on (MQTT PUBACK 0x87, AMQP rejected on a sender link attached
    before)."""
    mqtt_sub = MqttClient(router)
    alice = MqttClient(router, username="alice", password="alice-secret")
    amqp = amqp_connect(router)

    async def scenario():
        wamp = await raw_connect(router, "websocket")
        welcome = await wamp.hello(details={"roles": {
            "subscriber": {"features": {"subscription_revocation": True}},
            "callee": {"features": {"registration_revocation": True}}}})
        assert welcome[0] == 2
        features = welcome[2]["roles"]
        assert features["broker"]["features"]["subscription_revocation"] is True
        assert features["dealer"]["features"]["registration_revocation"] is True
        wamp.send([32, 1, {}, "org.news"])
        wamp.send([32, 2, {}, "com.keep"])
        wamp.send([64, 3, {}, "org.proc"])
        org_sub, com_sub, org_reg = [(await wamp.recv())[2] for _ in range(3)]

        assert await asyncio.to_thread(mqtt_sub.connect) is not None
        assert await asyncio.to_thread(mqtt_sub.subscribe, ("org/+", 0), ("com/keep", 0)) == [0, 0]
        org_link = amqp.create_receiver("org.news", credit=10, options=Receive(1))
        com_link = amqp.create_receiver("com.keep", credit=10, options=Receive(1))
        org_sender = amqp.create_sender("org.amqp.x", options=Send(1))
        assert send(org_sender, message(b"allowed")).remote_state == Delivery.ACCEPTED
        assert (await asyncio.to_thread(alice.connect)).reason_code == 0
        await asyncio.to_thread(alice.publish, "org/news", b"before", 1)
        assert (await wamp.recv())[1] == org_sub
        assert (await asyncio.to_thread(mqtt_sub.next_message)).payload == b"before"
        expect_body(org_link, b"before")

        realm_path(router).write_text(json.dumps(realm1(split_rules("com."))))
        out = await asyncio.to_thread(reload, router)
        assert "roles ~anonymous" in out
        assert "0 session(s) closed, 3 subscription(s) and 1 registration(s) revoked" in out

        revoked = [await wamp.recv(), await wamp.recv()]
        assert [notice[:2] for notice in revoked] == [[35, 0], [67, 0]]
        assert revoked[0][2]["subscription"] == org_sub
        assert revoked[1][2]["registration"] == org_reg
        assert revoked[0][2]["reason"] == revoked[1][2]["reason"] == "wamp.error.not_authorized"
        link = org_link.link
        try:
            amqp.wait(lambda: link.state & Endpoint.REMOTE_CLOSED, msg="the link's detach")
        except LinkDetached:  # how the blocking client reports it
            pass
        assert link.remote_condition.name == "amqp:unauthorized-access"

        await asyncio.to_thread(alice.publish, "org/news", b"gone", 1)
        await asyncio.to_thread(alice.publish, "com/keep", b"sentinel", 1)
        event = await wamp.recv()
        assert event[:2] == [36, com_sub]  # nothing on org.news came first
        assert await asyncio.to_thread(mqtt_sub.collect_until, b"sentinel") == []
        expect_body(com_link, b"sentinel")

        assert await asyncio.to_thread(mqtt_sub.publish, "org/x", b"x", 1) == NOT_AUTHORIZED
        assert await asyncio.to_thread(mqtt_sub.subscribe, ("org/+", 0)) == [NOT_AUTHORIZED]
        assert not mqtt_sub.disconnected.is_set()
        assert send(org_sender, message(b"refused")).remote_state == Delivery.REJECTED
        wamp.close()

    try:
        run(scenario())
    finally:
        amqp.close()
        mqtt_sub.close()
        alice.close()


def test_sessions_whose_login_lapsed_are_closed(router):
    """anonymous_role set to null closes anonymous sessions; a principal given another
    role is closed too (its session's role is what its login gave it), and its persistent
    MQTT session is not resumed under the old role."""
    mqtt_alice = MqttClient(router, client_id="alice-car", username="alice",
                            password="alice-secret", clean=False, session_expiry=600)
    mqtt_again = MqttClient(router, client_id="alice-car", username="alice",
                            password="alice-secret", clean=False, session_expiry=600)

    async def scenario():
        anonymous = await connect(router)
        alice = await connect(router, authid="alice", ticket="alice-secret")
        assert (await asyncio.to_thread(mqtt_alice.connect)).reason_code == 0
        assert await asyncio.to_thread(mqtt_alice.subscribe, ("net/#", 1)) == [1]
        data = json.loads(realm_path(router).read_text())
        data["anonymous_role"] = None
        data["principals"]["alice"]["role"] = "anonymous"
        realm_path(router).write_text(json.dumps(data))
        out = await asyncio.to_thread(reload, router)
        assert "anonymous_role anonymous -> None" in out and "3 session(s) closed" in out
        assert "anonymous logins are no longer allowed" in out
        assert "the principal 'alice' now has the role 'anonymous'" in out
        for session in (anonymous, alice):
            left = await asyncio.wait_for(asyncio.shield(session.left), TIMEOUT)
            assert left.reason == "wamp.close.killed"
        assert await asyncio.to_thread(mqtt_alice.wait_disconnected) == NOT_AUTHORIZED
        with pytest.raises(JoinFailed):
            await connect(router)
        again = await connect(router, authid="alice", ticket="alice-secret")
        assert (await again.joined).authrole == "anonymous"
        await again.close()
        connack = await asyncio.to_thread(mqtt_again.connect)
        assert (connack.reason_code, connack.session_present) == (0, False)
        # "net/#" is not the anonymous role's: the old session's subscription is gone with it
        assert await asyncio.to_thread(mqtt_again.subscribe, ("net/#", 1)) == [NOT_AUTHORIZED]

    try:
        run(scenario())
    finally:
        mqtt_alice.close()
        mqtt_again.close()


def test_a_broken_realm_file_is_refused_whole_and_the_old_rules_stay(router):
    """SIGHUP with a broken file: the router logs check-config's message and keeps its
    rules; ``reload`` refuses it with the same message. A change only a restart can apply
    is named as such."""
    config = str(router.config_path)
    good = realm_path(router).read_text()
    realm_path(router).write_text(json.dumps(dict(json.loads(good), anonymous_role="guest")))
    checked = cli("check-config", "--config", config)
    assert checked.returncode == 2
    message = checked.stderr.strip()
    assert message.startswith("configuration error: ") and "anonymous_role" in message

    router.proc.send_signal(signal.SIGHUP)
    line = router.wait_for_log(r"reload: reload refused")
    assert message in line and "the running configuration stays" in line
    refused = cli("reload", "--config", config)
    assert refused.returncode == 2 and refused.stderr.startswith(message)

    async def old_rules_hold():
        session = await connect(router)  # anonymous logins still get the old role
        queue = await session.events("org.still")
        await session.publish("org.still", 1, options=PublishOptions(acknowledge=True,
                                                                       exclude_me=False))
        assert (await next_item(queue))[0] == [1]
        await session.close()

    run(old_rules_hold())
    realm_path(router).write_text(json.dumps(dict(json.loads(good), uri_check="loose")))
    (router.workdir / "realms" / "realm2.json").write_text(json.dumps(realm_file("realm2")))
    node = json.loads(router.config_path.read_text())
    node["realms"].append("realm2")
    node["listeners"].append({"type": "rawsocket", "host": "127.0.0.1", "port": 0})
    router.config_path.write_text(json.dumps(node))
    out = reload(router).splitlines()
    assert out == ["applied: nothing changed",
                   "needs a restart: 'listeners' changed",
                   "needs a restart: realm(s) added: realm2",
                   "needs a restart: realm realm1: 'uri_check' changed"]


# the realm-file commands -------------------------------------------------------------------


@pytest.fixture
def realm_config(tmp_path):
    """A configuration and realm file (no router): alice (ticket), carol (WAMP-CRA and
    ticket), dave (cryptosign only) in role user."""
    (tmp_path / "realms").mkdir()
    principals = {
        "alice": {"role": "user", "ticket": hash_secret("alice-secret", 1000)},
        "carol": {"role": "user", "ticket": hash_secret("carol-secret", 1000)},
        "dave": {"role": "user", "cryptosign": {"pubkeys": ["ab" * 32]}},
    }
    (tmp_path / "realms" / "realm1.json").write_text(
        json.dumps(realm1(split_rules("com."), principals)))
    (tmp_path / "config.json").write_text(json.dumps(
        {"data_dir": "data", "realms_dir": "realms", "realms": ["realm1"],
         "listeners": [{"type": "websocket", "host": "127.0.0.1", "port": 0}]}))
    return tmp_path


def realm_cli(directory, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return cli(*args, "--realm", "realm1", "--config", str(directory / "config.json"),
               stdin=stdin)


def stored(directory) -> dict:
    return json.loads((directory / "realms" / "realm1.json").read_text())


def test_principal_list_remove_passwd(realm_config):
    listed = realm_cli(realm_config, "principal", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[:3] for line in lines[:3]] == [
        ["alice", "role", "user"], ["carol", "role", "user"], ["dave", "role", "user"]]
    assert lines[2].split()[3] == "cryptosign"
    assert lines[-1] == "anonymous logins: role anonymous"

    changed = realm_cli(realm_config, "principal", "passwd", "--authid", "carol",
                        stdin="carol-new\n")
    assert changed.returncode == 0, changed.stderr
    assert "python -m router reload" in changed.stdout and "restart" not in changed.stdout
    assert verify_secret("carol-new", stored(realm_config)["principals"]["carol"]["ticket"])
    no_secret = realm_cli(realm_config, "principal", "passwd", "--authid", "dave",
                          stdin="x\n")
    assert no_secret.returncode == 2 and "no secret to change" in no_secret.stderr

    removed = realm_cli(realm_config, "principal", "remove", "--authid", "alice")
    assert removed.returncode == 0, removed.stderr
    assert sorted(stored(realm_config)["principals"]) == ["carol", "dave"]
    again = realm_cli(realm_config, "principal", "remove", "--authid", "alice")
    assert again.returncode == 2 and "no principal 'alice'" in again.stderr


def test_role_list_and_remove(realm_config):
    listed = realm_cli(realm_config, "role", "list")
    assert listed.returncode == 0 and "user" in listed.stdout.split()
    in_use = realm_cli(realm_config, "role", "remove", "--role", "user")
    assert in_use.returncode == 2
    assert "role of alice, carol, dave" in in_use.stderr
    anonymous = realm_cli(realm_config, "role", "remove", "--role", "anonymous")
    assert anonymous.returncode == 2 and "anonymous_role" in anonymous.stderr
    for authid in ("alice", "carol", "dave"):
        assert realm_cli(realm_config, "principal", "remove", "--authid", authid).returncode == 0
    removed = realm_cli(realm_config, "role", "remove", "--role", "user")
    assert removed.returncode == 0, removed.stderr
    assert sorted(stored(realm_config)["roles"]) == ["anonymous"]
    assert cli("check-config", "--config", str(realm_config / "config.json")).returncode == 0


def test_role_add_creates_the_anonymous_role_a_new_realm_names(realm_config):
    """A realm whose anonymous_role names a role that does not exist yet is fixed by
    adding that role with the CLI (adding any other role still says what is wrong)."""
    data = stored(realm_config)
    data["anonymous_role"] = "guest"
    (realm_config / "realms" / "realm1.json").write_text(json.dumps(data))
    config = str(realm_config / "config.json")
    assert cli("check-config", "--config", config).returncode == 2
    other = realm_cli(realm_config, "role", "add", "--role", "other", "--allow", "subscribe",
                      "--uri", "com.", "--match", "prefix")
    assert other.returncode == 2 and "anonymous_role" in other.stderr
    added = realm_cli(realm_config, "role", "add", "--role", "guest", "--allow", "subscribe",
                      "--uri", "com.", "--match", "prefix")
    assert added.returncode == 0, added.stderr
    assert cli("check-config", "--config", config).returncode == 0
    assert stored(realm_config)["roles"]["guest"] == [
        {"uri": "com.", "match": "prefix", "allow": ["subscribe"]}]


def test_reload_without_a_running_router_says_so_and_signals_nobody(realm_config):
    """No pid file, or one left by a router killed with SIGKILL whose number another
    program has now: ``reload`` says no router runs and sends that program nothing."""
    config = str(realm_config / "config.json")
    missing = cli("reload", "--config", config)
    assert missing.returncode == 1 and "no running router found" in missing.stderr
    other = subprocess.Popen(["sleep", "60"])
    try:
        (realm_config / "data").mkdir()
        (realm_config / "data" / "router.pid").write_text(f"{other.pid}\n")
        stale = cli("reload", "--config", config)
        assert stale.returncode == 1 and "stale pid file" in stale.stderr
        assert other.poll() is None  # a SIGHUP would have ended it
    finally:
        other.kill()
        other.wait()
