"""AMQP error conditions the router sends, and how router errors map to them."""

from __future__ import annotations

from proton import Condition

from router.amqp.body import UnsupportedBody
from router.core import errors
from router.core.errors import RouterError

UNAUTHORIZED = "amqp:unauthorized-access"
INVALID_FIELD = "amqp:invalid-field"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
SHARED_GROUP = "x-shared-group"
"""Receiver link property: join this shared group (each message to one member)."""
INTERNAL_ERROR = "amqp:internal-error"
LINK_STOLEN = "amqp:link:stolen"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"


class AttachRefused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def router_error_condition(exc: RouterError) -> str:
    if exc.uri == errors.LIMIT_EXCEEDED:
        return RESOURCE_LIMIT_EXCEEDED
    return UNAUTHORIZED if exc.uri == errors.NOT_AUTHORIZED else INVALID_FIELD


def refusal_condition(exc: Exception) -> Condition:
    """The rejected outcome's error for an inbound message the router refused."""
    if isinstance(exc, UnsupportedBody):
        return Condition(NOT_IMPLEMENTED, str(exc))
    if isinstance(exc, AttachRefused):
        return Condition(exc.condition, exc.description)
    if isinstance(exc, RouterError):
        return Condition(router_error_condition(exc), exc.message or exc.uri)
    return Condition(INVALID_FIELD, str(exc))
