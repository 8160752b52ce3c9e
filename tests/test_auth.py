"""WAMP authentication (ticket, salted WAMP-CRA, cryptosign), the role-permission matrix,
``principal add``, secrets kept out of logs, and the back-off after failed logins."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from autobahn.wamp.types import PublishOptions, SubscribeOptions
from nacl.signing import SigningKey

from router.core.credentials import derive_wampcra, hash_secret
from router.mqtt.packets import ReasonCode
from tests.auth_helpers import authenticator, join, join_fails, outcome
from tests.clients import TIMEOUT, run
from tests.harness import ROOT, RouterProcess, realm_file
from tests.mqtt_clients import RawMqtt

TICKET = "tk-Secret-7f3a9"
CRA_SECRET = "cra-Secret-b41c"
BOB_TICKET = "tk-Bob-Secret-55e0"
ALICE_KEY = SigningKey.generate()
ALICE_PUB = ALICE_KEY.verify_key.encode().hex()
ALICE_PRIV = ALICE_KEY.encode().hex()
OTHER_PRIV = SigningKey.generate().encode().hex()
SECRETS = (TICKET, CRA_SECRET, BOB_TICKET, ALICE_PRIV, OTHER_PRIV, "wrong-Secret-9z")

WRITER = [{"uri": "com.a.", "match": "prefix",
           "allow": ["publish", "subscribe", "call", "register"]},
          {"uri": "com.s.", "match": "prefix", "allow": ["publish", "subscribe"]}]
READER = [{"uri": "com.a.", "match": "prefix", "allow": ["subscribe", "call"]}]
PRODUCTION_BACKOFF = {"after_failures": 3, "window": 60, "max_delay": 8}  # the defaults
OPEN = [{"uri": "", "match": "prefix", "allow": ["publish", "subscribe", "call", "register"]}]


def secured_realm() -> dict:
    return realm_file(
        "realm1", anonymous_role=None,
        roles={"writer": WRITER, "reader": READER},
        principals={
            "alice": {"role": "writer", "ticket": hash_secret(TICKET, 1000),
                      "wampcra": derive_wampcra(CRA_SECRET, 1000).as_json(),
                      "cryptosign": {"pubkeys": [ALICE_PUB]}},
            "bob": {"role": "reader", "ticket": hash_secret(BOB_TICKET, 1000)},
        })


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("router-auth"), [
        secured_realm(), realm_file("open", roles={"anonymous": OPEN})], [
        {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
        {"type": "rawsocket", "host": "127.0.0.1", "port": 0},
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}],
        extra_config={"login_backoff": PRODUCTION_BACKOFF}).start()
    yield process
    process.stop()


_sources = iter(range(10, 250))


def fresh_source() -> str:
    """A loopback address of its own: failures from it do not slow other tests down."""
    return f"127.0.0.{next(_sources)}"


def ticket(authid="alice", secret=TICKET):
    return authenticator("ticket", authid=authid, ticket=secret)


def wampcra(authid="alice", secret=CRA_SECRET):
    return authenticator("wampcra", authid=authid, secret=secret)


def cryptosign(authid="alice", privkey=ALICE_PRIV, **extra):
    kwargs = {"authid": authid} if authid else {}
    return authenticator("cryptosign", privkey=privkey, **kwargs, **extra)


@pytest.mark.parametrize("transport", ["websocket", "rawsocket"])
@pytest.mark.parametrize("method", ["ticket", "wampcra", "cryptosign"])
def test_each_method_logs_in(router, method, transport):
    auth = {"ticket": ticket, "wampcra": wampcra, "cryptosign": cryptosign}[method]()

    async def scenario():
        session = await join(router, auth, transport=transport)
        details = await session.joined
        await session.close()
        return details

    details = run(scenario())
    assert (details.authid, details.authrole, details.authmethod, details.authprovider) == \
        ("alice", "writer", method, "static")


def test_cryptosign_finds_the_principal_by_public_key(router):
    async def scenario():
        session = await join(router, cryptosign(authid=None))
        details = await session.joined
        await session.close()
        return details

    details = run(scenario())
    assert (details.authid, details.authmethod) == ("alice", "cryptosign")


def test_negotiation_follows_the_clients_order(router):
    async def scenario():
        first = await join(router, wampcra(), ticket(), authmethods=["wampcra", "ticket"])
        second = await join(router, wampcra(), ticket(), authmethods=["ticket", "wampcra"])
        # bob has no wampcra: the next method the client offers is used
        third = await join(router, wampcra("bob"), ticket("bob", BOB_TICKET),
                           authmethods=["wampcra", "ticket"])
        result = [(await s.joined).authmethod for s in (first, second, third)]
        for s in (first, second, third):
            await s.close()
        return result

    assert run(scenario()) == ["wampcra", "ticket", "ticket"]


@pytest.mark.parametrize("case, reason", [
    ("wrong ticket", "wamp.error.authentication_failed"),
    ("wrong wampcra secret", "wamp.error.authentication_failed"),
    ("cryptosign key of someone else", "wamp.error.authentication_failed"),
    ("cryptosign channel binding", "wamp.error.authentication_failed"),
    ("unknown authid", "wamp.error.no_such_principal"),
    ("unknown cryptosign key", "wamp.error.no_such_principal"),
    ("method the principal lacks", "wamp.error.no_matching_auth_method"),
    ("anonymous where the realm refuses it", "wamp.error.no_matching_auth_method"),
    ("tls without a client certificate", "wamp.error.no_matching_auth_method"),
])
def test_failures_abort_with_the_right_reason(router, case, reason):
    auths, kwargs = {
        "wrong ticket": ([ticket(secret="wrong-Secret-9z")], {}),
        "wrong wampcra secret": ([wampcra(secret="wrong-Secret-9z")], {}),
        "cryptosign key of someone else": (
            [cryptosign(privkey=OTHER_PRIV)], {}),
        "cryptosign channel binding": (
            [cryptosign()], {"authextra": {"pubkey": ALICE_PUB, "channel_binding": "tls-unique"}}),
        "unknown authid": ([ticket(authid="mallory")], {}),
        "unknown cryptosign key": ([cryptosign(authid=None, privkey=OTHER_PRIV)], {}),
        "method the principal lacks": ([wampcra("bob", BOB_TICKET)], {}),
        "anonymous where the realm refuses it": ([], {"authmethods": ["anonymous"]}),
        "tls without a client certificate": ([], {"authmethods": ["tls"], "authid": "alice"}),
    }[case]

    async def scenario():
        return await join_fails(router, *auths, source=fresh_source(), **kwargs)

    failure = run(scenario())
    assert failure.reason == reason
    for secret in SECRETS:
        assert secret not in str(failure)


# permissions -------------------------------------------------------------------------------

def test_role_permission_matrix(router):
    """writer may publish/subscribe/call/register on com.a.* and use com.s.*; reader may only
    subscribe and call on com.a.*: everything else is refused with not_authorized."""

    async def scenario():
        writer = await join(router, ticket())
        reader = await join(router, ticket("bob", BOB_TICKET))
        results = {}
        for name, session in (("writer", writer), ("reader", reader)):
            results[name, "publish"] = await outcome(session.publish(
                "com.a.topic", 1, options=PublishOptions(acknowledge=True)))
            results[name, "subscribe"] = await outcome(session.subscribe(
                lambda *a, **k: None, "com.a.topic"))
            results[name, "register"] = await outcome(session.register(
                lambda: name, f"com.a.proc_{name}"))
        results["writer", "call"] = await outcome(reader.call("com.a.proc_writer"))
        results["reader", "call"] = results["writer", "call"]
        results["writer", "call"] = await outcome(writer.call("com.a.proc_writer"))
        # retained delivery: only where the role may subscribe
        await writer.publish("com.s.secret", "classified",
                             options=PublishOptions(retain=True, acknowledge=True,
                                                    exclude_me=False))
        await writer.publish("com.a.news", "public",
                             options=PublishOptions(retain=True, acknowledge=True,
                                                    exclude_me=False))
        for name, session in (("writer", writer), ("reader", reader)):
            for topic in ("com.s.secret", "com.a.news"):
                got: asyncio.Queue = asyncio.Queue()
                result = await outcome(session.subscribe(
                    lambda value, details=None: got.put_nowait(value), topic,
                    options=SubscribeOptions(get_retained=True, details=True)))
                if result == "allowed":
                    value = await asyncio.wait_for(got.get(), TIMEOUT)
                    result = f"retained {value}"
                results[name, "retained " + topic] = result
        await writer.close()
        await reader.close()
        return results

    results = run(scenario())
    assert results == {
        ("writer", "publish"): "allowed", ("reader", "publish"): "denied",
        ("writer", "subscribe"): "allowed", ("reader", "subscribe"): "allowed",
        ("writer", "register"): "allowed", ("reader", "register"): "denied",
        ("writer", "call"): "allowed", ("reader", "call"): "allowed",
        ("writer", "retained com.s.secret"): "retained classified",
        ("reader", "retained com.s.secret"): "denied",
        ("writer", "retained com.a.news"): "retained public",
        ("reader", "retained com.a.news"): "retained public",
    }


# principal add -------------------------------------------------------------------------------

def router_cli(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_principal_add_then_login_after_restart(tmp_path):
    process = RouterProcess(tmp_path, [realm_file(
        "realm1", anonymous_role=None, roles={"user": OPEN, "admin": OPEN})])
    config = str(process.config_path)
    key = SigningKey.generate()
    common = ["principal", "add", "--realm", "realm1", "--config", config]
    for method, stdin in (("ticket", "carol-Ticket-1\n"), ("wampcra", "carol-Cra-2\n"),
                          ("cryptosign", key.verify_key.encode().hex() + "\n")):
        done = router_cli(*common, "--authid", "carol", "--role", "user", "--method", method,
                          stdin=stdin)
        assert done.returncode == 0, done.stderr
    refused = router_cli(*common, "--authid", "dave", "--role", "nosuchrole",
                         "--method", "ticket", stdin="x\n")
    assert refused.returncode != 0 and "nosuchrole" in refused.stderr
    stored = json.loads((tmp_path / "realms" / "realm1.json").read_text())
    carol = stored["principals"]["carol"]
    assert set(carol) == {"role", "ticket", "wampcra", "cryptosign"}
    assert stored["roles"]["admin"] == OPEN and "dave" not in stored["principals"]
    text = (tmp_path / "realms" / "realm1.json").read_text()
    assert "carol-Ticket-1" not in text and "carol-Cra-2" not in text

    process.start()
    try:
        async def scenario():
            methods = []
            for auth in (ticket("carol", "carol-Ticket-1"), wampcra("carol", "carol-Cra-2"),
                         cryptosign("carol", key.encode().hex())):
                session = await join(process, auth)
                methods.append((await session.joined).authmethod)
                await session.close()
            return methods

        assert run(scenario()) == ["ticket", "wampcra", "cryptosign"]
    finally:
        process.stop()


# secrets and back-off ------------------------------------------------------------------------

def test_no_secret_in_logs_event_logs_or_errors(tmp_path):
    process = RouterProcess(tmp_path, [secured_realm()],
                            extra_config={"eventlog": {"flush_interval": 0.2},
                                          "login_backoff": PRODUCTION_BACKOFF}).start()
    errors = []
    try:
        async def scenario():
            for auth in (ticket(), wampcra(), cryptosign(), ticket("bob", BOB_TICKET)):
                session = await join(process, auth)
                await session.publish("com.a.x", "hello",
                                      options=PublishOptions(acknowledge=True)) \
                    if (await session.joined).authrole == "writer" else None
                await session.close()
            for auth in (ticket(secret="wrong-Secret-9z"), wampcra(secret="wrong-Secret-9z"),
                         cryptosign(privkey=OTHER_PRIV), ticket("bob", "wrong-Secret-9z")):
                errors.append(str(await join_fails(process, auth, source=fresh_source())))

        run(scenario())
    finally:
        process.stop()
    failures = [line for line in process.log_lines if "login failed" in line]
    assert len(failures) == 4 and any("127.0.0." in line and "'alice'" in line
                                      for line in failures)
    eventlogs = "".join(path.read_text() for path in (tmp_path / "data").rglob("*.jsonl"))
    assert "alice" in eventlogs  # the logs were written, and name who joined
    haystacks = ["\n".join(process.log_lines), eventlogs, "\n".join(errors)]
    for secret in SECRETS:
        for haystack in haystacks:
            assert secret not in haystack


def test_backoff_delays_repeated_failures_without_blocking_others(router):
    source = fresh_source()

    async def attempt() -> float:
        started = time.monotonic()
        await join_fails(router, ticket(secret="wrong-Secret-9z"), source=source)
        return time.monotonic() - started

    async def scenario():
        first = await attempt()
        await attempt()
        await attempt()
        fourth = asyncio.ensure_future(attempt())
        # meanwhile another client (same host, even) joins at once
        started = time.monotonic()
        other = await join(router, ticket(), source=source)
        other_took = time.monotonic() - started
        assert not fourth.done()
        await other.close()
        return first, await fourth, other_took

    first, fourth, other_took = run(scenario())
    assert fourth > first + 1.0  # 2 s by the rule, measured generously
    assert other_took < fourth
    assert any("refusal delayed" in line for line in router.log_lines)


def test_mqtt_logins_share_the_backoff(router):
    source = fresh_source()

    def attempt(password: bytes) -> tuple[float, int]:
        client = RawMqtt(router, source=source)
        try:
            started = time.monotonic()
            connack = client.connect(client_id="", username="alice", password=password)
            return time.monotonic() - started, connack.reason_code
        finally:
            client.close()

    first = [attempt(b"wrong-Secret-9z") for _ in range(3)]
    assert [code for _, code in first] == [ReasonCode.BAD_USER_NAME_OR_PASSWORD] * 3
    with ThreadPoolExecutor(1) as pool:
        fourth = pool.submit(attempt, b"wrong-Secret-9z")
        good_took, good_code = attempt(TICKET.encode())  # same host, right password: at once
        assert good_code == 0 and not fourth.done()
        fourth_took, fourth_code = fourth.result(timeout=TIMEOUT)
    assert fourth_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert fourth_took > first[0][0] + 1.0  # 2 s by the rule, measured generously
    assert good_took < fourth_took
