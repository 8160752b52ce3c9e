"""The session and subscription meta APIs, as router procedures on a realm."""

from __future__ import annotations

from router.core import errors
from router.core.errors import RouterError
from router.core.model import SessionInfo
from router.core.realm import Realm
from router.core.uri import EXACT, MATCH_POLICIES


def _authroles_filter(args: list) -> set[str] | None:
    if not args or args[0] is None:
        return None
    if type(args[0]) is not list or any(type(role) is not str for role in args[0]):
        raise RouterError(errors.INVALID_ARGUMENT, "filter_authroles must be a list of strings")
    return set(args[0])


def _int_arg(args: list, name: str) -> int:
    if not args or type(args[0]) is not int:
        raise RouterError(errors.INVALID_ARGUMENT, f"'{name}' (an integer id) is required")
    return args[0]


def install_session_meta(realm: Realm) -> None:
    """wamp.session.count / list / get."""

    def matching(args: list) -> list[int]:
        roles = _authroles_filter(args)
        return [sid for sid, peer in realm.sessions.items()
                if roles is None or peer.info.authrole in roles]

    def count(caller: SessionInfo, args: list, kwargs: dict) -> int:
        return len(matching(args))

    def list_(caller: SessionInfo, args: list, kwargs: dict) -> list[int]:
        return matching(args)

    def get(caller: SessionInfo, args: list, kwargs: dict) -> dict:
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
    index = realm.broker.index

    def subscription(args: list):
        found = index.by_id.get(_int_arg(args, "subscription"))
        if found is None:
            raise RouterError(errors.NO_SUCH_SUBSCRIPTION, "no such subscription")
        return found

    def list_(caller: SessionInfo, args: list, kwargs: dict) -> dict:
        listed: dict[str, list[int]] = {policy: [] for policy in MATCH_POLICIES}
        for sub in index.by_id.values():
            if not sub.is_meta:
                listed[sub.match].append(sub.id)
        return listed

    def lookup(caller: SessionInfo, args: list, kwargs: dict) -> int | None:
        if not args or type(args[0]) is not str:
            raise RouterError(errors.INVALID_ARGUMENT, "'topic' (a string) is required")
        options = args[1] if len(args) > 1 and isinstance(args[1], dict) else kwargs
        match = options.get("match", EXACT)
        if match not in MATCH_POLICIES:
            raise RouterError(errors.INVALID_ARGUMENT, f"unknown match policy '{match}'")
        found = index.lookup(args[0], match)
        return found.id if found is not None else None

    def match(caller: SessionInfo, args: list, kwargs: dict) -> list[int] | None:
        if not args or type(args[0]) is not str:
            raise RouterError(errors.INVALID_ARGUMENT, "'topic' (a string) is required")
        ids = [sub.id for sub in index.matching(args[0])]
        return ids or None

    def get(caller: SessionInfo, args: list, kwargs: dict) -> dict:
        return subscription(args).details()

    def list_subscribers(caller: SessionInfo, args: list, kwargs: dict) -> list[int]:
        return list(subscription(args).subscribers)

    def count_subscribers(caller: SessionInfo, args: list, kwargs: dict) -> int:
        return len(subscription(args).subscribers)

    realm.dealer.procedures.update({
        "wamp.subscription.list": list_,
        "wamp.subscription.lookup": lookup,
        "wamp.subscription.match": match,
        "wamp.subscription.get": get,
        "wamp.subscription.list_subscribers": list_subscribers,
        "wamp.subscription.count_subscribers": count_subscribers,
    })
