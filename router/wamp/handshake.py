"""The WAMP opening handshake: HELLO, then WELCOME directly, or CHALLENGE and AUTHENTICATE
first, or a (held back) ABORT.

The client's order of ``authmethods`` decides among what the realm and the principal offer:
``anonymous``, ``tls`` (the verified client certificate's CN), ``ticket`` (checked in the
verifier's threads: PBKDF2 never runs on the reactor), ``wampcra`` and ``cryptosign``. A
refused login is told by ABORT only after the login guard's per-peer delay. The session
(:mod:`router.wamp.session`) owns the states and the transport; this module only decides
and moves the session through ``HANDSHAKE -> CHALLENGED [-> VERIFYING] -> ESTABLISHED`` or
``REFUSING``.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from autobahn.wamp import message as m

from router.core import errors
from router.core.credentials import (Principal, normalize_pubkey, verify_cryptosign,
                                     verify_wampcra)
from router.core.realm import Realm
from router.core.router import Router
from router.wamp.codec import WireMessage
from router.wamp.outlet import Outlet

HANDSHAKE, CHALLENGED, ESTABLISHED, CLOSING, CLOSED, REFUSING, VERIFYING = range(7)
"""The session's states (see :mod:`router.wamp.session`)."""

NO_MATCHING_AUTH_METHOD = "wamp.error.no_matching_auth_method"
AUTHENTICATION_FAILED = "wamp.error.authentication_failed"
NO_SUCH_PRINCIPAL = "wamp.error.no_such_principal"
SERVER_BUSY = "wamp.error.server_busy"
"""ABORT reason when too many logins are being verified (try again later)."""
CHALLENGE_METHODS = ("ticket", "wampcra", "cryptosign")


class HandshakeSession(Protocol):
    """What the handshake needs of its session: the state, the transport, and the three
    ways a handshake ends (WELCOME, ABORT) or talks (send)."""

    state: int
    client_roles: frozenset[tuple[str, str]]
    transport: Outlet

    def send(self, msg: WireMessage) -> None: ...

    def abort(self, reason: str, message: str) -> None: ...

    def welcome(self, realm: Realm, authid: str | None, authrole: str, authmethod: str,
                session_id: int | None = None) -> None: ...

    def peer_address(self) -> str: ...


_ANNOUNCED: dict[frozenset[tuple[str, str]], frozenset[tuple[str, str]]] = {}
"""Each distinct announcement once, shared by every session that made it (clients of one
library announce the same): at most :data:`MAX_ANNOUNCEMENTS` kept."""
MAX_ANNOUNCEMENTS = 256


def announced(roles: object) -> frozenset[tuple[str, str]]:
    """The (role, feature) pairs a HELLO's ``roles`` turns on: what the router asks of a
    session later (:meth:`WampSession.supports`), kept instead of the HELLO's nested dicts
    (a few hundred bytes to kilobytes per session)."""
    pairs = frozenset(
        (role, feature) for role, spec in (roles.items() if isinstance(roles, dict) else ())
        if isinstance(spec, dict) and isinstance(spec.get("features"), dict)
        for feature, on in spec["features"].items() if on)
    shared = _ANNOUNCED.get(pairs)
    if shared is None:
        shared = pairs
        if len(_ANNOUNCED) < MAX_ANNOUNCEMENTS:
            _ANNOUNCED[pairs] = pairs
    return shared


