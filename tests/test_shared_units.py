"""The shared-group policy of the core (router/core/shared.py) with recording peers: turn
order, preference for ready members, eligibility, failures and hand-over."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.broker import Broker
from router.core.model import Eligibility, Publication, SessionInfo
from router.core.shared import SharedGroup, SharedGroups
from router.core.uri import EXACT, MQTT


class Member:
    """A Peer that records the events it gets; ``is_ready`` and ``broken`` set by the test."""

    def __init__(self, session_id: int, is_ready: bool = True, broken: bool = False) -> None:
        self.info = SessionInfo(session_id, "realm1", f"id-{session_id}", "role")
        self.is_ready = is_ready
        self.broken = broken
        self.got: list[tuple[int, int]] = []

    def ready(self) -> bool:
        return self.is_ready

    def send_event(self, subscription, publication, retained=False) -> None:
        if self.broken:
            raise RuntimeError("broken member")
        self.got.append((subscription.id, publication.publication_id))


def publication(number: int, topic: tuple[str, ...] = ("a", "b"), publisher: SessionInfo | None = None,
                eligibility: Eligibility | None = None) -> Publication:
    return Publication(number, topic, None, None, publisher, eligibility=eligibility)


def broker_with(failures: list | None = None) -> Broker:
    """A broker whose delivery failures (the failing peers) go to ``failures``."""
    failed = failures if failures is not None else []
    return Broker(SharedGroups(), delivery_failed=lambda peer, pub, exc: failed.append(peer))


def received(member: Member) -> list[int]:
    return [publication_id for _, publication_id in member.got]


def test_members_take_turns():
    broker = broker_with()
    members = [Member(i) for i in (1, 2, 3)]
    groups = {broker.subscribe(member, ("a", "b"), EXACT, "g") for member in members}
    assert len(groups) == 1 and isinstance(groups.pop(), SharedGroup)
    for number in range(1, 7):
        assert broker.dispatch(publication(number)) == 1
    assert [received(m) for m in members] == [[1, 4], [2, 5], [3, 6]]


def test_a_ready_member_is_preferred_and_the_turn_follows_who_got_it():
    broker = broker_with()
    slow, fast = Member(1, is_ready=False), Member(2)
    for member in (slow, fast):
        broker.subscribe(member, ("a", "b"), EXACT, "g")
    for number in (1, 2, 3):
        broker.dispatch(publication(number))
    assert (received(slow), received(fast)) == ([], [1, 2, 3])
    fast.is_ready = False  # nobody ready: the next admitted member in turn queues it
    broker.dispatch(publication(4))
    broker.dispatch(publication(5))
    assert (received(slow), received(fast)) == ([4], [1, 2, 3, 5])


def test_a_member_the_publication_does_not_admit_is_skipped():
    broker = broker_with()
    first, second = Member(1), Member(2)
    for member in (first, second):
        broker.subscribe(member, ("a", "b"), EXACT, "g")
    for number in (1, 2):  # the publisher itself is excluded (exclude_me)
        broker.dispatch(publication(number, publisher=first.info))
    broker.dispatch(publication(3, eligibility=Eligibility(exclude=frozenset({2}))))
    assert (received(first), received(second)) == ([3], [1, 2])
    assert broker.dispatch(publication(4, eligibility=Eligibility(
        eligible=frozenset({9})))) == 0


def test_a_broken_member_is_counted_and_the_next_one_gets_it():
    failures: list = []
    broker = broker_with(failures)
    broken, sound = Member(1, broken=True), Member(2)
    for member in (broken, sound):
        broker.subscribe(member, ("a", "b"), EXACT, "g")
    assert broker.dispatch(publication(1)) == 1
    assert received(sound) == [1] and failures == [broken]


def test_groups_normal_subscriptions_and_other_groups_each_get_a_copy():
    broker = broker_with()
    a, b, alone = Member(1), Member(2), Member(3)
    broker.subscribe(a, ("a", "b"), EXACT, "g")
    broker.subscribe(b, ("a", "#"), MQTT, "g")  # another pattern: another group
    broker.subscribe(a, ("a", "b"), EXACT, "h")
    broker.subscribe(alone, ("a", "b"), EXACT)
    assert broker.dispatch(publication(1)) == 4
    assert (len(a.got), len(b.got), len(alone.got)) == (2, 1, 1)


def test_hand_over_skips_the_leaving_member_and_needs_another():
    broker = broker_with()
    leaving, heir = Member(1), Member(2)
    group = broker.subscribe(leaving, ("a", "b"), EXACT, "g")
    broker.subscribe(heir, ("a", "b"), EXACT, "g")
    assert broker.hand_over(group, publication(7), leaving.info.session_id)
    assert received(heir) == [7] and received(leaving) == []
    broker.remove_session(heir.info.session_id)
    assert not broker.hand_over(group, publication(8), leaving.info.session_id)


def test_the_last_member_leaving_ends_the_group():
    broker = broker_with()
    member = Member(1)
    group = broker.subscribe(member, ("a", "b"), EXACT, "g")
    assert broker.find(group.id) is group
    broker.unsubscribe(member, group.id)
    assert broker.find(group.id) is None and not broker.shared.by_id
    assert not broker.hand_over(group, publication(1), 2)


@settings(deadline=None)  # the machine is shared: timing is not what this checks
@given(st.lists(st.booleans(), min_size=1, max_size=6), st.integers(1, 30))
def test_every_publication_goes_to_exactly_one_member(readiness, count):
    broker = broker_with()
    members = [Member(i + 1, is_ready) for i, is_ready in enumerate(readiness)]
    for member in members:
        broker.subscribe(member, ("a", "b"), EXACT, "g")
    for number in range(count):
        assert broker.dispatch(publication(number)) == 1
    got = sorted(pid for member in members for pid in received(member))
    assert got == list(range(count))
    if any(readiness):
        assert all(not m.got for m in members if not m.is_ready)
