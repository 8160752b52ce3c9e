"""Who an HTTP request is: a bearer token, HTTP Basic with a principal's ticket, or the
realm's anonymous role when the request has no ``Authorization`` header.

Each request is its own short session as the core sees it (its own session id, protocol
``http``), with the identity a WAMP, MQTT or AMQP login of the same principal would get,
so the realm's role rules decide every request the same way. A ticket is checked in a
thread (the router's :class:`router.verifier.SecretVerifier`), never on the reactor, and a
verified one is then remembered a while (:class:`VerifiedTickets`): a console polling with
Basic every second would otherwise cost a password check (~0.15 s CPU) per poll.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from typing import Callable

from router.core.ownership import ANONYMOUS, anonymous_authid
from router.core.realm import Realm
from router.core.router import Router
from router.config import HttpSettings
from router.core.model import SessionInfo
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


class VerifiedTickets:
    """Basic credentials whose password check succeeded lately, so a client repeating them
    (a console polling) is not checked again until ``ttl`` seconds passed.

    An entry is a keyed hash (a random key of this object) of the authid, the ticket and
    the principal's stored ticket hash: the ticket itself is never kept, and a ticket
    changed by ``principal passwd`` and a live reload gives another key, so the old ticket
    is checked again (and refused). Only successes are remembered; at ``size`` entries the
    least recently used goes.
    """

    def __init__(self, ttl: float, size: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._expiries: OrderedDict[bytes, float] = OrderedDict()

    def _entry(self, authid: str, ticket: str, ticket_hash: str) -> bytes:
        message = json.dumps([authid, ticket, ticket_hash]).encode("utf-8")  # unambiguous
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def known(self, authid: str, ticket: str, ticket_hash: str) -> bool:
        """Whether these credentials passed a check less than ``ttl`` seconds ago."""
        entry = self._entry(authid, ticket, ticket_hash)
        expiry = self._expiries.get(entry)
        if expiry is None:
            return False
        if expiry <= self.clock():
            del self._expiries[entry]
            return False
        self._expiries.move_to_end(entry)
        return True

    def remember(self, authid: str, ticket: str, ticket_hash: str) -> None:
        """Note a successful check (nothing when the cache is off: ``ttl`` 0)."""
        if self.ttl <= 0:
            return
        entry = self._entry(authid, ticket, ticket_hash)
        self._expiries[entry] = self.clock() + self.ttl
        self._expiries.move_to_end(entry)
        while len(self._expiries) > self.size:
            self._expiries.popitem(last=False)


class HttpLogin:
    """Authenticates the requests of one ``http`` listener against its realm."""

    def __init__(self, router: Router, realm: Realm, tokens: TokenFile,
                 settings: HttpSettings) -> None:
        self.router = router
        self.realm = realm
        self.tokens = tokens
        self.verified = VerifiedTickets(settings.login_cache_ttl, settings.login_cache_size)

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
        ticket_hash = principal.ticket_hash

        def let_in() -> SessionInfo:
            return self._info(self.router.new_session_id(), principal.authid, principal.role,
                              "ticket", peer)

        if self.verified.known(authid, ticket, ticket_hash):
            answer(let_in())
            return

        def verified(ok: bool) -> None:
            if ok:
                self.verified.remember(authid, ticket, ticket_hash)
            answer(let_in() if ok else self._failed(peer, authid, "ticket", "wrong ticket"))

        if not self.router.verifier.verify(ticket, ticket_hash, verified,
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
