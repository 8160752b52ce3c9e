"""Per-realm protocol settings: the ``wamp``, ``mqtt`` and ``amqp`` blocks of a realm file.

Here, outside the frontend packages, so that reading the configuration loads no frontend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    max_subscriptions: int = 10_000
    """Subscriptions one session may hold; more are refused (``limit_exceeded``)."""
    max_registrations: int = 10_000
    """Registrations one session may hold; more are refused (``limit_exceeded``)."""
    max_pending_calls: int = 1000
    """Calls one session may have in progress (sent to a callee, not answered yet); more
    are refused (``limit_exceeded``)."""


@dataclass(frozen=True)
class MqttSettings:
    """Per-realm MQTT settings (the ``mqtt`` block of a realm file)."""

    payload_mapping: str = "json"
    qos_policy: str = ENFORCE_MINIMUM
    max_qos: int = 2
    max_packet_size: int = 1024 * 1024
    max_queued: int = 10_000
    max_session_expiry: int = 86_400
    """Seconds a persistent session outlives its connection at most, whatever the client
    asks (MQTT 3.1.1 clean session 0, MQTT 5 session expiry 0xFFFFFFFF = never included)."""
    max_keepalive: int = 65_535
    """Seconds of keep alive at most (0: no maximum); see ``MqttConnection``."""
    topic_alias_maximum: int = 16
    """Topic aliases per connection, inbound (announced in CONNACK) and outbound (at most
    the client's own maximum)."""
    max_subscriptions: int = 10_000
    """Subscriptions one session may hold; a filter past it gets SUBACK 0x97 (0x80)."""
    max_inbound_qos2: int = 1_000
    """QoS 2 messages of one session received (PUBREC sent) and awaiting PUBREL; one more
    closes the connection."""


@dataclass(frozen=True)
class AmqpSettings:
    """Per-realm AMQP settings (the ``amqp`` block of a realm file)."""

    payload_mapping: str = "json"
    """By default the realm's ``mqtt.payload_mapping``: MQTT and AMQP bytes map alike."""
    qos_policy: str = ENFORCE_MINIMUM
    """Default receiver policy; a receiver link may ask for another (``qos-policy``)."""
    max_queued: int = 10_000
    """Messages waiting to be sent on one receiver link (for credit, or while its connection
    is paused); more are dropped (counted as ``queue_full``)."""
    inbound_window: int = 100
    """Unsettled deliveries a client's sender link may have: credit is given back only as
    deliveries are answered, so a slow store holds the sender instead of queueing."""
    max_link_expiry: int = 86_400
    """Seconds a durable receiver link outlives its detach at most (expiry policy ``never``
    and longer timeouts included)."""
    max_links: int = 1_000
    """Links one connection may have attached; one more is refused
    (``amqp:resource-limit-exceeded``)."""
    max_sessions: int = 16
    """Sessions one connection may have begun (its channel-max): each may hold a message
    under way, so together they bound what a connection's unfinished messages hold."""


@dataclass(frozen=True)
class WebhookSettings:
    """One webhook of a realm (an entry of the realm file's ``webhooks`` list): the events of
    a topic pattern POSTed as JSON to a URL (see docs/webhooks.md)."""

    name: str
    """Unique in the realm: names the webhook's durable queue, its metrics and incidents."""
    url: str
    """``http://`` or ``https://`` URL each event is POSTed to."""
    topic: str
    """The pattern subscribed to: a URI of the realm, or an MQTT filter with match ``mqtt``."""
    match: str = "exact"
    authid: str | None = None
    """The principal the webhook subscribes as (its role's rules apply); None: the realm's
    anonymous role."""
    secret: str | None = None
    """Key of the ``X-Webhook-Signature`` HMAC-SHA256; None: requests are not signed."""
    qos: int = 1
    """1: events wait in a durable queue until the target answers 2xx; 0: in memory only."""
    qos_policy: str = "maximum"
    """How an event's QoS follows from the publication's and ``qos`` (router.core.qos)."""
    max_queue: int = 10_000
    """Events waiting for the target at most; one more is dropped (counted)."""
    max_queue_bytes: int = 64 * 1024 * 1024
    """Bytes of request bodies waiting at most; one more event is dropped (counted)."""
    timeout: float = 10.0
    """Seconds one request may take (connect, send, answer) before it counts as failed."""
    min_backoff: float = 0.5
    """Seconds before the first retry of a failed request; doubled at each failure."""
    max_backoff: float = 60.0
    """Seconds between two retries at most."""
    max_attempts: int | None = None
    """Requests for one event before it is given up (counted); None: retried until taken."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra request headers (an ``Authorization`` the target expects, say)."""
    node: str | None = None
    """The node that runs the webhook on the Redis engine (its ``engine.node``); the others
    leave it alone. None on the embedded engine."""
    ca: Path | None = None
    """PEM file of the CA(s) an ``https`` target's certificate must chain to instead of the
    system's (a private CA); None: the system's trusted CAs."""
