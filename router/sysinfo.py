"""Router figures for clients: MQTT ``$SYS/broker/...`` topics, ``wamp.router.stats`` and
``wamp.router.on_stats``, every ``sys_interval`` seconds, one set per realm.

The names and units are Mosquitto's where it has them, so MQTT tools that read a
Mosquitto's ``$SYS`` read ours. WAMP clients get the same figures, keyed by the same names
without the ``$SYS/broker/`` prefix. Who may read them: roles allowed to subscribe to
``wamp.router.on_stats`` (for ``$SYS`` too) or to call ``wamp.router.stats``.

``$SYS`` topics are not WAMP URIs (a ``$`` level, spaces), so they are served here, next to
the core rather than through it. An MQTT filter starting with ``$SYS/`` that the realm cannot
map (a strict realm) subscribes to this module's topics only; one it can map (a loose realm,
where clients may publish ``$SYS/...`` themselves) subscribes through the core as before and
gets the router's figures on that same subscription as well. As MQTT requires, no filter
starting with a wildcard matches them.
"""

from __future__ import annotations

import itertools
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Callable

from router.amqp.subscriber import AmqpSubscriber
from router.core import errors
from router.core.broker import Subscription
from router.core.errors import RouterError
from router.core.ids import random_id
from router.core.model import Publication, SessionInfo
from router.core.realm import Realm
from router.core.uri import EXACT
from router.metrics.collector import DROP_REASONS

from router.mqtt.packets import ReasonCode, SubscriptionOptions
from router.mqtt.session import MqttSession, MqttSubscription

if TYPE_CHECKING:
    from router.mqtt.frontend import MqttFrontend
    from router.node import Node

PREFIX = "$SYS/broker/"
STATS_TOPIC = "wamp.router.on_stats"
STATS_PROCEDURE = "wamp.router.stats"
SysKey = tuple[int, str]
"""(MQTT session id, ``$SYS`` filter)."""


def _version() -> str:
    try:
        return f"wamp-retain-router {version('wamp-retain-router')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "wamp-retain-router"


