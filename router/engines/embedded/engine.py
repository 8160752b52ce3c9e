"""The embedded engine: one node, retained events in memory written behind to SQLite.

What the router always did, behind :class:`router.core.engine.Engine`: nothing is
forwarded (there is no other node) and nobody needs this node's interest.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Mapping

from router.core.engine import Paused, RealmEngine
from router.core.history import EventHistory, HistoryRule
from router.core.incidents import Incidents
from router.core.model import Publication
from router.core.retention import RetainedEvent, RetainedStore, RetentionPolicy
from router.core.topic import SERVER_OWNED, Topic
from router.engines.embedded.bridge_queues import SqliteBridgeQueue
from router.engines.embedded.links import SqliteLinkStore
from router.engines.embedded.outbox import SqliteOutboxStore
from router.engines.embedded.sessions import SqliteSessionStore
from router.engines.embedded.sqlite import SqliteStore
from router.engines.records import encode_retained, live_entries

if TYPE_CHECKING:
    from router.core.realm import Realm

log = logging.getLogger(__name__)


class EmbeddedEngine:
    """Retained events per realm restored from and saved to the node's SQLite store."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store


    def open_realm(self, name: str, policy: RetentionPolicy,
                   history: list[HistoryRule]) -> RealmEngine:
        """The realm's retained events restored from SQLite and written behind to it on every
        change (the router's own ``$SYS`` topics excepted), with an in-memory history."""
        store = self.store
        retention = RetainedStore(policy, encode_retained)
        restored = restore_retained(retention, store, name)
        if restored:
            log.info("realm %s: restored %d retained topic(s)", name, restored)
        # the router's own $SYS figures are republished at start: never stored
        def save(topic: Topic, entries: list[RetainedEvent], action: str,
                 publication: Publication | None) -> None:
            if topic[0] != SERVER_OWNED:
                store.save_retained(name, topic, entries)

        retention.listeners.append(save)
        return RealmEngine(retention, store, EventHistory(history))

    def mqtt_session_store(self, realm: str) -> SqliteSessionStore:
        """Realm ``realm``'s persistent MQTT sessions, in this node's SQLite file."""
        return SqliteSessionStore(self.store, realm)

    def amqp_store(self, realm: str) -> SqliteLinkStore:
        """Realm ``realm``'s durable AMQP links, in this node's SQLite file."""
        return SqliteLinkStore(self.store, realm)

    def outbox_store(self, realm: str) -> SqliteOutboxStore:
        """Realm ``realm``'s webhook queues, in this node's SQLite file."""
        return SqliteOutboxStore(self.store, realm)

    def bridge_queue(self, realm: str, bridge: str) -> SqliteBridgeQueue:
        """Bridge ``bridge``'s queue, in this node's SQLite file."""
        return SqliteBridgeQueue(self.store, realm, bridge)

    def run_bridge(self, realm: str, bridge: str, start: Callable[[], None],
                   stop: Callable[[], None]) -> None:
        """The only node runs every bridge: at once."""
        start()

    def pause_intake_with(self, paused: Paused) -> None:
        """Never asked: the node pauses its intake for its SQLite writer itself."""

    def start(self, realms: "Mapping[str, Realm]", incidents: Incidents,
              ready: Callable[[], None]) -> None:
        """Nothing arrives from elsewhere: ready at once."""
        ready()

    def close(self) -> None:
        """The SQLite store belongs to the node, which closes it after its last write."""


def restore_retained(retention: RetainedStore, store: SqliteStore, realm: str) -> int:
    """Load a realm's retained events as they should look after a restart.

    Session ids of the old process mean nothing now, so entries whose eligibility
    named sessions were never stored, and entries kept only for a publisher's own
    session (older than the newest general event) are dropped.
    """
    now = time.time()
    topics = [(topic, live) for topic, blobs in store.load_retained(realm)
              if (live := live_entries(blobs, realm, now))]
    retention.restore(topics)
    return len(topics)
