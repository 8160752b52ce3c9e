"""The core's MQTT filter matching over level tuples agrees with a straightforward
reference: a regular expression built from the filter's text, as MQTT 3.1.1 section
4.7 words it (``+`` one whole level, possibly empty; a last ``#`` the parent level
and everything below; ``$`` topics hidden from a leading wildcard).

Levels include what MQTT allows and WAMP does not: empty levels, upper case, spaces,
``.`` inside a level, non-ASCII and ``$`` first levels.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.peer import Subscription
from router.core.subscriptions import SubscriptionIndex
from router.core.topic import filter_matches, from_mqtt, mqtt_pattern, valid_topic_filter
from router.core.trie import TopicTrie
from router.core.uri import MQTT

LEVEL = st.sampled_from(["a", "B", "", "a.b", "Living Room", "ü", "$sys"])
TOPICS = st.lists(LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)  # "" is no topic
FILTER_LEVELS = st.one_of(LEVEL, st.just("+"))


@st.composite
def filters(draw) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=0, max_size=4))
    if levels in ([], [""]) or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


def reference(topic_filter: str, topic: str) -> bool:
    """MQTT matching as a regular expression over the topic's text."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = topic_filter.split("/")
    rest = levels[-1] == "#"
    pattern = "/".join("[^/]*" if level == "+" else re.escape(level)
                       for level in (levels[:-1] if rest else levels))
    if rest:
        pattern = pattern + "(/.*)?" if len(levels) > 1 else ".*"
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


@settings(max_examples=400, deadline=None)
@given(st.lists(filters(), min_size=1, max_size=6, unique=True), TOPICS)
def test_subscription_side_matches_the_reference(topic_filters, topic):
    index = SubscriptionIndex()
    for number, topic_filter in enumerate(topic_filters, start=1):
        assert valid_topic_filter(topic_filter)
        levels, match = mqtt_pattern(topic_filter)
        if index.lookup(levels, match) is None:
            index.add(Subscription(number, levels, match))
    # by id: a filter without wildcards is an exact subscription, shown dotted (s.uri)
    found = [topic_filters[s.id - 1] for s in index.matching(from_mqtt(topic))]
    assert len(found) == len(set(found)), "a subscription was matched twice"
    assert set(found) == {f for f in topic_filters if reference(f, topic)}


@settings(max_examples=400, deadline=None)
@given(filters(), st.lists(TOPICS, min_size=1, max_size=8, unique=True))
def test_retained_side_matches_the_reference(topic_filter, topics):
    trie: TopicTrie[str] = TopicTrie()
    for topic in topics:
        trie.set(from_mqtt(topic), topic)
    levels, match = mqtt_pattern(topic_filter)
    expected = {t for t in topics if reference(topic_filter, t)}
    if match == MQTT:
        found = [value for _, value in trie.matching_filter(levels)]
        assert len(found) == len(set(found))
        assert set(found) == expected
    assert {t for t in topics if filter_matches(levels, from_mqtt(t))} == expected


def test_reference_examples():
    assert reference("a/#", "a") and reference("a/#", "a/b/c") and not reference("a/#", "ab")
    assert reference("+/+", "/x") and reference("+//x", "y//x") and not reference("#", "$SYS/x")
    assert reference("$SYS/#", "$SYS") and reference("/#", "/a") and not reference("/#", "a")


def test_a_wamp_level_plus_is_matched_once_by_a_plus_filter():
    index = SubscriptionIndex()
    index.add(Subscription(1, ("a", "+"), MQTT))
    assert [s.id for s in index.matching(("a", "+"))] == [1]
