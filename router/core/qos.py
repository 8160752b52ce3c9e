"""Delivery QoS across protocols, decided in one place.

A receiver gets a publication at ``min(published, granted)`` by default, as MQTT
does. A receiver may ask for another policy: ``exact`` (the publisher's QoS,
whatever was granted), ``minimum`` (the default) or ``maximum``
(``max(published, granted)``).
"""

from __future__ import annotations

AT_MOST_ONCE, AT_LEAST_ONCE, EXACTLY_ONCE = 0, 1, 2
QOS_LEVELS = (AT_MOST_ONCE, AT_LEAST_ONCE, EXACTLY_ONCE)

EXACT, ENFORCE_MINIMUM, ENFORCE_MAXIMUM = "exact", "minimum", "maximum"
POLICIES = (EXACT, ENFORCE_MINIMUM, ENFORCE_MAXIMUM)


def delivered_qos(published: int, granted: int, policy: str = ENFORCE_MINIMUM) -> int:
    """The QoS a receiver gets a publication with."""
    if policy == ENFORCE_MINIMUM:
        return published if published < granted else granted
    if policy == EXACT:
        return published
    if policy == ENFORCE_MAXIMUM:
        return published if published > granted else granted
    raise ValueError(f"unknown QoS policy {policy!r} (one of {', '.join(POLICIES)})")
