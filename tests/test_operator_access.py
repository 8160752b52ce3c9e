"""Operator access out of the box: ``retained list|purge`` and ``status`` on the shipped
configuration, from the router's machine, with no user, role or ticket created (the admin
socket in the data dir, :mod:`router.admin_socket`)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, RouterProcess, free_port
from tests.mqtt_clients import ClientPool, unique
from tests.test_topics import SHIPPED_REALM

SHIPPED_CONFIG = json.loads((ROOT / "config.json").read_text())


def router_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def shipped_copy(workdir: Path) -> RouterProcess:
    """``config.json`` and ``realms/realm1.json`` as shipped, on free ports (the metrics
    port one that ``status`` can find in the file: an ephemeral 0 it could not)."""
    listeners = [dict(listener, port=free_port() if listener["type"] == "metrics" else 0)
                 for listener in SHIPPED_CONFIG["listeners"]]
    extra = {key: value for key, value in SHIPPED_CONFIG.items()
             if key not in ("listeners", "realms")}
    return RouterProcess(workdir, [SHIPPED_REALM], listeners=listeners, extra_config=extra)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    process = shipped_copy(tmp_path_factory.mktemp("shipped")).start()
    yield process
    process.stop()


@pytest.fixture
def retained(shipped):
    """Three retained MQTT topics under a fresh base, and the base."""
    pool = ClientPool(shipped)
    base = unique("home")
    publisher = pool()
    for topic, payload in ((f"{base}/kitchen/temp", b"21.5"), (f"{base}/hall/temp", b"19"),
                           (f"{base}x/other", b"not below base")):
        publisher.publish(topic, payload, 1, retain=True)
    yield base
    pool.close()


def retained_cli(router: RouterProcess, *args: str) -> subprocess.CompletedProcess:
    return router_cli("retained", *args, "--config", str(router.config_path))


def rows(output: str) -> list[list[str]]:
    """The table's rows below its header, split on runs of two spaces."""
    lines = output.splitlines()
    assert lines[0].split()[:2] == ["TOPIC", "OWNER"], output
    return [[cell.strip() for cell in line.split("  ") if cell.strip()]
            for line in lines[1:-1]]


def test_retained_list_on_the_shipped_config_is_a_table_without_sys(shipped, retained):
    listed = retained_cli(shipped, "list")
    assert listed.returncode == 0, listed.stderr
    topics = [row[0] for row in rows(listed.stdout)]
    assert {f"{retained}.kitchen.temp", f"{retained}.hall.temp", f"{retained}x.other"} \
        <= set(topics)
    assert not any(topic.startswith("$SYS") for topic in topics), listed.stdout
    assert "of the router's own $SYS topics not shown (--sys shows them)" in listed.stdout
    kitchen = next(row for row in rows(listed.stdout) if row[0] == f"{retained}.kitchen.temp")
    assert kitchen[1] == "anonymous clients (role anonymous)"
    assert kitchen[3].endswith(" B") and kitchen[5] == "never", kitchen

    with_sys = retained_cli(shipped, "list", "--sys")
    assert with_sys.returncode == 0, with_sys.stderr
    assert "$SYS.broker.uptime" in [row[0] for row in rows(with_sys.stdout)]


def test_retained_list_json_and_mqtt_topic_filters(shipped, retained):
    as_json = retained_cli(shipped, "list", "--json", "--topic", f"{retained}/#")
    assert as_json.returncode == 0, as_json.stderr
    items = json.loads(as_json.stdout)
    assert [item["topic"] for item in items] == [f"{retained}.hall.temp",
                                                 f"{retained}.kitchen.temp"]
    assert all(len(item["events"]) == 1 and item["events"][0]["bytes"] > 0 for item in items)

    one_level = retained_cli(shipped, "list", "--topic", f"{retained}/+/temp")
    assert [row[0] for row in rows(one_level.stdout)] == [f"{retained}.hall.temp",
                                                           f"{retained}.kitchen.temp"]
    exact = retained_cli(shipped, "list", "--topic", f"{retained}.hall.temp")
    assert [row[0] for row in rows(exact.stdout)] == [f"{retained}.hall.temp"]
    sys_filter = retained_cli(shipped, "list", "--json", "--topic", "$SYS/broker/uptime")
    assert [item["topic"] for item in json.loads(sys_filter.stdout)] == ["$SYS.broker.uptime"]


