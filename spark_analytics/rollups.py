"""Rollups: per-key partial aggregates that merge, so a report never re-reads a compacted day.

Each table of the report is finished from one or more rollups. A rollup groups records by its
keys and keeps only values that merge: counts and sums (merged by summing), first and last
times (min, max) and KLL quantile sketches (merged sketch into sketch). ``compact`` stores
each closed day's rollups under ``_rollups/``, next to its Parquet records; a report merges the
stored rollups of compacted days with the rollups it computes from the JSON parts of the other
days, so its cost no longer grows with the records of compacted days. Merging is exact for
counts, sums and times; a merged sketch answers within the sketch's rank error (see
:data:`SKETCH_K`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from router.eventlog.schema import DAY_COLUMNS
from spark_analytics.aggregates import (RETAINED_KINDS, acks_with_topic, epoch_hour,
                                        epoch_minute, is_kind, size_bucket, topic_counters)
from spark_analytics.reader import day_of, event_ddl
from spark_analytics.storage import Entry, Files, join

SKETCH_K = 1000
"""KLL accuracy: a quantile's rank is off by about 0.3 % at most (Spark's default, 200, by
about 1.3 %), for sketches of a few KiB; a group of up to ``SKETCH_K`` values is exact."""


@dataclass(frozen=True)
class Value:
    """One rollup column: ``partial`` aggregates records, ``merge`` aggregates the column over
    partial rows (of any number of days and nodes)."""

    name: str
    partial: Column
    merge: Callable[[str], Column]


def summed(name: str, partial: Column) -> Value:
    return Value(name, partial, F.sum)


def earliest(name: str, partial: Column) -> Value:
    return Value(name, partial, F.min)


def latest(name: str, partial: Column) -> Value:
    return Value(name, partial, F.max)


def long_sketch(name: str, values: Column) -> Value:
    """A KLL sketch of integer ``values`` (nulls are skipped)."""
    return Value(name, F.kll_sketch_agg_bigint(values.cast("long"), SKETCH_K),
                 lambda column: F.kll_merge_agg_bigint(column, SKETCH_K))


def double_sketch(name: str, values: Column) -> Value:
    """A KLL sketch of floating-point ``values`` (nulls are skipped)."""
    return Value(name, F.kll_sketch_agg_double(values.cast("double"), SKETCH_K),
                 lambda column: F.kll_merge_agg_double(column, SKETCH_K))


def same_records(records: DataFrame) -> DataFrame:
    return records


@dataclass(frozen=True)
class Rollup:
    name: str
    keys: dict[str, Column]
    """Key columns by name, computed from a record."""
    values: tuple[Value, ...]
    rows: Column | None = None
    """Which records count (None: all)."""
    source: Callable[[DataFrame], DataFrame] = same_records
    """Turns the records into what ``rows``/``keys`` read (e.g. acks given their topic)."""

    def compute(self, records: DataFrame, by_day: bool = False) -> DataFrame:
        """The rollup of ``records``; ``by_day``: one per (realm, date) too, for storing."""
        rows = self.source(records)
        if self.rows is not None:
            rows = rows.where(self.rows)
        keys = [key.alias(name) for name, key in self.keys.items()]
        if by_day:
            keys.append(F.col("date"))
        return rows.groupBy(*keys).agg(*(value.partial.alias(value.name)
                                         for value in self.values))

    def merge(self, partials: DataFrame) -> DataFrame:
        return partials.groupBy(*self.keys).agg(
            *(value.merge(value.name).alias(value.name) for value in self.values))


def keyed(*names: str, **derived: Column) -> dict[str, Column]:
    return {**{name: F.col(name) for name in names}, **derived}


def when_publish(values: str) -> Column:
    return F.when(is_kind("publish"), F.col(values))


def ack_values() -> tuple[Value, ...]:
    return (summed("acks", F.count("*")), double_sketch("latency_ms", F.col("latency_ms")),
            latest("latency_ms_max", F.max("latency_ms")))


def publishes_per_minute(records: DataFrame) -> DataFrame:
    """Publishes per realm, topic and minute (and date, when the records carry theirs)."""
    keys = [F.col("realm"), F.col("topic"), epoch_minute(F.col("ts")).alias("minute")]
    if "date" in records.columns:
        keys.append(F.col("date"))
    return records.where(is_kind("publish")).groupBy(*keys).agg(F.count("*").alias("events"))


def busiest_minute() -> Column:
    """Of per-minute counts: the busiest minute, on a tie the earliest. A minute never spans
    two days (the writer files a record by its own time), so the busiest minute of several
    days is the busiest of their busiest minutes."""
    return F.min_by("minute", F.struct(-F.col("events"), F.col("minute")))


def all_rollups() -> tuple[Rollup, ...]:
    """The rollups every table is finished from (built per call: a Column belongs to the
    active session)."""
    publish, ack = is_kind("publish"), is_kind("ack")
    join_, leave = is_kind("session_join"), is_kind("session_leave")
    return (
        Rollup("realms", keyed("realm"), (
            summed("records", F.count("*")),
            earliest("first_ts", F.min("ts")),
            latest("last_ts", F.max("ts")),
            summed("events", F.count_if(publish)),
            summed("bytes", F.sum(when_publish("payload_bytes"))),
            summed("joined", F.count_if(join_)),
            summed("left", F.count_if(leave)),
            long_sketch("receivers", when_publish("receivers")),
            summed("acks", F.count_if(ack)),
            double_sketch("ack_latency_ms", F.when(ack, F.col("latency_ms"))),
            summed("duration_sum", F.sum(F.when(leave, F.col("duration")))),
            summed("duration_count", F.count(F.when(leave, F.col("duration")))),
            double_sketch("duration", F.when(leave, F.col("duration"))),
            latest("duration_max", F.max(F.when(leave, F.col("duration")))),
        )),
        Rollup("topics", keyed("realm", "topic"), (
            *(summed(name, counter) for name, counter in topic_counters().items()),
            long_sketch("receivers", when_publish("receivers")),
            summed("unreceived", F.count_if(publish & (F.col("receivers") == 0))),
            earliest("first_publish", F.min(when_publish("ts"))),
            latest("last_publish", F.max(when_publish("ts"))),
        ), rows=F.col("topic").isNotNull()),
        Rollup("topic_minutes", keyed("realm", "topic", minute=epoch_minute(F.col("ts"))),
               (summed("events", F.count("*")),), rows=publish),
        Rollup("topic_peaks", keyed("realm", "topic"), (
            Value("peak_minute", busiest_minute(), lambda name: F.min_by(
                name, F.struct(-F.col("peak_minute_events"), F.col(name)))),
            latest("peak_minute_events", F.max("events")),
        ), source=publishes_per_minute),
        Rollup("realm_minutes", keyed("realm", minute=epoch_minute(F.col("ts"))), (
            summed("events", F.count_if(publish)),
            summed("bytes", F.sum(when_publish("payload_bytes"))),
            summed("joined", F.count_if(join_)),
            summed("left", F.count_if(leave)),
        ), rows=publish | join_ | leave),
        Rollup("publishers", keyed("realm", "authid", "topic"), (
            summed("events", F.count("*")), summed("bytes", F.sum("payload_bytes"))),
               rows=publish),
        Rollup("publish_mix",
               keyed("realm", "protocol", "qos", "receivers",
                     size_from=size_bucket(F.col("payload_bytes"))),
               (summed("publishes", F.count("*")),), rows=publish),
        Rollup("protocols", keyed("realm", "protocol"), (
            summed("sessions", F.count_if(join_)), summed("events", F.count_if(publish))),
               rows=join_ | publish),
        Rollup("authids", keyed("realm", "authid"), (summed("joins", F.count("*")),),
               rows=join_),
        Rollup("ack_topics", keyed("realm", "topic"), ack_values(), rows=ack,
               source=acks_with_topic),
        Rollup("ack_protocols", keyed("realm", "protocol"), ack_values(), rows=ack),
        Rollup("ack_sessions", keyed("realm", "session", "authid", "protocol"), ack_values(),
               rows=ack),
        Rollup("incidents", keyed("realm", "kind", "protocol", "operation", "reason"), (
            summed("occurrences", F.sum(F.coalesce("count", F.lit(1)))),
            summed("counted", F.sum("count"))), rows=is_kind("refused") | is_kind("incident")),
        Rollup("retained_hours", keyed("realm", hour=epoch_hour(F.col("ts"))),
               tuple(summed(kind, F.count_if(is_kind(kind))) for kind in RETAINED_KINDS),
               rows=F.col("kind").startswith("retained_")),
        Rollup("subscriptions", keyed("realm", "pattern", "match", "session"), (
            summed("subscribes", F.count_if(is_kind("subscribe"))),
            summed("unsubscribes", F.count_if(is_kind("unsubscribe")))),
               rows=is_kind("subscribe") | is_kind("unsubscribe")),
    )


ROLLUPS_FOLDER = "_rollups"
"""Where ``compact`` stores the rollups of closed days: ``<rollup>/realm=<r>/date=<d>/``, one
Parquet file each (Spark's listing of the logs skips names starting with ``_``)."""


def stored_rollup_files(files: Files, logs: str, realm: str | None,
                        days: list[tuple[str, str]]) -> list[Entry]:
    """The files of every stored rollup of the (realm, date) ``days`` (of ``realm`` if
    given)."""
    wanted = set(days)
    return [entry for entry in files.glob(join(logs, ROLLUPS_FOLDER, "*", f"realm={realm or '*'}",
                                               "date=*", "*.parquet"))
            if day_of(entry.parent_names) in wanted]


def is_stored_rollup(entry: Entry) -> bool:
    return f"/{ROLLUPS_FOLDER}/" in entry.url


def stored_rollup(logs: str, name: str) -> str:
    return join(logs, ROLLUPS_FOLDER, name)


def store_rollup(rollup: Rollup, records: DataFrame, logs: str) -> None:
    """Store ``rollup`` of ``records`` (whole days, with ``realm`` and ``date`` columns), one
    file per day; the session's dynamic partition overwrite replaces only these days."""
    rows = rollup.compute(records, by_day=True).repartition(*DAY_COLUMNS)
    rows.write.mode("overwrite").partitionBy(*DAY_COLUMNS).parquet(
        stored_rollup(logs, rollup.name))


def no_records(spark: SparkSession) -> DataFrame:
    """An empty frame of records, planned from an empty range: a rollup's ``source`` may run
    a query on it (acks_with_topic's check), which over an empty range runs no Spark job
    (over ``createDataFrame([])``, an RDD, it was one: seconds in a new JVM)."""
    return spark.range(0).select(*(F.lit(None).cast(field.dataType).alias(field.name)
                                   for field in StructType.fromDDL(event_ddl()).fields))


def read_stored_rollup(spark: SparkSession, logs: str, rollup: Rollup,
                       days: list[tuple[str, str]]) -> DataFrame:
    """The stored ``rollup`` of the (realm, date) ``days`` as one DataFrame. The schema is
    the rollup's own (a day without rows for a rollup has no folder there); the day filter
    is on partition columns, so Spark opens only those days' files."""
    schema = rollup.compute(no_records(spark), by_day=True).schema
    day_key = F.concat_ws("/", *DAY_COLUMNS)
    return (spark.read.schema(schema).parquet(stored_rollup(logs, rollup.name))
            .where(day_key.isin(*(f"{realm}/{day}" for realm, day in days)))
            .drop("date"))


def merged(rollup: Rollup, parts: list[DataFrame]) -> DataFrame:
    """The rows of ``rollup`` in all ``parts`` (computed or stored) merged, one per key."""
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return rollup.merge(union)
