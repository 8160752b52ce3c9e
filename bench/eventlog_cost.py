"""What the event log costs the publish path, measured in-process (no sockets, no clients).

Publishes N events through a realm to K subscribers whose delivery is a no-op,
once without and once with the event log (the writer thread running and
writing to a temporary folder), and prints publishes/s and the relative cost.

    .venv/bin/python bench/eventlog_cost.py --events 200000 --subscribers 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twisted.internet.task import Clock  # noqa: E402

from router.core.authorization import Authorizer, PermissionRule, Role  # noqa: E402
from router.core.model import SessionInfo  # noqa: E402
from router.core.options import PublishOptions, SubscribeOptions  # noqa: E402
from router.core.realm import Realm  # noqa: E402
from router.eventlog.realm_log import RealmEventLog, RealmLogSettings  # noqa: E402
from router.eventlog.writer import EventLogWriter  # noqa: E402

TOPIC = ("bench", "topic")
"""The topic every publication goes to, as the core names it (levels)."""


class SilentPeer:
    def __init__(self, session_id: int) -> None:
        self.info = SessionInfo(session_id, "bench", f"user{session_id}", "anonymous")

    def send_event(self, subscription, publication, retained=False) -> None:
        publication.encodings().setdefault(subscription.id, None)


def run(events: int, subscribers: int, writer: EventLogWriter | None) -> float:
    rules = [PermissionRule(("",), "prefix", frozenset({"publish", "subscribe"}))]
    activity = (RealmEventLog("bench", writer, RealmLogSettings())
                if writer is not None else None)
    realm = Realm("bench", Authorizer({"anonymous": Role("anonymous", rules)}), Clock(),
                  activity=activity)
    peers = [SilentPeer(n + 1) for n in range(subscribers + 1)]
    for peer in peers[1:]:
        realm.subscribe(peer, TOPIC, SubscribeOptions())
    publisher, options = peers[0].info, PublishOptions()
    started = time.perf_counter()
    for n in range(events):
        realm.publish(publisher, TOPIC, [n, "payload"], None, options, None, 32)
        if writer is not None and n % 10_000 == 0:
            writer.flush()  # the router flushes on a timer; do it as often here
    elapsed = time.perf_counter() - started
    if writer is not None:
        writer.close()
    return events / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    without, with_log = [], []
    for _ in range(args.rounds):
        without.append(run(args.events, args.subscribers, None))
        folder = Path(tempfile.mkdtemp(prefix="bench-eventlog-"))
        with_log.append(run(args.events, args.subscribers, EventLogWriter(folder)))
    best_without, best_with = max(without), max(with_log)
    print(f"publishes/s without event log: {best_without:,.0f}")
    print(f"publishes/s with event log:    {best_with:,.0f}")
    print(f"cost of logging on the publish path: {(1 - best_with / best_without) * 100:.1f}%")


if __name__ == "__main__":
    main()
