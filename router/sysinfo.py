"""Router figures for clients: MQTT ``$SYS/broker/...`` topics, ``wamp.router.stats`` and
``wamp.router.on_stats``, every ``sys_interval`` seconds, one set per realm.

The names and units are Mosquitto's where it has them, so MQTT tools that read a
Mosquitto's ``$SYS`` read ours. WAMP clients get the same figures, keyed by the same names
without the ``$SYS/broker/`` prefix.

``$SYS`` figures are router-originated retained publications on the level-tuple topics
``("$SYS", "broker", ...)``, published through the core like any other: a subscriber gets
the last values when it subscribes, a persistent session keeps its subscription, filters
starting with a wildcard do not match them (MQTT's ``$`` rule, kept by the core), and who
may read them is decided by the realm's rules on those levels (clients can never publish
there: ``SERVER_OWNED`` in :mod:`router.core.topic`).
"""

from __future__ import annotations

import sys
import time
from importlib.metadata import PackageNotFoundError, version

from router.core.incidents import DROP_REASONS
from router.core.model import SessionInfo
from router.core.realm import Realm
from router.core.topic import SERVER_OWNED
from router.figures import NodeFigures
from router.mqtt.session import MqttSession
from router.webhooks.webhook import Webhook

BROKER = (SERVER_OWNED, "broker")
"""The first levels of every figure's topic, as Mosquitto names them."""
STATS_TOPIC = "wamp.router.on_stats"
STATS_PROCEDURE = "wamp.router.stats"


def _version() -> str:
    try:
        return f"wamp-retain-router {version('wamp-retain-router')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "wamp-retain-router"


class SysFigures:
    """Figures of the node and each realm, and their publication every interval."""

    def __init__(self, node: NodeFigures) -> None:
        self.node = node
        self.started = time.time()
        self.version = _version()
        self._last: dict[str, dict[str, str]] = {}
        """realm -> figure name -> the payload last published (only changes go out)."""

    def figures(self, realm: Realm) -> dict[str, int | str]:
        """``$SYS/broker/`` suffix -> value, for one realm (bytes and version: the node's)."""
        stats = realm.stats
        received = sum(sum(counts.values()) for counts in stats.received)
        sent = sum(sum(counts.values()) for counts in stats.delivered)
        dropped = sum(n for (name, _, reason), n in self.node.router.incidents.totals.items()
                      if name == realm.name and reason in DROP_REASONS)
        # an AMQP link or a webhook is not a client; without AMQP its module (and proton) is
        # not loaded, and there is no link to leave out
        amqp = sys.modules.get("router.amqp.subscriber")
        links = (amqp.AmqpSubscriber, Webhook) if amqp is not None else (Webhook,)
        clients = [peer for peer in realm.sessions.values() if not isinstance(peer, links)]
        connected = sum(1 for peer in clients
                        if not isinstance(peer, MqttSession) or peer.connection is not None)
        mqtt = self.node.mqtt.get(realm.name)
        away = sum(1 for s in mqtt.sessions.values() if s.connection is None) if mqtt else 0
        limits = self.node.listener_limits
        bridges = {f"connection/{bridge.config.name}/state": int(bridge.online)
                   for bridge in self.node.bridges  # in a cluster, the node that runs it says
                   if bridge.realm is realm and bridge.running}
        return {
            "version": self.version,
            "uptime": f"{int(time.time() - self.started)} seconds",
            "clients/connected": connected,
            "clients/total": connected + away,
            "clients/disconnected": away,
            "messages/received": received,
            "messages/sent": sent,
            "publish/messages/received": received,
            "publish/messages/sent": sent,
            "publish/messages/dropped": dropped,
            "retained messages/count": len(realm.retention) if realm.retention is not None else 0,
            "subscriptions/count": len(realm.broker.index.by_id),
            "bytes/received": sum(limit.bytes_in for limit in limits),
            "bytes/sent": sum(limit.bytes_out for limit in limits),
            **bridges,  # 1 connected, 0 not: Mosquitto's name and values for its bridges
        }

    def install(self, realm: Realm) -> None:
        """``wamp.router.stats`` on ``realm``."""
        def stats(caller: SessionInfo, args: list, kwargs: dict) -> dict:
            return self.figures(realm)
        realm.dealer.procedures[STATS_PROCEDURE] = stats

    def publish(self) -> None:
        """One interval: all figures on ``wamp.router.on_stats``, the changed ones as
        retained ``$SYS`` publications."""
        for realm in self.node.router.realms.values():
            figures = self.figures(realm)
            realm.publish_meta(STATS_TOPIC, [figures])
            last = self._last.setdefault(realm.name, {})
            for name, value in figures.items():
                payload = str(value)  # Mosquitto's payload: the value as text
                if last.get(name) != payload:
                    last[name] = payload
                    realm.publish_retained_figure(BROKER + tuple(name.split("/")),
                                                  payload.encode())
