"""Packaging as an operator meets it: ``pip install .`` in a fresh venv gets the router only
(no pyspark, no matplotlib) and, with ``init``, a router that starts outside the repository;
the starter files cannot drift from the repository's; the deploy/ examples stay valid."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import router
from router.starter import STARTER_FILES, template
from tests.harness import ROOT, end

INSTALL_TIMEOUT = 600
"""Building the wheel and installing it with its dependencies into a new venv: about 20 s
with pip's cache, minutes on a cold cache."""


def router_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_shipped_templates_are_the_repository_files():
    """``init`` writes router/templates/; the README runs config.json: they must be the same."""
    for name in STARTER_FILES:
        assert template(name) == (ROOT / name).read_bytes(), (
            f"router/templates/{name} differs from {name}: after changing the shipped file, "
            f"cp {name} router/templates/{name}")


def test_init_writes_a_starter_that_runs_and_never_overwrites(tmp_path):
    folder = tmp_path / "new" / "router"
    result = router_cli("init", str(folder))
    assert result.returncode == 0, result.stderr
    for name in STARTER_FILES:
        assert (folder / name).read_bytes() == (ROOT / name).read_bytes()
    # the next command as it can be typed: this interpreter (a bare python may lack Twisted)
    interpreter = Path(sys.executable)
    typed = interpreter.relative_to(ROOT) if interpreter.is_relative_to(ROOT) else interpreter
    assert f"next: {typed} -m router run --config {folder / 'config.json'}" in result.stdout
    assert router_cli("check-config", "--config", str(folder / "config.json")).returncode == 0

    (folder / "realms" / "realm1.json").write_text("{}  # an operator's edits")
    refused = router_cli("init", str(folder))
    assert refused.returncode == 1
    assert "not overwriting" in refused.stderr and "--force" in refused.stderr
    assert str(folder / "realms" / "realm1.json") in refused.stderr
    assert (folder / "realms" / "realm1.json").read_text() == "{}  # an operator's edits"

    forced = router_cli("init", str(folder), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (folder / "realms" / "realm1.json").read_bytes() == template("realms/realm1.json")


def test_init_for_a_container_binds_every_listener_to_all_addresses(tmp_path):
    result = router_cli("init", str(tmp_path), "--host", "0.0.0.0",
                        "--data-dir", str(tmp_path / "state"))
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "config.json").read_text())
    shipped = json.loads(template("config.json"))
    assert [listener["host"] for listener in config["listeners"]] == (
        ["0.0.0.0"] * len(shipped["listeners"]))
    assert [listener["port"] for listener in config["listeners"]] == (
        [listener["port"] for listener in shipped["listeners"]])
    assert config["data_dir"] == str(tmp_path / "state")
    assert router_cli("check-config", "--config", str(tmp_path / "config.json")).returncode == 0


def test_the_dockerfile_exposes_the_shipped_ports():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    exposed = {int(port) for line in re.findall(r"^EXPOSE (.+)$", dockerfile, re.M)
               for port in line.split()}
    shipped = {listener["port"] for listener in json.loads(template("config.json"))["listeners"]}
    assert exposed == shipped
    assert re.search(r"^USER (?!root\b)\S+", dockerfile, re.M), "the container runs as root"
    assert "init /etc/wamp-router --host 0.0.0.0" in dockerfile


