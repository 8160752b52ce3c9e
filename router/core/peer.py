"""What a frontend session offers the core: its identity and delivery callbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from router.core.model import Publication, SessionInfo

if TYPE_CHECKING:
    from router.core.broker import Subscription
    from router.core.dealer import Invocation, Registration


class Peer(Protocol):
    """A session attached to a realm, whatever its wire protocol."""

    info: SessionInfo

    def send_event(self, subscription: "Subscription", publication: Publication,
                   retained: bool = False) -> None:
        """Deliver one event on one subscription."""

    def ready(self) -> bool:
        """Can it take an event now (connected, not over its flow bound, room in its
        in-flight window)? Shared groups prefer members that are."""

    def backlog_room(self) -> bool:
        """May a retained backlog write one more event now (transport not paused, room in
        the in-flight window, nothing queued)? When it says no, its frontend calls
        ``Realm.backlogs.resume`` once it may; a paused transport also starts the
        slow-consumer clock, so a client that stopped reading is disconnected."""

    def send_invocation(self, invocation: "Invocation") -> None:
        """Ask this callee to run a procedure."""

    def send_interrupt(self, invocation: "Invocation", mode: str, reason: str) -> None:
        """Tell this callee to stop working on an invocation."""

    def send_result(self, call_request: int, args: list | None, kwargs: dict | None,
                    progress: bool) -> None:
        """Return a (possibly progressive) call result to this caller."""

    def send_call_error(self, call_request: int, error: str, args: list | None,
                        kwargs: dict | None) -> None:
        """Fail a call of this caller."""

    def supports(self, role: str, feature: str) -> bool:
        """Did the peer announce ``feature`` for ``role``?"""

    def kill(self, reason: str, message: str | None) -> None:
        """Close the session from the router side."""

    def subscription_revoked(self, subscription: "Subscription", reason: str) -> None:
        """The realm's rules no longer let this session hold ``subscription`` (a reload):
        drop it as the session's own unsubscribe would, and tell the client if its
        protocol can."""

    def registration_revoked(self, registration: "Registration", reason: str) -> None:
        """The core has unregistered this callee (a reload took the permission away):
        tell the client if its protocol can."""
