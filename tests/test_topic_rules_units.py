"""Topic-filter permission rules (``{"topic": "home/#"}``), ``%u``/``%c`` binding, the
refusal's explanation, and the Mosquitto password/ACL readers: pure cores, no sockets.

Coverage is checked against a brute-force reference: a rule covers a request iff every
topic of a small universe the request matches is matched by the rule (sound), and, for
MQTT filters and exact topics, whenever that holds on the universe (complete)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config import ConfigError, parse_rule
from router.core.authorization import Authorizer, PermissionRule, Role, filter_covers
from router.core.credentials import verify_secret
from router.core.model import SessionInfo
from router.core.topic import filter_matches, from_mqtt, topic_matches
from router.core.uri import EXACT, MQTT, PREFIX, WILDCARD
from router.mosquitto import MosquittoError, read_acl, read_passwords, roles

LEVELS = ("a", "b", "$s")
UNIVERSE = [parts for n in (1, 2, 3, 4) for parts in itertools.product(LEVELS + ("c",),
                                                                      repeat=n)]
"""Topics of up to four levels; ``c`` is in no rule or request, so it stands for "any"."""


def _filters() -> list[tuple[str, ...]]:
    plain = [parts for n in (1, 2, 3) for parts in itertools.product(LEVELS + ("+",), repeat=n)]
    return plain + [parts + ("#",) for parts in [()] + plain if len(parts) < 3]


FILTERS = _filters()


def _requests() -> list[tuple[tuple[str, ...], str]]:
    exact = [(topic, EXACT) for topic in UNIVERSE if len(topic) <= 3 and "c" not in topic]
    mqtt = [(levels, MQTT if "+" in levels or levels[-1] == "#" else EXACT)
            for levels in FILTERS]
    wild = [(tuple("" if level == "+" else level for level in levels), WILDCARD)
            for levels in FILTERS if "#" not in levels]
    prefix = [(levels[:-1] + (partial,), PREFIX) for levels, _ in exact
              for partial in {"", levels[-1][:1], levels[-1]}]
    return exact + mqtt + wild + prefix


REQUESTS = _requests()


def matched(pattern: tuple[str, ...], match: str) -> frozenset:
    return frozenset(topic for topic in UNIVERSE if topic_matches(pattern, match, topic))


def test_filter_rules_cover_exactly_what_they_match_on_a_universe():
    unsound, incomplete = [], []
    for rule in FILTERS:
        granted = frozenset(topic for topic in UNIVERSE if filter_matches(rule, topic))
        for request, match in REQUESTS:
            covered = filter_covers(rule, request, match)
            subset = matched(request, match) <= granted
            if covered and not subset:
                unsound.append((rule, request, match))
            if subset and not covered and match in (EXACT, MQTT):
                incomplete.append((rule, request, match))
    assert unsound == [] and incomplete == []


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FILTERS),
       st.lists(st.sampled_from(["a", "b", "$s", "", "ab", "+", "#"]), min_size=1, max_size=4),
       st.sampled_from([EXACT, PREFIX, WILDCARD, MQTT]),
       st.lists(st.lists(st.sampled_from(["a", "b", "$s", "", "ab", "x"]), min_size=1,
                         max_size=5), max_size=20))
def test_a_filter_rule_never_covers_a_request_beyond_its_topics(rule, levels, match, topics):
    request = tuple(levels)
    if match == MQTT and "#" in request[:-1]:
        return
    if filter_covers(rule, request, match):
        for topic in map(tuple, topics):
            if topic_matches(request, match, topic):
                assert filter_matches(rule, topic), (rule, request, match, topic)


@pytest.mark.parametrize("request_,match,covered", [
    ("home/#", MQTT, True), ("home/+/x", MQTT, True), ("home", EXACT, True),
    ("home/a/b", EXACT, True), ("#", MQTT, False), ("homer/x", EXACT, False),
    ("+/x", MQTT, False), ("home/+", MQTT, True)])
def test_home_rule(request_, match, covered):
    rule = PermissionRule(from_mqtt("home/#"), MQTT, frozenset({"subscribe"}))
    assert rule.covers(from_mqtt(request_), match) is covered


@pytest.mark.parametrize("rule,request_,match,covered", [
    ("#", ("$SYS", "broker", "load"), EXACT, False),      # a leading wildcard skips $SYS
    ("+/broker/load", ("$SYS", "broker", "load"), EXACT, False),
    ("$SYS/#", ("$SYS", "broker", "load"), EXACT, True),
    ("#", ("",), PREFIX, False),                          # WAMP prefix "" reaches $SYS
    ("#", ("a",), PREFIX, True),
    ("#", ("", "x"), WILDCARD, False),                    # WAMP ".x" reaches $SYS.x
    ("#", ("wamp", "session", "count"), EXACT, False),    # the router's own namespace
    ("home/#", ("home",), PREFIX, False),                 # WAMP prefix 'home' matches homer.x
    ("home/+/#", ("home", ""), PREFIX, True),             # 'home.' matches home.x, home.x.y
])
def test_system_and_reserved_topics_need_a_rule_that_names_them(rule, request_, match, covered):
    assert PermissionRule(from_mqtt(rule), MQTT, frozenset({"subscribe"})).covers(
        request_, match) is covered


def info(authid: str, role: str, client_id: str | None = None,
         method: str = "ticket") -> SessionInfo:
    return SessionInfo(1, "r", authid, role, method, client_id=client_id)


def test_personal_rules_are_bound_per_identity():
    rules = [PermissionRule(from_mqtt("devices/%u/#"), MQTT, frozenset({"publish"})),
             PermissionRule(from_mqtt("clients/%c"), MQTT, frozenset({"publish"}))]
    authorizer = Authorizer({"fleet": Role("fleet", rules)})
    alice, bob = info("alice", "fleet", "car1"), info("bob", "fleet")
    assert authorizer.allows(alice, "publish", ("devices", "alice", "x"))
    assert not authorizer.allows(alice, "publish", ("devices", "bob", "x"))
    assert authorizer.allows(bob, "publish", ("devices", "bob"))
    assert not authorizer.allows(bob, "publish", ("devices", "alice", "x"))  # cached per identity
    assert authorizer.allows(alice, "publish", ("clients", "car1"))
    assert not authorizer.allows(bob, "publish", ("clients", "car1"))        # no client id
    assert not authorizer.allows(bob, "publish", ("clients", "%c"))
    anonymous = info("alice", "fleet", method="anonymous")                   # %u needs a login
    assert not authorizer.allows(anonymous, "publish", ("devices", "alice", "x"))
    for sneaky in ("+", "#", "a/b", ""):                                     # never a wildcard
        assert not authorizer.allows(info(sneaky, "fleet"), "publish", ("devices", "x", "y"))


@pytest.mark.parametrize("rules", [
    [PermissionRule(("",), PREFIX, frozenset({"publish", "call"}))],
    [PermissionRule(("#",), MQTT, frozenset({"publish"})),
     PermissionRule(("$s", "#"), MQTT, frozenset({"publish"}))],
    [PermissionRule(("",), PREFIX, frozenset({"subscribe"})),
     PermissionRule(("wamp", ""), PREFIX, frozenset({"publish", "call"}))],
    [PermissionRule(("devices", "%u", "#"), MQTT, frozenset({"publish"})),
     PermissionRule(("#",), MQTT, frozenset({"call"}))],
])
def test_a_rule_granting_everything_answers_as_the_rules_do(rules):
    """A role whose prefix ``""`` / filter ``#`` rule grants an action answers without
    walking its rules: the same answer, twice (a second ask is no cache's), for every topic
    and action, the ``wamp`` and ``$`` topics included."""
    role = Role("role", rules)
    authorizer = Authorizer({"role": role})
    session = info("alice", "role", "car1")
    bound = role.bind("alice", "car1")
    for topic in UNIVERSE + [("wamp", "x"), ("$SYS", "a"), ("devices", "alice", "a")]:
        for action in ("publish", "call", "subscribe"):
            expected = bound.allows(action, topic)
            assert authorizer.allows(session, action, topic) is expected, (topic, action)
            assert authorizer.allows(session, action, topic) is expected, (topic, action)


def test_a_refusal_explains_the_rule_set_and_the_nearest_rule():
    rules = [PermissionRule(("home", ""), PREFIX, frozenset({"subscribe"})),
             PermissionRule(from_mqtt("garden/#"), MQTT, frozenset({"publish"}))]
    authorizer = Authorizer({"user": Role("user", rules)})
    user = info("alice", "user")
    why = authorizer.explain(user, "subscribe", ("home", "#"), MQTT)
    assert "nearest rule: uri 'home.' (prefix)" in why
    assert 'write a topic rule such as {"topic": "home/#"}' in why
    assert "does not allow subscribe" in authorizer.explain(user, "subscribe", ("garden", "x"),
                                                            EXACT)
    assert "no role 'other'" in authorizer.explain(info("x", "other"), "publish", ("a",), EXACT)


def test_realm_files_take_topic_rules_and_refuse_bad_ones():
    rule = parse_rule(Path("realm.json"), "roles.r[0]",
                      {"topic": "sensors/+/temp", "allow": ["subscribe"]}, "strict")
    assert (rule.pattern, rule.match) == (("sensors", "+", "temp"), MQTT)
    for bad in ({"topic": "a/#/b", "allow": ["publish"]},
                {"topic": "dev-%u/x", "allow": ["publish"]},
                {"topic": "$share/g/a", "allow": ["subscribe"]},
                {"topic": "a", "match": "prefix", "allow": ["publish"]}):
        with pytest.raises(ConfigError):
            parse_rule(Path("realm.json"), "roles.r[0]", bad, "strict")


# Made by mosquitto_passwd 2.0.11 (-H sha512-pbkdf2 and -H sha512): passwords s3cret, c4rol.
PBKDF2_LINE = ("alice:$7$101$VUhkGJqhz/Ax2guF$sJ674iJ0/hP5xjn49vnj7y/mX7sVraSBeEhNvc7ChEYJ0yhFKw4"
               "ZRIqDsWKJ388CSJSr5FWIaRWVaUewzqOtyA==")
SHA512_LINE = ("carol:$6$NzQ+5QPsyKLPCXKh$XXBGDacHONlIYzhs9Xh8ZdbLsT8RmMw55oxsLvG/p/fwLwp4llbxyh"
               "/5Yls+4XNV5SaVxQuEcF//HdtMQvyTGw==")


def test_mosquitto_hashes_are_verified_as_they_are(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"# comment\n{PBKDF2_LINE}\n\n{SHA512_LINE}\n")
    users = read_passwords(path)
    assert verify_secret("s3cret", users["alice"]) and not verify_secret("s3cret!", users["alice"])
    assert verify_secret("c4rol", users["carol"]) and not verify_secret("c4ro", users["carol"])
    for broken in ("$7$101$AA==$", "$7$x$AA==$AA==", "$6$!!$AA==", "$7$0$AA==$AA=="):
        assert not verify_secret("", broken)
    path.write_text("dave:plaintext\n")
    with pytest.raises(MosquittoError, match="passwd:1: .*mosquitto_passwd -U"):
        read_passwords(path)


def test_mosquitto_acl_becomes_roles(tmp_path):
    path = tmp_path / "acl"
    path.write_text("topic read public/#\n\nuser alice\ntopic home/#\ntopic write sensors/+/t\n"
                    "# fleet\npattern readwrite devices/%u/#\n")
    assert roles(read_acl(path)) == {
        "mosquitto": [{"topic": "devices/%u/#", "allow": ["publish", "subscribe"]}],
        "mosquitto-anonymous": [{"topic": "public/#", "allow": ["subscribe"]},
                                {"topic": "devices/%u/#", "allow": ["publish", "subscribe"]}],
        "mosquitto-alice": [{"topic": "home/#", "allow": ["publish", "subscribe"]},
                            {"topic": "sensors/+/t", "allow": ["publish"]},
                            {"topic": "devices/%u/#", "allow": ["publish", "subscribe"]}]}
    path.write_text("user alice\ntopic home/#\ntopic deny home/secret\n")
    with pytest.raises(MosquittoError, match="acl:3: 'topic deny home/secret': the router's "
                                             "rules only allow"):
        read_acl(path)
