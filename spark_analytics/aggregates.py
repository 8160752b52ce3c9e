"""The report's tables: each function finishes one small DataFrame from merged rollups.

The rollups (:mod:`spark_analytics.rollups`) hold per-key counts, sums, first/last times and
quantile sketches; ``Rollups`` maps each rollup's name to its rows merged over every day read.
Times are UTC wall-clock (``timestamp_ntz``) so the tables read the same on any machine.
Percentiles come out as separate ``_p50``/``_p90``/``_p99`` columns because CSV has no arrays.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from router.core import incidents
from router.eventlog.schema import KINDS

PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
QOS_LEVELS = (0, 1, 2)
RETAINED_KINDS = tuple(kind for kind in KINDS if kind.startswith("retained_"))

# Only these fields feed a rollup: the report caches them, not payloads or eligibility lists.
USED_COLUMNS = ("realm", "ts", "kind", "topic", "publication", "session", "authid", "protocol",
                "qos", "retain", "payload_bytes", "receivers", "duration", "latency_ms",
                "pattern", "match", "operation", "reason", "count")
Rollups = Mapping[str, DataFrame]

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


def epoch_hour(seconds: Column) -> Column:
    return F.floor(seconds / 3600)


def minute_time(minutes: Column) -> Column:
    return utc_time(minutes * 60)


def long_percentiles(sketch: str) -> Column:
    """The ``PERCENTILES`` of a rollup's integer sketch column as one array column of the
    same name (null when the sketch holds no value); :func:`split_percentiles` splits it."""
    return F.when(F.kll_sketch_get_n_bigint(sketch) > 0, F.kll_sketch_get_quantile_bigint(
        sketch, F.array(*map(F.lit, PERCENTILES.values())))).alias(sketch)


def double_percentiles(sketch: str) -> Column:
    """As :func:`long_percentiles`, for a floating-point sketch column."""
    return F.when(F.kll_sketch_get_n_double(sketch) > 0, F.kll_sketch_get_quantile_double(
        sketch, F.array(*map(F.lit, PERCENTILES.values())))).alias(sketch)


def split_percentiles(table: DataFrame, *names: str, cast: str | None = None) -> DataFrame:
    for name in names:
        for position, suffix in enumerate(PERCENTILES):
            value = F.col(name)[position]
            table = table.withColumn(f"{name}_{suffix}", value.cast(cast) if cast else value)
        table = table.drop(name)
    return table


def topic_counters() -> dict[str, Column]:
    """Per-topic counts that only ever grow, so rollups merge them and the stream can keep
    them as running state."""
    publish = is_kind("publish")
    return {
        "events": F.count_if(publish),
        "bytes": F.coalesce(F.sum(F.when(publish, F.col("payload_bytes"))), F.lit(0)),
        **{f"qos{level}": F.count_if(publish & (F.col("qos") == level)) for level in QOS_LEVELS},
        "retained_publishes": F.count_if(publish & F.col("retain")),
        **{kind: F.count_if(is_kind(kind)) for kind in RETAINED_KINDS},
        "subscribes": F.count_if(is_kind("subscribe")),
    }


def publishes(events: DataFrame) -> DataFrame:
    return events.where(is_kind("publish"))


def size_bucket(size: Column) -> Column:
    """A payload-size bucket ``b`` holds sizes from ``b`` up to twice ``b`` (0 holds empty
    payloads; null when the size is unknown)."""
    return F.when(size <= 0, F.lit(0)).otherwise(
        # the epsilon keeps an exact power of two (whose log2 may come out a hair below) in its bucket
        F.pow(F.lit(2), F.floor(F.log2(size) + 1e-9))).cast("long")


def acks_with_topic(events: DataFrame) -> DataFrame:
    """The ack records, each with a topic: an ack that names its topic keeps it; one that
    names only its publication takes the topic of that publish among ``events`` (null when
    the publish is not among them). The join runs only when some ack needs it."""
    acks = events.where(is_kind("ack"))
    if acks.where(F.col("topic").isNull() & F.col("publication").isNotNull()).isEmpty():
        return acks
    published = (publishes(events).where(F.col("publication").isNotNull())
                 .select("realm", "publication", F.col("topic").alias("published_topic"))
                 .dropDuplicates(["realm", "publication"]))
    return (acks.join(published, ["realm", "publication"], "left")
            .withColumn("topic", F.coalesce("topic", "published_topic")))


def summary(rollups: Rollups, topics: DataFrame, publishers: DataFrame) -> DataFrame:
    """One row per realm: time range, totals and the headline percentiles; the distinct
    topics and publishers are the rows of the (small, already built) ``topics`` and
    ``publishers`` tables, a topic or authid with no publish has no row there."""
    totals = rollups["realms"].select(
        "realm", "records", utc_time(F.col("first_ts")).alias("first_seen"),
        utc_time(F.col("last_ts")).alias("last_seen"), "events",
        F.coalesce("bytes", F.lit(0)).alias("bytes"), F.col("joined").alias("sessions"),
        long_percentiles("receivers"), "acks", double_percentiles("ack_latency_ms"))
    distinct = (topics.groupBy("realm").agg(F.count("topic").alias("topics"))
                .join(publishers.groupBy("realm").agg(F.count("authid").alias("publishers")),
                      "realm", "full"))
    table = (totals.join(distinct, "realm", "left")
             .fillna(0, subset=["topics", "publishers"]))
    table = split_percentiles(split_percentiles(table, "receivers", cast="int"),
                              "ack_latency_ms")
    return table.select(
        "realm", "records", "first_seen", "last_seen", "events", "bytes", "topics", "publishers",
        "sessions", *(f"receivers_{suffix}" for suffix in PERCENTILES), "acks",
        *(f"ack_latency_ms_{suffix}" for suffix in PERCENTILES)).orderBy("realm")


def topics(rollups: Rollups) -> DataFrame:
    """Per realm and topic: volume, rate and peak minute, QoS split, retention, fan-out."""
    rates = rollups["topic_peaks"].withColumn("peak_minute", minute_time(F.col("peak_minute")))
    table = (rollups["topics"].where(F.col("events") > 0)
             .withColumn("active_seconds", F.col("last_publish") - F.col("first_publish"))
             .withColumn("receivers", long_percentiles("receivers"))
             .join(rates, ["realm", "topic"], "left")
             .withColumn("events_per_minute",
                         F.col("events") * 60 / F.greatest(F.col("active_seconds"), F.lit(60.0)))
             .withColumn("retained_share",
                         F.when(F.col("events") > 0,
                                F.col("retained_publishes") / F.col("events"))))
    table = split_percentiles(table, "receivers", cast="int")
    return table.select(
        "realm", "topic", "events", "bytes", "events_per_minute", "active_seconds",
        "peak_minute", "unreceived",
        "peak_minute_events", *(f"qos{level}" for level in QOS_LEVELS), "retained_share",
        "retained_publishes", *RETAINED_KINDS, "subscribes",
        *(f"receivers_{suffix}" for suffix in PERCENTILES),
    ).orderBy(F.desc("events"), "realm", "topic")


def events_per_minute(rollups: Rollups) -> DataFrame:
    """Publishes and bytes per realm and UTC minute, for the traffic-over-time chart."""
    return (rollups["realm_minutes"].where(F.col("events") > 0)
            .select("realm", minute_time(F.col("minute")).alias("minute"), "events",
                    F.coalesce("bytes", F.lit(0)).alias("bytes"))
            .orderBy("realm", "minute"))


def with_share_of_realm(table: DataFrame, count_column: str) -> DataFrame:
    realm_total = F.sum(count_column).over(Window.partitionBy("realm"))
    return table.withColumn("share", F.col(count_column) / realm_total)


def qos(rollups: Rollups) -> DataFrame:
    """Publishes per realm and QoS level, with each level's share of the realm."""
    table = rollups["publish_mix"].groupBy("realm", "qos").agg(
        F.sum("publishes").alias("events"))
    return with_share_of_realm(table, "events").orderBy("realm", "qos")


