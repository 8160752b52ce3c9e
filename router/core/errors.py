"""Errors the core raises; frontends turn them into their protocol's error replies."""

from __future__ import annotations

from router.core.model import Args, Kwargs


class RouterError(Exception):
    """A request failed with a WAMP error URI (also the canonical error for other protocols)."""

    def __init__(self, uri: str, message: str | None = None, args: Args | None = None,
                 kwargs: Kwargs | None = None) -> None:
        super().__init__(message or uri)
        self.uri = uri
        self.message = message
        self.args_list = args if args is not None else ([message] if message else None)
        self.kwargs = kwargs


class Unencodable(Exception):
    """A value cannot be represented in a receiver's wire format (e.g. a CBOR tag for a
    JSON or MQTT receiver): that receiver is skipped, the others still get it."""


class PassthruRefused(Unencodable):
    """A Payload Passthru Mode payload for a receiver that cannot take it as it is (a WAMP
    session that did not announce the feature, or a byte receiver and a scheme other than
    ``mqtt``): skipped and counted, never sent converted."""


class ProtocolViolation(Exception):
    """The peer broke the protocol; its session must be aborted."""


INVALID_URI = "wamp.error.invalid_uri"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
NOT_AUTHORIZED = "wamp.error.not_authorized"
NO_SUCH_SUBSCRIPTION = "wamp.error.no_such_subscription"
NO_SUCH_REGISTRATION = "wamp.error.no_such_registration"
NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
NO_SUCH_SESSION = "wamp.error.no_such_session"
NO_SUCH_REALM = "wamp.error.no_such_realm"
PROCEDURE_ALREADY_EXISTS = "wamp.error.procedure_already_exists"
PROCEDURE_EXISTS_WITH_DIFFERENT_POLICY = (
    "wamp.error.procedure_exists_with_different_invocation_policy")
CANCELED = "wamp.error.canceled"
TIMEOUT = "wamp.error.timeout"
PROTOCOL_VIOLATION = "wamp.error.protocol_violation"
OPTION_NOT_ALLOWED = "wamp.error.option_not_allowed"
FEATURE_NOT_SUPPORTED = "wamp.error.feature_not_supported"
"""A passthru call (result) for a callee (caller) that did not announce Payload Passthru Mode."""
LIMIT_EXCEEDED = "wamp.error.limit_exceeded"
"""A request that would take a client-driven structure over its configured bound."""
KILLED = "wamp.close.killed"
"""Close reason of a session the router ends because its login no longer holds (a reload
removed its principal or changed its role)."""
UNAVAILABLE = "wamp.error.unavailable"
"""What a request needs (the engine's shared store) cannot be reached now; try again."""
