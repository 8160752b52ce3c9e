"""Shared subscriptions: load-balanced groups whose members may speak any protocol.

A group is (group name, topic pattern, match policy) in one realm. MQTT
``$share/g/a/b``, a WAMP SUBSCRIBE of ``a.b`` with ``x_shared_group: "g"`` and an
AMQP receiver link on ``a.b`` with the link property ``x-shared-group: "g"`` are
members of the same group. Each publication matching a group goes to exactly one
member:

* members are taken in turn (round robin, in the order they joined), skipping a
  member the publication does not admit (exclude_me, eligible/exclude lists);
* a member that can take it now (:meth:`Peer.ready`: connected, not over its
  flow bound, room in its in-flight window) is preferred; only when no admitted
  member is ready does the next admitted one in turn get it (an offline persistent
  MQTT session queues it, a slow one queues or drops QoS 0 as for its own
  subscriptions);
* a member whose delivery raises is counted (the broker's delivery failure) and
  the next member is tried, so one broken member costs the group nothing.

The broker checks once per publication whether any group exists (one dict truth
test), so publications without groups pay nothing else.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

from router.core.model import Details, Publication
from router.core.peer import Peer, Subscription
from router.core.subscriptions import PatternEntry, SubscriptionIndex
from router.core.topic import Topic

Failure = Callable[[Peer, Publication, Exception], None]


class SharedGroup(Subscription):
    """One shared group: a subscription whose ``subscribers`` take turns."""

    __slots__ = ("group", "turn")

    def __init__(self, subscription_id: int, topic: Topic, match: str, group: str) -> None:
        super().__init__(subscription_id, topic, match)
        self.group = group
        self.turn = 0

    def details(self) -> Details:
        """As a subscription's details, with the group's name, so the meta API tells groups
        apart."""
        details = super().details()
        details["x_shared_group"] = self.group
        return details

    def deliver(self, publication: Publication, failed: Failure,
                leaving: int | None = None) -> Peer | None:
        """Give ``publication`` to one member (not ``leaving``): the member that took it,
        None if none did."""
        members = self.peers()
        count = len(members)
        waiting: list[int] = []
        start = self.turn
        for position in range(start, start + count):
            peer = members[position % count]
            info = peer.info
            if info.session_id == leaving or not publication.admits(info):
                continue
            if not peer.ready():
                waiting.append(position)
            elif self._send(peer, position, count, publication, failed):
                return peer
        for position in waiting:
            peer = members[position % count]
            if self._send(peer, position, count, publication, failed):
                return peer
        return None

    def _send(self, peer: Peer, position: int, count: int, publication: Publication,
              failed: Failure) -> bool:
        """Deliver to the member at ``position``; the next turn starts after it."""
        try:
            peer.send_event(self, publication)
        except Exception as exc:  # this member alone failed: the next one gets it
            failed(peer, publication, exc)
            return False
        self.turn = (position + 1) % count
        return True


class _GroupsAt(PatternEntry):
    """Every group on one (topic pattern, match): the value the subscription index stores."""

    __slots__ = ("groups",)

    def __init__(self, index_id: int, topic: Topic, match: str) -> None:
        super().__init__(index_id, topic, match)
        self.groups: dict[str, SharedGroup] = {}


class SharedGroups:
    """The shared groups of one realm, matched with the same index as subscriptions."""

    def __init__(self) -> None:
        self._index: SubscriptionIndex[_GroupsAt] = SubscriptionIndex()
        self._index_ids = itertools.count(1)
        self.by_id: dict[int, SharedGroup] = {}

    def lookup(self, topic: Topic, match: str, group: str) -> SharedGroup | None:
        """The group ``group`` on (topic, match), if it exists: a new member joins it instead of
        creating another."""
        at = self._index.lookup(topic, match)
        return at.groups.get(group) if at is not None else None

    def create(self, subscription_id: int, topic: Topic, match: str, group: str) -> SharedGroup:
        """A new, empty group (the broker adds its first member)."""
        shared = SharedGroup(subscription_id, topic, match, group)
        at = self._index.lookup(topic, match)
        if at is None:
            at = _GroupsAt(next(self._index_ids), topic, match)
            self._index.add(at)
        at.groups[group] = shared
        self.by_id[subscription_id] = shared
        return shared

    def remove(self, shared: SharedGroup) -> None:
        """The group's last member left: the group goes (and its index entry with its last
        group)."""
        del self.by_id[shared.id]
        at = self._index.lookup(shared.topic, shared.match)
        assert at is not None, "a group is indexed until its last member leaves"
        del at.groups[shared.group]
        if not at.groups:
            self._index.remove(at)

    def matching(self, topic: Topic) -> Iterator[SharedGroup]:
        """Every group whose pattern matches ``topic``: each gets one delivery of a publication."""
        for at in self._index.matching(topic):
            yield from at.groups.values()

    def dispatch(self, publication: Publication, meta_only: bool, failed: Failure
                 ) -> list[Peer]:
        """One delivery per matching group; returns the members that took the publication."""
        took = []
        for shared in list(self.matching(publication.topic)):
            if meta_only and not shared.is_meta:
                continue
            peer = shared.deliver(publication, failed)
            if peer is not None:
                took.append(peer)
        return took

    def hand_over(self, group: Subscription, publication: Publication, leaving: int,
                  failed: Failure) -> Peer | None:
        """Another member of ``group`` takes a publication ``leaving`` will not complete:
        that member, or None."""
        shared = self.by_id.get(group.id)
        if shared is not group or shared is None or publication.expired():
            return None
        return shared.deliver(publication, failed, leaving)