def fanout(rollups: Rollups) -> DataFrame:
    """How many publishes reached how many receivers: the fan-out distribution."""
    return (rollups["publish_mix"].where(F.col("receivers").isNotNull())
            .groupBy("realm", "receivers").agg(F.sum("publishes").alias("publishes"))
            .orderBy("realm", "receivers"))


def publishers(rollups: Rollups) -> DataFrame:
    """Publishers (by authid) with their volume, busiest first."""
    table = rollups["publishers"].groupBy("realm", "authid").agg(
        F.sum("events").alias("events"), F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
        F.count("topic").alias("topics"))
    return with_share_of_realm(table, "events").orderBy(F.desc("events"), "realm", "authid")


def protocols(rollups: Rollups) -> DataFrame:
    """Traffic per transport protocol: messages published over it and their deliveries (the
    log gives a publish's receiver count, not the receivers' protocols, so a delivery counts
    under its publisher's protocol), and the sessions joined, which say nothing of traffic:
    many short sessions that publish little make a large share of them."""
    delivered = rollups["publish_mix"].groupBy("realm", "protocol").agg(
        F.sum(F.col("publishes") * F.coalesce("receivers", F.lit(0))).alias("deliveries"))
    joined = rollups["protocols"].select("realm", "protocol", "sessions", "events",
                                         F.lit(0).cast("long").alias("deliveries"))
    published = delivered.select("realm", "protocol", F.lit(0).cast("long").alias("sessions"),
                                 F.lit(0).cast("long").alias("events"), "deliveries")
    # a union, not a join: the protocol of a record without one is null on both sides
    table = joined.unionByName(published).groupBy("realm", "protocol").agg(
        *(F.sum(name).alias(name) for name in ("events", "deliveries", "sessions")))
    return (table.withColumn("messages", F.col("events") + F.col("deliveries"))
            .orderBy("realm", F.desc("messages"), F.desc("sessions")))


