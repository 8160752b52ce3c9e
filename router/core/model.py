"""The core's data model, shared by every frontend."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

from router.core.topic import Topic, display, mqtt_name, wamp_uri

Args: TypeAlias = list[Any]
"""The positional payload of an event, call or error: application values the router passes
on without looking into them (whatever the serializer decoded), hence ``Any``."""
Kwargs: TypeAlias = dict[str, Any]
"""The keyword payload of an event, call or error (see :data:`Args`)."""
Details: TypeAlias = dict[str, Any]
"""A WAMP options or details dictionary: keys the router knows are read one by one and
checked (:mod:`router.core.options`); the others are passed on or ignored."""

LONGEST_EXPIRY = 0xFFFFFFFF
"""The most units of time a wire carries for a message's remaining lifetime: MQTT 5's
message expiry interval (seconds) and AMQP's header ttl (milliseconds) are both 32-bit."""


def remaining(expires_at: float, now: float, per_second: int = 1) -> int:
    """What is left of a message's lifetime (``expires_at``), in whole ``1 / per_second``
    seconds: rounded up, so a message not yet expired never says 0, and at most
    :data:`LONGEST_EXPIRY`, so an expiry further off than the receiver's wire can say (an
    HTTP ``expires_in`` of years, an MQTT interval of 136 years for an AMQP receiver's
    milliseconds) goes out as the longest it can, not as an encoding error that loses
    the message."""
    return min(LONGEST_EXPIRY, max(1, math.ceil((expires_at - now) * per_second)))


class _Unknown(Enum):
    """A publication's topic view not worked out yet (None is a real answer: no such name)."""

    UNKNOWN = "unknown"


_UNKNOWN = _Unknown.UNKNOWN


@dataclass(slots=True)
class SessionInfo:
    """Who a session is, as the core sees it (whatever the protocol)."""

    session_id: int
    realm: str
    authid: str
    authrole: str
    authmethod: str = "anonymous"
    authprovider: str = "static"
    """Who vouched for the identity: the router's configuration (``static``); a webhook's
    session says ``router``. A field, so the positional fields after it keep their places."""
    protocol: str = "wamp"
    transport: dict[str, Any] | None = None
    """The transport details, when a frontend has more to say than ``peer`` (else see
    :meth:`transport_details`)."""
    joined_at: float = field(default_factory=time.time)
    client_id: str | None = None
    """The MQTT client id (what ``%c`` in a permission rule stands for); None elsewhere."""
    peer: object = None
    """The client's address (``host:port``), for the transport details: the text, or what
    makes it when asked (``str(peer)``: a WAMP RawSocket or MQTT TCP session does not keep
    its own copy, about 70 bytes, while it is open); None: not known."""

    def transport_details(self) -> dict[str, Any]:
        """``transport``, or ``{"type": protocol, "peer": peer}`` made when asked: a dict
        kept per session would be 184 bytes of every idle session."""
        if self.transport is not None:
            return self.transport
        return {} if self.peer is None else {"type": self.protocol, "peer": str(self.peer)}

    def details(self) -> dict[str, Any]:
        """The session details of the session meta API."""
        return {
            "session": self.session_id,
            "authid": self.authid,
            "authrole": self.authrole,
            "authmethod": self.authmethod,
            "authprovider": self.authprovider,
            "transport": self.transport_details(),
        }


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Subscriber black/white lists of a publication; ``None`` means the list is absent.

    A receiver qualifies iff it passes every present list (AND); exclusion wins.
    """

    exclude: frozenset[int] | None = None
    exclude_authid: frozenset[str] | None = None
    exclude_authrole: frozenset[str] | None = None
    eligible: frozenset[int] | None = None
    eligible_authid: frozenset[str] | None = None
    eligible_authrole: frozenset[str] | None = None

    def admits(self, session: SessionInfo) -> bool:
        """May ``session`` receive the publication? Asked once per receiver on every publication
        with lists."""
        if self.exclude is not None and session.session_id in self.exclude:
            return False
        if self.exclude_authid is not None and session.authid in self.exclude_authid:
            return False
        if self.exclude_authrole is not None and session.authrole in self.exclude_authrole:
            return False
        if self.eligible is not None and session.session_id not in self.eligible:
            return False
        if self.eligible_authid is not None and session.authid not in self.eligible_authid:
            return False
        if self.eligible_authrole is not None and session.authrole not in self.eligible_authrole:
            return False
        return True

    @property
    def names_sessions(self) -> bool:
        """Session ids lose their meaning across a restart; such events must not outlive it."""
        return self.exclude is not None or self.eligible is not None

    def to_json(self) -> dict[str, list[Any]]:
        """The lists as stored with a retained event or sent to another node (only those
        present)."""
        return {name: sorted(getattr(self, name)) for name in ELIGIBILITY_KEYS
                if getattr(self, name) is not None}

    @classmethod
    def from_json(cls, data: dict[str, list[Any]]) -> "Eligibility":
        """The lists back from :meth:`to_json`'s form."""
        return cls(**{name: frozenset(values) for name, values in data.items()})


ELIGIBILITY_KEYS = ("exclude", "exclude_authid", "exclude_authrole",
                    "eligible", "eligible_authid", "eligible_authrole")

