"""Unit tests of the bounds on client-driven core state (no router process needed)."""

from __future__ import annotations

from router.core.history import EventHistory, HistoryRule
from router.core.model import Publication, SessionInfo
from router.core.retention import RetainedStore, RetentionPolicy
from router.core.topic import from_uri
from router.engines.records import encode_retained

PUBLISHER = SessionInfo(1, "realm1", "pub", "anonymous")


class FakeClock:
    """The store's clock, moved by the test (the store is pure state, driven by time)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def publication(publication_id: int, topic: str, clock: FakeClock, ttl: float | None = None,
                expires_at: float | None = None) -> Publication:
    return Publication(publication_id, from_uri(topic), [publication_id], None, PUBLISHER, retain=True,
                       retain_ttl=ttl, expires_at=expires_at, timestamp=clock.now)


def test_expiry_heap_stays_bounded_by_live_entries_not_publishes():
    clock = FakeClock()
    store = RetainedStore(RetentionPolicy(), encode_retained, clock)
    for i in range(100_000):
        store.retain(publication(i + 1, "com.example.t", clock, ttl=60))
    assert len(store._expiry) <= 2 * 1 + 16
    subscriber = SessionInfo(2, "realm1", "sub", "anonymous")
    assert [p.publication_id
            for p in store.for_subscriber(from_uri("com.example.t"), "exact", subscriber)] == [100_000]
    # the live one still expires on time, and only then
    clock.now += 59.9
    assert store.expire() == 0
    assert len(store) == 1
    clock.now += 0.2
    assert store.expire() == 1
    assert len(store) == 0


def test_expiry_heap_bounded_across_many_topics_and_clears():
    clock = FakeClock()
    store = RetainedStore(RetentionPolicy(), encode_retained, clock)
    for round_ in range(50):
        for topic in range(100):
            store.retain(publication(round_ * 1000 + topic + 1, f"com.example.t{topic}", clock,
                                     ttl=10 + topic))
        store.clear(from_uri("com.example.t0"))
    assert len(store._expiry) <= 2 * 99 + 16
    clock.now += 10 + 49.5  # topics 1..49 are due (ttl 11..59), topics 50..99 are not
    assert store.expire() == 49
    assert len(store) == 50


def test_message_expiry_bounds_a_retained_event_without_ttl():
    clock = FakeClock()
    store = RetainedStore(RetentionPolicy(), encode_retained, clock)
    store.retain(publication(1, "com.example.m", clock, expires_at=clock.now + 1))
    store.retain(publication(2, "com.example.n", clock, ttl=100, expires_at=clock.now + 5))
    other = SessionInfo(2, "realm1", "sub", "anonymous")
    assert len(list(store.for_subscriber(from_uri("com.example."), "prefix", other))) == 2
    clock.now += 1
    assert [p.publication_id for p in store.for_subscriber(from_uri("com.example."), "prefix", other)] == [2]
    assert store.expire() == 1
    clock.now += 4
    assert store.expire() == 1
    assert len(store) == 0


def test_event_history_does_not_return_an_event_past_its_message_expiry():
    clock = FakeClock()
    history = EventHistory([HistoryRule(from_uri("com.example."), "prefix", 10)], clock)
    history.record(publication(1, "com.example.a", clock, expires_at=clock.now + 5))
    history.record(publication(2, "com.example.a", clock))
    subscriber = SessionInfo(2, "realm1", "sub", "anonymous")
    assert [p.publication_id for p in history.events(from_uri("com.example."), "prefix", subscriber)] \
        == [1, 2]
    clock.now += 5
    assert [p.publication_id for p in history.events(from_uri("com.example."), "prefix", subscriber)] \
        == [2]


def test_a_reverted_topic_leaves_no_expiry_behind_for_the_entries_it_dropped():
    clock = FakeClock()
    store = RetainedStore(RetentionPolicy(), encode_retained, clock)
    kept = store.retain(publication(1, "com.example.r", clock, ttl=100))
    store.retain(publication(2, "com.example.r", clock, ttl=10))  # its write "failed"
    changes = []
    store.listeners.append(lambda topic, entries, action, publication: changes.append(action))
    store.revert(from_uri("com.example.r"), [kept])
    clock.now += 10
    assert store.expire() == 0 and changes == []  # the reverted entry expires nothing
    subscriber = SessionInfo(2, "realm1", "sub", "anonymous")
    assert [p.publication_id
            for p in store.for_subscriber(from_uri("com.example.r"), "exact", subscriber)] == [1]
    clock.now += 90
    assert store.expire() == 1 and changes == ["expire"]