class Handshake:
    """One session's way from HELLO to WELCOME or ABORT. The session is passed to each
    call rather than kept, so the two make no reference cycle (see
    tests/test_connection_garbage.py)."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._pending: _PendingAuth | None = None

    def on_hello(self, session: HandshakeSession, msg: m.Hello, raw: list) -> None:
        """WELCOME, CHALLENGE or refuse: the first of the client's methods the realm allows."""
        realm = self._router.realms.get(msg.realm)
        if realm is None:
            session.abort(errors.NO_SUCH_REALM, f"no realm '{msg.realm}' on this router")
            return
        details = raw[2]
        session.client_roles = announced(details.get("roles") if isinstance(details, dict)
                                         else None)
        methods = [m_ for m_ in (msg.authmethods or ["anonymous"]) if isinstance(m_, str)]
        authextra = msg.authextra if isinstance(msg.authextra, dict) else {}
        principals = self._router.principals[realm.name]
        authid = msg.authid if isinstance(msg.authid, str) and msg.authid else None
        principal = principals.get(authid) if authid else None
        # the client's order decides, among what this principal (and the realm) offers
        for method in methods:
            if method == "anonymous" and realm.anonymous_role is not None:
                session.welcome(realm, None, realm.anonymous_role, "anonymous")  # router-named
                return
            if method == "tls":
                client_cn = self._client_cn(session)
                if client_cn is None:
                    continue
                cert_principal = principals.get(client_cn)
                if cert_principal is None or (authid and authid != client_cn):
                    self._refuse(session, NO_SUCH_PRINCIPAL if cert_principal is None
                                 else AUTHENTICATION_FAILED,
                                 "the client certificate does not name this principal",
                                 authid or client_cn, "tls",
                                 f"client certificate CN {client_cn!r}")
                    return
                session.welcome(realm, cert_principal.authid, cert_principal.role, "tls")
                return
            if method == "cryptosign":
                if self._challenge_cryptosign(session, realm, authid, principal, authextra):
                    return
                continue
            if method in CHALLENGE_METHODS and principal is not None \
                    and method in principal.methods():
                self._challenge(session, realm, principal, method)
                return
        unknown_key = authid is None and "cryptosign" in methods and "pubkey" in authextra
        if (authid and principal is None and any(m_ in CHALLENGE_METHODS for m_ in methods)
                or unknown_key):
            self._refuse(session, NO_SUCH_PRINCIPAL,
                         f"no principal '{authid or '(by public key)'}' in realm '{realm.name}'",
                         authid, "/".join(methods), "no such principal")
            return
        self._refuse(session, NO_MATCHING_AUTH_METHOD,
                     f"none of the offered auth methods {methods} is available",
                     authid, "/".join(methods), "no matching auth method")

    def _challenge_cryptosign(self, session: HandshakeSession, realm: Realm,
                              authid: str | None, principal: Principal | None,
                              authextra: dict) -> bool:
        """CHALLENGE for cryptosign if it applies (True), or refuse (True), or skip (False)."""
        pubkey = authextra.get("pubkey")
        pubkey = normalize_pubkey(pubkey) if isinstance(pubkey, str) else None
        if principal is None and authid is None and pubkey is not None:
            principal = next((p for p in self._router.principals[realm.name].values()
                              if pubkey in p.cryptosign_pubkeys), None)
        if principal is None or not principal.cryptosign_pubkeys:
            return False
        if authextra.get("channel_binding") is not None:
            self._refuse(session, AUTHENTICATION_FAILED,
                         "cryptosign channel binding is not supported by this router "
                         "(connect without channel_binding)",
                         principal.authid, "cryptosign", "channel binding requested")
            return True
        if pubkey is None or pubkey not in principal.cryptosign_pubkeys:
            self._refuse(session, AUTHENTICATION_FAILED,
                         "authextra.pubkey is missing or not a key of this principal",
                         principal.authid, "cryptosign", "unknown public key")
            return True
        self._challenge(session, realm, principal, "cryptosign", pubkey)
        return True

    def _challenge(self, session: HandshakeSession, realm: Realm, principal: Principal,
                   method: str, pubkey: str | None = None) -> None:
        session_id = self._router.new_session_id()
        extra: dict[str, Any] = {}
        data = ""
        if method == "wampcra":
            cra = principal.wampcra
            data = json.dumps({
                "authid": principal.authid, "authrole": principal.role,
                "authmethod": "wampcra", "authprovider": "static", "session": session_id,
                "nonce": secrets.token_urlsafe(24),
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())})
            extra = {"challenge": data, "salt": cra.salt, "iterations": cra.iterations,
                     "keylen": cra.keylen}
        elif method == "cryptosign":
            data = secrets.token_hex(32)
            extra = {"challenge": data, "channel_binding": None}
        self._pending = _PendingAuth(realm, principal.authid, principal.role, method,
                                          session_id, data, pubkey)
        session.state = CHALLENGED
        session.send(WireMessage([m.Challenge.MESSAGE_TYPE, method, extra]))

    def on_authenticate(self, session: HandshakeSession, msg: m.Authenticate) -> None:
        """Check the answer to our CHALLENGE (a ticket off the reactor, in the verifier)."""
        pending, self._pending = self._pending, None
        principal = self._router.principals[pending.realm.name].get(pending.authid)
        signature = msg.signature if isinstance(msg.signature, str) else ""
        if principal is not None and pending.method == "ticket":
            # PBKDF2 takes ~100 ms: never on the reactor
            session.state = VERIFYING
            session.transport.verifying(True)
            if not self._router.verifier.verify(
                    signature, principal.ticket_hash or "",
                    partial(self._verified, session, pending),
                    pending.realm.name, "wamp", session.peer_address()):
                session.abort(SERVER_BUSY, "too many logins are being verified; try again later")
            return
        ok = False
        if principal is not None:
            if pending.method == "wampcra" and principal.wampcra is not None:
                ok = verify_wampcra(principal.wampcra, pending.challenge, signature)
            elif pending.method == "cryptosign":
                ok = (pending.pubkey in principal.cryptosign_pubkeys
                      and verify_cryptosign(pending.pubkey, pending.challenge, signature))
        self._verified(session, pending, ok)

    def _verified(self, session: HandshakeSession, pending: _PendingAuth, ok: bool) -> None:
        """WELCOME or the (held back) refusal, unless the client left meanwhile."""
        if session.state == CLOSED:
            return
        if not ok:
            self._refuse(session, AUTHENTICATION_FAILED, "authentication failed", pending.authid,
                         pending.method, "wrong signature" if pending.method != "ticket"
                         else "wrong ticket")
            return
        session.welcome(pending.realm, pending.authid, pending.role, pending.method,
                        pending.session_id)

    def _refuse(self, session: HandshakeSession, reason: str, message: str,
                authid: str | None, method: str, why: str) -> None:
        """ABORT a failed login, held back by the login guard's per-peer delay."""
        delay = self._router.login_guard.failed("WAMP", session.peer_address(), authid,
                                                method, why)
        session.state = REFUSING
        session.transport.handshake_done()

        def abort() -> None:
            if session.state == REFUSING:
                session.abort(reason, message)

        self._router.login_guard.refuse(delay, abort)

    def _client_cn(self, session: HandshakeSession) -> str | None:
        """The CN of the verified TLS client certificate of this connection, if any."""
        from router.tls import peer_common_name
        return peer_common_name(getattr(session.transport, "transport", None))


@dataclass(frozen=True)
class _PendingAuth:
    """A CHALLENGE sent, waiting for AUTHENTICATE."""

    realm: Realm
    authid: str
    role: str
    method: str
    session_id: int
    challenge: str = ""
    """wampcra: the challenge JSON string; cryptosign: the 32 random bytes in hex."""
    pubkey: str | None = None

