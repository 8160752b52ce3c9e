"""Node configuration (``config.json``) and realm files (``realms/<name>.json``).

Every problem is reported as ``<file>: <key path>: <what is wrong>`` and the
router refuses to start; ``python -m router check-config`` runs the same checks.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from router.bridge.settings import (DIRECTIONS, PROTOCOLS, BridgeConfig, BridgeTls,
                                   TopicMapping)
from router.core.authorization import ACTIONS, Authorizer, PermissionRule, Role
from router.core.credentials import (MOSQUITTO_HASHES, SCHEME, Principal, WampCra,
                                     normalize_pubkey)
from router.core.engine import ClusterLimits
from router.core.history import HistoryRule
from router.core.model import SessionInfo
from router.core.ownership import principal_name_refusal
from router.core.payload import MAPPINGS
from router.core.qos import POLICIES, QOS_LEVELS
from router.core.topic import SERVER_OWNED
from router.core.retention import RetentionPolicy
from router.eventlog.realm_log import RealmLogSettings
from router.eventlog.schema import KINDS
from router.flow import FlowLimits
from router.settings import AmqpSettings, MqttSettings, WampSettings, WebhookSettings
from router.core.topic import SHARE_PREFIX, Topic, from_mqtt, from_uri, valid_topic_filter
from router.core.uri import MATCH_POLICIES, MQTT, is_valid_uri
from router.verifier import MAX_PENDING
from router.limits import LimitSettings

SERIALIZERS = ("json", "msgpack", "cbor")
LISTENER_TYPES = ("websocket", "rawsocket", "mqtt", "mqtt-websocket", "amqp", "metrics", "http")
MQTT_LISTENERS = ("mqtt", "mqtt-websocket")
REALM_LISTENERS = MQTT_LISTENERS + ("amqp", "http")
AMQP_DEFAULT_PORT = 5672
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024
RAWSOCKET_MIN, RAWSOCKET_MAX = 512, 2 ** 24
CLIENT_CERT_MODES = ("none", "optional", "required")
MAX_FOUR_BYTE = 0xFFFFFFFF
LIMIT_KEYS = {"handshake_timeout", "max_connections", "max_connections_per_host"}
FLOW_KEYS = {"max_buffered_bytes", "max_buffered_messages", "slow_consumer_timeout"}


class ConfigError(Exception):
    """A configuration problem, naming the file and the key."""

    def __init__(self, source: Path | str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")
        self.source = str(source)
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class TlsConfig:
    """TLS of one listener: PEM files, and whether clients must show a certificate."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_certs: str = "none"
    """"none", "optional" or "required"; a verified client certificate's subject CN is
    the authid of the principal it logs in as (authmethod "tls")."""


@dataclass(frozen=True)
class MetricsAuth:
    """What a scrape of the metrics listener must show: a bearer token or a user and password
    (HTTP basic); compared in constant time."""

    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class ListenerConfig:
    type: str
    host: str
    port: int
    path: str = "/ws"
    serializers: tuple[str, ...] = SERIALIZERS
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    realm: str | None = None
    """The realm an MQTT or AMQP listener's clients join (neither protocol names one)."""
    tls: TlsConfig | None = None
    limits: LimitSettings = field(default_factory=LimitSettings)
    """Connection caps and the handshake timeout (``handshake_timeout``,
    ``max_connections``, ``max_connections_per_host``)."""
    flow: FlowLimits = field(default_factory=FlowLimits)
    """What may be written to a client that does not read, and for how long."""
    auth: MetricsAuth | None = None
    """A metrics listener's required credentials (None: open, for a loopback listener)."""
    http: "HttpSettings | None" = None
    """An ``http`` listener's own bounds (calls, Server-Sent Events streams)."""


@dataclass(frozen=True)
class HttpSettings:
    """The bounds of an ``http`` listener (see docs/http.md); its request body limit is the
    listener's ``max_message_size``."""

    call_timeout: float = 30.0
    """Seconds a ``POST /call`` waits when the request names no timeout, and the most it may
    name: an HTTP client cannot cancel a call, so none may wait for ever."""
    sse_max_queued: int = 1000
    """Events waiting for one Server-Sent Events reader whose socket does not drain; at the
    bound the stream is closed, counted as ``slow_consumer``."""
    sse_keepalive: float = 15.0
    """Seconds between keep-alive comments on an idle event stream."""
    max_streams: int = 1000
    """Open event streams on the listener; one more is refused with 503."""
    max_recent_incidents: int = 100
    """Incidents ``GET /incidents`` can show (the node keeps the most recent ones)."""
    login_cache_ttl: float = 60.0
    """Seconds a verified Basic ``authid:ticket`` is taken without a new password check
    (0: every request is checked)."""
    login_cache_size: int = 1000
    """Verified Basic credentials remembered; at the bound the least recently used goes."""


@dataclass(frozen=True)
class RealmConfig:
    name: str
    source: Path
    roles: dict[str, list[PermissionRule]]
    uri_check: str = "strict"
    anonymous_role: str | None = None
    principals: dict[str, Principal] = field(default_factory=dict)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    history: tuple[HistoryRule, ...] = ()
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    wamp: WampSettings = field(default_factory=WampSettings)
    amqp: AmqpSettings = field(default_factory=AmqpSettings)
    webhooks: tuple[WebhookSettings, ...] = ()
    """Topic patterns whose events are POSTed to URLs (router/webhooks)."""


@dataclass(frozen=True)
class EventLogConfig:
    enabled: bool = True
    flush_interval: float = 1.0
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_age: float = 300.0
    max_queued_records: int = 100_000
    """Records waiting for the writer thread; more are dropped (counted)."""
    realms: dict[str, RealmLogSettings] = field(default_factory=dict)

    def for_realm(self, name: str) -> RealmLogSettings:
        return self.realms.get(name, RealmLogSettings(enabled=self.enabled))


@dataclass(frozen=True)
class StoreConfig:
    """The node's SQLite database."""

    max_bytes: int | None = None
    """Largest size the database may grow to; at it, writes fail as on a full disk (so
    acknowledgements that need them become errors). None: as large as the disk allows."""
    max_queued_writes: int = 50_000
    """Writes waiting for the writer thread above which publishers' reads pause (they
    resume below half of it); nothing is dropped."""


@dataclass(frozen=True)
class MemoryConfig:
    """Giving freed memory back to the operating system (see router/memory.py)."""

    trim_interval: float = 10.0
    """Seconds between heap trims while the router runs (0: only after connections close)."""