def sessions(rollups: Rollups) -> DataFrame:
    """Sessions per realm and how long they lasted (from session_leave's duration, seconds)."""
    authids = rollups["authids"].groupBy("realm").agg(F.count("authid").alias("authids"))
    table = (rollups["realms"].where((F.col("joined") > 0) | (F.col("left") > 0))
             .join(authids, "realm", "left")
             .select("realm", "joined", "left", F.coalesce("authids", F.lit(0)).alias("authids"),
                     (F.col("duration_sum") / F.col("duration_count")).alias("duration_mean"),
                     "duration_max", double_percentiles("duration")))
    return split_percentiles(table, "duration").orderBy("realm")


def latency_table(acks: DataFrame, *keys: str) -> DataFrame:
    """Acknowledgement counts, latency percentiles and maximum per ``keys`` of an ack
    rollup."""
    table = acks.select(*keys, "acks", "latency_ms_max", double_percentiles("latency_ms"))
    return split_percentiles(table, "latency_ms")


def ack_latency(rollups: Rollups) -> DataFrame:
    """Acknowledgement latency per realm and topic (see :func:`acks_with_topic`)."""
    return latency_table(rollups["ack_topics"], "realm", "topic").orderBy(
        F.desc("acks"), "realm", "topic")


def protocol_family(protocol: Column) -> Column:
    """``wamp`` for ``wamp.websocket``/``wamp.rawsocket``: incidents name the family only."""
    return F.split(protocol, r"\.")[0]


def refused(rollups: Rollups) -> DataFrame:
    """Refused and failed operations per realm, protocol, operation and reason: the core's
    ``refused`` records (not authorized, any protocol; MQTT/AMQP clients got a negative ack)
    and refusal incidents (invalid topics, unsupported values, refused connections...)."""
    rows = rollups["incidents"].where(is_kind("refused") | (
        is_kind("incident") & F.col("reason").isin(*REFUSAL_REASONS)))
    return (rows.groupBy("realm", protocol_family(F.col("protocol")).alias("protocol"),
                         F.coalesce("operation", F.lit("-")).alias("operation"), "reason")
            .agg(F.sum("occurrences").alias("refused"))
            .orderBy("realm", F.desc("refused"), "protocol", "operation", "reason"))


