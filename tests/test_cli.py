"""The command line as an operator uses it: check-config, run with a bad config, SIGTERM."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from router.core.credentials import hash_secret
from tests.clients import connect, raw_connect, run
from tests.harness import OPEN_ROLE, ROOT, RouterProcess, realm_file

PLAIN_SECRET = "hunter2-plain-text"


def router_cli(*args: str, stdin: str | None = None, timeout: float = 30.0):
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def good_config() -> tuple[dict, dict]:
    config = {"data_dir": "data", "realms_dir": "realms", "realms": ["realm1"],
              "listeners": [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                            {"type": "rawsocket", "host": "127.0.0.1", "port": 0}],
              "shutdown_timeout": 2}
    # deep copies: the mutations below must not touch the harness's shared OPEN_ROLE
    realm = realm_file("realm1", roles={"anonymous": copy.deepcopy(OPEN_ROLE),
                                        "user": copy.deepcopy(OPEN_ROLE)},
                       principals={"alice": {"role": "user",
                                             "ticket": hash_secret("secret", 1000)}})
    return config, realm


def write(directory: Path, config, realm) -> Path:
    """Write config.json and realms/realm1.json (dicts as JSON, strings verbatim)."""
    (directory / "realms").mkdir(exist_ok=True)
    for path, content in ((directory / "config.json", config),
                          (directory / "realms" / "realm1.json", realm)):
        path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return directory / "config.json"


def test_check_config_accepts_good_config(tmp_path):
    config_path = write(tmp_path, *good_config())
    result = router_cli("check-config", "--config", str(config_path))
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_repository_config_passes_check_config():
    result = router_cli("check-config", "--config", "config.json")
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
    default = router_cli("check-config")  # --config defaults to ./config.json
    assert default.returncode == 0, default.stderr


def _set(path: list, value):
    def mutate(config, realm):
        target = config if path[0] == "config" else realm
        *parents, last = path[1:]
        for key in parents:
            target = target[key]
        target[last] = value
    return mutate


def _add_realm(name):
    def mutate(config, realm):
        config["realms"].append(name)
    return mutate


def _replace(which, text):
    def mutate(config, realm):
        return (text, realm) if which == "config" else (config, text)
    return mutate


# (id, mutation, file the message must name, words the message must contain)
BAD_CONFIGS = [
    ("invalid JSON in config.json", _replace("config", '{"realms": ["realm1"],,}'),
     "config.json", ["JSON", "line 1"]),
    ("invalid JSON in realm file", _replace("realm", '{"name": "realm1"'),
     "realm1.json", ["JSON"]),
    ("unknown top-level key", _set(["config", "colour"], "blue"), "config.json", ["colour"]),
    ("unknown listener key", _set(["config", "listeners", 0, "tls"], True), "config.json",
     ["listeners", "tls"]),
    ("port is a string", _set(["config", "listeners", 1, "port"], "8081"), "config.json",
     ["listeners", "port"]),
    ("port out of range", _set(["config", "listeners", 0, "port"], 70000), "config.json",
     ["listeners", "port"]),
    ("unknown listener type", _set(["config", "listeners", 0, "type"], "gopher"), "config.json",
     ["listeners", "type"]),
    ("realm file missing", _add_realm("ghost"), "config.json", ["realms[", "ghost.json"]),
    ("rule with invalid match", _set(["realm", "roles", "user", 0, "match"], "regex"),
     "realm1.json", ["user", "match"]),
    ("rule with unknown action", _set(["realm", "roles", "user", 0, "allow"], ["delete"]),
     "realm1.json", ["user", "allow"]),
    ("principal with unknown role", _set(["realm", "principals", "alice", "role"], "admin"),
     "realm1.json", ["alice", "role"]),
    ("plain-text ticket", _set(["realm", "principals", "alice", "ticket"], PLAIN_SECRET),
     "realm1.json", ["alice", "ticket"]),
    ("anonymous_role unknown", _set(["realm", "anonymous_role"], "guest"), "realm1.json",
     ["anonymous_role"]),
    ("uri_check invalid", _set(["realm", "uri_check"], "sloppy"), "realm1.json", ["uri_check"]),
    ("max_testaments zero", _set(["realm", "wamp"], {"max_testaments": 0}), "realm1.json",
     ["wamp.max_testaments", "positive"]),
    ("max_session_expiry over four bytes", _set(["realm", "mqtt"], {"max_session_expiry": 2 ** 32}),
     "realm1.json", ["mqtt.max_session_expiry", "4294967295"]),
    # an expiry past year 9999 made every retained listing fail ("year 33715 is out of range")
    ("retention.default_ttl too long", _set(["realm", "retention"], {"default_ttl": 1e12}),
     "realm1.json", ["retention.default_ttl", "4294967295"]),
    ("max_keepalive over two bytes", _set(["realm", "mqtt"], {"max_keepalive": 65536}),
     "realm1.json", ["mqtt.max_keepalive", "65535"]),
    ("topic_alias_maximum negative", _set(["realm", "mqtt"], {"topic_alias_maximum": -1}),
     "realm1.json", ["mqtt.topic_alias_maximum", "0 to 65535"]),
    ("max_link_expiry not a number", _set(["realm", "amqp"], {"max_link_expiry": "1d"}),
     "realm1.json", ["amqp.max_link_expiry", "int"]),
    ("inbound_window negative", _set(["realm", "amqp"], {"inbound_window": -1}), "realm1.json",
     ["amqp.inbound_window", "positive"]),
    ("amqp.max_sessions over the channels", _set(["realm", "amqp"], {"max_sessions": 65537}),
     "realm1.json", ["amqp.max_sessions", "at most 32768"]),
    ("amqp.qos_policy unknown", _set(["realm", "amqp"], {"qos_policy": "best"}), "realm1.json",
     ["amqp.qos_policy", "minimum", "'best'"]),
    ("amqp.max_queued zero", _set(["realm", "amqp"], {"max_queued": 0}), "realm1.json",
     ["amqp.max_queued", "positive"]),
    ("amqp.payload_mapping unknown", _set(["realm", "amqp"], {"payload_mapping": "xml"}),
     "realm1.json", ["amqp.payload_mapping", "binary"]),
    ("handshake_timeout zero", _set(["config", "listeners", 0, "handshake_timeout"], 0),
     "config.json", ["listeners[0]", "handshake_timeout"]),
    ("max_connections negative", _set(["config", "listeners", 1, "max_connections"], -1),
     "config.json", ["listeners[1]", "max_connections"]),
    ("max_connections_per_host a string",
     _set(["config", "listeners", 0, "max_connections_per_host"], "many"), "config.json",
     ["listeners[0]", "max_connections_per_host"]),
    ("max_pending_verifications zero",
     _set(["config", "login_backoff"], {"max_pending_verifications": 0}), "config.json",
     ["login_backoff", "max_pending_verifications"]),
    ("slow_consumer_timeout zero", _set(["config", "listeners", 0, "slow_consumer_timeout"], 0),
     "config.json", ["listeners[0].slow_consumer_timeout", "positive"]),
    ("max_buffered_bytes a string", _set(["config", "listeners", 1, "max_buffered_bytes"], "4M"),
     "config.json", ["listeners[1].max_buffered_bytes"]),
    ("store.max_queued_writes zero", _set(["config", "store"], {"max_queued_writes": 0}),
     "config.json", ["store.max_queued_writes", "positive"]),
    ("memory.trim_interval negative", _set(["config", "memory"], {"trim_interval": -1}),
     "config.json", ["memory.trim_interval", "negative"]),
    ("eventlog.max_queued_records negative",
     _set(["config", "eventlog"], {"max_queued_records": -1}), "config.json",
     ["eventlog.max_queued_records", "positive"]),
    ("wamp.max_unacked zero", _set(["realm", "wamp"], {"max_unacked": 0}), "realm1.json",
     ["wamp.max_unacked", "positive"]),
    ("engine.type unknown", _set(["config", "engine"], {"type": "memory"}), "config.json",
     ["engine.type", '"embedded" or "redis"']),
    ("engine.url not redis", _set(["config", "engine"],
                                  {"type": "redis", "url": "http://h:1/0", "node": "a"}),
     "config.json", ["engine.url", "redis://host:port/db"]),
    ("engine.node missing", _set(["config", "engine"], {"type": "redis", "url": "redis://h/0"}),
     "config.json", ["engine.node", "required"]),
    ("engine.node with a space", _set(["config", "engine"],
                                      {"type": "redis", "url": "redis://h/0", "node": "a b"}),
     "config.json", ["engine.node", "letters"]),
    ("engine url on embedded", _set(["config", "engine"], {"type": "embedded", "url": "x"}),
     "config.json", ["engine.url", "unknown key"]),
    ("cluster.max_pending_commands zero", _set(["config", "cluster"],
                                               {"max_pending_commands": 0}),
     "config.json", ["cluster.max_pending_commands", "positive"]),
    ("cluster.max_pending_calls zero", _set(["config", "cluster"], {"max_pending_calls": 0}),
     "config.json", ["cluster.max_pending_calls", "positive"]),
    ("cluster.session_takeover_timeout negative",
     _set(["config", "cluster"], {"session_takeover_timeout": -1}),
     "config.json", ["cluster.session_takeover_timeout", "positive"]),
    ("cluster.call_timeout a string", _set(["config", "cluster"], {"call_timeout": "1s"}),
     "config.json", ["cluster.call_timeout"]),
    ("cluster.heartbeat_interval zero", _set(["config", "cluster"], {"heartbeat_interval": 0}),
     "config.json", ["cluster.heartbeat_interval", "positive"]),
    ("shutdown_timeout negative", _set(["config", "shutdown_timeout"], -1), "config.json",
     ["shutdown_timeout", "negative"]),
    # Python's json module reads NaN, Infinity and 1e400 (infinite), which no JSON number is;
    # every "> 0" check passes NaN, so a NaN timeout would be taken
    ("NaN in config.json", _replace("config", '{"realms": ["realm1"], "shutdown_timeout": NaN,'
                                    ' "listeners": [{"type": "websocket", "port": 0}]}'),
     "config.json", ["JSON", "NaN"]),
    ("1e400 in config.json", _replace("config", '{"realms": ["realm1"], "sys_interval": 1e400,'
                                      ' "listeners": [{"type": "websocket", "port": 0}]}'),
     "config.json", ["JSON", "1e400"]),
    ("Infinity in realm file", _set(["realm", "wamp"], {"max_unacked": float("inf")}),
     "realm1.json", ["JSON", "Infinity"]),
    ("cluster.node_timeout not above two heartbeats",
     _set(["config", "cluster"], {"heartbeat_interval": 1, "node_timeout": 2}),
     "config.json", ["cluster.node_timeout", "more than twice heartbeat_interval"]),
]


def make_bad_config(directory: Path, mutation) -> Path:
    config, realm = good_config()
    replaced = mutation(config, realm)
    if replaced is not None:
        config, realm = replaced
    return write(directory, config, realm)


@pytest.mark.parametrize("mutation,file_name,words", [case[1:] for case in BAD_CONFIGS],
                         ids=[case[0] for case in BAD_CONFIGS])
def test_check_config_rejects_bad_config(tmp_path, mutation, file_name, words):
    config_path = make_bad_config(tmp_path, mutation)
    result = router_cli("check-config", "--config", str(config_path))
    assert result.returncode != 0
    assert "OK" not in result.stdout
    message = result.stderr
    assert file_name in message, message
    # the key must be named in the text, not merely appear in the temporary path
    text = message.replace(str(tmp_path), "<dir>")
    for word in words:
        assert word in text, f"{word!r} not in {message!r}"
    assert PLAIN_SECRET not in result.stdout + result.stderr, "the secret was echoed"


@pytest.mark.parametrize("mutation,file_name,words",
                         [BAD_CONFIGS[4][1:], BAD_CONFIGS[7][1:], BAD_CONFIGS[11][1:]],
                         ids=[BAD_CONFIGS[4][0], BAD_CONFIGS[7][0], BAD_CONFIGS[11][0]])
def test_run_refuses_bad_config(tmp_path, mutation, file_name, words):
    config_path = make_bad_config(tmp_path, mutation)
    result = router_cli("run", "--config", str(config_path), timeout=20)
    assert result.returncode != 0
    assert file_name in result.stderr and all(word in result.stderr for word in words), \
        result.stderr
    assert "ready:" not in result.stderr


def test_a_config_file_that_is_not_utf8_is_a_clear_error_not_a_traceback(tmp_path):
    config_path = write(tmp_path, *good_config())
    config_path.write_bytes(b"\xff\xfe" + config_path.read_bytes())
    result = router_cli("check-config", "--config", str(config_path))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert "config.json" in result.stderr and "UTF-8" in result.stderr, result.stderr


def test_run_refuses_missing_config_file(tmp_path):
    result = router_cli("run", "--config", str(tmp_path / "nope.json"), timeout=20)
    assert result.returncode != 0
    assert "nope.json" in result.stderr


def test_run_names_the_file_and_data_dir_when_the_data_dir_cannot_be_made(tmp_path):
    """A data_dir that is a file said only "cannot start: [Errno 17] File exists: ..."."""
    config, realm = good_config()
    (tmp_path / "occupied").write_text("a file, not a directory")
    config["data_dir"] = "occupied"
    config_path = write(tmp_path, config, realm)
    result = router_cli("run", "--config", str(config_path), timeout=20)
    assert result.returncode != 0
    assert f"{config_path}: data_dir: cannot create" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_run_refuses_port_in_use_naming_the_listener_and_the_file(tmp_path):
    config, realm = good_config()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config["listeners"][1]["port"] = port
        config_path = write(tmp_path, config, realm)
        result = router_cli("run", "--config", str(config_path), timeout=20)
        check = router_cli("check-config", "--config", str(config_path))
    assert result.returncode != 0
    assert (f"cannot start: {config_path}: listeners[1] (rawsocket on 127.0.0.1:{port}): "
            f"cannot listen: Address already in use") in result.stderr, result.stderr
    # check-config says so too, as a warning: the port may be this config's running router's
    assert check.returncode == 0 and "OK" in check.stdout, check.stderr
    assert check.stderr == (f"warning: {config_path}: listeners[1] (rawsocket on "
                            f"127.0.0.1:{port}): cannot listen now: Address already in use\n")


def test_every_unknown_key_of_an_object_is_named_with_the_key_it_misspells(tmp_path):
    config, realm = good_config()
    config["listners"] = config["evntlog"] = {}
    config["colour"] = "blue"
    result = router_cli("check-config", "--config", str(write(tmp_path, config, realm)))
    assert result.returncode != 0
    assert ("config.json: unknown keys 'listners' (did you mean 'listeners'?), 'evntlog' "
            "(did you mean 'eventlog'?), 'colour' (known keys: ") in result.stderr, result.stderr
    del config["listners"], config["evntlog"], config["colour"]
    config["listeners"][0]["prot"] = 1
    result = router_cli("check-config", "--config", str(write(tmp_path, config, realm)))
    assert "config.json: listeners[0].prot: unknown key (did you mean 'port'?)" in result.stderr


def test_version_and_the_program_name_in_usage():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = router_cli("--version")
    assert result.returncode == 0
    assert result.stdout == f"python -m router (wamp-retain-router) {version}\n"
    # the installed script runs router.cli:main with its own path as argv[0]
    script = ("import sys; sys.argv[0] = '/usr/local/bin/wamp-router'; "
              "from router.cli import main; sys.exit(main())")
    for args, expected in ((["--help"], "usage: wamp-router "),
                           (["--version"], f"wamp-router (wamp-retain-router) {version}")):
        result = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and result.stdout.startswith(expected), result.stdout


def start_and_stop(process: RouterProcess) -> None:
    """Start, have one client session (the reactor runs: SIGTERM is handled), stop."""
    process.start()

    async def one_session():
        client = await connect(process, "websocket", "json")
        await client.close()

    try:
        run(one_session())
    finally:
        assert process.stop() == 0


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_start_and_stop_log_no_twisted_port_or_factory_chatter(tmp_path, log_format):
    quiet = RouterProcess(tmp_path / "quiet", [realm_file("realm1")],
                          run_args=["--log-format", log_format])
    start_and_stop(quiet)
    chatter = re.compile(r"(Starting|Stopping) factory|starting on \d+|Port \d+ Closed"
                         r"|Main loop terminated")
    assert not [line for line in quiet.log_lines if chatter.search(line)], quiet.log_lines
    assert any("ready: " in line for line in quiet.log_lines)
    assert any("shutdown complete" in line for line in quiet.log_lines)
    # still there for whoever asks for debug
    verbose = RouterProcess(tmp_path / "verbose", [realm_file("realm1")],
                            run_args=["--log-format", log_format, "--log-level", "debug"])
    start_and_stop(verbose)
    factory_lines = [line for line in verbose.log_lines if "Starting factory" in line]
    assert factory_lines and all("DEBUG" in line or '"level": "debug"' in line
                                 for line in factory_lines), factory_lines


def test_hash_secret_output_is_accepted(tmp_path):
    result = router_cli("hash-secret", stdin="s3cret-value\n")
    assert result.returncode == 0, result.stderr
    hashed = result.stdout.strip()
    assert hashed and "s3cret-value" not in hashed
    config, realm = good_config()
    realm["principals"]["alice"]["ticket"] = hashed
    check = router_cli("check-config", "--config", str(write(tmp_path, config, realm)))
    assert check.returncode == 0, check.stderr


# SIGTERM -----------------------------------------------------------------------------------

@pytest.fixture
def fresh_router(tmp_path):
    process = RouterProcess(tmp_path, [realm_file("realm1")]).start()
    yield process
    if process.proc.poll() is None:
        process.kill9()


def test_sigterm_sends_goodbye_system_shutdown_and_exits_zero(fresh_router):
    async def scenario():
        ws_client = await connect(fresh_router, "websocket", "json")
        raw_client = await connect(fresh_router, "rawsocket", "cbor")
        fresh_router.proc.send_signal(signal.SIGTERM)
        for client in (ws_client, raw_client):
            details = await asyncio.wait_for(asyncio.shield(client.left), 10)
            assert details is not None, "disconnected without GOODBYE"
            assert details.reason == "wamp.close.system_shutdown"
            await asyncio.wait_for(asyncio.shield(client.disconnected), 10)

    run(scenario())
    # wait for the exit the one SIGTERM started (a second signal would race with it)
    assert fresh_router.proc.wait(15) == 0


def test_sigterm_with_unresponsive_client_still_exits_zero(fresh_router):
    """A client that never answers GOODBYE cannot hold the shutdown hostage."""
    async def scenario():
        silent = await raw_connect(fresh_router, "rawsocket", "json")
        welcome = await silent.hello()
        assert welcome[0] == 2
        half_open = await raw_connect(fresh_router, "websocket", "json")  # never sends HELLO
        fresh_router.proc.send_signal(signal.SIGTERM)
        goodbye = await silent.recv()
        assert goodbye[0] == 6 and goodbye[2] == "wamp.close.system_shutdown", goodbye
        # no reply from us: the router must close the connection itself
        await asyncio.wait_for(silent.closed, 15)
        await asyncio.wait_for(half_open.closed, 15)

    run(scenario())
    assert fresh_router.proc.wait(15) == 0


@pytest.mark.parametrize("args", [["status", "--interval", "-1"], ["status", "--interval", "nan"],
                                  ["reload", "--timeout", "-1"], ["reload", "--timeout", "inf"]],
                         ids=["interval -1", "interval nan", "timeout -1", "timeout inf"])
def test_a_negative_or_non_finite_number_of_seconds_is_a_usage_error(args):
    """`status --interval -1` ended in a ValueError traceback from time.sleep; a reload that
    would wait -1 s said the router "did not report within -1 s"."""
    result = router_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert args[1] in result.stderr and "seconds" in result.stderr, result.stderr


@pytest.mark.parametrize("where", ["under-a-file", "realms-is-a-file"])
def test_init_where_it_cannot_write_says_so_without_a_traceback(tmp_path, where):
    """`init /proc/x` (or a folder under a file) ended in a FileNotFoundError traceback."""
    (tmp_path / "file").write_text("")
    if where == "under-a-file":
        folder = tmp_path / "file" / "starter"
    else:
        folder = tmp_path / "starter"
        folder.mkdir()
        (folder / "realms").write_text("")
    result = router_cli("init", str(folder))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot write the starter files into {folder}" in result.stderr, result.stderr