@pytest.mark.parametrize("typo", ["{base}/#/temp", "{base}/kit+/temp"])
def test_an_invalid_mqtt_filter_purges_nothing_and_says_why(shipped, retained, typo):
    """'home/#/temp' (a '#' not last) purged every retained topic under home/, neither of
    them ending in /temp alone: an invalid filter is refused, as any MQTT broker does."""
    purge = retained_cli(shipped, "purge", "--topic", typo.format(base=retained))
    assert purge.returncode != 0 and "purged" not in purge.stdout, purge.stdout
    assert "not an MQTT topic filter" in purge.stderr, purge.stderr
    listed = retained_cli(shipped, "list", "--topic", typo.format(base=retained))
    assert listed.returncode != 0 and "not an MQTT topic filter" in listed.stderr
    left = retained_cli(shipped, "list", "--json", "--topic", f"{retained}/#")
    assert len(json.loads(left.stdout)) == 2


def test_retained_purge_by_filter_and_by_prefix_says_how_many(shipped, retained):
    by_filter = retained_cli(shipped, "purge", "--topic", f"{retained}/+/temp")
    assert by_filter.returncode == 0, by_filter.stderr
    assert "purged 2 retained topic(s) in realm realm1" in by_filter.stdout
    by_prefix = retained_cli(shipped, "purge", "--prefix", f"{retained}x.")
    assert "purged 1 retained topic(s)" in by_prefix.stdout, by_prefix.stderr
    left = retained_cli(shipped, "list", "--json", "--prefix", retained)
    assert json.loads(left.stdout) == []
    again = retained_cli(shipped, "purge", "--topic", f"{retained}/hall/temp")
    assert "purged 0 retained topic(s)" in again.stdout, again.stderr


def test_status_on_the_shipped_config_needs_no_token(shipped):
    result = router_cli("status", "--config", str(shipped.config_path), "--interval", "0.2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"router at {shipped.urls['metrics']}: up ")
    assert "realm realm1:" in result.stdout


def test_the_admin_socket_is_the_router_users_only(shipped, tmp_path):
    path = shipped.workdir / "data" / "admin.sock"
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert os.stat(path).st_uid == os.getuid()
    if os.getuid() != 0 or not hasattr(os, "setuid"):
        return  # the peer check needs a second user to be shown
    # another user given a way in (a world-writable link outside the private data dir) is
    # still refused: the router checks who connects, not only the file's mode
    system_python = Path("/usr/bin/python3")  # one the other user may run (not this venv's)
    link = Path("/tmp") / f"{unique('admin')}.sock"
    if not system_python.exists():
        pytest.skip("no /usr/bin/python3 for the other user")
    try:
        os.link(path, link)
    except OSError:
        pytest.skip("cannot link the socket into /tmp")
    try:
        os.chmod(link, 0o666)
        # the refusal is sent as the connection opens: read it before asking anything
        probe = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
                 "print(s.recv(4096).decode())")
        other = subprocess.run([str(system_python), "-c", probe, str(link)], cwd="/",
                               capture_output=True, text=True, timeout=30,
                               preexec_fn=lambda: os.setuid(65534))
        assert "only the router's own user (or root) may use the admin socket" in other.stdout, \
            other.stdout + other.stderr
    finally:
        os.chmod(path, 0o600)
        link.unlink()


def test_status_without_a_metrics_listener_reads_the_admin_socket(router):
    result = router_cli("status", "--config", str(router.config_path), "--interval", "0.2")
    assert result.returncode == 0, result.stdout + result.stderr
    socket_path = router.workdir / "data" / "admin.sock"
    assert result.stdout.startswith(f"router at {socket_path} (admin socket): up ")


def test_no_router_running_is_said_with_the_data_dir_and_the_config(tmp_path):
    config = shipped_copy(tmp_path).config_path
    listed = router_cli("retained", "list", "--config", str(config))
    assert listed.returncode == 1
    assert (f"no router is running with data dir {tmp_path / 'data'} (no socket at "
            f"{tmp_path / 'data' / 'admin.sock'}); is it started with this --config "
            f"({config})?") in listed.stderr
    without_metrics = json.loads(config.read_text())
    without_metrics["listeners"] = [listener for listener in without_metrics["listeners"]
                                    if listener["type"] != "metrics"]
    config.write_text(json.dumps(without_metrics))
    status = router_cli("status", "--config", str(config), "--interval", "0.1")
    assert status.returncode == 1
    assert f"no router is running with data dir {tmp_path / 'data'}" in status.stdout


def test_admin_socket_off_by_config_is_said(tmp_path):
    process = shipped_copy(tmp_path)
    config = json.loads(process.config_path.read_text())
    config["admin_socket"] = None
    process.config_path.write_text(json.dumps(config))
    listed = router_cli("retained", "list", "--config", str(process.config_path))
    assert listed.returncode == 1 and "'admin_socket' is off: pass --url" in listed.stderr
