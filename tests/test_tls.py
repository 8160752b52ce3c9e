"""TLS on every listener (wss, RawSocket, MQTT, AMQP), passwords over TLS, and client
certificates mapped to principals."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys

import pytest
from proton import ConnectionException, SSLDomain
from proton.utils import BlockingConnection

from router.core.credentials import hash_secret
from router.mqtt.packets import Disconnect
from tests.auth_helpers import authenticator, client_context, join, \
    join_fails, make_certs
from tests.clients import TIMEOUT, run
from tests.harness import RouterProcess, ROOT, realm_file
from tests.metrics_scrape import check_byte_counts
from tests.mqtt_clients import V5, V311, MqttClient, RawMqtt, unique

SECRET = "tls-Secret-0b9d"
OPEN = [{"uri": "", "match": "prefix", "allow": ["publish", "subscribe", "call", "register"]}]
BAD_USER_NAME_OR_PASSWORD, NOT_AUTHORIZED = 0x86, 0x87


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"), client_cns=("device1", "stranger"))


@pytest.fixture(scope="module")
def router(tmp_path_factory, certs):
    tls = {"cert": str(certs["cert"]), "key": str(certs["key"]), "ca": str(certs["ca"]),
           "client_certs": "optional"}
    listeners = [
        {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws", "tls": tls},
        {"type": "rawsocket", "host": "127.0.0.1", "port": 0, "tls": tls},
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1", "tls": tls},
        {"type": "mqtt-websocket", "host": "127.0.0.1", "port": 0, "realm": "realm1",
         "tls": tls},
        {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1", "tls": tls},
        {"type": "metrics", "host": "127.0.0.1", "port": 0},
    ]
    realm = realm_file("realm1", anonymous_role=None, roles={"user": OPEN, "device": OPEN},
                       principals={"alice": {"role": "user", "ticket": hash_secret(SECRET, 1000)},
                                   "device1": {"role": "device"}})
    process = RouterProcess(tmp_path_factory.mktemp("router-tls"), [realm], listeners).start()
    yield process
    process.stop()


def test_listeners_announce_tls_urls(router):
    assert router.schemes == {"websocket": "wss", "rawsocket": "rawsocket+tls",
                              "mqtt": "mqtts", "mqtt-websocket": "mqtt+wss",
                              "amqp": "amqps", "metrics": "http"}


@pytest.mark.parametrize("transport", ["websocket", "rawsocket"])
def test_wamp_ticket_over_tls(router, certs, transport):
    async def scenario():
        context = client_context(certs)
        session = await join(router, authenticator("ticket", authid="alice", ticket=SECRET),
                             transport=transport, ssl_context=context)
        details = await session.joined
        await session.close()
        failure = await join_fails(router, authenticator("ticket", authid="alice",
                                                         ticket="nope"),
                                   transport=transport, ssl_context=context)
        return details, failure

    details, failure = run(scenario())
    assert (details.authid, details.authmethod) == ("alice", "ticket")
    assert failure.reason == "wamp.error.authentication_failed"


def test_wamp_client_certificate_logs_in_as_its_cn(router, certs):
    async def scenario():
        session = await join(router, transport="websocket", authmethods=["tls"],
                             ssl_context=client_context(certs, "device1"))
        details = await session.joined
        await session.close()
        unknown = await join_fails(router, transport="websocket", authmethods=["tls"],
                                   ssl_context=client_context(certs, "stranger"))
        return details, unknown

    details, unknown = run(scenario())
    assert (details.authid, details.authrole, details.authmethod) == ("device1", "device", "tls")
    assert unknown.reason == "wamp.error.no_such_principal"


def test_a_client_that_does_not_trust_the_router_cannot_talk_to_it(router, certs, tmp_path):
    import ssl
    other = make_certs(tmp_path / "other")

    async def scenario():
        with pytest.raises(ssl.SSLError):
            await join(router, authenticator("ticket", authid="alice", ticket=SECRET),
                       ssl_context=client_context(other))

    run(scenario())


def mqtt(router, certs, client_cn=None, **kwargs) -> MqttClient:
    client = MqttClient(router, **{"version": V5, **kwargs})
    cert = (str(certs[f"{client_cn}.cert"]), str(certs[f"{client_cn}.key"])) if client_cn \
        else (None, None)
    client.client.tls_set(ca_certs=str(certs["ca"]), certfile=cert[0], keyfile=cert[1])
    return client


def test_mqtt_password_over_tls(router, certs):
    good = mqtt(router, certs, username="alice", password=SECRET)
    bad = mqtt(router, certs, username="alice", password="nope")
    anonymous = mqtt(router, certs)
    device = mqtt(router, certs, client_cn="device1")
    try:
        assert good.connect().reason_code == 0
        good.subscribe(("tls/topic", 1))
        assert device.connect().reason_code == 0  # the certificate's CN is the principal
        device.publish("tls/topic", b"from device1", qos=1)
        good.expect("tls/topic", b"from device1")
        assert bad.connect().reason_code == BAD_USER_NAME_OR_PASSWORD
        assert anonymous.connect().reason_code == NOT_AUTHORIZED
    finally:
        for client in (good, bad, anonymous, device):
            client.close()


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_over_secure_websocket(router, certs, version):
    good = mqtt(router, certs, transport="ws", version=version, username="alice",
                password=SECRET)
    device = mqtt(router, certs, client_cn="device1", transport="ws", version=version)
    anonymous = mqtt(router, certs, transport="ws", version=version)
    try:
        assert good.connect().reason_code == 0
        good.subscribe(("tls/ws", 1))
        assert device.connect().reason_code == 0  # the certificate's CN is the principal
        device.publish("tls/ws", b"over wss", qos=1)
        good.expect("tls/ws", b"over wss")
        assert anonymous.connect().reason_code == NOT_AUTHORIZED
    finally:
        for client in (good, device, anonymous):
            client.close()


def amqp(router, certs, client_cn=None, **kwargs) -> BlockingConnection:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certs["ca"]))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    if client_cn is not None:
        domain.set_credentials(str(certs[f"{client_cn}.cert"]), str(certs[f"{client_cn}.key"]),
                               None)
    host, port, _ = router.address("amqp")
    return BlockingConnection(f"amqps://{host}:{port}", timeout=TIMEOUT, ssl_domain=domain,
                              **kwargs)


def test_amqp_sasl_plain_over_tls(router, certs):
    connection = amqp(router, certs, user="alice", password=SECRET, allowed_mechs="PLAIN")
    sender = connection.create_sender("com.example.tls")
    connection.close()
    assert sender is not None
    with pytest.raises(ConnectionException):
        amqp(router, certs, user="alice", password="nope", allowed_mechs="PLAIN")


def test_amqp_external_with_client_certificate(router, certs):
    connection = amqp(router, certs, client_cn="device1", allowed_mechs="EXTERNAL")
    connection.create_sender("com.example.tls")
    connection.close()
    with pytest.raises(ConnectionException):
        amqp(router, certs, client_cn="stranger", allowed_mechs="EXTERNAL")


def test_no_secret_in_the_tls_routers_log(router):
    assert any("login failed" in line for line in router.log_lines)
    assert not any(SECRET in line or "nope" in line for line in router.log_lines)


def test_tls_config_errors_name_the_file_and_key(tmp_path, certs):
    config = {"realms": ["realm1"], "listeners": [
        {"type": "mqtt", "port": 0, "realm": "realm1",
         "tls": {"cert": "missing.pem", "key": str(certs["key"])}}]}
    (tmp_path / "realms").mkdir()
    (tmp_path / "realms" / "realm1.json").write_text(json.dumps(realm_file("realm1")))
    (tmp_path / "config.json").write_text(json.dumps(config))

    def check():
        return subprocess.run([sys.executable, "-m", "router", "check-config", "--config",
                               str(tmp_path / "config.json")], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    done = check()
    assert done.returncode == 2
    assert "listeners[0].tls.cert: file" in done.stderr and "missing.pem" in done.stderr
    config["listeners"][0]["tls"] = {"cert": str(certs["cert"]), "key": str(certs["key"]),
                                     "client_certs": "required"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = check()
    assert done.returncode == 2 and "listeners[0].tls.ca: is required" in done.stderr
    config["listeners"][0]["tls"] = {"cert": str(certs["cert"]),
                                     "key": str(certs["device1.key"])}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = check()
    assert done.returncode == 2 and "listeners[0].tls.cert: cannot use" in done.stderr


def test_readme_openssl_line_makes_a_pair_the_router_accepts(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    "key.pem", "-out", "cert.pem", "-days", "365", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "realms").mkdir()
    (tmp_path / "realms" / "realm1.json").write_text(json.dumps(realm_file("realm1")))
    (tmp_path / "config.json").write_text(json.dumps({"realms": ["realm1"], "listeners": [
        {"type": "websocket", "port": 0, "tls": {"cert": "cert.pem", "key": "key.pem"}}]}))
    done = subprocess.run([sys.executable, "-m", "router", "check-config", "--config",
                           str(tmp_path / "config.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_byte_counters_count_what_the_client_wrote_and_read_before_tls(router, certs):
    check_byte_counts(router, tls_raw_mqtt(router, certs), username="alice",
                      password=SECRET.encode())



def tls_raw_mqtt(router, certs) -> RawMqtt:
    client = RawMqtt(router)
    client.sock = ssl.create_default_context(cafile=str(certs["ca"])).wrap_socket(
        client.sock, server_hostname="localhost")
    return client


def test_closes_the_router_decides_reach_a_tls_client(router, certs):
    """DISCONNECT and a keep-alive timeout close the connection over TLS as over TCP (the
    close alert used to wait for a producer that never went away)."""
    leaving, silent = tls_raw_mqtt(router, certs), tls_raw_mqtt(router, certs)
    try:
        leaving.connect_ok(client_id=unique("leave"), username="alice",
                           password=SECRET.encode())
        silent.connect_ok(client_id=unique("silent"), keep_alive=1, username="alice",
                          password=SECRET.encode())
        leaving.send(Disconnect())
        leaving.wait_closed(5)
        silent.wait_closed(5)  # 1.5 x keep-alive without a packet
    finally:
        leaving.close()
        silent.close()


NO_TLS_LINE = "running without TLS"


def test_a_router_with_tls_listeners_loads_tls(router):
    assert not any(NO_TLS_LINE in line for line in router.log_lines)


def test_a_router_that_asks_for_no_tls_runs_without_it_and_serves_every_listener(tmp_path):
    """pyOpenSSL is left out when nothing asks for TLS (router/tls.py); every other kind of
    listener, and a plain-http webhook, must still work without it."""
    from autobahn.wamp.types import PublishOptions

    from tests.amqp_clients import connect as amqp_connect
    from tests.clients import connect, next_item
    from tests.http_clients import request
    from tests.metrics_scrape import fetch
    from tests.test_webhooks import Target

    listeners = [
        {"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
        {"type": "rawsocket", "host": "127.0.0.1", "port": 0},
        {"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
        {"type": "mqtt-websocket", "host": "127.0.0.1", "port": 0, "path": "/mqtt",
         "realm": "realm1"},
        {"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
        {"type": "http", "host": "127.0.0.1", "port": 0, "realm": "realm1"},
        {"type": "metrics", "host": "127.0.0.1", "port": 0},
    ]
    target = Target()
    hook = {"name": "plain", "url": target.url, "topic": "hook"}
    process = RouterProcess(tmp_path, [realm_file("realm1", webhooks=[hook])], listeners).start()
    try:
        assert any(NO_TLS_LINE in line for line in process.log_lines)

        async def wamp(transport: str) -> None:
            sub = await connect(process, transport, "json")
            pub = await connect(process, transport, "json")
            events = await sub.events("com.example.notls")
            await pub.publish("com.example.notls", transport,
                              options=PublishOptions(acknowledge=True))
            assert (await next_item(events))[0] == [transport]
            await pub.close()
            await sub.close()

        for transport in ("websocket", "rawsocket"):
            run(wamp(transport))
        for transport in ("tcp", "ws"):
            client = MqttClient(process, version=V311, transport=transport)
            try:
                assert client.connect().reason_code == 0
                client.subscribe(("notls/x", 1))
                client.publish("notls/x", b"plain", qos=1)
                client.expect("notls/x", b"plain")
            finally:
                client.close()
        amqp_connect(process).close()
        assert request(process, "POST", "/publish", {"topic": "com.example.notls"}).status \
            in (200, 202, 204)
        status, body = fetch(process)
        assert status == 200 and "router_" in body
        assert request(process, "POST", "/publish", {"topic": "hook", "args": ["plain"]}).status \
            in (200, 202, 204)
        assert target.wait_accepted(1)[0].event["args"] == ["plain"]
    finally:
        process.stop()
        target.stop()
