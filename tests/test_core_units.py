"""Unit tests of router.core without sockets or a reactor.

Property tests compare the indexes (TopicTrie, SubscriptionIndex), which work on level
tuples, with a brute-force reference on dotted strings (:func:`uri_matches`, WAMP's
own wording of matching), and check that authorization's ``covers`` never grants more
than the rule matches.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from router.core import errors
from router.core.authorization import Authorizer, PermissionRule, Role
from router.core.peer import Subscription
from router.core.subscriptions import SubscriptionIndex
from router.core.dealer import Dealer
from router.core.engine import RealmEngine
from router.core.errors import ProtocolViolation, RouterError
from router.core.meta import install_retention_admin
from router.core.model import ELIGIBILITY_KEYS, Eligibility, Publication, SessionInfo
from router.core.options import (parse_call_options, parse_publish_options,
                                 parse_subscribe_options)
from router.core.payload import UNMAPPED, JsonPayloadPublication, from_bytes
from router.core.realm import Realm
from router.core.retention import RetainedStore, RetentionPolicy
from router.core.topic import from_uri as L
from router.core.topic import filter_matches, prefix_matches, to_uri, wildcard_matches
from router.core.trie import TopicTrie
from router.core.uri import EXACT, MQTT, PREFIX, WILDCARD, is_reserved, is_valid_uri
from router.engines.records import encode_retained


def uri_matches(pattern: str, match: str, uri: str) -> bool:
    """Reference WAMP matching on dotted strings: exact, string prefix, or wildcard
    (an empty component is any one component)."""
    if match == EXACT:
        return uri == pattern
    if match == PREFIX:
        return uri.startswith(pattern)
    parts, wanted = uri.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(w in ("", p) for w, p in zip(wanted, parts))


def dotted(pairs) -> list:
    """Trie (levels, value) pairs with their keys as dotted strings."""
    return [(to_uri(key), value) for key, value in pairs]

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# A tiny alphabet of components so that generated keys share prefixes, collide and
# are string prefixes of each other ("a" / "ab"), which is where the bugs hide.
COMPONENT = st.sampled_from(["a", "b", "ab", "ba", "c"])
TOPIC_PARTS = st.lists(COMPONENT, min_size=1, max_size=4)
TOPIC = TOPIC_PARTS.map(".".join)
PATTERN_PARTS = st.lists(st.one_of(COMPONENT, st.just("")), min_size=1, max_size=4)
WILDCARD_PATTERN = PATTERN_PARTS.map(".".join)


# --------------------------------------------------------------------------------------
# TopicTrie


def test_trie_set_get_pop_basics():
    trie: TopicTrie[int] = TopicTrie()
    trie.set(L("a.b.c"), 1)
    trie.set(L("a.b"), 2)
    trie.set(L("a.b"), 3)  # overwrite does not grow the trie
    assert len(trie) == 2
    assert trie.get(L("a.b")) == 3 and trie.get(L("a.b.c")) == 1
    assert trie.get(L("a")) is None and trie.get(L("a"), "dflt") == "dflt"
    assert trie.get(L("a.b.c.d")) is None
    assert trie.pop(L("a")) is None  # an inner node without a value is not a key
    assert trie.pop(L("a.b.c")) == 1
    assert trie.pop(L("a.b.c"), "gone") == "gone"
    assert len(trie) == 1 and trie.get(L("a.b")) == 3
    assert trie.pop(L("a.b")) == 3
    assert len(trie) == 0
    assert trie._root.children == {}, "pop must prune empty branches"


def test_trie_pop_keeps_branches_still_in_use():
    trie: TopicTrie[str] = TopicTrie()
    for key in ("a.b.c", "a.b.d", "a"):
        trie.set(L(key), key)
    trie.pop(L("a.b.c"))
    assert dict(dotted(trie.items())) == {"a.b.d": "a.b.d", "a": "a"}
    trie.pop(L("a.b.d"))
    assert list(trie._root.children) == ["a"]
    assert trie._root.children["a"].children == {}, "the emptied 'a.b' branch must be pruned"
    assert dict(dotted(trie.items())) == {"a": "a"}


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), WILDCARD_PATTERN), max_size=40))
def test_trie_behaves_like_a_dict_and_prunes(ops):
    trie: TopicTrie[str] = TopicTrie()
    model: dict[str, str] = {}
    for is_set, key in ops:
        if is_set:
            trie.set(L(key), key + "!")
            model[key] = key + "!"
        else:
            assert trie.pop(L(key)) == model.pop(key, None)
        assert len(trie) == len(model)
    assert dict(dotted(trie.items())) == model
    for _, key in ops:
        assert trie.get(L(key)) == model.get(key)
    for key in list(model):
        trie.pop(L(key))
    assert len(trie) == 0 and trie._root.children == {}


@SETTINGS
@given(st.sets(WILDCARD_PATTERN, max_size=25), TOPIC_PARTS)
def test_trie_match_patterns_equals_brute_force(patterns, topic_parts):
    trie: TopicTrie[str] = TopicTrie()
    for pattern in patterns:
        trie.set(L(pattern), pattern)
    topic = ".".join(topic_parts)
    found = list(trie.match_patterns(tuple(topic_parts)))
    assert len(found) == len(set(found)), "a pattern was yielded twice"
    assert set(found) == {p for p in patterns if uri_matches(p, WILDCARD, topic)}


PREFIX_QUERY = st.one_of(
    st.tuples(TOPIC, st.integers(0, 12)).map(lambda t: t[0][:t[1]]),  # any string prefix
    TOPIC.map(lambda t: t + "."),                                      # a trailing dot
    st.just(""),
)


@SETTINGS
@given(st.sets(TOPIC, max_size=25), PREFIX_QUERY)
def test_trie_under_prefix_uses_string_prefix_semantics(topics, prefix):
    trie: TopicTrie[str] = TopicTrie()
    for topic in topics:
        trie.set(L(topic), topic)
    found = dotted(trie.under_prefix(L(prefix)))
    assert len(found) == len(set(found))
    assert all(key == value for key, value in found)
    assert {key for key, _ in found} == {t for t in topics if uri_matches(prefix, PREFIX, t)}


def test_trie_under_prefix_partial_last_component():
    trie: TopicTrie[int] = TopicTrie()
    for index, key in enumerate(["a.b", "a.b.c", "a.bc", "a.bc.d", "a.cb", "a", "ab.b"]):
        trie.set(L(key), index)

    def under(prefix: str) -> list[str]:
        return sorted(k for k, _ in dotted(trie.under_prefix(L(prefix))))
    assert under("a.b") == ["a.b", "a.b.c", "a.bc", "a.bc.d"]
    assert under("a.b.") == ["a.b.c"]
    assert under("a") == ["a", "a.b", "a.b.c", "a.bc", "a.bc.d", "a.cb", "ab.b"]
    assert under("a.") == ["a.b", "a.b.c", "a.bc", "a.bc.d", "a.cb"]
    assert under("x") == []
    assert len(under("")) == 7


@SETTINGS
@given(st.sets(TOPIC, max_size=25), PATTERN_PARTS)
def test_trie_matching_wildcard_equals_brute_force(topics, pattern_parts):
    trie: TopicTrie[str] = TopicTrie()
    for topic in topics:
        trie.set(L(topic), topic)
    pattern = ".".join(pattern_parts)
    found = [to_uri(key) for key, _ in trie.matching_wildcard(tuple(pattern_parts))]
    assert len(found) == len(set(found))
    assert set(found) == {t for t in topics if uri_matches(pattern, WILDCARD, t)}


# --------------------------------------------------------------------------------------
# URIs


@pytest.mark.parametrize("uri,check,match,valid", [
    ("com.example.topic", "strict", EXACT, True),
    ("com.example.my_topic2", "strict", EXACT, True),
    ("Com.Example", "strict", EXACT, False),
    ("Com.Example", "loose", EXACT, True),
    ("com.ex-ample", "strict", EXACT, False),
    ("com.ex-ample", "loose", EXACT, True),
    ("com.ex ample", "loose", EXACT, False),
    ("com.ex#ample", "loose", EXACT, False),
    ("", "strict", EXACT, False),
    ("", "loose", EXACT, False),
    ("a..b", "strict", EXACT, False),
    ("a..b", "loose", EXACT, False),
    (".a", "strict", EXACT, False),
    ("a.", "strict", EXACT, False),
    ("a.", "loose", EXACT, False),
    # prefix: only the last component may be empty
    ("a.b.", "strict", PREFIX, True),
    ("a.b.", "loose", PREFIX, True),
    ("a.b", "strict", PREFIX, True),
    ("a..b", "strict", PREFIX, False),
    ("a..b", "loose", PREFIX, False),
    (".a", "strict", PREFIX, False),
    ("a.B", "strict", PREFIX, False),
    # wildcard: any component may be empty
    ("a..b", "strict", WILDCARD, True),
    ("a..b", "loose", WILDCARD, True),
    ("..b", "strict", WILDCARD, True),
    ("a.b.", "strict", WILDCARD, True),
    ("a.B.", "strict", WILDCARD, False),
    ("a.B.", "loose", WILDCARD, True),
    ("a. .b", "loose", WILDCARD, False),
    ("a.#.b", "loose", WILDCARD, False),
])
def test_uri_validation(uri, check, match, valid):
    assert is_valid_uri(uri, check, match) is valid


@pytest.mark.parametrize("value", [None, 1, b"com.example", ["com"]])
def test_uri_validation_rejects_non_strings(value):
    for check, match in itertools.product(("strict", "loose"), (EXACT, PREFIX, WILDCARD)):
        assert not is_valid_uri(value, check, match)


@SETTINGS
@given(st.text(alphabet="ab_.#- Z9", max_size=12))
def test_uri_validation_modes_nest(uri):
    for match in (EXACT, PREFIX, WILDCARD):
        if is_valid_uri(uri, "strict", match):
            assert is_valid_uri(uri, "loose", match)
    for check in ("strict", "loose"):
        if is_valid_uri(uri, check, EXACT):
            assert is_valid_uri(uri, check, PREFIX) and is_valid_uri(uri, check, WILDCARD)
            assert "" not in uri.split(".")


def test_reserved_namespace():
    assert is_reserved("wamp") and is_reserved("wamp.session.count")
    assert not is_reserved("wampx.a") and not is_reserved("com.wamp") and not is_reserved("wam")


def test_wildcard_matches_counts_components():
    pattern = ("com", "myapp", "", "userevent")
    assert wildcard_matches(pattern, L("com.myapp.foo.userevent"))
    assert not wildcard_matches(pattern, L("com.myapp.foo.userevent.bar"))
    assert not wildcard_matches(pattern, L("com.myapp.userevent"))


# --------------------------------------------------------------------------------------
# PermissionRule.covers soundness


def _pattern_for(match: str) -> st.SearchStrategy[str]:
    if match == EXACT:
        return TOPIC
    if match == PREFIX:
        return st.one_of(TOPIC, TOPIC.map(lambda t: t + "."),
                         st.tuples(TOPIC, st.integers(1, 8)).map(lambda t: t[0][:t[1]]),
                         st.just(""))
    return WILDCARD_PATTERN


@st.composite
def pattern_and_match(draw):
    match = draw(st.sampled_from([EXACT, PREFIX, WILDCARD]))
    return draw(_pattern_for(match)), match


@st.composite
def topics_matched_by(draw, pattern: str, match: str):
    """Concrete topics, many of them matched by (pattern, match)."""
    topics = draw(st.lists(TOPIC, max_size=10))
    for _ in range(draw(st.integers(0, 6))):
        if match == EXACT:
            topics.append(pattern)
        elif match == PREFIX:
            topics.append(pattern + draw(st.sampled_from(["", "a", ".a", "b.c", "a.b"])))
        else:
            topics.append(".".join(part or draw(COMPONENT) for part in pattern.split(".")))
    return [t for t in topics if is_valid_uri(t, "strict", EXACT)]


@st.composite
def rule_near(draw, uri: str):
    """A rule (uri, match) derived from a requested pattern, so that covers() is often true."""
    kind = draw(st.sampled_from(["independent", "prefix-cut", "prefix-extend", "wild", "same"]))
    if kind == "independent":
        return draw(pattern_and_match())
    if kind == "prefix-cut":
        return uri[:draw(st.integers(0, len(uri)))], PREFIX
    if kind == "prefix-extend":
        return uri + draw(st.sampled_from(["", ".", "a", ".a", "b."])), PREFIX
    if kind == "wild":
        parts = [part if draw(st.booleans()) else "" for part in uri.split(".")]
        return ".".join(parts), WILDCARD
    return uri, draw(st.sampled_from([EXACT, PREFIX, WILDCARD]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_permission_rule_covers_is_sound(data):
    uri, match = data.draw(pattern_and_match(), label="request")
    rule_uri, rule_match = data.draw(rule_near(uri), label="rule")
    rule = PermissionRule(L(rule_uri), rule_match, frozenset({"subscribe"}))
    topics = data.draw(topics_matched_by(uri, match), label="topics")
    if rule.covers(L(uri), match):
        for topic in topics:
            if uri_matches(uri, match, topic):
                assert uri_matches(rule_uri, rule_match, topic), (
                    f"rule ({rule_uri!r}, {rule_match}) covers ({uri!r}, {match}) "
                    f"but not its match {topic!r}")


def _small_universe():
    components = ["a", "b", "ab"]
    topics = [".".join(parts) for n in (1, 2, 3)
              for parts in itertools.product(components, repeat=n)]
    wild = [".".join(parts) for n in (1, 2, 3)
            for parts in itertools.product(components + [""], repeat=n)]
    prefixes = sorted({t[:i] for t in topics for i in range(len(t) + 1)})
    patterns = ([(t, EXACT) for t in topics] + [(p, PREFIX) for p in prefixes]
                + [(w, WILDCARD) for w in wild])
    return topics, patterns


def test_permission_rule_covers_is_sound_exhaustively_on_a_small_universe():
    topics, patterns = _small_universe()
    matched = {pm: frozenset(t for t in topics if uri_matches(pm[0], pm[1], t))
               for pm in patterns}
    unsound = []
    for rule_uri, rule_match in patterns:
        rule = PermissionRule(L(rule_uri), rule_match, frozenset({"call"}))
        for uri, match in patterns:
            if rule.covers(L(uri), match) and not matched[(uri, match)] <= matched[(rule_uri,
                                                                                  rule_match)]:
                unsound.append(((rule_uri, rule_match), (uri, match)))
    assert unsound == []


@pytest.mark.parametrize("rule,request_,covered", [
    (("com.a.", PREFIX), ("com.a.b", EXACT), True),
    (("com.a.", PREFIX), ("com.a.b.", PREFIX), True),
    (("com.a.", PREFIX), ("com.a", PREFIX), False),        # would match com.ab
    (("com.a.", PREFIX), ("com.a..c", WILDCARD), True),
    (("com.a.", PREFIX), ("com..c", WILDCARD), False),
    (("com.a.b", EXACT), ("com.a.b", EXACT), True),
    (("com.a.b", EXACT), ("com.a.b", PREFIX), False),
    (("com..b", WILDCARD), ("com.x.b", EXACT), True),
    (("com..b", WILDCARD), ("com..b", WILDCARD), True),
    (("com.x.b", WILDCARD), ("com..b", WILDCARD), False),
    (("com..b", WILDCARD), ("com.x", PREFIX), False),
])
def test_permission_rule_covers_examples(rule, request_, covered):
    assert PermissionRule(L(rule[0]), rule[1], frozenset({"call"})).covers(
        L(request_[0]), request_[1]) is covered


@pytest.mark.parametrize("rule,uri,covered", [
    (("", PREFIX), "wamp.session.count", False),   # a catch-all does not reach into wamp.*
    (("..", WILDCARD), "wamp.session.count", False),
    (("wamp.session.", PREFIX), "wamp.session.count", True),
    (("wamp.session.count", EXACT), "wamp.session.count", True),
    (("", PREFIX), "com.wamp.x", True),
])
def test_reserved_namespace_needs_a_rule_that_names_it(rule, uri, covered):
    assert PermissionRule(L(rule[0]), rule[1], frozenset({"call"})).covers(L(uri)) is covered


# --------------------------------------------------------------------------------------
# Eligibility and Publication.admits


def _session(session_id=1, authid="alice", authrole="user") -> SessionInfo:
    return SessionInfo(session_id, "realm1", authid, authrole)


ME = _session(1, "alice", "user")
# For each list: (value that admits ME, value that rejects ME)
LIST_CASES = {
    "exclude": (frozenset({2}), frozenset({1, 2})),
    "exclude_authid": (frozenset({"bob"}), frozenset({"alice"})),
    "exclude_authrole": (frozenset({"admin"}), frozenset({"user"})),
    "eligible": (frozenset({1, 3}), frozenset({3})),
    "eligible_authid": (frozenset({"alice", "bob"}), frozenset({"bob"})),
    "eligible_authrole": (frozenset({"user"}), frozenset({"admin"})),
}


@pytest.mark.parametrize("states", list(itertools.product(("absent", "pass", "fail"), repeat=2)))
@pytest.mark.parametrize("pair", list(itertools.combinations(ELIGIBILITY_KEYS, 2)))
def test_eligibility_truth_table(pair, states):
    kwargs = {}
    for key, state in zip(pair, states):
        if state != "absent":
            kwargs[key] = LIST_CASES[key][0 if state == "pass" else 1]
    assert Eligibility(**kwargs).admits(ME) is ("fail" not in states)


@pytest.mark.parametrize("key", ELIGIBILITY_KEYS)
def test_eligibility_single_list(key):
    admit, reject = LIST_CASES[key]
    assert Eligibility(**{key: admit}).admits(ME)
    assert not Eligibility(**{key: reject}).admits(ME)
    assert Eligibility().admits(ME)


def test_eligibility_exclusion_wins_and_empty_eligible_means_nobody():
    assert not Eligibility(eligible=frozenset({1}), exclude=frozenset({1})).admits(ME)
    assert not Eligibility(eligible_authid=frozenset({"alice"}),
                           exclude_authid=frozenset({"alice"})).admits(ME)
    assert not Eligibility(eligible_authrole=frozenset({"user"}),
                           exclude_authrole=frozenset({"user"})).admits(ME)
    for key in ("eligible", "eligible_authid", "eligible_authrole"):
        assert not Eligibility(**{key: frozenset()}).admits(ME), key
    for key in ("exclude", "exclude_authid", "exclude_authrole"):
        assert Eligibility(**{key: frozenset()}).admits(ME), key


@SETTINGS
@given(st.fixed_dictionaries({}, optional={
    "exclude": st.frozensets(st.integers(1, 3)),
    "eligible": st.frozensets(st.integers(1, 3)),
    "exclude_authid": st.frozensets(st.sampled_from("xyz")),
    "eligible_authid": st.frozensets(st.sampled_from("xyz")),
    "exclude_authrole": st.frozensets(st.sampled_from("rs")),
    "eligible_authrole": st.frozensets(st.sampled_from("rs")),
}), st.integers(1, 3), st.sampled_from("xyz"), st.sampled_from("rs"))
def test_eligibility_is_the_and_of_all_present_lists(lists, sid, authid, authrole):
    session = _session(sid, authid, authrole)
    expected = (sid not in lists.get("exclude", ())
                and authid not in lists.get("exclude_authid", ())
                and authrole not in lists.get("exclude_authrole", ())
                and ("eligible" not in lists or sid in lists["eligible"])
                and ("eligible_authid" not in lists or authid in lists["eligible_authid"])
                and ("eligible_authrole" not in lists or authrole in lists["eligible_authrole"]))
    assert Eligibility(**lists).admits(session) is expected
    assert Eligibility.from_json(Eligibility(**lists).to_json()) == Eligibility(**lists)


def test_publication_admits_with_exclude_me():
    publisher, other = _session(1), _session(2)
    default = Publication(10, L("com.t"), None, None, publisher)
    assert not default.admits(publisher)
    assert default.admits(other)
    included = Publication(11, L("com.t"), None, None, publisher, exclude_me=False)
    assert included.admits(publisher)
    restricted = Publication(12, L("com.t"), None, None, publisher, exclude_me=False,
                             eligibility=Eligibility(eligible=frozenset({2})))
    assert not restricted.admits(publisher) and restricted.admits(other)
    meta = Publication(13, L("wamp.session.on_join"), None, None, None)
    assert meta.admits(publisher) and meta.admits(other)


def test_publication_discloses_only_when_asked():
    publisher = _session(7, "pub", "role")
    assert Publication(1, L("com.t"), None, None, publisher).publisher_details() == {}
    assert Publication(1, L("com.t"), None, None, publisher, disclose=True).publisher_details() == {
        "publisher": 7, "publisher_authid": "pub", "publisher_authrole": "role"}


# --------------------------------------------------------------------------------------
# Option parsing


@pytest.mark.parametrize("options", [
    {"acknowledge": 1}, {"acknowledge": "true"}, {"exclude_me": None}, {"disclose_me": 0},
    {"retain": "hello"}, {"exclude": [1, "2"]}, {"exclude": 1}, {"exclude": [True]},
    {"eligible": ["1"]}, {"exclude_authid": [123]}, {"eligible_authid": "alice"},
    {"exclude_authrole": [None]}, {"eligible_authrole": [["x"]]},
    {"_retain_ttl": 0}, {"_retain_ttl": -5}, {"_retain_ttl": "10"}, {"_retain_ttl": True},
    {"_retain_ttl": float("nan")}, {"_retain_ttl": float("inf")}, {"_retain_ttl": 2 ** 32},
])
def test_publish_option_type_errors_are_protocol_violations(options):
    with pytest.raises(ProtocolViolation):
        parse_publish_options(options)


@pytest.mark.parametrize("options", [None, [], "acknowledge"])
def test_publish_options_must_be_a_dict(options):
    with pytest.raises(ProtocolViolation):
        parse_publish_options(options)


def test_publish_options_parse_and_ignore_unknown_keys():
    assert parse_publish_options({"foo": 1, "_vendor_x": [1], "rkey": "z"}) == \
        parse_publish_options({})
    parsed = parse_publish_options({"acknowledge": True, "exclude_me": False,
                                    "disclose_me": True, "retain": True, "_retain_ttl": 2,
                                    "exclude": [3], "eligible_authrole": ["r"],
                                    "unknown_key": "whatever"})
    assert parsed.acknowledge and not parsed.exclude_me and parsed.disclose_me and parsed.retain
    assert parsed.retain_ttl == 2.0
    assert parsed.eligibility == Eligibility(exclude=frozenset({3}),
                                             eligible_authrole=frozenset({"r"}))
    defaults = parse_publish_options({})
    assert (defaults.acknowledge, defaults.exclude_me, defaults.disclose_me, defaults.retain,
            defaults.retain_ttl, defaults.eligibility) == (False, True, False, False, None, None)


@pytest.mark.parametrize("options", [
    {"match": "regex"}, {"match": 1}, {"match": None}, {"match": ["exact"]},
    {"get_retained": "yes"}, {"get_retained": 1},
])
def test_subscribe_option_type_errors_are_protocol_violations(options):
    with pytest.raises(ProtocolViolation):
        parse_subscribe_options(options)


def test_subscribe_options_ignore_unknown_keys():
    parsed = parse_subscribe_options({"match": "wildcard", "nkey": "n", "_x_y": 1,
                                      "get_retained": True})
    assert parsed.match == WILDCARD and parsed.get_retained
    assert parse_subscribe_options({"whatever": {}}) == parse_subscribe_options({})
    assert parse_subscribe_options({}).match == EXACT


@pytest.mark.parametrize("options", [
    {"timeout": -1}, {"timeout": 1.5}, {"timeout": "10"}, {"timeout": True}, {"timeout": None},
    {"timeout": 2 ** 32 * 1000},
    {"receive_progress": 1}, {"receive_progress": "true"}, {"disclose_me": "yes"},
])
def test_call_option_type_errors_are_protocol_violations(options):
    with pytest.raises(ProtocolViolation):
        parse_call_options(options)


def test_call_options_parse_and_ignore_unknown_keys():
    parsed = parse_call_options({"timeout": 250, "receive_progress": True, "disclose_me": True,
                                 "ppt_scheme": None, "_foo": 1})
    assert (parsed.timeout_ms, parsed.receive_progress, parsed.disclose_me) == (250, True, True)
    assert parse_call_options({"foo": "bar"}) == parse_call_options({})
    assert parse_call_options({}).timeout_ms == 0


# --------------------------------------------------------------------------------------
# SubscriptionIndex


SUBSCRIPTION_SPEC = st.one_of(
    st.tuples(TOPIC, st.just(EXACT)),
    st.tuples(_pattern_for(PREFIX), st.just(PREFIX)),
    st.tuples(WILDCARD_PATTERN, st.just(WILDCARD)),
)


@SETTINGS
@given(st.lists(SUBSCRIPTION_SPEC, max_size=30, unique=True),
       st.lists(st.integers(0, 29), max_size=10), st.lists(TOPIC, min_size=1, max_size=8))
def test_subscription_index_matching_equals_brute_force(specs, removals, topics):
    index = SubscriptionIndex()
    live: dict[int, Subscription] = {}
    for number, (uri, match) in enumerate(specs, start=1):
        subscription = Subscription(number, L(uri), match)
        index.add(subscription)
        live[number] = subscription
    for position in removals:
        if position < len(specs) and position + 1 in live:
            index.remove(live.pop(position + 1))
    for uri, match in specs:
        found = index.lookup(L(uri), match)
        expected = [s for s in live.values() if (s.uri, s.match) == (uri, match)]
        assert found is (expected[0] if expected else None)
    for topic in topics:
        found = [s.id for s in index.matching(L(topic))]
        assert len(found) == len(set(found)), "a subscription was matched twice"
        assert set(found) == {s.id for s in live.values() if uri_matches(s.uri, s.match, topic)}


# --------------------------------------------------------------------------------------
# Dealer with a fake clock and fake peers


class FakePeer:
    """A Peer that records what the dealer sends it."""

    def __init__(self, session_id: int, cancel: bool = True) -> None:
        self.info = SessionInfo(session_id, "realm1", f"id-{session_id}", "role")
        self.cancel = cancel
        self.invocations: list = []
        self.interrupts: list[tuple[int, str, str]] = []
        self.results: list[tuple[int, list | None, dict | None, bool]] = []
        self.errors: list[tuple[int, str]] = []

    def send_event(self, subscription, publication, retained=False) -> None:
        raise AssertionError("no events expected")

    def send_invocation(self, invocation) -> None:
        self.invocations.append(invocation)

    def send_interrupt(self, invocation, mode: str, reason: str) -> None:
        self.interrupts.append((invocation.request_id, mode, reason))

    def send_result(self, call_request, args, kwargs, progress) -> None:
        self.results.append((call_request, args, kwargs, progress))

    def send_call_error(self, call_request, error, args, kwargs) -> None:
        self.errors.append((call_request, error))

    def supports(self, role: str, feature: str) -> bool:
        return self.cancel and (role, feature) == ("callee", "call_canceling")

    def kill(self, reason, message) -> None:
        pass


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def dealer(clock):
    return Dealer(clock)


def test_dealer_call_and_yield(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    registration = dealer.register(callee, "com.p", EXACT, "single")
    dealer.call(caller, 5, "com.p", [1], {"k": "v"})
    [invocation] = callee.invocations
    assert invocation.registration is registration
    assert (invocation.args, invocation.kwargs) == ([1], {"k": "v"})
    assert "procedure" not in invocation.details and "caller" not in invocation.details
    dealer.yield_(callee, invocation.request_id, ["ok"], None, False)
    assert caller.results == [(5, ["ok"], None, False)]
    dealer.yield_(callee, invocation.request_id, ["again"], None, False)
    assert len(caller.results) == 1, "a second YIELD for a finished invocation is dropped"


def test_dealer_timeout_fires_timeout_error_and_interrupts(dealer, clock):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.slow", EXACT, "single")
    dealer.call(caller, 1, "com.slow", None, None, timeout_ms=500)
    clock.advance(0.499)
    assert caller.errors == [] and callee.interrupts == []
    clock.advance(0.002)
    assert caller.errors == [(1, errors.TIMEOUT)]
    request_id = callee.invocations[0].request_id
    assert callee.interrupts == [(request_id, "killnowait", errors.TIMEOUT)]
    dealer.yield_(callee, request_id, ["late"], None, False)
    assert caller.results == [], "a late YIELD after the timeout must not reach the caller"
    assert clock.getDelayedCalls() == []


def test_dealer_timeout_without_cancel_support_does_not_interrupt(dealer, clock):
    callee, caller = FakePeer(1, cancel=False), FakePeer(2)
    dealer.register(callee, "com.slow", EXACT, "single")
    dealer.call(caller, 1, "com.slow", None, None, timeout_ms=100)
    clock.advance(0.2)
    assert caller.errors == [(1, errors.TIMEOUT)] and callee.interrupts == []


def test_dealer_result_before_timeout_cancels_the_timer(dealer, clock):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.fast", EXACT, "single")
    dealer.call(caller, 1, "com.fast", None, None, timeout_ms=1000)
    assert len(clock.getDelayedCalls()) == 1
    dealer.yield_(callee, callee.invocations[0].request_id, None, None, False)
    assert clock.getDelayedCalls() == []
    clock.advance(5)
    assert caller.errors == [] and caller.results == [(1, None, None, False)]


def test_dealer_roundrobin_order(dealer):
    callees = [FakePeer(1), FakePeer(2), FakePeer(3)]
    caller = FakePeer(9)
    for callee in callees:
        dealer.register(callee, "com.rr", EXACT, "roundrobin")
    for request in range(1, 7):
        dealer.call(caller, request, "com.rr", [request], None)
    assert [inv.args[0] for inv in callees[0].invocations] == [1, 4]
    assert [inv.args[0] for inv in callees[1].invocations] == [2, 5]
    assert [inv.args[0] for inv in callees[2].invocations] == [3, 6]
    assert [inv.request_id for inv in callees[0].invocations] == [1, 2], \
        "invocation request ids are per callee and sequential"


@pytest.mark.parametrize("policy,expected", [("first", 1), ("last", 3)])
def test_dealer_first_and_last(dealer, policy, expected):
    callees = {n: FakePeer(n) for n in (1, 2, 3)}
    for callee in callees.values():
        dealer.register(callee, "com.fl", EXACT, policy)
    for request in range(1, 4):
        dealer.call(FakePeer(9), request, "com.fl", None, None)
    assert {n: len(c.invocations) for n, c in callees.items() if c.invocations} == {expected: 3}


def test_dealer_shared_registration_errors(dealer):
    a, b = FakePeer(1), FakePeer(2)
    dealer.register(a, "com.s", EXACT, "single")
    with pytest.raises(RouterError) as exc:
        dealer.register(b, "com.s", EXACT, "single")
    assert exc.value.uri == errors.PROCEDURE_ALREADY_EXISTS
    with pytest.raises(RouterError) as exc:
        dealer.register(b, "com.s", EXACT, "roundrobin")
    assert exc.value.uri == errors.PROCEDURE_EXISTS_WITH_DIFFERENT_POLICY
    dealer.register(a, "com.r", EXACT, "random")
    with pytest.raises(RouterError) as exc:
        dealer.register(a, "com.r", EXACT, "random")
    assert exc.value.uri == errors.PROCEDURE_ALREADY_EXISTS
    with pytest.raises(RouterError) as exc:
        dealer.register(a, "com.x", EXACT, "bogus")
    assert exc.value.uri == errors.INVALID_ARGUMENT


def test_dealer_lookup_precedence_exact_then_longest_prefix_then_wildcard(dealer):
    peers = [FakePeer(n) for n in range(1, 7)]
    exact = dealer.register(peers[0], "com.a.b.c", EXACT, "single")
    short_prefix = dealer.register(peers[1], "com.a", PREFIX, "single")
    long_prefix = dealer.register(peers[2], "com.a.b", PREFIX, "single")
    early_wild = dealer.register(peers[3], "com...c", WILDCARD, "single")
    late_wild = dealer.register(peers[4], "com.a..c", WILDCARD, "single")
    assert dealer.registrations.lookup("com.a.b.c") is exact
    dealer.unregister(peers[0], exact.id)
    assert dealer.registrations.lookup("com.a.b.c") is long_prefix
    assert dealer.registrations.lookup("com.a.bc") is long_prefix, "prefix matching is a string prefix"
    assert dealer.registrations.lookup("com.a.x.c") is short_prefix
    dealer.unregister(peers[2], long_prefix.id)
    assert dealer.registrations.lookup("com.a.b.c") is short_prefix, "any prefix beats a wildcard"
    dealer.unregister(peers[1], short_prefix.id)
    assert dealer.registrations.lookup("com.a.b.c") is late_wild, "the wildcard whose first wildcard is last"
    assert dealer.registrations.lookup("com.x.y.c") is early_wild
    assert dealer.registrations.lookup("com.a.b.d") is None
    assert dealer.registrations.lookup("com.a.b") is None


def test_dealer_pattern_invocation_carries_procedure_and_caller(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.pat.", PREFIX, "single")
    dealer.call(caller, 1, "com.pat.x.y", None, None, receive_progress=True,
                disclose_caller=True)
    details = callee.invocations[0].details
    assert details == {"procedure": "com.pat.x.y", "receive_progress": True, "caller": 2,
                       "caller_authid": "id-2", "caller_authrole": "role"}


def test_dealer_progressive_results(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.prog", EXACT, "single")
    dealer.call(caller, 1, "com.prog", None, None, receive_progress=True)
    request_id = callee.invocations[0].request_id
    dealer.yield_(callee, request_id, [1], None, True)
    dealer.yield_(callee, request_id, [2], None, True)
    dealer.yield_(callee, request_id, [3], None, False)
    assert caller.results == [(1, [1], None, True), (1, [2], None, True), (1, [3], None, False)]


def test_dealer_progress_dropped_when_not_requested(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.prog", EXACT, "single")
    dealer.call(caller, 1, "com.prog", None, None)
    request_id = callee.invocations[0].request_id
    dealer.yield_(callee, request_id, [1], None, True)
    dealer.yield_(callee, request_id, [2], None, False)
    assert caller.results == [(1, [2], None, False)]


def test_dealer_cancel_killnowait_and_skip(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.c", EXACT, "single")
    dealer.call(caller, 1, "com.c", None, None)
    dealer.call(caller, 2, "com.c", None, None)
    dealer.cancel(caller, 1, "killnowait")
    assert caller.errors == [(1, errors.CANCELED)]
    assert callee.interrupts == [(1, "killnowait", errors.CANCELED)]
    dealer.cancel(caller, 2, "skip")
    assert caller.errors == [(1, errors.CANCELED), (2, errors.CANCELED)]
    assert len(callee.interrupts) == 1, "skip does not interrupt the callee"
    dealer.yield_(callee, 2, ["late"], None, False)
    assert caller.results == []
    with pytest.raises(RouterError) as exc:
        dealer.cancel(caller, 3, "bogus")
    assert exc.value.uri == errors.INVALID_ARGUMENT


def test_dealer_cancel_kill_waits_for_the_callee_error(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.c", EXACT, "single")
    dealer.call(caller, 1, "com.c", None, None)
    dealer.cancel(caller, 1, "kill")
    assert callee.interrupts == [(1, "kill", errors.CANCELED)]
    assert caller.errors == [], "kill mode answers the caller only after the callee"
    dealer.invocation_error(callee, 1, "wamp.error.canceled", None, None)
    assert caller.errors == [(1, errors.CANCELED)]


def test_dealer_cancel_kill_then_yield_still_answers_the_caller(dealer):
    # RFC (Call Canceling, mode kill): "the Caller may receive RESULT or ERROR depending
    # whether the Callee finishes processing the invocation or the interrupt first".
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.c", EXACT, "single")
    dealer.call(caller, 1, "com.c", None, None)
    dealer.cancel(caller, 1, "kill")
    dealer.yield_(callee, 1, ["done anyway"], None, False)
    assert caller.results or caller.errors, "the caller got neither RESULT nor ERROR"


def test_dealer_callee_leaving_fails_pending_calls(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    registration = dealer.register(callee, "com.c", EXACT, "single")
    dealer.call(caller, 7, "com.c", None, None)
    dealer.remove_session(callee)
    assert caller.errors == [(7, errors.CANCELED)]
    assert dealer.registrations.lookup("com.c") is None and registration.id not in dealer.by_id
    with pytest.raises(RouterError) as exc:
        dealer.call(caller, 8, "com.c", None, None)
    assert exc.value.uri == errors.NO_SUCH_PROCEDURE


def test_dealer_caller_leaving_interrupts_the_callee(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.c", EXACT, "single")
    dealer.call(caller, 1, "com.c", None, None)
    dealer.remove_session(caller)
    assert callee.interrupts == [(1, "killnowait", errors.CANCELED)]
    dealer.yield_(callee, 1, ["late"], None, False)
    assert caller.results == [] and caller.errors == []


def test_dealer_builtin_procedures_are_checked_first(dealer):
    callee, caller = FakePeer(1), FakePeer(2)
    dealer.register(callee, "com.", PREFIX, "single")
    dealer.procedures["com.builtin"] = lambda who, args, kwargs: [who.session_id, args, kwargs]
    dealer.call(caller, 1, "com.builtin", [1], {"a": 2})
    assert caller.results == [(1, [[2, [1], {"a": 2}]], None, False)]
    assert callee.invocations == []


# --------------------------------------------------------------------------------------
# Topics as levels: views, levelwise prefixes, rules on topics that are no URI


@pytest.mark.parametrize("topic,uri,mqtt_name", [
    (("a", "b"), "a.b", "a/b"),
    (("TopicA",), "TopicA", "TopicA"),
    (("", "TopicA"), None, "/TopicA"),
    (("p", "", "x"), None, "p//x"),
    (("home", "Living Room"), None, "home/Living Room"),
    (("a.b", "c"), None, "a.b/c"),
    (("a/b", "c"), "a/b.c", None),          # a loose URI with '/' inside a level
    (("a", "+"), "a.+", None),              # a loose URI level MQTT cannot name
])
def test_publication_views_of_a_topic(topic, uri, mqtt_name):
    publication = Publication(1, topic, None, None, None)
    assert publication.uri("loose") == uri
    assert publication.mqtt_topic() == mqtt_name
    assert Publication(1, topic, None, None, None).uri("strict") == (
        uri if uri is not None and is_valid_uri(uri, "strict") else None)


@SETTINGS
@given(st.lists(st.sampled_from(["a", "b", "ab", "a.b", "", "B"]), min_size=1, max_size=4),
       st.lists(st.sampled_from(["a", "b", "ab", "a.b", "", "B"]), min_size=1, max_size=4))
def test_prefix_matching_is_a_string_prefix_on_uris_and_levelwise_beyond(prefix, topic):
    prefix, topic = tuple(prefix), tuple(topic)
    levelwise = prefix_matches(prefix, topic)
    if not any("." in level for level in prefix + topic):
        assert levelwise == to_uri(topic).startswith(to_uri(prefix))
    elif levelwise:  # never more than the string prefix allows
        assert to_uri(topic).startswith(to_uri(prefix))
    index = SubscriptionIndex()
    index.add(Subscription(1, prefix, PREFIX))
    assert [s.id for s in index.matching(topic)] == ([1] if levelwise else [])


@pytest.mark.parametrize("rule,topic,match,covered", [
    (("com.example.", PREFIX), ("com", "example", "x"), EXACT, True),
    (("com.example.", PREFIX), ("com.example.x",), EXACT, False),   # one MQTT level
    (("com.example.", PREFIX), ("com.example", "x"), EXACT, False),
    (("com.example.", PREFIX), ("com", "example", "#"), MQTT, False),  # matches com/example
    (("com.example", PREFIX), ("com", "example", "#"), MQTT, True),
    (("com.example.", PREFIX), ("com", "example", "+"), MQTT, True),
    (("com.example", PREFIX), ("com", "#"), MQTT, False),
    (("com.example.", PREFIX), ("com", "+", "x"), MQTT, False),
    (("", PREFIX), ("#",), MQTT, True),
    (("", PREFIX), ("", "TopicA"), EXACT, True),
    (("", PREFIX), ("wamp", "#"), MQTT, False),
    (("com..x", WILDCARD), ("com", "", "x"), EXACT, True),         # an empty MQTT level
    (("com..x", WILDCARD), ("com", "+", "x"), MQTT, True),
    (("com.+.x", WILDCARD), ("com", "+", "x"), MQTT, False),       # a literal '+' is no '+'
    (("com..x", WILDCARD), ("com", "+", "#"), MQTT, False),
    (("home.Living Room", EXACT), ("home", "Living Room"), EXACT, True),
])
def test_rules_cover_mqtt_topics_and_filters_levelwise(rule, topic, match, covered):
    assert PermissionRule(L(rule[0]), rule[1], frozenset({"subscribe"})).covers(
        topic, match) is covered


@SETTINGS
@given(st.sampled_from(["", "a", "a.", "a.b", "a.b.", "a.ab", "ab"]),
       st.lists(st.sampled_from(["a", "b", "ab", "a.b", "", "+"]), min_size=1, max_size=3),
       st.booleans(),
       st.lists(st.lists(st.sampled_from(["a", "b", "ab", "a.b", ""]), min_size=1,
                         max_size=4), max_size=12))
def test_a_prefix_rule_never_covers_a_filter_beyond_its_topics(rule_uri, levels, rest, topics):
    topic_filter = tuple(levels) + (("#",) if rest else ())
    rule = PermissionRule(L(rule_uri), PREFIX, frozenset({"subscribe"}))
    if rule.covers(topic_filter, MQTT if "+" in topic_filter or rest else EXACT):
        for topic in map(tuple, topics):
            if filter_matches(topic_filter, topic):
                assert prefix_matches(L(rule_uri), topic), (rule_uri, topic_filter, topic)


def test_retained_admin_lists_and_purges_topics_that_are_no_uri():
    rule = PermissionRule(L(""), PREFIX, frozenset({"publish"}))
    realm = Realm("r", Authorizer({"any": Role("any", [rule])}), Clock(),
                  engine=RealmEngine(RetainedStore(RetentionPolicy(), encode_retained)))
    install_retention_admin(realm)
    publisher = _session(1, "pub", "any")
    for topic in (("a", "b"), ("", "a"), ("a.b", "c")):
        realm.publish(publisher, topic, ["x"], None, parse_publish_options({"retain": True}))
    procedures = realm.dealer.procedures
    listed = procedures["wamp.retained.list"](publisher, [], {})
    assert [(item["topic"], item.get("levels")) for item in listed] == [
        ("/a", ["", "a"]), ("a.b", None), ("a.b/c", ["a.b", "c"])]
    assert procedures["wamp.retained.purge"](publisher, [], {"levels": ["a.b", "c"]}) == 1
    assert procedures["wamp.retained.purge"](publisher, [], {"topic": "a.b"}) == 1
    assert [item["topic"] for item in procedures["wamp.retained.list"](publisher, [], {})] == [
        "/a"]
    with pytest.raises(RouterError):
        procedures["wamp.retained.purge"](publisher, [], {"levels": []})


@pytest.mark.parametrize("data, expected", [
    (b"[1, 2]", ([1, 2], None)),
    (b' \n{"a": 1}', (None, {"a": 1})),
    (b'"text"', (["text"], None)),
    (b"-1.5", ([-1.5], None)),
    (b"7", ([7], None)),
    (b"true", ([True], None)),
    (b"null", ([None], None)),
    (b"Infinity", ([float("inf")], None)),
    (b"A\xda\x00 binary", ([b"A\xda\x00 binary"], None)),
    (b"\xef\xbb\xbf[1]", ([b"\xef\xbb\xbf[1]"], None)),  # a BOM: not JSON to Python either
    (b"{not json", ([b"{not json"], None)),
    (b"21.5C", ([b"21.5C"], None)),  # a value, then more: not JSON
    (b"[1] \t\r\n", ([1], None)),
    (b"1 x", ([b"1 x"], None)),
    (b" ", ([b" "], None)),
    (b"", (None, None)),
])
def test_json_payload_mapping_reads_json_and_leaves_other_bytes_binary(data, expected):
    assert from_bytes(data, "json") == expected
    assert from_bytes(data, "binary") == ((None, None) if not data else ([data], None))
    # an MQTT publish's publication maps its payload only when asked, the same way
    for first in ("args", "kwargs"):
        lazy = JsonPayloadPublication(1, ("t",), UNMAPPED, UNMAPPED, None, payload=data)
        getattr(lazy, first)
        assert (lazy.args, lazy.kwargs) == expected


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=" \t\n\r[]{}\",:-+.0123456789eEtrufalsnIx\u00e9", max_size=12))
def test_json_payload_mapping_reads_what_json_loads_reads(text):
    data = text.encode()
    try:
        value = json.loads(data)
    except ValueError:
        expected: tuple = ([data], None) if data else (None, None)
    else:
        expected = ((value, None) if isinstance(value, list) else
                    (None, value) if isinstance(value, dict) else ([value], None))
    assert from_bytes(data, "json") == expected
