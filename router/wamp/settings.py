"""Per-realm settings of the WAMP frontend (the ``wamp`` block of a realm file)."""

from __future__ import annotations

from dataclasses import dataclass

from router.core.qos import ENFORCE_MINIMUM


@dataclass(frozen=True)
class WampSettings:
    granted_qos: int = 0
    """QoS granted to WAMP subscriptions that do not ask (SUBSCRIBE option ``_qos``)."""
    qos_policy: str = ENFORCE_MINIMUM
    """Default receiver policy; a SUBSCRIBE may ask for another with ``_qos_policy``."""
    ack_timeout: float = 10.0
    """Seconds to wait for EVENT_RECEIVED before delivering an acknowledged event again."""
    max_redeliveries: int = 3
    max_testaments: int = 100
    """Testaments one session may hold (both scopes together); more are refused."""
    max_unacked: int = 1000
    """Acknowledged events a session may have unanswered; more are dropped (counted)."""
