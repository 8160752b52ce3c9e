"""The node: builds the router from configuration, opens listeners, shuts down cleanly."""

from __future__ import annotations

import logging

from twisted.internet import defer, task
from twisted.internet.interfaces import IListeningPort, IReactorCore

from router.config import SERIALIZERS, ListenerConfig, NodeConfig
from router.core.authorization import Authorizer, Role
from router.core.meta import install_session_meta, install_subscription_meta
from router.core.realm import Realm
from router.core.router import Router
from router.core.testament import Testaments
from router.wamp.codec import make_serializers
from router.wamp.session import WampSession
from router.wamp.transports import RouterRawSocketFactory, RouterWebSocketFactory

log = logging.getLogger(__name__)


def build_router(config: NodeConfig, reactor) -> Router:
    """Realms, authorizers and meta APIs from configuration; no I/O."""
    router = Router()
    for realm_config in config.realms.values():
        roles = {name: Role(name, rules) for name, rules in realm_config.roles.items()}
        realm = Realm(realm_config.name, Authorizer(roles), reactor,
                      uri_check=realm_config.uri_check,
                      anonymous_role=realm_config.anonymous_role)
        install_session_meta(realm)
        install_subscription_meta(realm)
        Testaments(realm)
        router.add_realm(realm, realm_config.principals)
    return router


class Node:
    """A running router: listeners on the reactor and a clean shutdown path."""

    def __init__(self, config: NodeConfig, reactor: IReactorCore) -> None:
        self.config = config
        self.reactor = reactor
        self.router = build_router(config, reactor)
        self.ports: list[tuple[ListenerConfig, IListeningPort]] = []
        # One serializer instance per format for all listeners: an EVENT is encoded once
        # per format and the bytes are reused for every receiver on any transport.
        self._serializers = dict(zip(SERIALIZERS, make_serializers(SERIALIZERS)))

    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        for listener in self.config.listeners:
            self.ports.append((listener, self._listen(listener)))
        self.reactor.addSystemEventTrigger("before", "shutdown", self.shutdown)
        log.info("ready: %s", " ".join(self.urls()))

    def urls(self) -> list[str]:
        urls = []
        for listener, port in self.ports:
            address = port.getHost()
            if listener.type == "websocket":
                urls.append(f"ws://{address.host}:{address.port}{listener.path}")
            else:
                urls.append(f"rawsocket://{address.host}:{address.port}")
        return urls

    def _listen(self, listener: ListenerConfig) -> IListeningPort:
        serializers = [self._serializers[name] for name in listener.serializers]
        protocol_name = f"wamp.{listener.type}"

        def session_factory() -> WampSession:
            return WampSession(self.router, protocol_name)

        if listener.type == "websocket":
            factory = RouterWebSocketFactory(session_factory, serializers, listener.path,
                                             listener.max_message_size)
        else:
            factory = RouterRawSocketFactory(session_factory, serializers,
                                             listener.max_message_size)
        return self.reactor.listenTCP(listener.port, factory, interface=listener.host)

    @defer.inlineCallbacks
    def shutdown(self):
        """GOODBYE to every session, give clients a moment to answer, then close."""
        log.info("shutting down: closing %d connection(s)", len(self.router.connections))
        for _, port in self.ports:
            yield port.stopListening()
        for peer in list(self.router.connections):
            peer.kill("wamp.close.system_shutdown", "the router is shutting down")
        deadline = self.reactor.seconds() + self.config.shutdown_timeout
        while self.router.connections and self.reactor.seconds() < deadline:
            yield task.deferLater(self.reactor, 0.05, lambda: None)
        log.info("shutdown complete")
