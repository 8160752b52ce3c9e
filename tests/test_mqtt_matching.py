"""The core's MQTT filter matching agrees with the MQTT codec's independent reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.trie import TopicTrie
from router.core.uri import filter_matches
from router.mqtt.codec import topic_matches
from router.mqtt.topics import filter_to_pattern, topic_to_uri

LEVELS = st.sampled_from(["a", "b", "c", "$sys"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTER_LEVELS = st.sampled_from(["a", "b", "c", "$sys", "+"])


@st.composite
def filters(draw) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


@settings(max_examples=300)
@given(st.lists(filters(), min_size=1, max_size=6, unique=True), TOPICS)
def test_subscription_side_matches_the_reference(topic_filters, topic):
    trie: TopicTrie[str] = TopicTrie()
    for topic_filter in topic_filters:
        trie.set(filter_to_pattern(topic_filter, "loose")[0], topic_filter)
    matched = set(trie.match_filters(topic_to_uri(topic, "loose").split(".")))
    assert matched == {f for f in topic_filters if topic_matches(f, topic)}


@settings(max_examples=300)
@given(filters(), st.lists(TOPICS, min_size=1, max_size=8, unique=True))
def test_retained_side_matches_the_reference(topic_filter, topics):
    trie: TopicTrie[str] = TopicTrie()
    for topic in topics:
        trie.set(topic_to_uri(topic, "loose"), topic)
    pattern = filter_to_pattern(topic_filter, "loose")[0]
    found = {value for _, value in trie.matching_filter(pattern.split("."))}
    expected = {t for t in topics if topic_matches(topic_filter, t)}
    assert found == expected
    assert {t for t in topics if filter_matches(pattern.split("."), topic_to_uri(t, "loose"))} \
        == expected
