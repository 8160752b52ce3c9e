"""Router procedures on a realm: session and subscription meta APIs, history, retained admin."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Iterable

from twisted.internet import defer

from router.core import errors
from router.core.errors import RouterError
from router.core.model import Args, Details, Kwargs, Publication, SessionInfo
from router.core.peer import Subscription
from router.core.history import TimeWindow, rfc3339
from router.core.realm import Realm
from router.core.topic import Topic, from_uri, name_fields
from router.core.uri import EXACT, MATCH_POLICIES, PREFIX


def authroles_filter(args: Args) -> set[str] | None:
    """The optional ``filter_authroles`` argument of the session meta procedures, checked: None
    when the caller gave none."""
    if not args or args[0] is None:
        return None
    if type(args[0]) is not list or any(type(role) is not str for role in args[0]):
        raise RouterError(errors.INVALID_ARGUMENT, "filter_authroles must be a list of strings")
    return set(args[0])


def _int_arg(args: Args, name: str) -> int:
    if not args or type(args[0]) is not int:
        raise RouterError(errors.INVALID_ARGUMENT, f"'{name}' (an integer id) is required")
    return args[0]


def topic_arg(args: Args) -> Topic:
    """The topic of wamp.subscription.lookup / match."""
    if not args or type(args[0]) is not str:
        raise RouterError(errors.INVALID_ARGUMENT, "'topic' (a string) is required")
    return from_uri(args[0])


def lookup_args(args: Args, kwargs: Kwargs) -> tuple[Topic, str]:
    """(topic, match) of wamp.subscription.lookup(topic, options)."""
    topic = topic_arg(args)
    options = args[1] if len(args) > 1 and isinstance(args[1], dict) else kwargs
    match = options.get("match", EXACT)
    if match not in MATCH_POLICIES:
        raise RouterError(errors.INVALID_ARGUMENT, f"unknown match policy '{match}'")
    return topic, match


def by_match(subscriptions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """wamp.subscription.list's answer from (match, id) pairs."""
    listed: dict[str, list[int]] = {policy: [] for policy in MATCH_POLICIES}
    for match, subscription_id in subscriptions:
        listed.setdefault(match, []).append(subscription_id)
    return listed


def install_session_meta(realm: Realm) -> None:
    """wamp.session.count / list / get."""

    def matching(args: Args) -> list[int]:
        roles = authroles_filter(args)
        return [sid for sid, peer in realm.sessions.items()
                if roles is None or peer.info.authrole in roles]

    def count(caller: SessionInfo, args: Args, kwargs: Kwargs) -> int:
        if authroles_filter(args) is None:
            return len(realm.sessions)  # (no list of every session for a count of them)
        return len(matching(args))

    def list_(caller: SessionInfo, args: Args, kwargs: Kwargs) -> list[int]:
        return matching(args)

    def get(caller: SessionInfo, args: Args, kwargs: Kwargs) -> Details:
        peer = realm.sessions.get(_int_arg(args, "session"))
        if peer is None:
            raise RouterError(errors.NO_SUCH_SESSION, "no such session")
        return peer.info.details()

    realm.dealer.procedures.update({
        "wamp.session.count": count,
        "wamp.session.list": list_,
        "wamp.session.get": get,
    })


def install_subscription_meta(realm: Realm) -> None:
    """wamp.subscription.list / lookup / match / get / list_subscribers / count_subscribers."""
    broker = realm.broker
    index = broker.index

    def subscription(args: Args) -> Subscription:
        found = broker.find(_int_arg(args, "subscription"))
        if found is None:
            raise RouterError(errors.NO_SUCH_SUBSCRIPTION, "no such subscription")
        return found

    def list_(caller: SessionInfo, args: Args, kwargs: Kwargs) -> dict[str, list[int]]:
        return by_match((sub.match, sub.id) for sub in itertools.chain(
            index.by_id.values(), broker.shared.by_id.values()) if not sub.is_meta)

    def lookup(caller: SessionInfo, args: Args, kwargs: Kwargs) -> int | None:
        found = index.lookup(*lookup_args(args, kwargs))
        return found.id if found is not None else None

    def match(caller: SessionInfo, args: Args, kwargs: Kwargs) -> list[int] | None:
        topic = topic_arg(args)
        ids = [sub.id for sub in itertools.chain(index.matching(topic),
                                                 broker.shared.matching(topic))
               if not sub.is_meta]
        return ids or None

    def get(caller: SessionInfo, args: Args, kwargs: Kwargs) -> Details:
        return subscription(args).details()

    def list_subscribers(caller: SessionInfo, args: Args, kwargs: Kwargs) -> list[int]:
        return subscription(args).session_ids()

    def count_subscribers(caller: SessionInfo, args: Args, kwargs: Kwargs) -> int:
        return len(subscription(args).pairs())

    realm.dealer.procedures.update({
        "wamp.subscription.list": list_,
        "wamp.subscription.lookup": lookup,
        "wamp.subscription.match": match,
        "wamp.subscription.get": get,
        "wamp.subscription.list_subscribers": list_subscribers,
        "wamp.subscription.count_subscribers": count_subscribers,
    })


