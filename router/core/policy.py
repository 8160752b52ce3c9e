"""Live reload of a realm's rules: roles, principals and the anonymous role.

The new rules take effect at once for every later request (authorization is checked on
each publish, call, subscribe and register). Sessions are then brought in line:

* a session whose login no longer holds (its principal is gone, its principal now has
  another role, or anonymous logins now get another role or none) is closed with
  :data:`router.core.errors.KILLED`;
* every other session keeps running; what it holds that its role no longer covers
  (subscriptions, registrations) is revoked, and its frontend tells the client as its
  protocol can (:meth:`router.core.peer.Peer.subscription_revoked`,
  :meth:`~router.core.peer.Peer.registration_revoked`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.core import errors
from router.core.authorization import Authorizer
from router.core.credentials import Principal
from router.core.incidents import REVOKED
from router.core.peer import Peer
from router.core.realm import Realm
from router.core.stats import family
from router.core.topic import from_uri


@dataclass
class PolicyOutcome:
    """What a reload did to a realm's live sessions."""

    closed: list[str] = field(default_factory=list)
    """One line per session closed, saying why."""
    revoked_subscriptions: int = 0
    revoked_registrations: int = 0

    def summary(self) -> str:
        """One line for the reload's log and its answer to the operator."""
        return (f"{len(self.closed)} session(s) closed, {self.revoked_subscriptions} "
                f"subscription(s) and {self.revoked_registrations} registration(s) revoked")


def apply_policy(realm: Realm, principals: dict[str, Principal], authorizer: Authorizer,
                 anonymous_role: str | None, current: dict[str, Principal]) -> PolicyOutcome:
    """Give ``realm`` new rules and bring its sessions in line with them.

    ``current`` is the realm's principal table the frontends read; it is updated in place
    so that every frontend sees the new principals at its next login."""
    realm.replace_policy(authorizer, anonymous_role)
    current.clear()
    current.update(principals)
    outcome = PolicyOutcome()
    for peer in list(realm.sessions.values()):
        if realm.sessions.get(peer.info.session_id) is not peer:
            continue  # left meanwhile (an AMQP connection closed takes its links along)
        why = _login_lapsed(peer, principals, anonymous_role)
        if why is not None:
            outcome.closed.append(f"session {peer.info.session_id} ({peer.info.authid}): {why}")
            realm.incidents.count(realm.name, family(peer.info.protocol), REVOKED,
                                  f"session {peer.info.session_id} closed: {why}")
            peer.kill(errors.KILLED, why)
            continue
        _revoke(realm, peer, outcome)
    return outcome


def _login_lapsed(peer: Peer, principals: dict[str, Principal],
                  anonymous_role: str | None) -> str | None:
    """Why ``peer``'s login would not give it its role any more, or None if it still does."""
    info = peer.info
    if info.authmethod == "anonymous":
        if anonymous_role is None:
            return "anonymous logins are no longer allowed"
        if anonymous_role != info.authrole:
            return f"anonymous logins now get the role '{anonymous_role}'"
        return None
    principal = principals.get(info.authid)
    if principal is None:
        return f"the principal '{info.authid}' was removed"
    if principal.role != info.authrole:
        return f"the principal '{info.authid}' now has the role '{principal.role}'"
    return None


def _revoke(realm: Realm, peer: Peer, outcome: PolicyOutcome) -> None:
    """Revoke what ``peer`` holds that its role no longer covers."""
    info = peer.info
    allows = realm.authorizer.allows
    for subscription in realm.broker.subscriptions_of(info.session_id):
        if not allows(info, "subscribe", subscription.topic, subscription.match):
            reason = f"role '{info.authrole}' may no longer subscribe to '{subscription.uri}'"
            outcome.revoked_subscriptions += 1
            realm.incidents.count(realm.name, family(info.protocol), REVOKED,
                                  f"session {info.session_id}: {reason}")
            peer.subscription_revoked(subscription, reason)
    for registration in [r for r in realm.dealer.by_id.values() if peer in r.callees]:
        if not allows(info, "register", from_uri(registration.uri), registration.match):
            reason = f"role '{info.authrole}' may no longer register '{registration.uri}'"
            outcome.revoked_registrations += 1
            realm.incidents.count(realm.name, family(info.protocol), REVOKED,
                                  f"session {info.session_id}: {reason}")
            realm.dealer.unregister(peer, registration.id)
            peer.registration_revoked(registration, reason)