@dataclass(frozen=True)
class NodeConfig:
    source: Path
    data_dir: Path
    listeners: tuple[ListenerConfig, ...]
    realms: dict[str, RealmConfig]
    shutdown_timeout: float = 5.0
    eventlog: EventLogConfig = field(default_factory=EventLogConfig)
    login_backoff: LoginBackoff = field(default_factory=lambda: LoginBackoff())
    store: StoreConfig = field(default_factory=StoreConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    engine: EngineConfig = field(default_factory=lambda: EngineConfig())
    sys_interval: float = 10.0
    """Seconds between ``$SYS`` / ``wamp.router.on_stats`` publications (0: none)."""
    cluster: ClusterLimits = field(default_factory=ClusterLimits)
    """What a node has under way with Redis and the other nodes (Redis engine only)."""
    admin_socket: Path | None = None
    """The local operators' Unix socket (:mod:`router.admin_socket`); None: none."""
    bridges: tuple[BridgeConfig, ...] = ()
    """Connections to other MQTT brokers (:mod:`router.bridge`)."""


@dataclass(frozen=True)
class EngineConfig:
    """Where realms share state beyond this node (see router/core/engine.py)."""

    type: str = "embedded"
    """``embedded``: one node, SQLite. ``redis``: every node on the same Redis serves the
    same realms."""
    url: str | None = None
    """redis://host:port/db (``redis`` only)."""
    node: str | None = None
    """This node's name, unique among the nodes on that Redis (``redis`` only)."""
    redis_address: tuple[str, int, int] | None = None
    """(host, port, db) of ``url``."""


@dataclass(frozen=True)
class LoginBackoff:
    """After ``after_failures`` failed logins from one host within ``window`` seconds, each
    further refusal is delayed min(2 ** (failures - after_failures), max_delay) seconds."""

    after_failures: int = 3
    window: float = 60.0
    max_delay: float = 8.0
    max_pending_verifications: int = MAX_PENDING
    """Password checks waiting for or running in the verifier's threads; over it a
    login is refused at once as "server busy"."""


class _Reader:
    """Typed access to one JSON object, with errors that name the file and key path."""

    def __init__(self, source: Path, data: Any, path: str = "") -> None:
        self.source = source
        self.data = data
        self.path = path

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self._join(key), problem)

    def _join(self, key: str) -> str:
        if not self.path:
            return key
        return f"{self.path}{key}" if key.startswith("[") else f"{self.path}.{key}"

    def require_object(self) -> dict:
        if not isinstance(self.data, dict):
            raise ConfigError(self.source, self.path or "(top level)", "must be a JSON object")
        return self.data

    def reject_unknown(self, known: set[str]) -> None:
        """Refuse every key not in ``known``, all of them in one error, each with the known
        key it most likely misspells."""
        unknown = [key for key in self.require_object() if key not in known]
        if not unknown:
            return

        def hint(key: str) -> str:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
            return f" (did you mean '{close[0]}'?)" if close else ""

        known_list = f"(known keys: {', '.join(sorted(known))})"
        if len(unknown) == 1:
            raise self.fail(unknown[0], f"unknown key{hint(unknown[0])} {known_list}")
        named = ", ".join(f"'{key}'{hint(key)}" for key in unknown)
        raise ConfigError(self.source, self.path, f"unknown keys {named} {known_list}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        data = self.require_object()
        if key not in data:
            if default is ...:
                raise self.fail(key, "is required")
            return default
        value = data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if type(value) not in kinds or (type(value) is bool and bool not in kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise self.fail(key, f"must be {names}, got {json.dumps(value)}")
        return value

    def child(self, key: str | int, data: Any) -> "_Reader":
        suffix = f"[{key}]" if isinstance(key, int) else key
        return _Reader(self.source, data, self._join(suffix))


class _NotJsonNumber(ValueError):
    """NaN, Infinity or a number too large for a float: Python's json module reads them,
    JSON has none, and NaN would pass every range check (``NaN <= 0`` is false)."""


def _not_a_constant(text: str) -> Any:
    raise _NotJsonNumber(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotJsonNumber(f"{text} is too large for a number")
    return value


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"not UTF-8 text (byte {exc.start}: "
                          f"{exc.object[exc.start:exc.start + 1]!r})") from exc
    try:
        return json.loads(text, parse_constant=_not_a_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ConfigError(path, "", f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}") from exc
    except _NotJsonNumber as exc:
        raise ConfigError(path, "", f"invalid JSON: {exc}") from exc


def _tls(reader: _Reader, base: Path) -> TlsConfig:
    reader.reject_unknown({"cert", "key", "ca", "client_certs"})
    paths = {}
    for key in ("cert", "key", "ca"):
        value = (reader.get(key, (str, type(None)), None) if key == "ca"
                 else reader.get(key, str))
        if value is None:
            paths[key] = None
            continue
        path = base / value
        if not path.is_file():
            raise reader.fail(key, f"file {path} does not exist")
        paths[key] = path
    mode = reader.get("client_certs", str, "none")
    if mode not in CLIENT_CERT_MODES:
        raise reader.fail("client_certs", f"must be one of {', '.join(CLIENT_CERT_MODES)}, "
                          f"got '{mode}'")
    if mode != "none" and paths["ca"] is None:
        raise reader.fail("ca", f"is required when client_certs is '{mode}' (the CA that "
                          "signs client certificates)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(paths["cert"], paths["key"])
    except (ssl.SSLError, OSError) as exc:
        raise reader.fail("cert", f"cannot use {paths['cert']} with key {paths['key']} "
                          f"({exc.__class__.__name__}: {exc})") from None
    if paths["ca"] is not None:
        try:
            context.load_verify_locations(paths["ca"])
        except (ssl.SSLError, OSError) as exc:
            raise reader.fail("ca", f"cannot read CA certificates from {paths['ca']} ({exc})") \
                from None
    return TlsConfig(paths["cert"], paths["key"], paths["ca"], mode)


def _metrics_auth(reader: _Reader) -> MetricsAuth:
    reader.reject_unknown({"bearer_token", "basic"})
    token = reader.get("bearer_token", (str, type(None)), None)
    basic_data = reader.get("basic", (dict, type(None)), None)
    if (token is None) == (basic_data is None):
        raise reader.fail("bearer_token", "give exactly one of 'bearer_token' and 'basic'")
    if token is not None:
        if not token:
            raise reader.fail("bearer_token", "must not be empty")
        return MetricsAuth(bearer_token=token)
    basic = reader.child("basic", basic_data)
    basic.reject_unknown({"username", "password"})
    username, password = basic.get("username", str), basic.get("password", str)
    if not username or ":" in username:
        raise basic.fail("username", "must be a non-empty name without ':'")
    if not password:
        raise basic.fail("password", "must not be empty")
    return MetricsAuth(username=username, password=password)


def _metrics_listener(reader: _Reader, base: Path) -> ListenerConfig:
    """A ``metrics`` listener: HTTP(S) serving the Prometheus text format at ``path``."""
    reader.reject_unknown({"type", "host", "port", "path", "tls", "auth"})
    host = reader.get("host", str, "127.0.0.1")
    port = reader.get("port", int)
    if not 0 <= port <= 65535:
        raise reader.fail("port", f"must be between 0 and 65535, got {port}")
    path = reader.get("path", str, "/metrics")
    if not path.startswith("/"):
        raise reader.fail("path", f"must start with '/', got '{path}'")
    tls_data = reader.get("tls", (dict, type(None)), None)
    tls = _tls(reader.child("tls", tls_data), base) if tls_data is not None else None
    auth_data = reader.get("auth", (dict, type(None)), None)
    auth = _metrics_auth(reader.child("auth", auth_data)) if auth_data is not None else None
    return ListenerConfig("metrics", host, port, path, tls=tls, auth=auth)


def _listener(reader: _Reader, realm_names: list[str], base: Path) -> ListenerConfig:
    kind = reader.get("type", str)
    if kind not in LISTENER_TYPES:
        raise reader.fail("type", f"must be one of {', '.join(LISTENER_TYPES)}, got '{kind}'")
    if kind == "metrics":
        return _metrics_listener(reader, base)
    if kind in REALM_LISTENERS:
        reader.reject_unknown({"type", "host", "port", "max_message_size", "realm", "tls"}
                              | LIMIT_KEYS | (HTTP_KEYS if kind == "http"
                                              else FLOW_KEYS | {"path"}))
        realm = reader.get("realm", str)
        if realm not in realm_names:
            raise reader.fail("realm", f"'{realm}' is not one of the realms this node loads")
    else:
        reader.reject_unknown({"type", "host", "port", "path", "serializers", "max_message_size",
                               "tls"} | LIMIT_KEYS | FLOW_KEYS)
        realm = None
    host = reader.get("host", str, "127.0.0.1")
    port = reader.get("port", int, AMQP_DEFAULT_PORT if kind == "amqp" else ...)
    if not 0 <= port <= 65535:
        raise reader.fail("port", f"must be between 0 and 65535, got {port}")
    path = reader.get("path", str, "/mqtt" if kind == "mqtt-websocket" else "/ws")
    if kind.endswith("websocket") and not path.startswith("/"):
        raise reader.fail("path", f"must start with '/', got '{path}'")
    serializers = tuple(reader.get("serializers", list, list(SERIALIZERS)))
    if not serializers:
        raise reader.fail("serializers", "must name at least one serializer")
    for index, name in enumerate(serializers):
        if name not in SERIALIZERS:
            raise reader.fail(f"serializers[{index}]",
                              f"must be one of {', '.join(SERIALIZERS)}, got {json.dumps(name)}")
    size = reader.get("max_message_size", int, DEFAULT_MAX_MESSAGE_SIZE)
    low, high = (RAWSOCKET_MIN, RAWSOCKET_MAX) if kind == "rawsocket" else (512, 2 ** 30)
    if not low <= size <= high:
        raise reader.fail("max_message_size", f"must be between {low} and {high}, got {size}")
    tls_data = reader.get("tls", (dict, type(None)), None)
    tls = _tls(reader.child("tls", tls_data), base) if tls_data is not None else None
    return ListenerConfig(kind, host, port, path, serializers, size, realm, tls, _limits(reader),
                          _flow(reader), http=_http(reader) if kind == "http" else None)


HTTP_KEYS = {"call_timeout", "sse_max_queued", "sse_keepalive", "max_streams",
             "max_recent_incidents", "login_cache_ttl", "login_cache_size"}


def _http(reader: _Reader) -> HttpSettings:
    defaults = HttpSettings()
    login_cache_ttl = reader.get("login_cache_ttl", (int, float), defaults.login_cache_ttl)
    if login_cache_ttl < 0:
        raise reader.fail("login_cache_ttl",
                          f"must not be negative (0 turns the cache off), got {login_cache_ttl}")
    return HttpSettings(
        float(_positive(reader, "call_timeout", (int, float), defaults.call_timeout)),
        _positive(reader, "sse_max_queued", int, defaults.sse_max_queued),
        float(_positive(reader, "sse_keepalive", (int, float), defaults.sse_keepalive)),
        _positive(reader, "max_streams", int, defaults.max_streams),
        _positive(reader, "max_recent_incidents", int, defaults.max_recent_incidents),
        float(login_cache_ttl),
        _positive(reader, "login_cache_size", int, defaults.login_cache_size))


def _limits(reader: _Reader) -> LimitSettings:
    defaults = LimitSettings()
    return LimitSettings(
        float(_positive(reader, "handshake_timeout", (int, float), defaults.handshake_timeout)),
        _positive(reader, "max_connections", int, defaults.max_connections),
        _positive(reader, "max_connections_per_host", int, defaults.max_connections_per_host))


def _flow(reader: _Reader) -> FlowLimits:
    defaults = FlowLimits()
    return FlowLimits(
        _positive(reader, "max_buffered_bytes", int, defaults.max_buffered_bytes),
        _positive(reader, "max_buffered_messages", int, defaults.max_buffered_messages),
        float(_positive(reader, "slow_consumer_timeout", (int, float),
                        defaults.slow_consumer_timeout)))


def _rule(reader: _Reader, check: str) -> PermissionRule:
    if "topic" in reader.data:
        reader.reject_unknown({"topic", "allow", "disclose"})
        pattern, match = _topic_filter(reader), MQTT
    else:
        reader.reject_unknown({"uri", "match", "allow", "disclose"})
        pattern, match = _pattern(reader, check)
    allow = reader.get("allow", list)
    for index, action in enumerate(allow):
        if action not in ACTIONS:
            raise reader.fail(f"allow[{index}]",
                              f"must be one of {', '.join(ACTIONS)}, got {json.dumps(action)}")
    return PermissionRule(pattern, match, frozenset(allow), reader.get("disclose", bool, False))


def _topic_filter(reader: _Reader) -> Topic:
    """The levels of a rule's MQTT topic filter (``%u``/``%c`` only as whole levels)."""
    text = reader.get("topic", str)
    if not valid_topic_filter(text) or text.startswith(SHARE_PREFIX):
        raise reader.fail("topic", f"'{text}' is not an MQTT topic filter ('+' fills a whole "
                          "level, '#' a whole last level; no $share)")
    levels = from_mqtt(text)
    if any(("%u" in level or "%c" in level) and level not in ("%u", "%c")
           for level in levels):
        raise reader.fail("topic", f"'{text}': %u and %c must fill a whole level "
                          "(as in Mosquitto's pattern lines)")
    return levels


def parse_rule(source: Path, where: str, rule: Any, uri_check: str) -> PermissionRule:
    """A permission rule as a realm file would hold it at ``where`` (for tools that write
    realm files: the same checks, errors naming the file and key)."""
    return _rule(_Reader(source, rule, where), uri_check)


def _principal(reader: _Reader, authid: str, roles: dict) -> Principal:
    refusal = principal_name_refusal(authid)
    if refusal is not None:
        raise ConfigError(reader.source, reader.path, refusal)
    reader.reject_unknown({"role", "ticket", "wampcra", "cryptosign"})
    role = reader.get("role", str)
    if role not in roles:
        raise reader.fail("role", f"names the role '{role}', which is not in 'roles'")
    ticket = reader.get("ticket", str, None)
    if ticket is not None and not (ticket.startswith(SCHEME + "$")
                                   or ticket.startswith(MOSQUITTO_HASHES)):
        raise reader.fail("ticket", "must be a hash made by 'python -m router hash-secret' "
                          "or a Mosquitto $7$/$6$ password hash (plain-text secrets are "
                          "not accepted)")
    cra_data = reader.get("wampcra", dict, None)
    cra = None
    if cra_data is not None:
        cra_reader = reader.child("wampcra", cra_data)
        cra_reader.reject_unknown({"salt", "iterations", "keylen", "key"})
        salt = cra_reader.get("salt", str)
        iterations = _positive(cra_reader, "iterations", int, ...)
        keylen = _positive(cra_reader, "keylen", int, 32)
        key = cra_reader.get("key", str)
        try:
            raw = base64.b64decode(key, validate=True)
        except ValueError:
            raw = b""
        if len(raw) != keylen:
            raise cra_reader.fail("key", f"must be the base64 of the {keylen}-byte PBKDF2 key "
                                  "derived from the secret (made by 'python -m router "
                                  "principal add --method wampcra')")
        cra = WampCra(salt, iterations, keylen, key)
    sign_data = reader.get("cryptosign", dict, None)
    pubkeys: tuple[str, ...] = ()
    if sign_data is not None:
        sign_reader = reader.child("cryptosign", sign_data)
        sign_reader.reject_unknown({"pubkeys"})
        keys_reader = sign_reader.child("pubkeys", sign_reader.get("pubkeys", list))
        for index, value in enumerate(keys_reader.data):
            normal = normalize_pubkey(value) if type(value) is str else None
            if normal is None:
                raise keys_reader.fail(f"[{index}]",
                                       "must be a hex Ed25519 public key (64 hex digits)")
            pubkeys += (normal,)
    return Principal(authid, role, ticket, cra, pubkeys)


def _pattern(reader: _Reader, check: str) -> tuple[Topic, str]:
    """(levels, match) of a ``uri`` + ``match`` entry: a URI of the realm split on ``.``;
    it then applies to the topics of every protocol (:mod:`router.core.topic`)."""
    uri = reader.get("uri", str)
    match = reader.get("match", str, "exact")
    if match not in MATCH_POLICIES:
        raise reader.fail("match", f"must be one of {', '.join(MATCH_POLICIES)}, got '{match}'")
    head, _, rest = uri.partition(".")
    if head == SERVER_OWNED:  # the router's $SYS levels: any further levels, as MQTT names
        check, uri_rest = "loose", rest
    else:
        uri_rest = uri
    if not is_valid_uri(uri_rest, check, match):
        raise reader.fail("uri", f"'{uri}' is not a valid {check} URI for match '{match}'")
    return from_uri(uri), match


def _positive(reader: _Reader, key: str, kind: type | tuple, default: Any) -> Any:
    value = reader.get(key, kind, default)
    if value is not None and value <= 0:
        raise reader.fail(key, f"must be positive, got {value}")
    return value


def _retention(reader: _Reader, check: str) -> RetentionPolicy:
    reader.reject_unknown({"default_ttl", "max_topics", "max_bytes", "max_restricted", "decline",
                           "max_topics_per_principal", "max_bytes_per_principal"})
    defaults = RetentionPolicy()
    declined_reader = reader.child("decline", reader.get("decline", list, []))
    declined = []
    for index, entry in enumerate(declined_reader.data):
        entry_reader = declined_reader.child(index, entry)
        entry_reader.reject_unknown({"uri", "match"})
        declined.append(_pattern(entry_reader, check))
    default_ttl = _positive(reader, "default_ttl", (int, float, type(None)), None)
    if default_ttl is not None and default_ttl > MAX_FOUR_BYTE:  # (as MQTT's expiry interval)
        raise reader.fail("default_ttl", f"must be at most {MAX_FOUR_BYTE} seconds, got "
                          f"{default_ttl}: an expiry past year 9999 has no date")
    return RetentionPolicy(
        default_ttl=default_ttl,
        max_topics=_positive(reader, "max_topics", int, defaults.max_topics),
        max_bytes=_positive(reader, "max_bytes", int, defaults.max_bytes),
        max_restricted=_positive(reader, "max_restricted", int, defaults.max_restricted),
        max_topics_per_principal=_positive(reader, "max_topics_per_principal", int,
                                           defaults.max_topics_per_principal),
        max_bytes_per_principal=_positive(reader, "max_bytes_per_principal", int,
                                          defaults.max_bytes_per_principal),
        declined=tuple(declined))


def _mqtt(reader: _Reader) -> MqttSettings:
    reader.reject_unknown({"payload_mapping", "qos_policy", "max_qos", "max_packet_size",
                           "max_queued", "max_session_expiry", "max_keepalive",
                           "topic_alias_maximum", "max_subscriptions", "max_inbound_qos2"})
    defaults = MqttSettings()
    mapping = reader.get("payload_mapping", str, defaults.payload_mapping)
    if mapping not in MAPPINGS:
        raise reader.fail("payload_mapping", f"must be one of {', '.join(MAPPINGS)}, "
                          f"got '{mapping}'")
    policy = reader.get("qos_policy", str, defaults.qos_policy)
    if policy not in POLICIES:
        raise reader.fail("qos_policy", f"must be one of {', '.join(POLICIES)}, got '{policy}'")
    max_qos = reader.get("max_qos", int, defaults.max_qos)
    if max_qos not in QOS_LEVELS:
        raise reader.fail("max_qos", f"must be 0, 1 or 2, got {max_qos}")
    return MqttSettings(mapping, policy, max_qos,
                        _positive(reader, "max_packet_size", int, defaults.max_packet_size),
                        _positive(reader, "max_queued", int, defaults.max_queued),
                        _expiry_cap(reader, "max_session_expiry", defaults.max_session_expiry),
                        _two_byte(reader, "max_keepalive", defaults.max_keepalive),
                        _two_byte(reader, "topic_alias_maximum", defaults.topic_alias_maximum),
                        _positive(reader, "max_subscriptions", int, defaults.max_subscriptions),
                        _positive(reader, "max_inbound_qos2", int, defaults.max_inbound_qos2))


def _two_byte(reader: _Reader, key: str, default: int) -> int:
    """0 to 65535, as MQTT carries it (a two-byte integer)."""
    value = reader.get(key, int, default)
    if not 0 <= value <= 0xFFFF:
        raise reader.fail(key, f"must be 0 to 65535, got {value}")
    return value


def _expiry_cap(reader: _Reader, key: str, default: int) -> int:
    """Whole seconds, as MQTT 5 tells them to clients (a four-byte integer)."""
    value = _positive(reader, key, int, default)
    if value > MAX_FOUR_BYTE:
        raise reader.fail(key, f"must be at most {MAX_FOUR_BYTE}, got {value}")
    return value


def _amqp(reader: _Reader, mqtt: MqttSettings) -> AmqpSettings:
    reader.reject_unknown({"payload_mapping", "qos_policy", "max_queued", "inbound_window",
                           "max_link_expiry", "max_links", "max_sessions"})
    defaults = AmqpSettings()
    return AmqpSettings(payload_mapping=_one_of(reader, "payload_mapping", MAPPINGS,
                                                mqtt.payload_mapping),
                        qos_policy=_one_of(reader, "qos_policy", POLICIES, defaults.qos_policy),
                        max_queued=_positive(reader, "max_queued", int, defaults.max_queued),
                        inbound_window=_positive(reader, "inbound_window", int,
                                                 defaults.inbound_window),
                        max_link_expiry=_expiry_cap(reader, "max_link_expiry",
                                                    defaults.max_link_expiry),
                        max_links=_positive(reader, "max_links", int, defaults.max_links),
                        max_sessions=_max_sessions(reader, defaults.max_sessions))


MAX_AMQP_SESSIONS = 32768
"""Proton takes a channel-max up to 32767 (channels 0 .. 32767)."""


def _max_sessions(reader: _Reader, default: int) -> int:
    value = _positive(reader, "max_sessions", int, default)
    if value > MAX_AMQP_SESSIONS:
        raise reader.fail("max_sessions", f"must be at most {MAX_AMQP_SESSIONS}, got {value}")
    return value


def _one_of(reader: _Reader, key: str, allowed: tuple[str, ...], default: str) -> str:
    """A string that must be one of ``allowed`` (a policy, a mapping)."""
    value = reader.get(key, str, default)
    if value not in allowed:
        raise reader.fail(key, f"must be one of {', '.join(allowed)}, got '{value}'")
    return value


def _wamp(reader: _Reader) -> WampSettings:
    reader.reject_unknown({"granted_qos", "qos_policy", "ack_timeout", "max_redeliveries",
                           "max_testaments", "max_unacked", "max_subscriptions",
                           "max_registrations", "max_pending_calls"})
    defaults = WampSettings()
    granted = reader.get("granted_qos", int, defaults.granted_qos)
    if granted not in QOS_LEVELS:
        raise reader.fail("granted_qos", f"must be 0, 1 or 2, got {granted}")
    policy = reader.get("qos_policy", str, defaults.qos_policy)
    if policy not in POLICIES:
        raise reader.fail("qos_policy", f"must be one of {', '.join(POLICIES)}, got '{policy}'")
    return WampSettings(granted, policy,
                        float(_positive(reader, "ack_timeout", (int, float), defaults.ack_timeout)),
                        reader.get("max_redeliveries", int, defaults.max_redeliveries),
                        _positive(reader, "max_testaments", int, defaults.max_testaments),
                        _positive(reader, "max_unacked", int, defaults.max_unacked),
                        _positive(reader, "max_subscriptions", int, defaults.max_subscriptions),
                        _positive(reader, "max_registrations", int, defaults.max_registrations),
                        _positive(reader, "max_pending_calls", int, defaults.max_pending_calls))


def _history_rule(reader: _Reader, check: str) -> HistoryRule:
    reader.reject_unknown({"uri", "match", "limit", "max_age"})
    uri, match = _pattern(reader, check)
    return HistoryRule(uri, match, _positive(reader, "limit", int, ...),
                       _positive(reader, "max_age", (int, float, type(None)), None))


def load_realm(path: Path, expected_name: str) -> RealmConfig:
    """Read and validate one realm file."""
    reader = _Reader(path, _load_json(path))
    reader.reject_unknown({"name", "uri_check", "anonymous_role", "roles", "principals",
                           "retention", "history", "mqtt", "wamp", "amqp", "webhooks"})
    name = reader.get("name", str)
    if name != expected_name:
        raise reader.fail("name", f"is '{name}' but config.json loads this file as "
                          f"realm '{expected_name}'")
    if not is_valid_uri(name, "loose"):
        raise reader.fail("name", f"'{name}' is not a valid realm URI")
    check = reader.get("uri_check", str, "strict")
    if check not in ("strict", "loose"):
        raise reader.fail("uri_check", f"must be 'strict' or 'loose', got '{check}'")
    roles_reader = reader.child("roles", reader.get("roles", dict))
    roles = {}
    for role_name, rules in roles_reader.data.items():
        rules_reader = roles_reader.child(role_name, rules)
        if type(rules) is not list:
            raise roles_reader.fail(role_name, "must be a list of permission rules")
        roles[role_name] = [_rule(rules_reader.child(i, rule), check)
                            for i, rule in enumerate(rules)]
    anonymous = reader.get("anonymous_role", (str, type(None)), None)
    if anonymous is not None and anonymous not in roles:
        raise reader.fail("anonymous_role", f"names the role '{anonymous}', which is not in 'roles'")
    principals_reader = reader.child("principals", reader.get("principals", dict, {}))
    principals = {authid: _principal(principals_reader.child(authid, entry), authid, roles)
                  for authid, entry in principals_reader.data.items()}
    retention = _retention(reader.child("retention", reader.get("retention", dict, {})), check)
    history_reader = reader.child("history", reader.get("history", list, []))
    history = tuple(_history_rule(history_reader.child(i, rule), check)
                    for i, rule in enumerate(history_reader.data))
    mqtt = _mqtt(reader.child("mqtt", reader.get("mqtt", dict, {})))
    wamp = _wamp(reader.child("wamp", reader.get("wamp", dict, {})))
    amqp = _amqp(reader.child("amqp", reader.get("amqp", dict, {})), mqtt)
    hooks_reader = reader.child("webhooks", reader.get("webhooks", list, []))
    webhooks = tuple(_webhook(hooks_reader.child(i, entry), name, check, roles, anonymous,
                              principals)
                     for i, entry in enumerate(hooks_reader.data))
    names = [hook.name for hook in webhooks]
    for index, hook in enumerate(webhooks):
        if names.index(hook.name) != index:
            raise hooks_reader.fail(f"[{index}].name", f"'{hook.name}' names another webhook "
                                    "of the realm too")
    return RealmConfig(name, path, roles, check, anonymous, principals, retention, history, mqtt,
                       wamp, amqp, webhooks)


WEBHOOK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Webhook names become metric labels and queue keys: kept to characters needing no quoting."""


def _webhook(reader: _Reader, realm: str, check: str, roles: dict[str, list[PermissionRule]],
             anonymous: str | None, principals: dict[str, Principal]) -> WebhookSettings:
    """One ``webhooks`` entry, its subscription checked against the role it acts in."""
    reader.reject_unknown({"name", "url", "topic", "match", "authid", "secret", "qos",
                           "qos_policy", "max_queue", "max_queue_bytes", "timeout",
                           "min_backoff", "max_backoff", "max_attempts", "headers", "ca",
                           "node"})
    defaults = WebhookSettings("", "", "")
    name = reader.get("name", str)
    if not WEBHOOK_NAME.fullmatch(name):
        raise reader.fail("name", "must be 1 to 64 letters, digits, '_', '.' or '-', "
                          f"got {json.dumps(name)}")
    url = reader.get("url", str)
    try:
        parsed = urlsplit(url)
        parsed.port  # noqa: B018 (a port that is no number raises here)
    except ValueError as exc:
        raise reader.fail("url", f"is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.fragment:
        raise reader.fail("url", f"must be an http:// or https:// URL, got {json.dumps(url)}")
    if parsed.username is not None:
        raise reader.fail("url", "must not hold credentials (the session meta API shows the "
                          "URL): give the target's Authorization in 'headers'")
    match = reader.get("match", str, defaults.match)
    if match == MQTT:
        topic = _topic_filter(reader)
    elif match in MATCH_POLICIES:
        uri = reader.get("topic", str)
        if not is_valid_uri(uri, check, match):
            raise reader.fail("topic", f"'{uri}' is not a valid {check} URI for match "
                              f"'{match}' (or give an MQTT filter with match 'mqtt')")
        topic = from_uri(uri)
    else:
        raise reader.fail("match", f"must be one of {', '.join(MATCH_POLICIES + (MQTT,))}, "
                          f"got '{match}'")
    authid = reader.get("authid", (str, type(None)), None)
    if authid is None:
        if anonymous is None:
            raise reader.fail("authid", "is required: the realm has no anonymous_role for a "
                              "webhook without one to act in")
        role = anonymous
    elif authid not in principals:
        raise reader.fail("authid", f"'{authid}' is not a principal of the realm")
    else:
        role = principals[authid].role
    identity = SessionInfo(0, realm, authid or "anonymous-webhook", role,
                           "webhook" if authid else "anonymous", protocol="webhook")
    if not Authorizer({name: Role(name, rules) for name, rules in roles.items()}).allows(
            identity, "subscribe", topic, match):
        raise reader.fail("topic", f"role '{role}' may not subscribe to "
                          f"'{reader.get('topic', str)}' (match '{match}')")
    secret = reader.get("secret", (str, type(None)), None)
    if secret == "":
        raise reader.fail("secret", "must not be empty (leave it out to send unsigned requests)")
    qos = reader.get("qos", int, defaults.qos)
    if qos not in (0, 1):
        raise reader.fail("qos", f"must be 0 or 1, got {qos}")
    min_backoff = float(_positive(reader, "min_backoff", (int, float), defaults.min_backoff))
    max_backoff = float(_positive(reader, "max_backoff", (int, float), defaults.max_backoff))
    if max_backoff < min_backoff:
        raise reader.fail("max_backoff", f"must be at least min_backoff ({min_backoff:g}), "
                          f"got {max_backoff:g}")
    headers_reader = reader.child("headers", reader.get("headers", dict, {}))
    for key, value in headers_reader.data.items():
        if (type(value) is not str or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", key)
                or any(ch in value for ch in "\r\n")):
            raise headers_reader.fail(key, "must be a header name with a one-line string value")
    ca = reader.get("ca", (str, type(None)), None)
    ca_path = reader.source.parent / ca if ca is not None else None
    if ca_path is not None:
        if parsed.scheme != "https":
            raise reader.fail("ca", "applies to an https:// url only")
        try:
            ssl.create_default_context(cafile=str(ca_path))
        except (ssl.SSLError, OSError) as exc:
            raise reader.fail("ca", f"cannot read CA certificates from {ca_path} ({exc})") \
                from None
    return WebhookSettings(
        name, url, reader.get("topic", str), match, authid, secret, qos,
        _one_of(reader, "qos_policy", POLICIES, defaults.qos_policy),
        _positive(reader, "max_queue", int, defaults.max_queue),
        _positive(reader, "max_queue_bytes", int, defaults.max_queue_bytes),
        float(_positive(reader, "timeout", (int, float), defaults.timeout)),
        min_backoff, max_backoff,
        _positive(reader, "max_attempts", (int, type(None)), defaults.max_attempts),
        tuple(headers_reader.data.items()), reader.get("node", (str, type(None)), None),
        ca_path)


def _realm_log(reader: _Reader, default_enabled: bool) -> RealmLogSettings:
    reader.reject_unknown({"enabled", "kinds", "payloads"})
    kinds = reader.get("kinds", list, list(KINDS))
    for index, kind in enumerate(kinds):
        if kind not in KINDS:
            raise reader.fail(f"kinds[{index}]",
                              f"must be one of {', '.join(KINDS)}, got {json.dumps(kind)}")
    return RealmLogSettings(reader.get("enabled", bool, default_enabled), frozenset(kinds),
                            reader.get("payloads", bool, False))


def _eventlog(reader: _Reader, realm_names: list[str]) -> EventLogConfig:
    reader.reject_unknown({"enabled", "flush_interval", "max_file_bytes", "max_file_age",
                           "max_queued_records", "realms"})
    defaults = EventLogConfig()
    enabled = reader.get("enabled", bool, True)
    realms_reader = reader.child("realms", reader.get("realms", dict, {}))
    realms = {}
    for name, entry in realms_reader.data.items():
        if name not in realm_names:
            raise realms_reader.fail(name, "is not one of the realms this node loads")
        realms[name] = _realm_log(realms_reader.child(name, entry), enabled)
    return EventLogConfig(
        enabled=enabled,
        flush_interval=_positive(reader, "flush_interval", (int, float), defaults.flush_interval),
        max_file_bytes=_positive(reader, "max_file_bytes", int, defaults.max_file_bytes),
        max_file_age=_positive(reader, "max_file_age", (int, float), defaults.max_file_age),
        max_queued_records=_positive(reader, "max_queued_records", int,
                                     defaults.max_queued_records),
        realms=realms)


ADMIN_SOCKET = "admin.sock"
"""Default ``admin_socket``, relative to ``data_dir`` (an absolute path stays as it is)."""


def load_config(path: Path | str) -> NodeConfig:
    """Read and validate ``config.json`` and every realm file it names."""
    path = Path(path)
    base = path.resolve().parent
    reader = _Reader(path, _load_json(path))
    reader.reject_unknown({"data_dir", "realms_dir", "realms", "listeners", "shutdown_timeout",
                           "eventlog", "login_backoff", "store", "memory", "engine",
                           "sys_interval", "cluster", "admin_socket", "bridges"})
    data_dir = base / reader.get("data_dir", str, "data")
    admin_socket = reader.get("admin_socket", (str, type(None)), ADMIN_SOCKET)
    realms_dir = base / reader.get("realms_dir", str, "realms")
    names = reader.get("realms", list)
    if not names:
        raise reader.fail("realms", "must name at least one realm")
    realms = {}
    for index, name in enumerate(names):
        if type(name) is not str:
            raise reader.fail(f"realms[{index}]", f"must be a realm name, got {json.dumps(name)}")
        realm_file = realms_dir / f"{name}.json"
        if not realm_file.exists():
            raise reader.fail(f"realms[{index}]", f"realm file {realm_file} does not exist")
        realms[name] = load_realm(realm_file, name)
    listeners_reader = reader.child("listeners", reader.get("listeners", list))
    listeners = tuple(_listener(listeners_reader.child(i, entry), names, base)
                      for i, entry in enumerate(listeners_reader.data))
    if not listeners:
        raise reader.fail("listeners", "must define at least one listener")
    timeout = reader.get("shutdown_timeout", (int, float), 5.0)
    if timeout < 0:
        raise reader.fail("shutdown_timeout", f"must not be negative, got {timeout}")
    eventlog = _eventlog(reader.child("eventlog", reader.get("eventlog", dict, {})), names)
    backoff_reader = reader.child("login_backoff", reader.get("login_backoff", dict, {}))
    backoff_reader.reject_unknown({"after_failures", "window", "max_delay",
                                   "max_pending_verifications"})
    after = backoff_reader.get("after_failures", int, 3)
    if after < 0:
        raise backoff_reader.fail("after_failures", f"must not be negative, got {after}")
    max_delay = backoff_reader.get("max_delay", (int, float), 8.0)
    if max_delay < 0:
        raise backoff_reader.fail("max_delay", f"must not be negative, got {max_delay}")
    backoff = LoginBackoff(after, float(_positive(backoff_reader, "window", (int, float), 60.0)),
                           float(max_delay),
                           _positive(backoff_reader, "max_pending_verifications", int,
                                     MAX_PENDING))
    store_reader = reader.child("store", reader.get("store", dict, {}))
    store_reader.reject_unknown({"max_bytes", "max_queued_writes"})
    store = StoreConfig(_positive(store_reader, "max_bytes", (int, type(None)), None),
                        _positive(store_reader, "max_queued_writes", int,
                                  StoreConfig().max_queued_writes))
    memory_reader = reader.child("memory", reader.get("memory", dict, {}))
    memory_reader.reject_unknown({"trim_interval"})
    trim_interval = memory_reader.get("trim_interval", (int, float), MemoryConfig().trim_interval)
    if trim_interval < 0:
        raise memory_reader.fail("trim_interval", f"must not be negative, got {trim_interval}")
    engine = _engine(reader.child("engine", reader.get("engine", dict, {"type": "embedded"})))
    for realm in realms.values():
        for index, hook in enumerate(realm.webhooks):
            if engine.type == "redis" and hook.node is None:
                raise ConfigError(realm.source, f"webhooks[{index}].node", "is required on the "
                                  "redis engine: the name of the one node that sends its events")
            if engine.type != "redis" and hook.node is not None:
                raise ConfigError(realm.source, f"webhooks[{index}].node", "applies to the "
                                  "redis engine only (this node runs every webhook)")
    sys_interval = reader.get("sys_interval", (int, float), NodeConfig.sys_interval)
    if sys_interval < 0:
        raise reader.fail("sys_interval", f"must not be negative, got {sys_interval}")
    cluster_reader = reader.child("cluster", reader.get("cluster", dict, {}))
    cluster_reader.reject_unknown({"max_pending_calls", "call_timeout", "max_pending_commands",
                                   "session_takeover_timeout", "confirm_timeout",
                                   "heartbeat_interval", "node_timeout"})
    defaults = ClusterLimits()
    seconds = {key: float(_positive(cluster_reader, key, (int, float), getattr(defaults, key)))
               for key in ("call_timeout", "session_takeover_timeout", "confirm_timeout",
                           "heartbeat_interval", "node_timeout")}
    if seconds["node_timeout"] <= 2 * seconds["heartbeat_interval"]:
        raise cluster_reader.fail("node_timeout", "must be more than twice heartbeat_interval "
                                  f"({seconds['heartbeat_interval']:g} s), got "
                                  f"{seconds['node_timeout']:g}")
    cluster = ClusterLimits(
        _positive(cluster_reader, "max_pending_calls", int, defaults.max_pending_calls),
        max_pending_commands=_positive(cluster_reader, "max_pending_commands", int,
                                       defaults.max_pending_commands), **seconds)
    bridges = _bridges(reader.child("bridges", reader.get("bridges", list, [])), realms, base)
    return NodeConfig(path, data_dir, listeners, realms, float(timeout), eventlog, backoff,
                      store, MemoryConfig(float(trim_interval)), engine, float(sys_interval),
                      cluster, data_dir / admin_socket if admin_socket else None, bridges)


NODE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Node names become Redis key and channel names: kept to characters that need no quoting."""


def _engine(reader: _Reader) -> EngineConfig:
    """``{"type": "embedded"}`` or ``{"type": "redis", "url": ..., "node": ...}``."""
    kind = reader.get("type", str)
    if kind == "embedded":
        reader.reject_unknown({"type"})
        return EngineConfig()
    if kind != "redis":
        raise reader.fail("type", f'must be "embedded" or "redis", got {json.dumps(kind)}')
    reader.reject_unknown({"type", "url", "node"})
    url = reader.get("url", str)
    try:
        parsed = urlsplit(url)
        port, db = parsed.port or 6379, parsed.path[1:] or "0"
    except ValueError as exc:
        raise reader.fail("url", f"is not a URL ({exc})") from None
    if (parsed.scheme != "redis" or not parsed.hostname or parsed.query or parsed.fragment
            or parsed.username or parsed.password or not db.isdigit()):
        raise reader.fail("url", f"must be redis://host:port/db, got {json.dumps(url)}")
    node = reader.get("node", str)
    if not NODE_NAME.fullmatch(node):
        raise reader.fail("node", "must be 1 to 64 letters, digits, '_', '.' or '-', "
                                  f"got {json.dumps(node)}")
    return EngineConfig("redis", url, node, (parsed.hostname, port, int(db)))


BRIDGE_KEYS = {"name", "realm", "host", "port", "role", "topics", "protocol", "client_id",
               "username", "password", "clean_session", "session_expiry", "keep_alive", "tls",
               "max_queued", "max_inflight", "reconnect_min", "reconnect_max",
               "connect_timeout"}


def _bridges(reader: _Reader, realms: dict[str, RealmConfig],
             base: Path) -> tuple[BridgeConfig, ...]:
    """The ``bridges`` list (see docs/bridges.md); names unique, realms and roles known."""
    bridges: list[BridgeConfig] = []
    for index, entry in enumerate(reader.data):
        bridge = _bridge(reader.child(index, entry), realms, base)
        if any(other.name == bridge.name for other in bridges):
            raise reader.child(index, entry).fail("name", f"'{bridge.name}' names two bridges")
        bridges.append(bridge)
    return tuple(bridges)


def _bridge(reader: _Reader, realms: dict[str, RealmConfig], base: Path) -> BridgeConfig:
    reader.reject_unknown(BRIDGE_KEYS)
    defaults = BridgeConfig("", "", "", "", ())
    name = reader.get("name", str)
    if not NODE_NAME.fullmatch(name):
        raise reader.fail("name", "must be 1 to 64 letters, digits, '_', '.' or '-' (it is a "
                                  f"$SYS topic level and a metric label), got {json.dumps(name)}")
    realm = reader.get("realm", str)
    if realm not in realms:
        raise reader.fail("realm", f"'{realm}' is not one of the realms this node loads")
    role = reader.get("role", str)
    if role not in realms[realm].roles:
        raise reader.fail("role", f"realm '{realm}' has no role '{role}'")
    port = reader.get("port", int, defaults.port)
    if not 0 < port < 65536:
        raise reader.fail("port", f"must be 1 to 65535, got {port}")
    protocol = reader.get("protocol", str, "5")
    if protocol not in PROTOCOLS:
        raise reader.fail("protocol", f'must be "3.1.1" or "5", got {json.dumps(protocol)}')
    topics_reader = reader.child("topics", reader.get("topics", list))
    if not topics_reader.data:
        raise ConfigError(reader.source, topics_reader.path, "must hold at least one topic "
                          "mapping")
    topics = tuple(_topic_mapping(topics_reader.child(i, entry))
                   for i, entry in enumerate(topics_reader.data))
    keep_alive = reader.get("keep_alive", int, defaults.keep_alive)
    if not 0 <= keep_alive <= 0xFFFF:
        raise reader.fail("keep_alive", f"must be 0 to 65535 seconds, got {keep_alive}")
    session_expiry = reader.get("session_expiry", int, defaults.session_expiry)
    if not 0 <= session_expiry <= MAX_FOUR_BYTE:
        raise reader.fail("session_expiry", f"must be 0 to {MAX_FOUR_BYTE}, got {session_expiry}")
    username = reader.get("username", (str, type(None)), None)
    password = reader.get("password", (str, type(None)), None)
    if password is not None and username is None and protocol == "3.1.1":
        raise reader.fail("password", "needs a username in MQTT 3.1.1")
    seconds = {key: float(_positive(reader, key, (int, float), getattr(defaults, key)))
               for key in ("reconnect_min", "reconnect_max", "connect_timeout")}
    if seconds["reconnect_max"] < seconds["reconnect_min"]:
        raise reader.fail("reconnect_max", f"must be at least reconnect_min "
                                           f"({seconds['reconnect_min']:g}), "
                                           f"got {seconds['reconnect_max']:g}")
    tls = reader.get("tls", (dict, type(None)), None)
    return BridgeConfig(
        name, realm, reader.get("host", str), role, topics, port, PROTOCOLS[protocol],
        reader.get("client_id", str, ""), username, password,
        reader.get("clean_session", bool, defaults.clean_session), session_expiry, keep_alive,
        None if tls is None else _bridge_tls(reader.child("tls", tls), base),
        _positive(reader, "max_queued", int, defaults.max_queued),
        _positive(reader, "max_inflight", int, defaults.max_inflight), **seconds)


def _topic_mapping(reader: _Reader) -> TopicMapping:
    reader.reject_unknown({"topic", "direction", "qos", "local_prefix", "remote_prefix"})
    direction = _one_of(reader, "direction", DIRECTIONS, "out")
    qos = reader.get("qos", int, 1)
    if qos not in QOS_LEVELS:
        raise reader.fail("qos", f"must be 0, 1 or 2, got {qos}")
    mapping = TopicMapping(reader.get("topic", str), direction, qos,
                           reader.get("local_prefix", str, ""),
                           reader.get("remote_prefix", str, ""))
    for key in ("local_prefix", "remote_prefix"):
        if "+" in getattr(mapping, key) or "#" in getattr(mapping, key):
            raise reader.fail(key, "must not hold a wildcard ('+' or '#')")
    for where, topic_filter in (("local", mapping.local_filter),
                                ("remote", mapping.remote_filter)):
        if (not mapping.topic or not valid_topic_filter(topic_filter)
                or topic_filter.startswith(SHARE_PREFIX)):
            raise reader.fail("topic", f"the {where} filter {json.dumps(topic_filter)} is not "
                                       "a valid MQTT topic filter (nor a shared one)")
    return mapping


def _bridge_tls(reader: _Reader, base: Path) -> BridgeTls:
    reader.reject_unknown({"ca", "cert", "key", "verify_hostname"})
    paths: dict[str, Path | None] = {}
    for key in ("ca", "cert", "key"):
        value = reader.get(key, (str, type(None)), None)
        paths[key] = None if value is None else base / value
        if paths[key] is not None and not paths[key].is_file():  # type: ignore[union-attr]
            raise reader.fail(key, f"file {paths[key]} does not exist")
    if (paths["cert"] is None) != (paths["key"] is None):
        raise reader.fail("cert" if paths["cert"] is None else "key",
                          "a client certificate needs both 'cert' and 'key'")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if paths["ca"] is not None:
            context.load_verify_locations(paths["ca"])
        if paths["cert"] is not None:
            context.load_cert_chain(paths["cert"], paths["key"])
    except (ssl.SSLError, OSError) as exc:
        raise reader.fail("cert" if paths["cert"] else "ca",
                          f"cannot be used ({exc.__class__.__name__}: {exc})") from None
    return BridgeTls(paths["ca"], paths["cert"], paths["key"],
                     reader.get("verify_hostname", bool, True))
