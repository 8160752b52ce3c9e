"""Incident counting: every incident counted, one log line per cause and interval."""

from __future__ import annotations

import logging

from router.core.incidents import QUEUE_FULL, SLOW_CONSUMER, Incidents


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_one_cause_is_counted_in_full_and_logged_once_per_interval(caplog):
    clock = FakeClock()
    incidents = Incidents(interval=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="router.incidents"):
        for _ in range(50_000):
            incidents.count("realm1", "mqtt", SLOW_CONSUMER, "client c1")
        assert len(caplog.records) == 1
        clock.now += 10.0
        incidents.flush()
    assert incidents.total(SLOW_CONSUMER) == 50_000
    assert len(caplog.records) == 2
    assert "x49999" in caplog.records[1].getMessage()


def test_causes_are_counted_apart_by_realm_protocol_and_reason(caplog):
    incidents = Incidents(interval=10.0, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="router.incidents"):
        incidents.count("realm1", "mqtt", SLOW_CONSUMER)
        incidents.count("realm1", "wamp", SLOW_CONSUMER)
        incidents.count("realm2", "mqtt", QUEUE_FULL, n=3)
    assert len(caplog.records) == 3
    assert incidents.total(SLOW_CONSUMER) == 2
    assert incidents.total(SLOW_CONSUMER, protocol="wamp") == 1
    assert incidents.total(QUEUE_FULL, realm="realm2") == 3
    assert incidents.total(QUEUE_FULL, realm="realm1") == 0


def test_flush_before_the_interval_holds_the_count_back():
    clock = FakeClock()
    incidents = Incidents(interval=10.0, clock=clock)
    incidents.count("r", "amqp", QUEUE_FULL)
    incidents.count("r", "amqp", QUEUE_FULL)
    clock.now += 5
    incidents.flush()
    assert incidents._unlogged[("r", "amqp", QUEUE_FULL)] == 1
    clock.now += 5
    incidents.flush()
    assert not incidents._unlogged


def test_a_login_flood_from_one_host_logs_its_first_failures_then_counts(caplog):
    from router.core.incidents import LOGIN_FAILED
    from router.core.login_guard import LoginGuard

    class Clock:
        def seconds(self) -> float:
            return 50.0

    incidents = Incidents(interval=10.0, clock=FakeClock())
    guard = LoginGuard(Clock(), window=60.0, free=3, max_delay=8.0, incidents=incidents)
    with caplog.at_level(logging.WARNING):
        delays = [guard.failed("MQTT", "10.0.0.7:5000", "alice", "password", "wrong password")
                  for _ in range(1000)]
    assert delays[:3] == [0.0, 0.0, 0.0] and delays[3] == 2.0 and delays[-1] == 8.0
    assert incidents.total(LOGIN_FAILED, protocol="mqtt") == 997
    assert len(caplog.records) == 4  # three failures one by one, then one counted line
