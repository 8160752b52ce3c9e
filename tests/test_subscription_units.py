"""Units behind subscription work in proportion to the change (issue 24, items 6 and 7):
incremental bookkeeping of prefix shapes, per-session caps in broker and dealer, and the
spreading of one packet's work over reactor turns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from router.core import errors
from router.core.authorization import Authorizer, PermissionRule, Role
from router.core.broker import Broker
from router.core.peer import Registration, Subscription
from router.core.subscriptions import FEW_SHAPES, SubscriptionIndex
from router.core.dealer import Dealer, RegistrationIndex
from router.core.errors import RouterError
from router.core.model import SessionInfo
from router.core.options import PublishOptions, SubscribeOptions
from router.core.realm import Realm
from router.core.shared import SharedGroups
from router.core.topic import from_uri as L
from router.core.topic import prefix_matches
from router.core.uri import MQTT, PREFIX
from router.mqtt import spread as spread_module
from router.mqtt.packets import shared_options
from router.mqtt.session import MqttSession, MqttSubscription
from router.mqtt.spread import spread
from router.settings import MqttSettings
from tests.test_core_units import FakePeer


def _ids(index: SubscriptionIndex, topic: tuple[str, ...]) -> set[int]:
    return {subscription.id for subscription in index.matching(topic)}


def test_prefix_shapes_follow_the_prefixes_that_come_and_go():
    index = SubscriptionIndex()
    same_shape = [Subscription(n, ("com", f"a{n}"), "prefix") for n in (1, 2)]
    other = Subscription(3, ("com", "abc"), "prefix")
    for subscription in same_shape + [other]:
        index.add(subscription)
    assert _ids(index, ("com", "a1x")) == {1}
    assert _ids(index, ("com", "abcd")) == {3}
    index.remove(same_shape[0])  # the shape stays: another prefix has it
    assert _ids(index, ("com", "a2x")) == {2}
    assert _ids(index, ("com", "a1x")) == set()
    index.remove(same_shape[1])
    index.remove(other)
    assert _ids(index, ("com", "a2x")) == set()
    index.add(Subscription(4, ("com", "a2"), "prefix"))  # the shape comes back
    assert _ids(index, ("com", "a2x")) == {4}


def test_an_exact_only_index_matches_without_a_walk_until_a_pattern_comes():
    """While every entry is on an exact topic, matching is one lookup (a tuple); each kind
    of pattern, added and removed, switches the walk on and off again."""
    index = SubscriptionIndex()
    exact = Subscription(1, ("a", "b"), "exact")
    index.add(exact)
    assert tuple(index.matching(("a", "b"))) == (exact,)
    assert tuple(index.matching(("a", "c"))) == ()
    for n, (topic, match) in enumerate([(("a",), "prefix"), (("a", ""), "wildcard"),
                                        (("a", "+"), "mqtt")], start=2):
        pattern = Subscription(n, topic, match)
        index.add(pattern)
        assert _ids(index, ("a", "b")) == {1, n}
        assert _ids(index, ("a", "c")) == {n}
        index.remove(pattern)
        assert tuple(index.matching(("a", "b"))) == (exact,)
        assert tuple(index.matching(("a", "c"))) == ()


def test_broker_caps_what_a_session_holds_not_what_it_asks_again():
    broker = Broker(SharedGroups())
    peer, other = FakePeer(1), FakePeer(2)
    first = broker.subscribe(peer, ("a",), "exact", limit=2)
    broker.subscribe(peer, ("b",), "exact", group="g", limit=2)  # a shared one counts too
    assert broker.subscribe(peer, ("a",), "exact", limit=2) is first
    with pytest.raises(RouterError) as refused:
        broker.subscribe(peer, ("c",), "exact", limit=2)
    assert refused.value.uri == errors.LIMIT_EXCEEDED
    broker.subscribe(other, ("c",), "exact", limit=2)  # per session
    broker.unsubscribe(peer, first.id)
    broker.subscribe(peer, ("c",), "exact", limit=2)


def test_dealer_caps_registrations_and_a_leaving_session_drops_only_its_own():
    dealer = Dealer(Clock())
    peer, other = FakePeer(1), FakePeer(2)
    kept = dealer.register(other, "com.shared", "exact", "roundrobin")
    dealer.register(peer, "com.shared", "exact", "roundrobin", limit=2)
    mine = dealer.register(peer, "com.mine", "exact", "single", limit=2)
    with pytest.raises(RouterError) as refused:
        dealer.register(peer, "com.more", "exact", "single", limit=2)
    assert refused.value.uri == errors.LIMIT_EXCEEDED
    dealer.unregister(peer, mine.id)
    dealer.register(peer, "com.more", "exact", "single", limit=2)
    dealer.remove_session(peer)
    assert kept.callees == [other]
    assert set(dealer.by_id) == {kept.id}


def test_spread_gives_the_reactor_back_between_units_and_keeps_their_order(monkeypatch):
    monkeypatch.setattr(spread_module, "TURN_BUDGET", 0.0)  # one unit per turn
    done, turns, scheduled = [], [], []

    def work():
        for n in range(3):
            done.append(n)
            yield

    spread(work(), turns.append, scheduled.append)
    while scheduled:
        scheduled.pop(0)()
    assert done == [0, 1, 2]
    assert turns == [False, False, False, True]  # the last turn finds the work at its end


def test_spread_finishes_small_work_in_the_same_turn():
    turns, scheduled = [], []
    spread(iter([None] * 10), turns.append, scheduled.append)
    assert turns == [True] and scheduled == []


def test_mqtt_clients_with_overlapping_filters_pay_for_their_own_not_for_the_others():
    # each client holding two filters that match a topic ('#' and 'a/#': one copy for both,
    # MQTT-3.3.4-2) walked every subscription of the realm that matched it: one client's
    # 2,000 filters matching the topic made a publish to 50 such clients 50 x 2,000 steps
    realm = Realm("r", Authorizer({"any": Role("any", [
        PermissionRule(L(""), PREFIX, frozenset({"publish", "subscribe"}))])}), Clock())
    owner = SimpleNamespace(realm=realm, settings=MqttSettings(), store=None)
    topic = tuple("abcdefghijklm")

    def client(session_id: int, filters: list[tuple[str, ...]]) -> MqttSession:
        session = MqttSession(owner, SessionInfo(session_id, "r", f"c{session_id}", "any",
                                                 client_id=f"c{session_id}"), 0)
        realm.attach(session)
        for levels in filters:
            core = realm.subscribe(session, levels, SubscribeOptions(MQTT))
            session.add_subscription(MqttSubscription(
                "/".join(levels), core, shared_options(0, False, False, 2)))
        return session

    crowd = [tuple("+" if bit == "1" else level for bit, level in zip(f"{n:013b}", topic))
             for n in range(2_000)]
    client(1, crowd)
    for session_id in range(2, 52):
        client(session_id, [("#",), ("a", "#")])
    index = realm.broker.index
    walked = 0
    matching = index.matching

    def counted(levels):
        nonlocal walked
        for entry in matching(levels):
            walked += 1
            yield entry

    index.matching = counted  # type: ignore[method-assign]
    realm.publish(SessionInfo(99, "r", "pub", "any"), topic, ["x"], None, PublishOptions())
    # the dispatch's walk, and one more for all the clients that combine their filters
    assert walked == 2 * (len(crowd) + 2)


def test_a_call_looks_at_a_few_prefix_registrations_not_every_one():
    # a call to a procedure no exact registration has tried every prefix registration of
    # the realm: 10,000 of another session's made each such call ~10x as costly
    index: RegistrationIndex[object] = RegistrationIndex()
    for n in range(10_000):
        index.add(Registration(n + 1, f"com.crowd.p{n}.", PREFIX, "single"))
    for uri in ("com.", "com.victim.", "com.victim.proc.deeper"):
        index.add(Registration(len(index.prefix) + 1, uri, PREFIX, "single"))

    class Asked(str):
        """A procedure name that counts the prefixes taken of it (each probed once)."""
        count = 0

        def __getitem__(self, key):  # type: ignore[override]
            Asked.count += 1
            return super().__getitem__(key)

    found = index.lookup(Asked("com.victim.proc"))
    assert found is not None and found.uri == "com.victim."
    assert Asked.count <= 5  # one per length up to the procedure's: com.crowd.pN. has 4
    index.remove(index.prefix["com.victim."])
    assert index.lookup("com.victim.proc").uri == "com."  # type: ignore[union-attr]
    assert index.lookup("org.x") is None


@given(st.sets(st.text("ab.", max_size=5), max_size=12), st.lists(st.text("ab.", max_size=7)))
def test_a_call_finds_the_longest_prefix_registration_that_starts_it(uris, procedures):
    index: RegistrationIndex[object] = RegistrationIndex()
    for n, uri in enumerate(sorted(uris)):
        index.add(Registration(n + 1, uri, PREFIX, "single"))
    for procedure in procedures:
        if procedure in index.exact:
            continue
        longest = max((uri for uri in uris if procedure.startswith(uri)), key=len, default=None)
        found = index._longest_prefix(procedure)
        assert (found and found.uri) == longest, (sorted(uris), procedure)


def test_prefixes_of_many_lengths_cost_a_publish_its_topics_prefixes_not_every_shape():
    # one session's prefix subscriptions on 10,000 lengths of a level ('q', 'qq', ...) were
    # 10,000 shapes each publish in the realm walked
    index: SubscriptionIndex[Subscription] = SubscriptionIndex()
    for n in range(1, 10_001):
        index.add(Subscription(n, ("q" * n,), PREFIX))
    mine = [Subscription(20_001, ("home", "kit"), PREFIX), Subscription(20_002, ("home", ""),
                                                                         PREFIX)]
    for subscription in mine:
        index.add(subscription)

    class Walked(list):
        """The index's shapes, counting how many a publish steps through."""
        steps = 0

        def __iter__(self):
            for shape in super().__iter__():
                Walked.steps += 1
                yield shape

    index._prefix_shapes = Walked(index._prefix_shapes)
    assert [s.id for s in index.matching(("home", "kitchen"))] == [20_002, 20_001]
    assert [s.id for s in index.matching(("qqq",))] == [1, 2, 3]
    assert Walked.steps == 0


@given(st.sets(st.lists(st.text("ab", max_size=3), min_size=1, max_size=3).map(tuple),
               max_size=10),
       st.lists(st.lists(st.text("ab", max_size=4), min_size=1, max_size=4).map(tuple)))
def test_a_topic_finds_the_same_prefixes_however_many_shapes(prefixes, topics):
    many: SubscriptionIndex[Subscription] = SubscriptionIndex()
    for n in range(1, FEW_SHAPES + 2):  # more shapes than FEW_SHAPES: the topic's own probed
        many.add(Subscription(100 + n, ("z" * n,), PREFIX))
    for n, prefix in enumerate(sorted(prefixes)):
        many.add(Subscription(n + 1, prefix, PREFIX))
    for topic in topics:
        expected = sorted(n + 1 for n, prefix in enumerate(sorted(prefixes))
                          if prefix_matches(prefix, topic))
        assert sorted(s.id for s in many.matching(topic) if s.id < 100) == expected