def filter_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching on ``/`` levels (``+`` one level, ``#`` this and every level below)."""
    levels = topic.split("/")
    parts = topic_filter.split("/")
    for index, part in enumerate(parts):
        if part == "#":
            return True
        if index >= len(levels) or (part != "+" and part != levels[index]):
            return False
    return len(parts) == len(levels)


class SysFigures:
    """Figures of the node and each realm, and their publication to subscribers."""

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.started = time.time()
        self.version = _version()
        self._subscribers: dict[str, dict[SysKey, tuple[MqttSession, Subscription, str]]] = {}
        """realm -> (session id, filter) -> (session, its subscription, the filter)."""
        self._ids = itertools.count(-1, -1)
        """Ids of ``$SYS`` subscriptions: negative, so never one of the broker's (from 1),
        which an MQTT session uses to find its subscription's options."""
        self._last: dict[str, dict[str, str]] = {}
        """realm -> topic -> the payload last published (only changes go out)."""

    # figures ------------------------------------------------------------------------

    def figures(self, realm: Realm) -> dict[str, int | str]:
        """``$SYS/broker/`` suffix -> value, for one realm (bytes and version: the node's)."""
        stats = realm.stats
        received = sum(sum(counts.values()) for counts in stats.received)
        sent = sum(sum(counts.values()) for counts in stats.delivered)
        dropped = sum(n for (name, _, reason), n in self.node.router.incidents.totals.items()
                      if name == realm.name and reason in DROP_REASONS)
        clients = [peer for peer in realm.sessions.values()
                   if not isinstance(peer, AmqpSubscriber)]  # a link, not a client
        connected = sum(1 for peer in clients
                        if not isinstance(peer, MqttSession) or peer.connection is not None)
        mqtt = self.node.mqtt.get(realm.name)
        away = sum(1 for s in mqtt.sessions.values() if s.connection is None) if mqtt else 0
        total = connected + away
        limits = self.node.listener_limits
        return {
            "version": self.version,
            "uptime": f"{int(time.time() - self.started)} seconds",
            "clients/connected": connected,
            "clients/total": total,
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
        }

    # WAMP ---------------------------------------------------------------------------

    def install(self, realm: Realm) -> None:
        """``wamp.router.stats`` on ``realm``; drops a leaving session's ``$SYS`` filters."""
        def stats(caller: SessionInfo, args: list, kwargs: dict) -> dict:
            return self.figures(realm)
        realm.dealer.procedures[STATS_PROCEDURE] = stats
        realm.on_leave(lambda peer: self._forget(realm.name, peer.info.session_id))

    # MQTT $SYS ----------------------------------------------------------------------

    def subscribe(self, frontend: "MqttFrontend", session: MqttSession, topic_filter: str,
                  options: SubscriptionOptions, identifier: int | None
                  ) -> tuple[int, Callable[[], None] | None]:
        """An MQTT SUBSCRIBE to a ``$SYS/`` filter, answered like the frontend's own: (SUBACK
        reason code, a call that sends the current figures as retained messages, if due).
        Not persisted: a resumed session subscribes again, as with Mosquitto's ``$SYS``."""
        realm = frontend.realm
        if not realm.authorizer.allows(session.info.authrole, "subscribe", STATS_TOPIC, EXACT):
            frontend.count_refusal(session, f"subscribe {topic_filter}", RouterError(
                errors.NOT_AUTHORIZED, f"role '{session.info.authrole}' may not read $SYS"))
            return ReasonCode.NOT_AUTHORIZED, None
        existed = topic_filter in session.subscriptions
        granted = min(options.qos, frontend.settings.max_qos)
        subscription = Subscription(next(self._ids), topic_filter, "mqtt")
        session.add_subscription(MqttSubscription(topic_filter, subscription, SubscriptionOptions(
            granted, options.no_local, options.retain_as_published, options.retain_handling),
            identifier), persist=False)
        self._watch(realm, session, subscription, topic_filter)
        if options.retain_handling == 2 or (options.retain_handling == 1 and existed):
            return granted, None
        return granted, self._sender(realm, session, subscription, topic_filter)

    def also(self, realm: Realm, session: MqttSession, core: Subscription, topic_filter: str,
             deliver: Callable[[], None] | None) -> Callable[[], None] | None:
        """A ``$SYS/`` filter the core took (a loose realm): the router's figures go on the
        same subscription, for roles that may read them; returns the retained-message
        sender to use instead of ``deliver`` (None: nothing is due)."""
        if not realm.authorizer.allows(session.info.authrole, "subscribe", STATS_TOPIC, EXACT):
            return deliver
        self._watch(realm, session, core, topic_filter)
        if deliver is None:
            return None
        figures = self._sender(realm, session, core, topic_filter)

        def both() -> None:
            deliver()
            figures()
        return both

    def _watch(self, realm: Realm, session: MqttSession, subscription: Subscription,
               topic_filter: str) -> None:
        subscribers = self._subscribers.setdefault(realm.name, {})
        subscribers[(session.info.session_id, topic_filter)] = (session, subscription,
                                                                topic_filter)

    def _sender(self, realm: Realm, session: MqttSession, subscription: Subscription,
                topic_filter: str) -> Callable[[], None]:
        """A call that sends the current figures matching ``topic_filter``, retained."""
        def send_retained() -> None:
            for topic, payload in self._payloads(self.figures(realm)).items():
                if filter_matches(topic_filter, topic):
                    realm.broker.deliver(session, subscription, self._publication(topic, payload),
                                         retained=True)
        return send_retained

    def unsubscribe(self, realm: Realm, session: MqttSession, topic_filter: str) -> None:
        """Forget one ``$SYS`` filter of a session (the frontend drops its own record)."""
        self._subscribers.get(realm.name, {}).pop((session.info.session_id, topic_filter), None)

    def _forget(self, realm: str, session_id: int) -> None:
        subscribers = self._subscribers.get(realm)
        if subscribers:
            for key in [key for key in subscribers if key[0] == session_id]:
                del subscribers[key]

    @staticmethod
    def _payloads(figures: dict[str, int | str]) -> dict[str, str]:
        """``$SYS`` topic -> payload (Mosquitto's: the value as text)."""
        return {PREFIX + name: str(value) for name, value in figures.items()}

    @staticmethod
    def _publication(topic: str, payload: str) -> Publication:
        return Publication(random_id(), topic, None, None, None, retain=True,
                           payload=payload.encode())

    # the interval -------------------------------------------------------------------

    def publish(self) -> None:
        """One interval: changed ``$SYS`` figures to MQTT subscribers, all figures on
        ``wamp.router.on_stats`` (for WAMP subscribers allowed to subscribe to it)."""
        for realm in self.node.router.realms.values():
            figures = self.figures(realm)
            realm.publish_meta(STATS_TOPIC, [figures])
            payloads = self._payloads(figures)
            last = self._last.get(realm.name, {})
            self._last[realm.name] = payloads
            subscribers = list(self._subscribers.get(realm.name, {}).values())
            if not subscribers:
                continue
            for topic, payload in payloads.items():
                if last.get(topic) == payload:
                    continue
                publication = self._publication(topic, payload)
                for session, subscription, topic_filter in subscribers:
                    if filter_matches(topic_filter, topic):
                        realm.broker.deliver(session, subscription, publication)
                publication.wire_cache = None
