"""Shared fixtures: a real router process per test module."""

from __future__ import annotations

import pytest

from tests.harness import RouterProcess, realm_file
from tests.mqtt_clients import ClientPool


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
