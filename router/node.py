"""The node: builds the router from configuration, opens listeners, shuts down cleanly."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from twisted.internet import defer, task, threads
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorCore

from router.admin_socket import SOCKET_MODE, AdminFactory
from router.bridge.bridge import Bridge
from router.config import SERIALIZERS, ConfigError, ListenerConfig, NodeConfig
from router.core.engine import Engine
from router.core.login_guard import LoginGuard
from router.core.meta import (install_event_history, install_retention_admin,
                              install_session_meta, install_subscription_meta)
from router.core.realm import Realm
from router.core.router import Router
from router.core.testament import Testaments
from router.core.topic import SERVER_OWNED, Topic
from router.eventlog.realm_log import RealmEventLog
from router.eventlog.writer import EventLogWriter
from router.counting import counting_port
from router.flow import ConnectionFlow, FlowContext, IntakeGate, TurnWriter
from router.limits import ConnectionLimits
from router.memory import MemoryReclaimer
from router.metrics.retention import watch_retention
from router.mqtt.frontend import MqttFrontend
from router.mqtt.persistence import MqttSessionStore
from router.mqtt.transports import MqttTcpFactory, MqttWebSocketFactory
from router.ports import describe
from router.reload import PID_FILE, Reloader, authorizer_for
from router.engines.embedded.engine import EmbeddedEngine
from router.engines.embedded.sqlite import SqliteStore
from router.engines.records import live_entries
from router.sysinfo import SysFigures
from router.tls import server_options
from router.verifier import SecretVerifier
from router.wamp.codec import make_serializers
from router.wamp.session import WampListener, WampSession
from router.wamp.transports import RouterRawSocketFactory, RouterWebSocketFactory
from router.webhooks.webhook import Webhook, open_webhooks

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from router.amqp.frontend import AmqpFrontend
    from router.amqp.persistence import AmqpStore
    from router.http.api import HttpApi

# Imported where first needed, not here: what a router without them never uses costs it
# no memory (measured on the idle router, bench/RESULTS.md): the Redis engine and its
# client, AMQP (proton) without an AMQP listener, prometheus_client and twisted.web until
# metrics are scraped or a metrics listener is opened, the HTTP frontend (twisted.web) without
# an http listener, pyOpenSSL without TLS (router/tls.py).

log = logging.getLogger(__name__)

FULL_COLLECTION_AFTER = 100
"""Middle-generation collections between two full ones once the node is ready (Python's
default is 10; CPython also waits until a quarter more objects than the last full
collection kept have been promoted). bench/soak.py makes ~0.8 middle-generation
collections a second: with 10 it had a full collection every 7-20 s of its soak phase,
with 100 none in its 95 s (at that rate one every two minutes or so)."""

LISTEN_BACKLOG = 1024
"""Twisted's default of 50 makes a burst of connects wait for SYN retries; the connection
caps (``max_connections``), not the kernel's accept queue, are what bound connections."""

INCIDENT_PROTOCOL = {"websocket": "wamp", "rawsocket": "wamp", "mqtt": "mqtt",
                     "mqtt-websocket": "mqtt", "amqp": "amqp", "http": "http"}
"""Listener type -> the protocol its refusals are counted under."""


def build_router(config: NodeConfig, reactor, engine: Engine,
                 eventlog: EventLogWriter) -> Router:
    """Realms on ``engine`` (retained events, history, other nodes), authorizers, event logs,
    meta APIs."""
    router = Router(reactor)
    logs: dict[str, RealmEventLog] = {}
    router.incidents.listener = partial(_log_incident, logs)
    backoff = config.login_backoff
    router.login_guard = LoginGuard(reactor, backoff.window, backoff.after_failures,
                                    backoff.max_delay, router.incidents)
    router.verifier = SecretVerifier(reactor, router.incidents,
                                     max_pending=backoff.max_pending_verifications)
    for realm_config in config.realms.values():
        log_settings = config.eventlog.for_realm(realm_config.name)
        activity = (RealmEventLog(realm_config.name, eventlog, log_settings)
                    if log_settings.enabled else None)
        if activity is not None:
            logs[realm_config.name] = activity
        realm_engine = engine.open_realm(realm_config.name, realm_config.retention,
                                         list(realm_config.history))
        if activity is not None and realm_engine.retention is not None:
            realm_engine.retention.listeners.append(
                lambda topic, entries, action, publication, activity=activity:
                topic[0] == SERVER_OWNED or activity.retained(topic, action, publication))
        realm = Realm(realm_config.name, authorizer_for(realm_config.roles), reactor,
                      uri_check=realm_config.uri_check,
                      anonymous_role=realm_config.anonymous_role,
                      engine=realm_engine, activity=activity)
        install_session_meta(realm)
        install_subscription_meta(realm)
        install_event_history(realm)
        install_retention_admin(realm)
        Testaments(realm, realm_config.wamp.max_testaments, realm_engine.testaments)
        router.add_realm(realm, realm_config.principals)
    return router