PPT_KEYS = ("ppt_scheme", "ppt_serializer", "ppt_cipher", "ppt_keyid")
"""The options of WAMP Payload Passthru Mode (AP), forwarded into EVENT / INVOCATION /
RESULT / ERROR details as the sender wrote them."""
TRANSPARENCY_KEYS = ("enc_algo", "enc_key", "enc_serializer")
"""The same for autobahn's older dialect ("payload transparency", what its cryptobox
``KeyRing`` sends): the payload is the message's last element itself, not in Arguments."""


@dataclass(frozen=True, slots=True)
class Passthru:
    """An opaque payload the router never decodes (WAMP Payload Passthru Mode): its bytes
    travel as the one argument ``args=[payload]``, and these options say what they are."""

    options: dict[str, str]
    """The ``ppt_*`` (or ``enc_*``) keys exactly as the sender gave them."""
    transparency: bool = False
    """autobahn's dialect (``enc_algo``...), announced as ``payload_transparency``."""

    @property
    def scheme(self) -> str:
        """``ppt_scheme`` (``enc_algo``): ``mqtt`` for plain bytes any byte-oriented
        receiver may take, anything else (``wamp``, ``cryptobox``, ``x_...``) only for
        WAMP receivers of the same dialect."""
        return self.options["enc_algo" if self.transparency else "ppt_scheme"]

    @property
    def feature(self) -> str:
        """The HELLO feature a receiver must have announced to get it."""
        return "payload_transparency" if self.transparency else "payload_passthru_mode"

    def to_json(self) -> list[Any]:
        """The stored form (retained and history records, cluster packs)."""
        return [self.transparency, self.options]

    @classmethod
    def from_json(cls, data: list[Any] | None) -> "Passthru | None":
        """Back from :meth:`to_json`; ``None`` for records made before passthru existed."""
        return None if data is None else cls(data[1], data[0])


@dataclass(slots=True, eq=False)
class Publication:
    """One published event, routed once to every matching subscription."""

    publication_id: int
    topic: Topic
    """The levels of the topic (see :mod:`router.core.topic`)."""
    args: Args | None
    kwargs: Kwargs | None
    publisher: SessionInfo | None
    disclose: bool = False
    eligibility: Eligibility | None = None
    exclude_me: bool = True
    retain: bool = False
    retain_ttl: float | None = None
    payload_bytes: int = 0
    """Encoded size of the payload as the publisher sent it (for the event log)."""
    qos: int = 0
    payload: bytes | None = None
    """The raw payload of a byte-oriented publisher (MQTT, AMQP), passed on unchanged."""
    properties: Details | None = None
    """MQTT 5 properties passed through to MQTT receivers (user properties, content type...)."""
    expires_at: float | None = None
    """Message expiry: the event is not delivered after this time."""
    amqp: bytes | None = None
    """The bare message (properties, application-properties, body) of an AMQP publisher,
    encoded as it arrived: AMQP receivers get it unchanged."""
    timestamp: float = field(default_factory=time.time)
    passthru: Passthru | None = None
    """Set for a Payload Passthru Mode publication: ``args`` is ``[opaque bytes]``, sent
    only to receivers that can take it as it is (see :mod:`router.core.payload`)."""
    wire_cache: dict[str, Any] | None = None
    """Per-frontend encodings shared by all receivers (e.g. one WAMP EVENT per subscription)
    during one dispatch; see :meth:`encodings`."""
    uri_view: str | None | _Unknown = field(default=_UNKNOWN, repr=False)
    """The topic as a WAMP URI of its realm (``None``: it is not one), once asked for."""
    mqtt_view: str | None | _Unknown = field(default=_UNKNOWN, repr=False)
    """The topic as an MQTT topic name (``None``: it is not one), once asked for."""

    def encodings(self) -> dict[str, Any]:
        """The wire-encodings cache, created on first use: retained and historic events
        spend most of their life without one."""
        cache = self.wire_cache
        if cache is None:
            cache = self.wire_cache = {}
        return cache

    def uri(self, uri_check: str) -> str | None:
        """The topic as a WAMP URI of the realm (whose ``uri_check`` is given), built once
        per publication whatever the number of receivers; ``None`` if it is not one."""
        view = self.uri_view
        if view is _UNKNOWN:
            view = self.uri_view = wamp_uri(self.topic, uri_check)
        return view

    def mqtt_topic(self) -> str | None:
        """The topic as an MQTT topic name, built once per publication; ``None`` if it
        cannot be one."""
        view = self.mqtt_view
        if view is _UNKNOWN:
            view = self.mqtt_view = mqtt_name(self.topic)
        return view

    @property
    def name(self) -> str:
        """The topic as logs and incident details show it."""
        return display(self.topic)

    def expired(self) -> bool:
        """Has its message expiry passed? Then no queue may deliver it any more."""
        expires_at = self.expires_at
        return expires_at is not None and expires_at <= time.time()

    def admits(self, session: SessionInfo) -> bool:
        """Would ``session`` have received this event as a subscriber when it was published?"""
        if (self.exclude_me and self.publisher is not None
                and session.session_id == self.publisher.session_id):
            return False
        return self.eligibility is None or self.eligibility.admits(session)

    def publisher_details(self) -> dict[str, Any]:
        """The publisher identity an EVENT discloses, if disclosure applies."""
        if not self.disclose or self.publisher is None:
            return {}
        return {
            "publisher": self.publisher.session_id,
            "publisher_authid": self.publisher.authid,
            "publisher_authrole": self.publisher.authrole,
        }
