"""Who an HTTP request is: a bearer token, HTTP Basic with a principal's ticket, or the
realm's anonymous role when the request has no ``Authorization`` header.

Each request is its own short session as the core sees it (its own session id, protocol
``http``), with the identity a WAMP, MQTT or AMQP login of the same principal would get,
so the realm's role rules decide every request the same way. A ticket is checked in a
thread (the router's :class:`router.verifier.SecretVerifier`), never on the reactor.
"""

from __future__ import annotations

import base64
import binascii
from typing import Callable

from router.core.model import SessionInfo
from router.core.ownership import ANONYMOUS, anonymous_authid
from router.core.realm import Realm
from router.core.router import Router
from router.http.tokens import TokenFile

PROTOCOL = "http"


class LoginFailed(Exception):
    """Bad or unusable credentials: answered with 401 (``delay``: held back that long)."""

    def __init__(self, message: str, delay: float = 0.0) -> None:
        super().__init__(message)
        self.message = message
        self.delay = delay


class Busy(Exception):
    """Too many password checks wait already: answered with 503."""


Answer = Callable[["SessionInfo | LoginFailed | Busy"], None]


class HttpLogin:
    """Authenticates the requests of one ``http`` listener against its realm."""

    def __init__(self, router: Router, realm: Realm, tokens: TokenFile) -> None:
        self.router = router
        self.realm = realm
        self.tokens = tokens

    def identify(self, header: bytes | None, peer: str, answer: Answer) -> None:
        """``answer`` the request's session identity or why there is none: at once, or on
        the reactor once a ticket is checked."""
        if header is None:
            if self.realm.anonymous_role is None:
                answer(self._failed(peer, None, ANONYMOUS, "anonymous access is off"))
                return
            session_id = self.router.new_session_id()
            answer(self._info(session_id, anonymous_authid(session_id),
                              self.realm.anonymous_role, ANONYMOUS, peer))
            return
        scheme, _, value = header.decode("latin-1").partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            answer(self._bearer(value.strip(), peer))
        elif scheme == "basic":
            self._basic(value.strip(), peer, answer)
        else:
            answer(self._failed(peer, None, scheme or "-",
                                "the Authorization scheme must be Bearer or Basic"))

    def _bearer(self, token: str, peer: str) -> "SessionInfo | LoginFailed":
        record = self.tokens.find(token)
        if record is None or record.realm != self.realm.name:
            return self._failed(peer, None, "token", "unknown or revoked token")
        principal = self.router.principals[self.realm.name].get(record.principal)
        if principal is None:
            return self._failed(peer, record.principal, "token",
                                "the token's principal is no longer in the realm")
        return self._info(self.router.new_session_id(), principal.authid, principal.role,
                          "token", peer)

    def _basic(self, value: str, peer: str, answer: Answer) -> None:
        try:
            authid, sep, ticket = base64.b64decode(value, validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            answer(self._failed(peer, None, "ticket", "malformed Basic credentials"))
            return
        principal = self.router.principals[self.realm.name].get(authid)
        if not sep or principal is None or principal.ticket_hash is None:
            answer(self._failed(peer, authid, "ticket", "no such principal with a ticket"))
            return

        def verified(ok: bool) -> None:
            answer(self._info(self.router.new_session_id(), principal.authid, principal.role,
                              "ticket", peer) if ok
                   else self._failed(peer, authid, "ticket", "wrong ticket"))

        if not self.router.verifier.verify(ticket, principal.ticket_hash, verified,
                                           self.realm.name, PROTOCOL, peer):
            answer(Busy("too many logins are being checked; try again"))

    def _failed(self, peer: str, authid: str | None, method: str,
                reason: str) -> LoginFailed:
        delay = self.router.login_guard.failed("HTTP", peer, authid, method, reason)
        return LoginFailed(reason, delay)

    def _info(self, session_id: int, authid: str, authrole: str, method: str,
              peer: str) -> SessionInfo:
        return SessionInfo(session_id, self.realm.name, authid, authrole, method,
                           protocol=PROTOCOL, transport={"type": "http", "peer": peer})