def _log_incident(logs: dict[str, RealmEventLog], realm: str, protocol: str, reason: str,
                  n: int) -> None:
    """Incidents of a realm with an event log go to it (node-wide ones, realm "", do not)."""
    log_ = logs.get(realm)
    if log_ is not None:
        log_.incident(protocol, reason, n)


def make_engine(config: NodeConfig, store: SqliteStore,
                reactor) -> Engine[MqttSessionStore, AmqpStore, Realm]:
    """The engine ``config`` names; a Redis engine loads each realm's state from Redis.
    The only place that names an engine implementation."""
    engine = config.engine
    if engine.type == "redis":
        from router.engines.redis.engine import RedisEngine
        return RedisEngine(engine.redis_address, engine.node, reactor,  # type: ignore[arg-type]
                           store, config.cluster)
    return EmbeddedEngine(store)


class ListenerFailed(Exception):
    """A listener's port could not be opened: the message names the file and the listener."""


class Node:
    """A running router: listeners on the reactor and a clean shutdown path."""

    def __init__(self, config: NodeConfig, reactor: IReactorCore) -> None:
        self.config = config
        self.reactor = reactor
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # named as every configuration error is: file, key, reason
            raise ConfigError(config.source, "data_dir",
                              f"cannot create {config.data_dir} ({exc.strerror})") from exc
        self.store = SqliteStore(config.data_dir / "router.sqlite3", reactor.callFromThread,
                                 config.store.max_bytes, config.store.max_queued_writes,
                                 getattr(reactor, "at_turn_end", None)
                                 or partial(reactor.callLater, 0))
        self.reclaimer = MemoryReclaimer(reactor, reactor.callInThread,
                                         interval=config.memory.trim_interval)
        """Gives the memory of closed connections back to the operating system."""
        self.intake = IntakeGate()
        """Reads from publishing connections, paused while the store's writer is behind."""
        self.turn_writer = TurnWriter(self.reactor)
        """Sends what each reactor turn wrote to each connection, at the turn's end."""
        self.store.on_pressure = self.intake.set_paused
        self.eventlog = EventLogWriter(config.data_dir / "eventlog",
                                       config.eventlog.max_file_bytes,
                                       config.eventlog.max_file_age,
                                       max_queued_records=config.eventlog.max_queued_records,
                                       node=config.engine.node)
        self.engine = make_engine(config, self.store, reactor)
        self.engine.pause_intake_with(self.intake.set_paused)
        self.router = build_router(config, reactor, self.engine, self.eventlog)
        self.store.incidents = self.router.incidents
        self.store.on_retained_lost = self._retained_lost
        self.eventlog.incidents = self.router.incidents
        for realm in self.router.realms.values():
            if realm.retention is not None:
                watch_retention(realm.retention, realm.stats)
        self.listener_limits: list[ConnectionLimits] = []
        """Every client listener's limits, with its connection and byte counts."""
        self._metrics: CollectorRegistry | None = None
        self.mqtt = self._mqtt_frontends()
        self.amqp = self._amqp_frontends()
        self.reclaimer.tables = self._tables
        self.reclaimer.connections = self.router.connections.__len__
        self.webhooks: list[Webhook] = [
            hook for name, realm in self.router.realms.items()
            for hook in open_webhooks(realm, config.realms[name].webhooks,
                                      self.router.principals[name],
                                      self.engine.outbox_store(name), reactor,
                                      config.engine.node)]
        """Every realm's webhooks (started with the node)."""
        self.bridges = [Bridge(bridge, self.router, self.router.realms[bridge.realm],
                               self.engine.bridge_queue(bridge.realm, bridge.name), reactor,
                               config.realms[bridge.realm].mqtt.payload_mapping)
                        for bridge in config.bridges]
        """Connections to other MQTT brokers, each run where the engine says."""
        self.sys = SysFigures(self)
        """``$SYS`` topics and ``wamp.router.stats``, published every ``sys_interval``."""
        for realm in self.router.realms.values():
            self.sys.install(realm)
        self._sys_loop = task.LoopingCall(self.sys.publish)
        self._sys_loop.clock = reactor
        self._expiry = task.LoopingCall(self._expire_retained)
        self._expiry.clock = reactor
        self._log_flush = task.LoopingCall(self._flush_eventlog)
        self._log_flush.clock = reactor
        self._incident_flush = task.LoopingCall(self.router.incidents.flush)
        self._incident_flush.clock = reactor
        self.reloader = Reloader(config, self.router, reactor)
        """Roles, principals and anonymous roles again from the files, on SIGHUP."""
        self._pid_file: Path | None = None
        self.admin_port: IListeningPort | None = None
        """The local operators' socket (config ``admin_socket``), once listening."""
        self.ports: list[tuple[ListenerConfig, IListeningPort]] = []
        self.http_apis: list[HttpApi] = []
        """The ``http`` listeners' APIs (pages such as the console hang under their
        ``pages``)."""
        # One serializer instance per format for all listeners: an EVENT is encoded once
        # per format and the bytes are reused for every receiver on any transport.
        self._serializers = dict(zip(SERIALIZERS, make_serializers(SERIALIZERS)))

    def start(self, cannot_start: Callable[[Exception], None]) -> None:
        """Start the node's loops and webhooks, then the engine; once the engine is connected
        to the other nodes (at once on a single node), open the listeners and say ``ready:``.
        ``cannot_start`` gets what keeps a listener from opening."""
        self._expiry.start(1.0, now=False)
        self.eventlog.start(self.reactor)
        self._log_flush.start(self.config.eventlog.flush_interval, now=False)
        self._incident_flush.start(self.router.incidents.interval, now=False)
        self.reclaimer.start()
        if self.config.sys_interval > 0:
            self._sys_loop.start(self.config.sys_interval, now=True)
        for hook in self.webhooks:  # subscribed before any client can publish
            hook.start()
        self.reactor.addSystemEventTrigger("before", "shutdown", self.shutdown)
        self._watch_reload()
        self.engine.start(self.router.realms, self.router.incidents,
                          lambda: self._let_clients_in(cannot_start))

    def _let_clients_in(self, cannot_start: Callable[[Exception], None]) -> None:
        """The listeners, the admin socket and the bridges, then the ``ready:`` line; what
        keeps them from starting (a port in use) goes to ``cannot_start``, also when the
        engine calls this later, from the reactor."""
        try:
            self._listen_all()
            self._listen_admin()
            for bridge in self.bridges:
                self.engine.run_bridge(bridge.config.realm, bridge.config.name, bridge.start,
                                       bridge.stop)
        except ListenerFailed as exc:  # a port in use: the message says it all
            cannot_start(exc)
            return
        except Exception as exc:  # a bug: its traceback too
            log.exception("opening the listeners failed")
            cannot_start(exc)
            return
        # what start-up built (modules, configuration, restored state) lives as long as the
        # process: out of the collector's scans, a full collection under load looks only at
        # what clients created since, so its pause does not grow with the code base
        gc.collect()
        gc.freeze()
        # and what start-up freed (the configuration's parse, the restored state's rows) goes
        # back to the system now, not at the first periodic trim: ~1.3 MB of an idle router
        self.reclaimer.trim()
        # and full collections rare: each one stops the reactor while it scans every object
        # the clients' connections and queues hold (bench/soak.py: up to ~87k objects with
        # 2,000 idle connections and two full MQTT queues, 83-87 ms of CPU, 118-140 ms on a
        # busy 2-core machine), and what it would find is little, since a closed connection
        # leaves no reference cycle (tests/test_connection_garbage.py)
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
        log.info("ready: %s", " ".join(self.urls()))

    def _listen_all(self) -> None:
        """Every configured client listener; the first that cannot listen stops the rest."""
        for index, listener in enumerate(self.config.listeners):
            try:
                self.ports.append((listener, self._listen(listener)))
            except CannotListenError as exc:
                reason = exc.socketError.strerror if isinstance(exc.socketError, OSError) \
                    else exc.socketError
                raise ListenerFailed(f"{describe(self.config, index)}: cannot listen: "
                                     f"{reason}") from exc

    def _tables(self) -> Iterator[dict | set]:
        """What grows with the connections and keeps its size once they close: the
        reactor's, the router's (with every realm's) and the MQTT frontends' tables."""
        tables = getattr(self.reactor, "tables", None)  # router.reactor's, not another's
        if tables is not None:
            yield from tables()
        yield from self.router.tables()
        for frontend in self.mqtt.values():
            yield frontend.sessions

    def _listen_admin(self) -> None:
        """The admin socket, if configured. One that cannot be opened (another router on this
        data dir, a path over the system's limit) is a warning: the router serves its
        clients without it, and ``retained`` / ``status`` say there is no socket."""
        path = self.config.admin_socket
        if path is None:
            return
        factory = AdminFactory(self.router, self._metrics_text)
        try:
            self.admin_port = self.reactor.listenUNIX(str(path), factory, mode=SOCKET_MODE,
                                                      wantPID=True)
        except (CannotListenError, OSError) as exc:
            reason = getattr(exc, "socketError", None) or exc
            log.warning("%s: no admin socket at %s: %s (set 'admin_socket' to move it)",
                        self.config.source, path, reason)

    def _watch_reload(self) -> None:
        """SIGHUP reloads (where there is one, and when the node runs the process); the pid
        file tells ``python -m router reload`` whom to signal."""
        if (not hasattr(signal, "SIGHUP")
                or threading.current_thread() is not threading.main_thread()):
            return
        signal.signal(signal.SIGHUP,
                      lambda signum, frame: self.reactor.callFromThread(self.reloader.request))
        self._pid_file = self.config.data_dir / PID_FILE
        self._pid_file.write_text(f"{os.getpid()}\n", encoding="ascii")

    def urls(self) -> list[str]:
        urls = []
        for listener, port in self.ports:
            address = port.getHost()
            secure = listener.tls is not None
            hostport = f"{address.host}:{address.port}"
            if listener.type == "http":
                urls.append(f"{'https' if secure else 'http'}://{hostport}/")
            elif listener.type == "metrics":
                urls.append(f"{'https' if secure else 'http'}://{hostport}{listener.path}")
            elif listener.type == "websocket":
                urls.append(f"{'wss' if secure else 'ws'}://{hostport}{listener.path}")
            elif listener.type == "rawsocket":
                urls.append(f"rawsocket{'+tls' if secure else ''}://{hostport}")
            elif listener.type == "mqtt":
                urls.append(f"mqtt{'s' if secure else ''}://{hostport}")
            elif listener.type == "amqp":
                urls.append(f"amqp{'s' if secure else ''}://{hostport}")
            else:
                urls.append(f"mqtt+ws{'s' if secure else ''}://{hostport}{listener.path}")
        return urls

    def _mqtt_frontends(self) -> dict[str, MqttFrontend]:
        """One MQTT frontend per realm an MQTT listener serves, with its sessions restored."""
        frontends = {}
        for listener in self.config.listeners:
            if (listener.realm is None or listener.realm in frontends
                    or listener.type not in ("mqtt", "mqtt-websocket")):
                continue
            realm = self.router.realms[listener.realm]
            frontend = MqttFrontend(self.router, realm, self.config.realms[realm.name].mqtt,
                                    self.engine.mqtt_session_store(realm.name), self.reactor)
            restored = frontend.restore()
            if restored:
                log.info("realm %s: restored %d persistent MQTT session(s)", realm.name, restored)
            frontends[realm.name] = frontend
        return frontends

    @property
    def metrics(self) -> "CollectorRegistry":
        """This node's metrics (not prometheus_client's process-global registry), made at
        the first scrape or metrics listener."""
        if self._metrics is None:
            from router.metrics.collector import registry_for
            self._metrics = registry_for(self)
        return self._metrics

    def _metrics_text(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.metrics)

    def _amqp_frontends(self) -> "dict[str, AmqpFrontend]":
        """One AMQP frontend per realm an AMQP listener serves, durable links restored."""
        frontends = {}
        for listener in self.config.listeners:
            if listener.type != "amqp" or listener.realm in frontends:
                continue
            from router.amqp.frontend import AmqpFrontend
            realm = self.router.realms[listener.realm]
            frontend = AmqpFrontend(self.router, realm, self.config.realms[realm.name].amqp,
                                    self.engine.amqp_store(realm.name),
                                    self.reactor)
            restored = frontend.restore()
            if restored:
                log.info("realm %s: restored %d durable AMQP subscription(s)", realm.name,
                         restored)
            frontends[realm.name] = frontend
        return frontends

    def _listen(self, listener: ListenerConfig) -> IListeningPort:
        factory = self._factory(listener)
        if listener.tls is not None:
            return self.reactor.listenSSL(listener.port, factory, server_options(listener.tls),
                                          backlog=LISTEN_BACKLOG, interface=listener.host)
        return counting_port(self.reactor.listenTCP(listener.port, factory,
                                                    backlog=LISTEN_BACKLOG,
                                                    interface=listener.host))

    def _factory(self, listener: ListenerConfig):
        if listener.type == "metrics":
            from router.metrics.http import metrics_site
            return metrics_site(self.metrics, listener.path, listener.auth)
        factory = (self._http_site(listener) if listener.type == "http"
                   else self._protocol_factory(listener))
        factory.limits = ConnectionLimits(self.reactor, self.router.incidents, listener.limits,
                                          INCIDENT_PROTOCOL[listener.type], listener.realm)
        self.listener_limits.append(factory.limits)
        return factory

    def _http_site(self, listener: ListenerConfig):
        """The REST API and event streams of one ``http`` listener (its realm's)."""
        settings = listener.http
        assert settings is not None and listener.realm is not None
        from router.http.api import HttpApi, http_site
        from router.http.console import ConsoleResource
        from router.http.tokens import TokenFile
        from router.metrics.collector import queued  # the same queue depths the metrics give
        self.router.incidents.keep_recent(settings.max_recent_incidents)
        realm = self.router.realms[listener.realm]
        api = HttpApi(self.router, realm, settings,
                      self.config.realms[realm.name].mqtt.payload_mapping,
                      TokenFile(self.config.data_dir), self.reactor, self.sys.figures,
                      queued)
        api.pages["/console"] = ConsoleResource("/console")
        self.http_apis.append(api)
        return http_site(api, listener.max_message_size, listener.limits.handshake_timeout)

    def _protocol_factory(self, listener: ListenerConfig):
        new_flow = partial(ConnectionFlow, context=FlowContext(
            listener.flow, self.reactor, self.intake, self.reclaimer.released,
            self.turn_writer if listener.tls is None else None))
        if listener.type == "amqp":
            from router.amqp.transports import AmqpTcpFactory
            return AmqpTcpFactory(self.amqp[listener.realm], new_flow,
                                  listener.max_message_size, tls=listener.tls is not None)
        if listener.type == "mqtt":
            return MqttTcpFactory(self.mqtt[listener.realm], new_flow,
                                  tls=listener.tls is not None)
        if listener.type == "mqtt-websocket":
            return MqttWebSocketFactory(self.mqtt[listener.realm], listener.path,
                                        listener.max_message_size, new_flow)
        serializers = [self._serializers[name] for name in listener.serializers]
        session_factory = partial(WampSession, WampListener(
            self.router, f"wamp.{listener.type}",
            {name: realm.wamp for name, realm in self.config.realms.items()}))

        if listener.type == "websocket":
            return RouterWebSocketFactory(session_factory, serializers, listener.path,
                                          listener.max_message_size, new_flow)
        return RouterRawSocketFactory(session_factory, serializers, listener.max_message_size,
                                      new_flow, tls=listener.tls is not None)

    @defer.inlineCallbacks
    def shutdown(self):
        """GOODBYE to every session, give clients a moment to answer, then close."""
        log.info("shutting down: closing %d connection(s)", len(self.router.connections))
        for _, port in self.ports:
            yield port.stopListening()
        if self.admin_port is not None:
            yield self.admin_port.stopListening()
        for peer in list(self.router.connections):
            peer.kill("wamp.close.system_shutdown", "the router is shutting down")
        for bridge in self.bridges:
            bridge.stop()
        deadline = self.reactor.seconds() + self.config.shutdown_timeout
        while self.router.connections and self.reactor.seconds() < deadline:
            yield task.deferLater(self.reactor, 0.05, lambda: None)
        for hook in self.webhooks:  # what they still queue stays stored for the next start
            hook.stop()
            yield hook.client.close()
        for loop in (self._expiry, self._log_flush, self._incident_flush, self._sys_loop):
            if loop.running:
                loop.stop()
        self.reclaimer.cancel()
        if self._pid_file is not None:
            self._pid_file.unlink(missing_ok=True)
        self.engine.close()
        pool = self.reactor.getThreadPool()
        self.store.hand_off()  # what this turn queued, before the writer is told to stop
        yield threads.deferToThreadPool(self.reactor, pool, self.store.close)
        self._flush_eventlog()
        yield threads.deferToThreadPool(self.reactor, pool, self.eventlog.close)
        log.info("shutdown complete")

    def _flush_eventlog(self) -> None:
        """Hand the writer thread what the realms logged, incidents counted so far included."""
        for realm in self.router.realms.values():
            if isinstance(realm.activity, RealmEventLog):
                realm.activity.flush_incidents()
        self.eventlog.flush()

    def _retained_lost(self, realm: str, topic: Topic, stored: list[bytes]) -> None:
        """A retained write failed: the realm's memory goes back to what is stored."""
        retention = self.router.realms[realm].retention
        if retention is not None:
            retention.revert(topic, live_entries(stored, realm, time.time()))

    def _expire_retained(self) -> None:
        for realm in self.router.realms.values():
            if realm.retention is not None:
                realm.retention.expire()