def _timestamp_kwarg(kwargs: Kwargs, key: str) -> float | None:
    value = kwargs.get(key)
    if value is None:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise RouterError(errors.INVALID_ARGUMENT, f"'{key}' must be an RFC 3339 time") from exc


def install_event_history(realm: Realm) -> None:
    """wamp.subscription.get_events(subscription, limit=, reverse=, after_time=, ...),
    answered when the history is read (at once on one node, when Redis replies on many:
    the dealer sends what the Deferred gives)."""
    history = realm.history
    if history is None:
        return  # the realm keeps no history: there is nothing to answer from

    def get_events(caller: SessionInfo, args: Args,
                   kwargs: Kwargs) -> defer.Deferred[list[Details]]:
        subscription = realm.broker.find(_int_arg(args, "subscription"))
        if subscription is None:
            raise RouterError(errors.NO_SUCH_SUBSCRIPTION, "no such subscription")
        realm.authorize(caller, "subscribe", subscription.topic, subscription.match)
        limit = kwargs.get("limit")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise RouterError(errors.INVALID_ARGUMENT, "'limit' must be a non-negative integer")
        reverse = kwargs.get("reverse", False)
        if type(reverse) is not bool:
            raise RouterError(errors.INVALID_ARGUMENT, "'reverse' must be a bool")
        window = TimeWindow(*(_timestamp_kwarg(kwargs, key) for key in
                              ("from_time", "after_time", "before_time", "until_time")))

        answer: defer.Deferred[list[Details]] = defer.Deferred()

        def records(events: list[Publication] | Exception) -> None:
            if isinstance(events, Exception):
                answer.errback(RouterError(errors.UNAVAILABLE,
                                           f"the history cannot be read: {events}"))
                return
            found = []
            for publication in events:
                details = publication.publisher_details()
                details["topic"] = publication.name
                if publication.passthru is not None:  # args is [the opaque payload]
                    details.update(publication.passthru.options)
                record = {"timestamp": rfc3339(publication.timestamp),
                          "subscription": subscription.id,
                          "publication": publication.publication_id, "details": details}
                if publication.args:
                    record["args"] = publication.args
                if publication.kwargs:
                    record["kwargs"] = publication.kwargs
                found.append(record)
            answer.callback(found)

        history.read(subscription.topic, subscription.match, caller, limit, reverse, window,
                     records)
        return answer

    realm.dealer.procedures["wamp.subscription.get_events"] = get_events


def install_retention_admin(realm: Realm) -> None:
    """wamp.retained.list(prefix="", limit=1000) and
    wamp.retained.purge(topic= | levels= | prefix=).

    Topics are listed by :func:`router.core.topic.display` name, with their ``levels``
    when that name is not the dotted form (an MQTT topic such as ``/a`` or ``a.b/c``).
    """
    retention = realm.retention
    if retention is None:
        return  # the realm retains nothing: there is nothing to list or purge

    def _prefix(kwargs: Kwargs, args: Args) -> Topic:
        prefix = kwargs.get("prefix", args[0] if args else "")
        if type(prefix) is not str:
            raise RouterError(errors.INVALID_ARGUMENT, "'prefix' must be a string")
        return from_uri(prefix)

    def _topic(kwargs: Kwargs) -> Topic | None:
        topic, levels = kwargs.get("topic"), kwargs.get("levels")
        if topic is not None:
            if type(topic) is not str:
                raise RouterError(errors.INVALID_ARGUMENT, "'topic' must be a string")
            return from_uri(topic)
        if levels is not None:
            if (type(levels) is not list or not levels
                    or any(type(level) is not str for level in levels)):
                raise RouterError(errors.INVALID_ARGUMENT,
                                  "'levels' must be a non-empty list of strings")
            return tuple(levels)
        return None

    def list_(caller: SessionInfo, args: Args, kwargs: Kwargs) -> list[Details]:
        limit = kwargs.get("limit", 1000)
        if type(limit) is not int or limit < 0:
            raise RouterError(errors.INVALID_ARGUMENT, "'limit' must be a non-negative integer")
        listed: list[Details] = []
        for topic, entries in retention.topics(_prefix(kwargs, args), PREFIX):
            if len(listed) >= limit:
                break
            listed.append({
                **name_fields(topic),
                "owner": str(entries[-1].owner) if entries[-1].owner is not None else None,
                "events": [{"publication": e.publication.publication_id,
                            "timestamp": rfc3339(e.publication.timestamp),
                            "expires": rfc3339(e.expires_at) if e.expires_at else None,
                            "restricted": not e.general, "bytes": e.size} for e in entries],
            })
        return sorted(listed, key=lambda item: item["topic"])

    def purge(caller: SessionInfo, args: Args, kwargs: Kwargs) -> int:
        topic = _topic(kwargs)
        if topic is not None:
            return 1 if retention.clear(topic) else 0
        if "prefix" not in kwargs:
            raise RouterError(errors.INVALID_ARGUMENT,
                              "give 'topic', 'levels' or 'prefix' (\"\" = all)")
        topics = [topic for topic, _ in retention.topics(_prefix(kwargs, args), PREFIX)]
        for topic in topics:
            retention.clear(topic)
        return len(topics)

    realm.dealer.procedures["wamp.retained.list"] = list_
    realm.dealer.procedures["wamp.retained.purge"] = purge
