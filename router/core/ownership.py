"""Who a client is, and who owns the state it leaves behind.

An anonymous client is given an authid by the router, ``anonymous-<session id in hex>``:
never one it picks, so no anonymous client can pass for a principal in an
``eligible_authid`` list or an ACL pattern built from the authid. State that outlives a
connection (an MQTT session, an AMQP durable link) belongs to its creator: the principal
(its authid), or, for a session created anonymously, the anonymous clients as a class (the
router cannot tell one anonymous client from another; only the client id or the container
id and link name find the state again). A client may take over or resume only state of its
own owner; anything else is refused and left as it is.
"""

from __future__ import annotations

import unicodedata

from router.core.model import SessionInfo

ANONYMOUS = "anonymous"
"""The authmethod of anonymous clients (and the prefix of their authids)."""


def anonymous_authid(session_id: int) -> str:
    """The router-assigned authid of an anonymous client with this session id."""
    return f"{ANONYMOUS}-{session_id:x}"


def assigned_to_anonymous(authid: str) -> bool:
    """Whether ``authid`` has the form the router gives anonymous clients (no principal may
    be named so: an ``eligible_authid`` list must not reach an anonymous client by chance)."""
    return authid.startswith(ANONYMOUS + "-")


def principal_name_refusal(authid: str) -> str | None:
    """Why ``authid`` cannot name a principal, None when it can: empty, a control character
    (a newline in a name forges log lines and breaks one-line-per-principal files), a lone
    surrogate (no log or store can write it), or the router's own ``anonymous-...`` form."""
    if not authid:
        return "a principal's name may not be empty"
    if any(unicodedata.category(character) == "Cc" for character in authid):
        return "a principal's name may not hold a control character (a newline, a tab)"
    try:
        authid.encode()
    except UnicodeEncodeError:
        return "a principal's name must be Unicode text (no lone surrogate)"
    if assigned_to_anonymous(authid):
        return ("a principal may not be named 'anonymous-...': the router names anonymous "
                "clients so")
    return None


def owner(authid: str, authmethod: str) -> str:
    """The owner of state created by this identity, as one string (stores keep it):
    ``principal:<authid>``, or ``anonymous`` for the anonymous clients as a class (told
    apart by the authmethod, so a principal whose name looks like an anonymous authid never
    owns anonymous state)."""
    return ANONYMOUS if authmethod == ANONYMOUS else f"principal:{authid}"


class AnonymousInfo(SessionInfo):
    """The info of an anonymous session (WAMP, MQTT): its authid, which the router
    chooses, is :func:`anonymous_authid` of its session id, made when asked (kept, the text
    would be 72 bytes of every idle anonymous session)."""

    __slots__ = ()

    @property
    def authid(self) -> str:
        """``anonymous-<session id in hex>``."""
        return anonymous_authid(self.session_id)

    @authid.setter
    def authid(self, authid: str | None) -> None:
        """What :class:`SessionInfo` sets when made (None): the name is the session id's."""
