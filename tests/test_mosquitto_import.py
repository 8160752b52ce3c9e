"""Moving from Mosquitto: ``import-mosquitto`` turns a password file made by the real
``mosquitto_passwd`` and an ACL file into principals and roles; the users then log in over
MQTT with the passwords they had, and get exactly the ACL's grants."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.harness import ROOT, RouterProcess, realm_file
from tests.mqtt_clients import MqttClient, listeners

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")
NOT_AUTHORIZED, BAD_PASSWORD = 0x87, 0x86
PASSWORDS = {"alice": "alice pw", "bob": "bob:pw", "carol": "carol-pw"}
ACL = """# anonymous clients
topic read public/#

user alice
topic readwrite home/#
topic write sensors/+/temp

pattern readwrite devices/%u/#
"""


def import_mosquitto(config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router", "import-mosquitto", "--config",
                           str(config), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(MOSQUITTO_PASSWD is None,
                    reason="mosquitto_passwd is not installed (Debian package 'mosquitto')")
def test_imported_users_log_in_with_their_mosquitto_passwords_and_grants(tmp_path):
    passwd = tmp_path / "passwd"
    for index, (user, password) in enumerate(PASSWORDS.items()):
        hashing = ["-H", "sha512"] if user == "carol" else []  # Mosquitto 1.6's $6$ too
        subprocess.run([MOSQUITTO_PASSWD, *hashing, *(["-c"] if index == 0 else []), "-b",
                        str(passwd), user, password], check=True, capture_output=True, timeout=30)
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    process = RouterProcess(tmp_path / "node", [realm_file("realm1", anonymous_role=None)],
                            listeners=listeners("realm1", wamp=False))
    imported = import_mosquitto(process.config_path, "--password-file", str(passwd),
                                "--acl-file", str(acl))
    assert imported.returncode == 0, imported.stderr
    assert "imported 3 user(s)" in imported.stdout and "mosquitto-anonymous" in imported.stdout
    principals = json.loads((tmp_path / "node" / "realms" / "realm1.json").read_text())[
        "principals"]
    assert principals["alice"]["ticket"].startswith("$7$")
    assert principals["carol"]["ticket"].startswith("$6$")
    process.start()
    clients = []
    try:
        def login(user: str, password: str) -> MqttClient:
            client = MqttClient(process, username=user, password=password)
            clients.append(client)
            assert client.connect().reason_code == (0 if password == PASSWORDS[user]
                                                     else BAD_PASSWORD), user
            return client

        login("alice", "wrong")
        alice, bob, carol = (login(user, PASSWORDS[user]) for user in ("alice", "bob", "carol"))
        assert alice.subscribe(("home/#", 1), ("homer/x", 1), ("sensors/+/temp", 1)) == [
            1, NOT_AUTHORIZED, NOT_AUTHORIZED]  # sensors: write only
        assert alice.publish("sensors/k/temp", b"21", qos=1) == 0
        assert alice.publish("devices/alice/x", b"1", qos=1) == 0
        assert alice.publish("devices/bob/x", b"1", qos=1) == NOT_AUTHORIZED
        assert bob.publish("devices/bob/x", b"1", qos=1) == 0
        assert bob.subscribe(("home/#", 1), ("public/#", 1)) == [NOT_AUTHORIZED] * 2
        assert carol.publish("devices/carol/x", b"1", qos=1) == 0
    finally:
        for client in clients:
            client.close()
        process.stop()


def test_a_deny_line_is_refused_with_its_line(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite home/#\ntopic deny home/secret\n")
    process = RouterProcess(tmp_path / "node", [realm_file("realm1")])
    before = (tmp_path / "node" / "realms" / "realm1.json").read_text()
    refused = import_mosquitto(process.config_path, "--acl-file", str(acl))
    assert refused.returncode == 2
    assert f"{acl}:3: 'topic deny home/secret': the router's rules only allow" in refused.stderr
    assert (tmp_path / "node" / "realms" / "realm1.json").read_text() == before