def test_the_systemd_unit_verifies(tmp_path):
    """``systemd-analyze verify`` on the shipped unit; it wants ExecStart's binary to exist, so
    it checks a copy pointing at one that does."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    unit = (ROOT / "deploy" / "wamp-router.service").read_text()
    assert re.search(r"^ExecReload=/bin/kill -HUP \$MAINPID$", unit, re.M)
    for setting in ("NoNewPrivileges=yes", "ProtectSystem=strict", "Restart=on-failure",
                    "ReadWritePaths=/var/lib/wamp-router", "User=wamp-router"):
        assert re.search(rf"^{re.escape(setting)}$", unit, re.M), setting
    binary = tmp_path / "wamp-router"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    copy = tmp_path / "wamp-router.service"
    copy.write_text(unit.replace("/opt/wamp-router/bin/wamp-router", str(binary)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    # unknown keys and bad values are only warnings (exit 0): any line about the unit fails
    about_the_unit = [line for line in (result.stdout + result.stderr).splitlines()
                      if copy.name in line]
    assert result.returncode == 0 and not about_the_unit, result.stdout + result.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, venv): the wheel built from a copy of the sources (the build writes build/ and
    *.egg-info next to them) and a new venv, without system site-packages, where it is
    installed the way an operator does, dependencies from the index."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("router", "spark_analytics"):
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    environment = base / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    pip = [str(environment / "bin" / "python"), "-m", "pip", "-q"]
    wheels = base / "wheels"
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True,
                   timeout=INSTALL_TIMEOUT)
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([*pip, "install", str(wheel)], check=True, timeout=INSTALL_TIMEOUT)
    return wheel, environment


@pytest.mark.timeout(INSTALL_TIMEOUT)
def test_the_wheel_requires_no_analytics_and_ships_the_starter(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    assert metadata["Version"] == router.__version__
    for name in STARTER_FILES:
        assert f"router/templates/{name}" in names
    requires = metadata.get_all("Requires-Dist")
    heavy = [line for line in requires if re.match(r"(pyspark|matplotlib)\b", line)]
    assert heavy and all('extra == "analytics"' in line for line in heavy), requires
    assert any(line.startswith("wamp-retain-router[analytics]") and 'extra == "test"' in line
               for line in requires), requires


@pytest.mark.timeout(INSTALL_TIMEOUT)
def test_a_fresh_install_starts_the_router_outside_the_repository(installed, tmp_path):
    _, environment = installed
    bin_dir = environment / "bin"
    python = str(bin_dir / "python")
    for module in ("pyspark", "matplotlib"):
        probe = subprocess.run([python, "-c", f"import {module}"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, module
    analytics = subprocess.run([python, "-m", "spark_analytics", "report", "--help"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert analytics.returncode != 0
    assert "pip install 'wamp-retain-router[analytics]'" in analytics.stderr
    assert "Traceback" not in analytics.stderr

    wamp_router = str(bin_dir / "wamp-router")
    version = subprocess.run([wamp_router, "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.stdout == f"wamp-router (wamp-retain-router) {router.__version__}\n"

    init = subprocess.run([wamp_router, "init", "site"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    assert "next: wamp-router run --config site/config.json" in init.stdout
    config_path = tmp_path / "site" / "config.json"
    config = json.loads(config_path.read_text())
    for listener in config["listeners"]:
        listener["port"] = 0  # the shipped ports may be taken on this machine
    config_path.write_text(json.dumps(config))

    proc = subprocess.Popen([wamp_router, "run", "--config", "site/config.json"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log = []
        for line in proc.stderr:  # the test's timeout bounds the wait
            log.append(line)
            if "ready: " in line:
                break
        else:
            pytest.fail("the router exited before it was ready:\n" + "".join(log))
        urls = line.split("ready: ", 1)[1].split()
        metrics_url = next(url for url in urls if url.endswith("/metrics"))
        with urllib.request.urlopen(metrics_url, timeout=30) as response:
            assert b"router_" in response.read()
        # the http listener's OpenAPI file and the console's files are package data:
        # served from the install too
        api_url = next(url for url in urls if url.startswith("http://") and url.endswith("/"))
        with urllib.request.urlopen(api_url + "openapi.json", timeout=30) as response:
            assert json.loads(response.read())["openapi"].startswith("3.")
        for name in ("console/", "console/console.js", "console/console.css"):
            with urllib.request.urlopen(api_url + name, timeout=30) as response:
                assert response.status == 200 and response.read(), name
        proc.terminate()
        _, rest = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(log) + rest
        assert "Traceback" not in "".join(log) + rest
    finally:
        end(proc)
    assert (tmp_path / "site" / "data").is_dir(), "the data folder is next to config.json"
