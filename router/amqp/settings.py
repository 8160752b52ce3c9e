"""Per-realm settings of the AMQP frontend (the ``amqp`` block of a realm file)."""

from __future__ import annotations

from dataclasses import dataclass

from router.core.qos import ENFORCE_MINIMUM


@dataclass(frozen=True)
class AmqpSettings:
    payload_mapping: str = "json"
    """Shared with MQTT: the realm's ``mqtt.payload_mapping``."""
    qos_policy: str = ENFORCE_MINIMUM
    max_queued: int = 10_000
    max_message_size: int = 1024 * 1024
    inbound_window: int = 100
    """Unsettled deliveries a client's sender link may have: credit is given back only as
    deliveries are answered, so a slow store holds the sender instead of queueing."""
    max_link_expiry: int = 86_400
    """Seconds a durable receiver link outlives its detach at most (expiry policy ``never``
    and longer timeouts included)."""
