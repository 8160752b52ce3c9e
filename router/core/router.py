"""The router: every realm of the node and every live session, whatever its protocol."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Protocol

from router.core.credentials import Principal
from router.core.ids import random_id
from router.core.incidents import Incidents
from router.core.login_guard import LoginGuard
from router.core.peer import Peer
from router.core.realm import Realm
from router.core.scheduler import Scheduler


class PasswordVerifier(Protocol):
    """Checks a password against its stored hash off the event loop (``router.verifier``)."""

    @property
    def checks(self) -> Mapping[str, int]:
        """Checks run so far, per protocol (what logins cost the CPU)."""

    def verify(self, secret: str, stored: str, answer: Callable[[bool], None], realm: str,
               protocol: str, peer: str | None) -> bool:
        """Schedule the check and ``answer(ok)`` later; False at once if too many wait."""


class Connections:
    """A set of connections kept as a dict's keys: at tens of thousands of entries a set's
    table (16 bytes a slot, grown fourfold, at most 3/5 full) cost about 106 bytes per
    connection at 19,800, a dict about 33 (``bench/session_memory.py --tracemalloc``)."""

    __slots__ = ("_members",)

    def __init__(self) -> None:
        self._members: dict[Any, None] = {}

    def add(self, connection: Any) -> None:
        """Count ``connection`` in (idempotent)."""
        self._members[connection] = None

    def discard(self, connection: Any) -> None:
        """Count ``connection`` out, if it is in."""
        self._members.pop(connection, None)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._members)


class Router:
    """Owns the realms and hands out globally unique session ids."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.realms: dict[str, Realm] = {}
        self.principals: dict[str, dict[str, Principal]] = {}
        self.login_guard = LoginGuard(scheduler)
        """Failed logins of every protocol: logged and slowed per peer host."""
        self.incidents = Incidents()
        """Drops, refusals and store failures of every realm and protocol: counted, and
        logged at most once per cause and interval."""
        self.verifier: PasswordVerifier | None = None
        """Password (ticket) checks of every protocol, in threads off the reactor (the node
        sets :class:`router.verifier.SecretVerifier`)."""

        self.peers: dict[int, Peer] = {}
        self.connections = Connections()
        """Every open client connection, joined or not (closed with GOODBYE on shutdown)."""

    def add_realm(self, realm: Realm, principals: dict[str, Principal]) -> None:
        """Serve ``realm`` with its principals; its incidents count into the router's."""
        self.realms[realm.name] = realm
        realm.incidents = self.incidents
        self.principals[realm.name] = principals

    def new_session_id(self) -> int:
        """A session id no live session has (random, as WAMP asks, so ids cannot be guessed)."""
        while True:
            session_id = random_id()
            if session_id not in self.peers:
                return session_id

    def tables(self) -> Iterator[dict[Any, Any]]:
        """The tables that grow with the connections, sessions and subscriptions, every
        realm's included: a dict keeps the size it grew to when its entries go, so after a
        crowd of connections closed they are rebuilt (:func:`router.memory.compact`)."""
        yield self.peers
        yield self.connections._members
        for realm in self.realms.values():
            yield from realm.tables()

    def track(self, peer: Peer) -> None:
        """Reach a joined session by id from any realm (the admin and meta APIs kill by id)."""
        self.peers[peer.info.session_id] = peer

    def forget(self, peer: Peer) -> None:
        """The session is gone: its id may be handed out again."""
        self.peers.pop(peer.info.session_id, None)
