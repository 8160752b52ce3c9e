"""Counting a realm's retained evictions and expiries for the metrics: wired at start,
without prometheus_client (imported only once metrics are asked for)."""

from __future__ import annotations

from router.core.retention import RetainedStore
from router.core.stats import RealmStats


def watch_retention(retention: RetainedStore, stats: RealmStats) -> None:
    """Count a realm's retained evictions and expiries (told by the store's change listeners)."""
    def changed(topic: str, entries: list, action: str, publication: object) -> None:
        if action == "evict":
            stats.retained_evictions += 1
        elif action == "expire":
            stats.retained_expiries += 1
    retention.listeners.append(changed)
