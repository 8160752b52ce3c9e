"""A realm's event history in Redis: the same rules on every node, one log for the cluster.

Each history rule of the realm is a Redis list ``wr:history:<realm>:<match>:<pattern>``,
newest first, trimmed to the rule's ``limit`` in the script that pushes to it (and
expiring ``max_age`` after its last push), so Redis holds at most the rules' limits
whatever the publishers do. An entry is ``<sequence> <exclude_me><publication>``: the
sequence (one counter per realm, ``wr:history-seq:<realm>``) orders events across rules
and nodes and makes an event two rules keep count once; the publication is the form the
nodes forward to each other (:func:`router.engines.records.pack_publication`).

Writes are batched: what a reactor turn recorded goes to Redis as one script call, not
waited for (lost and counted when Redis is not connected or too far behind). A read asks
for every rule's list in one transaction and answers when Redis replies; the entries are
decoded on the reactor (at most the sum of the rules' limits per read).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgpack
from twisted.python.failure import Failure

from router.core.history import Answer, HistoryRule, TimeWindow, recordable, select
from router.core.incidents import UNENCODABLE
from router.core.model import Publication, SessionInfo
from router.core.topic import Topic, topic_matches
from router.engines.records import pack_publication, topic_key, unpack_publication
from router.engines.redis.lua import script
from router.engines.redis.resp import Arg, command

if TYPE_CHECKING:
    from router.engines.redis.context import EngineContext

APPEND = script("append")
"""KEYS: the sequence counter, then one list per rule. ARGV: each rule's limit, each rule's
max_age in ms (0: none), then per event the indexes of the rules it matched ("0,2") and
its entry without the sequence."""


class RedisHistory:
    """The history of one realm, kept in Redis (see the module docstring)."""

    def __init__(self, engine: "EngineContext", realm: str, rules: list[HistoryRule]) -> None:
        self.engine = engine
        self.realm = realm
        self.rules = rules
        self.keys = [f"wr:history:{realm}:{rule.match}:{topic_key(rule.pattern)}".encode()
                     for rule in rules]
        self._head: list[Arg] = [f"wr:history-seq:{realm}".encode(), *self.keys,
                      *(rule.limit for rule in rules),
                      *(int(rule.max_age * 1000) if rule.max_age else 0 for rule in rules)]
        self._batch: list[bytes] = []
        """Rule indexes and entry of each event recorded in this reactor turn."""

    def __bool__(self) -> bool:
        return bool(self.rules)

    def size(self) -> int:
        """The logs are in Redis (what a reactor turn recorded is sent at its end)."""
        return 0

    def record(self, publication: Publication) -> None:
        """Append a publication to every matching rule's list in Redis, in one script call per
        reactor turn."""
        if not recordable(publication):
            return
        matched = b",".join(b"%d" % index for index, rule in enumerate(self.rules)
                            if topic_matches(rule.pattern, rule.match, publication.topic))
        if not matched:
            return
        try:
            packed = pack_publication(self.realm, publication)
        except (TypeError, ValueError) as exc:
            self.engine.incidents.count(self.realm, "engine", UNENCODABLE,
                                        f"topic {publication.name}: not kept in the "
                                        f"history ({exc})")
            return
        if not self._batch:
            self.engine.reactor.callLater(0, self._flush)
        self._batch += (matched, (b"1" if publication.exclude_me else b"0") + packed)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        self.engine.send(command("EVAL", APPEND, len(self.keys) + 1, *self._head, *batch), 1,
                         self.realm, f"history: {len(batch) // 2} event(s) not kept")

    def read(self, pattern: Topic, match: str, session: SessionInfo, limit: int | None,
             reverse: bool, window: TimeWindow | None, answer: Answer) -> None:
        """Every rule's list in one transaction; ``answer`` runs when Redis replies."""
        lists = b"".join(command("LRANGE", key, 0, -1) for key in self.keys)
        replies = self.engine.request(command("MULTI") + lists + command("EXEC"),
                                      1 + len(self.keys))

        def replied(logs: "list[list[bytes]] | Failure") -> None:
            if isinstance(logs, Failure):
                answer(logs.value if isinstance(logs.value, Exception) else Exception(logs))
                return
            now = time.time()
            try:
                events = select(self._decode(logs, now), pattern, match, session, limit,
                                reverse, window, now)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                answer(exc)  # an entry this node cannot read (not written by a node)
                return
            answer(events)

        replies.addBoth(replied)

    def _decode(self, logs: list[list[bytes]], now: float) -> list[tuple[int, Publication]]:
        """(sequence, publication) of each entry no older than its rule's ``max_age``; an
        event two rules keep is decoded once."""
        decoded: dict[int, Publication] = {}
        kept = []
        for rule, entries in zip(self.rules, logs):
            horizon = now - rule.max_age if rule.max_age is not None else None
            for entry in entries:
                sequence_text, data = entry.split(b" ", 1)
                sequence = int(sequence_text)
                publication = decoded.get(sequence)
                if publication is None:
                    _, publication = unpack_publication(data[1:], data[:1] == b"1")
                    decoded[sequence] = publication
                if horizon is None or publication.timestamp >= horizon:
                    kept.append((sequence, publication))
        return kept