def drops(rollups: Rollups) -> DataFrame:
    """Messages not delivered, per realm, protocol and reason (from incident records)."""
    return (rollups["incidents"].where(is_kind("incident") & F.col("reason").isin(*DROP_REASONS))
            .groupBy("realm", "protocol", "reason").agg(F.sum("counted").alias("dropped"))
            .orderBy("realm", F.desc("dropped"), "protocol", "reason"))


def retained_per_hour(rollups: Rollups) -> DataFrame:
    """Retained-store changes per realm and UTC hour, with the running net of topics set
    minus topics cleared, expired or evicted since the start of the range read."""
    table = rollups["retained_hours"].select(
        "realm", utc_time(F.col("hour") * 3600).alias("hour"),
        *(F.col(kind).alias(kind.removeprefix("retained_") + "s") for kind in RETAINED_KINDS))
    change = F.col("sets") - F.col("clears") - F.col("expires") - F.col("evicts")
    running = Window.partitionBy("realm").orderBy("hour").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return table.withColumn("net_changes", F.sum(change).over(running)).orderBy("realm", "hour")


def ack_latency_by_protocol(rollups: Rollups) -> DataFrame:
    """Acknowledgement latency per realm and the acknowledging client's protocol."""
    return latency_table(rollups["ack_protocols"], "realm", "protocol").orderBy(
        "realm", "protocol")


def slowest_consumers(rollups: Rollups) -> DataFrame:
    """Acknowledging sessions, slowest (by p99 latency) first."""
    return latency_table(rollups["ack_sessions"], "realm", "session", "authid",
                         "protocol").orderBy(F.desc("latency_ms_p99"), F.desc("acks"),
                                             "realm", "session")


def subscriptions(rollups: Rollups) -> DataFrame:
    """Per realm and pattern: subscribe/unsubscribe counts and the sessions subscribing."""
    return (rollups["subscriptions"].groupBy("realm", "pattern", "match")
            .agg(F.sum("subscribes").alias("subscribes"),
                 F.sum("unsubscribes").alias("unsubscribes"),
                 F.count(F.when(F.col("subscribes") > 0, F.col("session"))).alias("sessions"))
            .orderBy(F.desc("subscribes"), "realm", "pattern"))


def unreceived_topics(topics: DataFrame) -> DataFrame:
    """Topics with publishes that reached no receiver, most such publishes first (from the
    ``topics`` table, which counts both)."""
    return (topics.select("realm", "topic", "unreceived", "events")
            .where(F.col("unreceived") > 0)
            .withColumn("unreceived_share", F.col("unreceived") / F.col("events"))
            .orderBy(F.desc("unreceived"), "realm", "topic"))


def top_topics_per_minute(rollups: Rollups, topics: DataFrame) -> DataFrame:
    """Publishes per minute of the busiest topics (``TOP_TOPICS_OVER_TIME`` of all realms,
    the first rows of the ``topics`` table). Their names filter the per-minute rollup before
    it is merged, so only their rows are read (the filter reaches the Parquet scans)."""
    top = (topics.orderBy(F.desc("events"), "realm", "topic").limit(TOP_TOPICS_OVER_TIME)
           .select("realm", "topic").collect())
    minutes = rollups["topic_minutes"].where(F.col("topic").isin(*{row.topic for row in top}))
    pairs = minutes.sparkSession.createDataFrame(top, "realm string, topic string")
    return (minutes.join(F.broadcast(pairs), ["realm", "topic"])
            .select("realm", "topic", minute_time(F.col("minute")).alias("minute"), "events")
            .orderBy("realm", "topic", "minute"))


def session_churn(rollups: Rollups) -> DataFrame:
    """Sessions joining and leaving per realm and UTC minute."""
    return (rollups["realm_minutes"].where((F.col("joined") > 0) | (F.col("left") > 0))
            .select("realm", minute_time(F.col("minute")).alias("minute"), "joined", "left")
            .orderBy("realm", "minute"))


def payload_sizes(rollups: Rollups) -> DataFrame:
    """Publishes per realm, protocol and payload-size bucket (see :func:`size_bucket`)."""
    return (rollups["publish_mix"].where(F.col("size_from").isNotNull())
            .groupBy("realm", "protocol", "size_from")
            .agg(F.sum("publishes").alias("publishes"))
            .orderBy("realm", "protocol", "size_from"))
