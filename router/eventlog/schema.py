"""The one schema of event-log records, used by the writer and by the Spark reader.

Every record is one JSON object per line with these fields; a field that does
not apply to a record's ``kind`` is absent (read as null). Files live at
``<data_dir>/eventlog/realm=<name>/date=<yyyy-mm-dd>/part-<n>.jsonl`` so Spark
prunes by realm and day (the partition columns ``realm`` and ``date`` come from
the path and are not repeated inside records). A node of a cluster (the Redis
engine) writes one folder deeper, ``.../date=<yyyy-mm-dd>/node=<name>/part-<n>.jsonl``,
which gives the partition column ``node`` (null for a single node's logs).
"""

from __future__ import annotations

KINDS = (
    "publish",          # one per publication
    "retained_set",     # a publication became (part of) a topic's retained state
    "retained_clear",   # a topic's retained events were cleared (by a publish or an operator)
    "retained_expire",  # a retained event's TTL passed
    "retained_evict",   # a topic was evicted by the realm's limits
    "subscribe",
    "unsubscribe",
    "session_join",
    "session_leave",
    "ack",              # a receiver acknowledged a QoS >= 1 delivery
    "refused",          # the core refused a client's publish/subscribe/register/call
    "incident",         # incidents of one (protocol, reason) in the last flush interval
)

FIELDS: tuple[tuple[str, str], ...] = (
    ("ts", "double"),            # seconds since the epoch (UTC), when the router saw it
    ("kind", "string"),          # one of KINDS
    ("topic", "string"),         # publish, retained_*, ack, and subscribe/unsubscribe/refused
                                 # with match exact: the canonical core topic
                                 # (router.core.topic.display): the dotted URI of a topic
                                 # that has one (WAMP topics exactly as WAMP names them); a
                                 # topic that has none (an MQTT topic with an empty level or
                                 # a "." inside a level: /a, a//b, a.b/c) in MQTT "/" form,
                                 # or, with one level, a "/" inside one or a first "[",
                                 # as the JSON list of its levels (["a.b"]), with `levels`;
                                 # never a pattern
    ("levels", "array<string>"),  # the topic's levels, present only where `topic` is not the
                                 # dotted form (so split(topic, ".") is the levels otherwise)
    ("publication", "long"),     # publication id (publish, retained_set, retained_expire)
    ("session", "long"),         # acting session: publisher, subscriber, joining/leaving session
    ("authid", "string"),
    ("authrole", "string"),
    ("protocol", "string"),      # e.g. wamp.websocket, wamp.rawsocket, mqtt, amqp
    ("qos", "integer"),          # 0, 1 or 2 (publish, ack)
    ("retain", "boolean"),       # publish: retain requested
    ("payload_bytes", "long"),   # publish: encoded size of the payload as received
    ("receivers", "integer"),    # publish: number of deliveries (fan-out)
    ("eligibility", "string"),   # publish: comma-separated names of black/white lists used
    ("pattern", "string"),       # subscribe/unsubscribe/refused: the pattern as the meta API
                                 # shows it (MQTT filters in "/" form, the rest dotted)
    ("match", "string"),         # subscribe/unsubscribe/refused: one of MATCH_KINDS
    ("subscription", "long"),    # subscribe/unsubscribe
    ("get_retained", "boolean"),  # subscribe
    ("granted_qos", "integer"),  # subscribe
    ("authmethod", "string"),    # session_join / session_leave
    ("duration", "double"),      # session_leave: seconds the session lasted
    ("latency_ms", "double"),    # ack: milliseconds from delivery to acknowledgement (the
                                 # ack also has session fields, topic and the delivered qos)
    ("payload", "string"),       # publish: JSON of [args, kwargs], only where the realm opts in
    ("operation", "string"),     # refused: publish | subscribe | register | call
    ("reason", "string"),        # refused, incident: a reason of router.core.incidents
    ("count", "long"),           # incident: how many in the interval
)

MATCH_KINDS = (
    "exact",     # the pattern is one topic
    "prefix",    # WAMP prefix match
    "wildcard",  # WAMP wildcard match (empty levels match any one level)
    "mqtt",      # an MQTT filter with + or # (levels in the core's level tuples)
)

FIELD_NAMES = tuple(name for name, _ in FIELDS)
DAY_COLUMNS = ("realm", "date")
"""The partition folders of every layout (compacted days are folders of these only)."""
PARTITION_COLUMNS = (*DAY_COLUMNS, "node")
"""All partition columns; ``node`` only exists as a folder in a cluster's logs."""


def spark_ddl() -> str:
    """The schema as a Spark DDL string (``StructType.fromDDL`` / ``schema=`` accept it)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in FIELDS)
