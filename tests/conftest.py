"""Shared fixtures: a real router process per test module."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.harness import RouterProcess, realm_file
from tests.mqtt_clients import ClientPool
from tests.reaper import pytest_runtest_call, pytest_sessionfinish  # noqa: F401 (hooks)

# The properties run beside router and Spark processes on a small machine: how long one
# example or one draw takes says nothing about the code under test, so no timing checks.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """A router with one open realm ``realm1`` on WebSocket and RawSocket."""
    process = RouterProcess(tmp_path_factory.mktemp("router"), [realm_file("realm1")]).start()
    yield process
    process.stop()


@pytest.fixture
def mqtt(router):
    """paho clients on the module's ``router``, all closed at the end of the test."""
    pool = ClientPool(router)
    yield pool
    pool.close()


@pytest.fixture
def clients(mqtt):
    """The same pool, under the name the MQTT test modules use."""
    return mqtt
