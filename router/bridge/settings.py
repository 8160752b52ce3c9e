"""The ``bridges`` block of ``config.json``: what each bridge connects to and forwards.

Here, apart from the bridge's code, so that reading the configuration loads no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OUT, IN, BOTH = "out", "in", "both"
DIRECTIONS = (OUT, IN, BOTH)
PROTOCOLS = {"3.1.1": 4, "5": 5}
"""``protocol`` in the configuration -> the MQTT protocol level on the wire."""


@dataclass(frozen=True)
class BridgeTls:
    """TLS towards the remote broker."""

    ca: Path | None = None
    """PEM CA certificates the remote's certificate must chain to (None: the system's)."""
    cert: Path | None = None
    """PEM client certificate shown to the remote (with ``key``), if it asks for one."""
    key: Path | None = None
    verify_hostname: bool = True
    """Check that the remote's certificate names ``host``; off only for a test broker or
    an address the certificate cannot name."""


@dataclass(frozen=True)
class TopicMapping:
    """One forwarded topic filter, written relative to both prefixes (as Mosquitto's
    ``topic`` line): local ``local_prefix + topic`` is remote ``remote_prefix + topic``."""

    topic: str
    direction: str = OUT
    qos: int = 1
    """Highest QoS forwarded (a message keeps its own QoS if lower) and the QoS of the
    bridge's subscription on the remote broker."""
    local_prefix: str = ""
    remote_prefix: str = ""

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.topic

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.topic

    @property
    def goes_out(self) -> bool:
        return self.direction != IN

    @property
    def comes_in(self) -> bool:
        return self.direction != OUT

    def to_remote(self, local_topic: str) -> str:
        """The remote topic of a local topic this mapping's local filter matched."""
        return self.remote_prefix + local_topic[len(self.local_prefix):]

    def to_local(self, remote_topic: str) -> str:
        """The local topic of a remote topic this mapping's remote filter matched."""
        return self.local_prefix + remote_topic[len(self.remote_prefix):]


@dataclass(frozen=True)
class BridgeConfig:
    """One bridge: a connection from one realm to one remote MQTT broker."""

    name: str
    realm: str
    host: str
    role: str
    """The realm role the bridge acts as (authid ``bridge-<name>``): its subscriptions for
    ``out`` mappings and its publications for ``in`` mappings are checked against it."""
    topics: tuple[TopicMapping, ...]
    port: int = 1883
    protocol: int = 5
    """4 (MQTT 3.1.1) or 5."""
    client_id: str = ""
    """Empty: ``bridge-<name>``."""
    username: str | None = None
    password: str | None = None
    clean_session: bool = False
    """False: the remote keeps the bridge's session (its subscriptions and the messages
    that arrive for them) while the bridge is away."""
    session_expiry: int = 86_400
    """MQTT 5: seconds the remote keeps that session after the connection ends."""
    keep_alive: int = 60
    tls: BridgeTls | None = None
    max_queued: int = 10_000
    """QoS >= 1 messages waiting for the remote (stored); one more is dropped, counted."""
    max_inflight: int = 20
    """QoS >= 1 messages sent and not yet acknowledged (lower if the remote says so)."""
    reconnect_min: float = 1.0
    """Seconds before the first reconnect; doubled after each failed attempt..."""
    reconnect_max: float = 60.0
    """...up to this."""
    connect_timeout: float = 10.0
    """Seconds a TCP connect and then the CONNACK may take."""

    @property
    def authid(self) -> str:
        return f"bridge-{self.name}"

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or f"bridge-{self.name}"
