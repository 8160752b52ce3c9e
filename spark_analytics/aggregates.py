"""The report's tables: each function turns the event records into one small DataFrame.

Times are UTC wall-clock (``timestamp_ntz``) so the tables read the same on any machine.
Percentiles come out as separate ``_p50``/``_p90``/``_p99`` columns because CSV has no arrays.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from router.core import incidents
from router.eventlog.schema import KINDS

PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
QOS_LEVELS = (0, 1, 2)
RETAINED_KINDS = tuple(kind for kind in KINDS if kind.startswith("retained_"))

# Only these fields feed a table: the report caches them, not payloads or eligibility lists.
USED_COLUMNS = ("realm", "ts", "kind", "topic", "publication", "session", "authid", "protocol",
                "qos", "retain", "payload_bytes", "receivers", "duration", "latency_ms",
                "pattern", "match", "operation", "reason", "count")

DROP_REASONS = (incidents.SLOW_CONSUMER, incidents.QUEUE_FULL, incidents.EXPIRED,
                incidents.UNENCODABLE, incidents.UNREPRESENTABLE, incidents.TOO_LARGE,
                incidents.UNACKNOWLEDGED, incidents.DELIVERY_FAILED)
"""Incident reasons that mean a message did not reach a receiver."""
REFUSAL_REASONS = (incidents.INVALID_TOPIC, incidents.UNSUPPORTED, incidents.REFUSED,
                   incidents.DISCONNECTED, incidents.STORE_FAILED)
"""Incident reasons that mean a client's operation or connection was refused or failed
(not_authorized comes from the core's own ``refused`` records, once per operation)."""
TOP_TOPICS_OVER_TIME = 10


def is_kind(kind: str) -> Column:
    return F.col("kind") == kind


def utc_time(seconds: Column) -> Column:
    """Epoch seconds as a UTC wall-clock timestamp (the session's time zone is UTC)."""
    return F.timestamp_seconds(seconds).cast("timestamp_ntz")


def epoch_minute(seconds: Column) -> Column:
    """Minutes since the epoch: grouping on a number is much cheaper than on a timestamp."""
    return F.floor(seconds / 60)


def minute_time(minutes: Column) -> Column:
    return utc_time(minutes * 60)


def percentiles(values: Column, name: str) -> Column:
    """Approximate percentiles of ``values`` (nulls ignored) as one array column ``name``;
    :func:`split_percentiles` turns it into columns after the aggregation."""
    return F.percentile_approx(values, list(PERCENTILES.values())).alias(name)


def split_percentiles(table: DataFrame, *names: str) -> DataFrame:
    for name in names:
        for position, suffix in enumerate(PERCENTILES):
            table = table.withColumn(f"{name}_{suffix}", F.col(name)[position])
        table = table.drop(name)
    return table


def topic_counters() -> list[Column]:
    """Per-topic counts that only ever grow, so the stream can keep them as running state."""
    publish = is_kind("publish")
    return [
        F.count_if(publish).alias("events"),
        F.coalesce(F.sum(F.when(publish, F.col("payload_bytes"))), F.lit(0)).alias("bytes"),
        *(F.count_if(publish & (F.col("qos") == level)).alias(f"qos{level}")
          for level in QOS_LEVELS),
        F.count_if(publish & F.col("retain")).alias("retained_publishes"),
        *(F.count_if(is_kind(kind)).alias(kind) for kind in RETAINED_KINDS),
        F.count_if(is_kind("subscribe")).alias("subscribes"),
    ]


def publishes(events: DataFrame) -> DataFrame:
    return events.where(is_kind("publish"))


def size_bucket(size: Column) -> Column:
    """A payload-size bucket ``b`` holds sizes from ``b`` up to twice ``b`` (0 holds empty
    payloads; null when the size is unknown)."""
    return F.when(size <= 0, F.lit(0)).otherwise(
        # the epsilon keeps an exact power of two (whose log2 may come out a hair below) in its bucket
        F.pow(F.lit(2), F.floor(F.log2(size) + 1e-9))).cast("long")


def topic_minutes(events: DataFrame) -> DataFrame:
    """Publishes per realm, topic and epoch minute (``events``)."""
    return (publishes(events)
            .groupBy("realm", "topic", epoch_minute(F.col("ts")).alias("minute"))
            .agg(F.count("*").alias("events")))


def summary(events: DataFrame, topics: DataFrame, publishers: DataFrame) -> DataFrame:
    """One row per realm: time range, totals and the headline percentiles; the distinct
    topics and publishers are the rows of the (small, already built) ``topics`` and
    ``publishers`` tables, a topic or authid with no publish has no row there."""
    publish = is_kind("publish")
    totals = events.groupBy("realm").agg(
        F.count("*").alias("records"),
        utc_time(F.min("ts")).alias("first_seen"),
        utc_time(F.max("ts")).alias("last_seen"),
        F.count_if(publish).alias("events"),
        F.coalesce(F.sum(F.when(publish, F.col("payload_bytes"))), F.lit(0)).alias("bytes"),
        F.count_if(is_kind("session_join")).alias("sessions"),
        percentiles(F.when(publish, F.col("receivers")), "receivers"),
        F.count_if(is_kind("ack")).alias("acks"),
        percentiles(F.when(is_kind("ack"), F.col("latency_ms")), "ack_latency_ms"),
    )
    # not distinct counts next to the percentiles: Spark would expand every record once per
    # distinct column and compute the percentiles over all copies
    distinct = (topics.groupBy("realm").agg(F.count("topic").alias("topics"))
                .join(publishers.groupBy("realm").agg(F.count("authid").alias("publishers")),
                      "realm", "full"))
    table = (totals.join(distinct, "realm", "left")
             .fillna(0, subset=["topics", "publishers"]))
    return split_percentiles(table, "receivers", "ack_latency_ms").select(
        "realm", "records", "first_seen", "last_seen", "events", "bytes", "topics", "publishers",
        "sessions", *(f"receivers_{suffix}" for suffix in PERCENTILES), "acks",
        *(f"ack_latency_ms_{suffix}" for suffix in PERCENTILES)).orderBy("realm")


def topics(events: DataFrame) -> DataFrame:
    """Per realm and topic: volume, rate and peak minute, QoS split, retention, fan-out."""
    publish = is_kind("publish")
    totals = (events.where(F.col("topic").isNotNull()).groupBy("realm", "topic")
              .agg(*topic_counters(),
                   percentiles(F.when(publish, F.col("receivers")), "receivers"),
                   F.count_if(publish & (F.col("receivers") == 0)).alias("unreceived"),
                   (F.max(F.when(publish, F.col("ts"))) - F.min(F.when(publish, F.col("ts"))))
                   .alias("active_seconds")))
    per_minute = topic_minutes(events).withColumnRenamed("events", "minute_events")
    rates = per_minute.groupBy("realm", "topic").agg(
        # the busiest minute; on a tie the earliest (min of (-events, minute))
        minute_time(F.min_by("minute", F.struct(-F.col("minute_events"), F.col("minute"))))
        .alias("peak_minute"),
        F.max("minute_events").alias("peak_minute_events"),
    )
    table = (totals.where(F.col("events") > 0).join(rates, ["realm", "topic"], "left")
             .withColumn("events_per_minute",
                         F.col("events") * 60 / F.greatest(F.col("active_seconds"), F.lit(60.0)))
             .withColumn("retained_share",
                         F.when(F.col("events") > 0,
                                F.col("retained_publishes") / F.col("events"))))
    table = split_percentiles(table, "receivers")
    return table.select(
        "realm", "topic", "events", "bytes", "events_per_minute", "active_seconds",
        "peak_minute", "unreceived",
        "peak_minute_events", *(f"qos{level}" for level in QOS_LEVELS), "retained_share",
        "retained_publishes", *RETAINED_KINDS, "subscribes",
        *(f"receivers_{suffix}" for suffix in PERCENTILES),
    ).orderBy(F.desc("events"), "realm", "topic")


def events_per_minute(events: DataFrame) -> DataFrame:
    """Publishes and bytes per realm and UTC minute, for the traffic-over-time chart."""
    return (publishes(events).groupBy("realm", epoch_minute(F.col("ts")).alias("minute"))
            .agg(F.count("*").alias("events"),
                 F.coalesce(F.sum("payload_bytes"), F.lit(0)).alias("bytes"))
            .withColumn("minute", minute_time(F.col("minute")))
            .orderBy("realm", "minute"))


def with_share_of_realm(table: DataFrame, count_column: str) -> DataFrame:
    realm_total = F.sum(count_column).over(Window.partitionBy("realm"))
    return table.withColumn("share", F.col(count_column) / realm_total)


def qos(events: DataFrame) -> DataFrame:
    """Publishes per realm and QoS level, with each level's share of the realm."""
    table = publishes(events).groupBy("realm", "qos").agg(F.count("*").alias("events"))
    return with_share_of_realm(table, "events").orderBy("realm", "qos")


def fanout(events: DataFrame) -> DataFrame:
    """How many publishes reached how many receivers: the fan-out distribution."""
    return (publishes(events).where(F.col("receivers").isNotNull())
            .groupBy("realm", "receivers").agg(F.count("*").alias("publishes"))
            .orderBy("realm", "receivers"))


def publishers(events: DataFrame) -> DataFrame:
    """Publishers (by authid) with their volume, busiest first."""
    # per topic first, then per publisher: cheaper than a distinct count next to the sums
    per_topic = (publishes(events).groupBy("realm", "authid", "topic")
                 .agg(F.count("*").alias("events"), F.sum("payload_bytes").alias("bytes")))
    table = per_topic.groupBy("realm", "authid").agg(
        F.sum("events").alias("events"), F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
        F.count("topic").alias("topics"))
    return with_share_of_realm(table, "events").orderBy(F.desc("events"), "realm", "authid")


def protocols(events: DataFrame) -> DataFrame:
    """Sessions joined and events published per transport protocol."""
    return (events.where(is_kind("session_join") | is_kind("publish"))
            .groupBy("realm", "protocol")
            .agg(F.count_if(is_kind("session_join")).alias("sessions"),
                 F.count_if(is_kind("publish")).alias("events"))
            .orderBy("realm", F.desc("sessions"), F.desc("events")))


def sessions(events: DataFrame) -> DataFrame:
    """Sessions per realm and how long they lasted (from session_leave's duration, seconds)."""
    left = is_kind("session_leave")
    table = events.groupBy("realm").agg(
        F.count_if(is_kind("session_join")).alias("joined"),
        F.count_if(left).alias("left"),
        F.count_distinct(F.when(is_kind("session_join"), F.col("authid"))).alias("authids"),
        F.avg(F.when(left, F.col("duration"))).alias("duration_mean"),
        percentiles(F.when(left, F.col("duration")), "duration"),
        F.max(F.when(left, F.col("duration"))).alias("duration_max"),
    ).where((F.col("joined") > 0) | (F.col("left") > 0))
    return split_percentiles(table, "duration").orderBy("realm")


def ack_latency(events: DataFrame) -> DataFrame:
    """Acknowledgement latency per realm and topic. An ack that names its topic counts there;
    one that names only its publication takes the topic of that publish (null when the publish
    is outside the range read). The join runs only when some ack needs it."""
    acks = events.where(is_kind("ack"))
    if not acks.where(F.col("topic").isNull() & F.col("publication").isNotNull()).isEmpty():
        published = (publishes(events).where(F.col("publication").isNotNull())
                     .select("realm", "publication", F.col("topic").alias("published_topic"))
                     .dropDuplicates(["realm", "publication"]))
        acks = (acks.join(published, ["realm", "publication"], "left")
                .withColumn("topic", F.coalesce("topic", "published_topic")))
    table = acks.groupBy("realm", "topic").agg(
        F.count("*").alias("acks"), percentiles(F.col("latency_ms"), "latency_ms"),
        F.max("latency_ms").alias("latency_ms_max"))
    return split_percentiles(table, "latency_ms").orderBy(F.desc("acks"), "realm", "topic")


def protocol_family(protocol: Column) -> Column:
    """``wamp`` for ``wamp.websocket``/``wamp.rawsocket``: incidents name the family only."""
    return F.split(protocol, r"\.")[0]


def refused(events: DataFrame) -> DataFrame:
    """Refused and failed operations per realm, protocol, operation and reason: the core's
    ``refused`` records (not authorized, any protocol; MQTT/AMQP clients got a negative ack)
    and refusal incidents (invalid topics, unsupported values, refused connections...)."""
    rows = events.where(is_kind("refused") | (is_kind("incident")
                                              & F.col("reason").isin(*REFUSAL_REASONS)))
    return (rows.groupBy("realm", protocol_family(F.col("protocol")).alias("protocol"),
                         F.coalesce("operation", F.lit("-")).alias("operation"), "reason")
            .agg(F.sum(F.coalesce("count", F.lit(1))).alias("refused"))
            .orderBy("realm", F.desc("refused"), "protocol", "operation", "reason"))


def drops(events: DataFrame) -> DataFrame:
    """Messages not delivered, per realm, protocol and reason (from incident records)."""
    return (events.where(is_kind("incident") & F.col("reason").isin(*DROP_REASONS))
            .groupBy("realm", "protocol", "reason").agg(F.sum("count").alias("dropped"))
            .orderBy("realm", F.desc("dropped"), "protocol", "reason"))


def hour(seconds: Column) -> Column:
    return utc_time(F.floor(seconds / 3600) * 3600)


def retained_per_hour(events: DataFrame) -> DataFrame:
    """Retained-store changes per realm and UTC hour, with the running net of topics set
    minus topics cleared, expired or evicted since the start of the range read."""
    table = (events.where(F.col("kind").startswith("retained_"))
             .groupBy("realm", hour(F.col("ts")).alias("hour"))
             .agg(*(F.count_if(is_kind(kind)).alias(kind.removeprefix("retained_") + "s")
                    for kind in RETAINED_KINDS)))
    change = F.col("sets") - F.col("clears") - F.col("expires") - F.col("evicts")
    running = Window.partitionBy("realm").orderBy("hour").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return table.withColumn("net_changes", F.sum(change).over(running)).orderBy("realm", "hour")


def latency_columns() -> list[Column]:
    return [F.count("*").alias("acks"), percentiles(F.col("latency_ms"), "latency_ms"),
            F.max("latency_ms").alias("latency_ms_max")]


def ack_latency_by_protocol(events: DataFrame) -> DataFrame:
    """Acknowledgement latency per realm and the acknowledging client's protocol."""
    table = events.where(is_kind("ack")).groupBy("realm", "protocol").agg(*latency_columns())
    return split_percentiles(table, "latency_ms").orderBy("realm", "protocol")


def slowest_consumers(events: DataFrame) -> DataFrame:
    """Acknowledging sessions, slowest (by p99 latency) first."""
    table = (events.where(is_kind("ack"))
             .groupBy("realm", "session", "authid", "protocol").agg(*latency_columns()))
    return split_percentiles(table, "latency_ms").orderBy(
        F.desc("latency_ms_p99"), F.desc("acks"), "realm", "session")


def subscriptions(events: DataFrame) -> DataFrame:
    """Per realm and pattern: subscribe/unsubscribe counts and the sessions subscribing."""
    return (events.where(is_kind("subscribe") | is_kind("unsubscribe"))
            .groupBy("realm", "pattern", "match")
            .agg(F.count_if(is_kind("subscribe")).alias("subscribes"),
                 F.count_if(is_kind("unsubscribe")).alias("unsubscribes"),
                 F.count_distinct(F.when(is_kind("subscribe"), F.col("session")))
                 .alias("sessions"))
            .orderBy(F.desc("subscribes"), "realm", "pattern"))


def unreceived_topics(topics: DataFrame) -> DataFrame:
    """Topics with publishes that reached no receiver, most such publishes first (from the
    ``topics`` table, which counts both)."""
    return (topics.select("realm", "topic", "unreceived", "events")
            .where(F.col("unreceived") > 0)
            .withColumn("unreceived_share", F.col("unreceived") / F.col("events"))
            .orderBy(F.desc("unreceived"), "realm", "topic"))


def top_topics_per_minute(events: DataFrame, topics: DataFrame) -> DataFrame:
    """Publishes per minute of the busiest topics (``TOP_TOPICS_OVER_TIME`` of all realms,
    the first rows of the ``topics`` table): only their publishes are counted per minute."""
    top = (topics.orderBy(F.desc("events"), "realm", "topic").limit(TOP_TOPICS_OVER_TIME)
           .select("realm", "topic"))
    return (topic_minutes(events.join(F.broadcast(top), ["realm", "topic"]))
            .withColumn("minute", minute_time(F.col("minute")))
            .orderBy("realm", "topic", "minute"))


def session_churn(events: DataFrame) -> DataFrame:
    """Sessions joining and leaving per realm and UTC minute."""
    return (events.where(is_kind("session_join") | is_kind("session_leave"))
            .groupBy("realm", epoch_minute(F.col("ts")).alias("minute"))
            .agg(F.count_if(is_kind("session_join")).alias("joined"),
                 F.count_if(is_kind("session_leave")).alias("left"))
            .withColumn("minute", minute_time(F.col("minute")))
            .orderBy("realm", "minute"))


def payload_sizes(events: DataFrame) -> DataFrame:
    """Publishes per realm, protocol and payload-size bucket (see :func:`size_bucket`)."""
    return (publishes(events).withColumn("size_from", size_bucket(F.col("payload_bytes")))
            .where(F.col("size_from").isNotNull())
            .groupBy("realm", "protocol", "size_from")
            .agg(F.count("*").alias("publishes"))
            .orderBy("realm", "protocol", "size_from"))
