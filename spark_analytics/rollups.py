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

from router.eventlog.schema import DAY_COLUMNS
from spark_analytics.aggregates import (RETAINED_KINDS, acks_with_topic, epoch_hour,
                                        epoch_minute, is_kind, size_bucket, topic_counters)
from spark_analytics.reader import event_ddl
from spark_analytics.storage import join

SKETCH_K = 1000
"""KLL accuracy: a quantile's rank is off by about 0.3 % at most (Spark's default, 200, by
about 1.3 %), for sketches of a few KiB; a group of up to ``SKETCH_K`` values is exact."""


FOLDS: dict[str, Callable[[Column], Column]] = {
    "sum": F.sum, "min": F.min, "max": F.max,
    "kll_bigint": lambda values: F.kll_sketch_agg_bigint(values, SKETCH_K),
    "kll_double": lambda values: F.kll_sketch_agg_double(values, SKETCH_K)}
"""How a value folds a per-record column (:attr:`Value.row`), by name; ``kll_*`` build a
sketch of the values (nulls skipped)."""


@dataclass(frozen=True)
class Value:
    """One rollup column: ``partial`` aggregates records, ``merge`` aggregates the column over
    partial rows (of any number of days and nodes). A value that folds one per-record column
    also says which (``row``) and how (``fold``): that is what lets :func:`compute_all`
    compute every rollup in one aggregation."""

    name: str
    partial: Column
    merge: Callable[[str], Column]
    row: Column | None = None
    fold: str | None = None

    @property
    def is_sketch(self) -> bool:
        return self.fold is not None and self.fold.startswith("kll_")


def folded(name: str, row: Column, fold: str) -> Value:
    """``row`` of each record folded by ``fold`` (one of :data:`FOLDS`) into the column."""
    return Value(name, FOLDS[fold](row), FOLDS[fold], row, fold)


def summed(name: str, row: Column) -> Value:
    return folded(name, row, "sum")


def counted(name: str, condition: Column | None = None) -> Value:
    """How many records (that meet ``condition``): 0, never null, for none."""
    row = F.lit(1) if condition is None else F.when(condition, 1).otherwise(0)
    return folded(name, row, "sum")


def earliest(name: str, row: Column) -> Value:
    return folded(name, row, "min")


def latest(name: str, row: Column) -> Value:
    return folded(name, row, "max")


def long_sketch(name: str, values: Column) -> Value:
    """A KLL sketch of integer ``values`` (nulls are skipped)."""
    values = values.cast("long")
    return Value(name, FOLDS["kll_bigint"](values),
                 lambda column: F.kll_merge_agg_bigint(column, SKETCH_K), values, "kll_bigint")


def double_sketch(name: str, values: Column) -> Value:
    """A KLL sketch of floating-point ``values`` (nulls are skipped)."""
    values = values.cast("double")
    return Value(name, FOLDS["kll_double"](values),
                 lambda column: F.kll_merge_agg_double(column, SKETCH_K), values, "kll_double")


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
    from_rollup: str | None = None
    """The rollup whose rows are what ``source`` makes of the records: :func:`compute_all`
    aggregates those instead."""

    def compute(self, records: DataFrame, by_day: bool = False) -> DataFrame:
        """The rollup of ``records``; ``by_day``: one per (realm, date) too, for storing."""
        rows = self.source(records)
        if self.rows is not None:
            rows = rows.where(self.rows)
        return self.aggregate(rows, by_day)

    def aggregate(self, rows: DataFrame, by_day: bool = False) -> DataFrame:
        """``rows`` (the records this rollup counts, as ``source`` made them) grouped."""
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
    return (counted("acks"), double_sketch("latency_ms", F.col("latency_ms")),
            latest("latency_ms_max", F.col("latency_ms")))


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
            counted("records"),
            earliest("first_ts", F.col("ts")),
            latest("last_ts", F.col("ts")),
            counted("events", publish),
            summed("bytes", when_publish("payload_bytes")),
            counted("joined", join_),
            counted("left", leave),
            long_sketch("receivers", when_publish("receivers")),
            counted("acks", ack),
            double_sketch("ack_latency_ms", F.when(ack, F.col("latency_ms"))),
            summed("duration_sum", F.when(leave, F.col("duration"))),
            counted("duration_count", leave & F.col("duration").isNotNull()),
            double_sketch("duration", F.when(leave, F.col("duration"))),
            latest("duration_max", F.when(leave, F.col("duration"))),
        )),
        Rollup("topics", keyed("realm", "topic"), (
            *(summed(name, counter) for name, counter in topic_counters().items()),
            long_sketch("receivers", when_publish("receivers")),
            counted("unreceived", publish & (F.col("receivers") == 0)),
            earliest("first_publish", when_publish("ts")),
            latest("last_publish", when_publish("ts")),
        ), rows=F.col("topic").isNotNull()),
        Rollup("topic_minutes", keyed("realm", "topic", minute=epoch_minute(F.col("ts"))),
               (counted("events"),), rows=publish),
        Rollup("topic_peaks", keyed("realm", "topic"), (
            Value("peak_minute", busiest_minute(), lambda name: F.min_by(
                name, F.struct(-F.col("peak_minute_events"), F.col(name)))),
            latest("peak_minute_events", F.col("events")),
        ), source=publishes_per_minute, from_rollup="topic_minutes"),
        Rollup("realm_minutes", keyed("realm", minute=epoch_minute(F.col("ts"))), (
            counted("events", publish),
            summed("bytes", when_publish("payload_bytes")),
            counted("joined", join_),
            counted("left", leave),
        ), rows=publish | join_ | leave),
        Rollup("publishers", keyed("realm", "authid", "topic"), (
            counted("events"), summed("bytes", F.col("payload_bytes"))),
               rows=publish),
        Rollup("publish_mix",
               keyed("realm", "protocol", "qos", "receivers",
                     size_from=size_bucket(F.col("payload_bytes"))),
               (counted("publishes"),), rows=publish),
        Rollup("protocols", keyed("realm", "protocol"), (
            counted("sessions", join_), counted("events", publish)),
               rows=join_ | publish),
        Rollup("authids", keyed("realm", "authid"), (counted("joins"),),
               rows=join_),
        Rollup("ack_topics", keyed("realm", "topic"), ack_values(), rows=ack,
               source=acks_with_topic),
        Rollup("ack_protocols", keyed("realm", "protocol"), ack_values(), rows=ack),
        Rollup("ack_sessions", keyed("realm", "session", "authid", "protocol"), ack_values(),
               rows=ack),
        Rollup("incidents", keyed("realm", "kind", "protocol", "operation", "reason"), (
            summed("occurrences", F.coalesce("count", F.lit(1))),
            summed("counted", F.col("count"))), rows=is_kind("refused") | is_kind("incident")),
        Rollup("retained_hours", keyed("realm", hour=epoch_hour(F.col("ts"))),
               tuple(counted(kind, is_kind(kind)) for kind in RETAINED_KINDS),
               rows=F.col("kind").startswith("retained_")),
        Rollup("subscriptions", keyed("realm", "pattern", "match", "session"), (
            counted("subscribes", is_kind("subscribe")),
            counted("unsubscribes", is_kind("unsubscribe"))),
               rows=is_kind("subscribe") | is_kind("unsubscribe")),
    )



@dataclass(frozen=True)
class _Set:
    """A grouping set of :func:`compute_all`: a rollup's keys and its non-sketch values, or
    (``sketch`` set) its keys plus one sketch's value, counted: a histogram to sketch from."""

    rollup: Rollup
    sketch: Value | None = None

    def keys(self) -> dict[str, Column]:
        keys = dict(self.rollup.keys)
        if self.sketch is not None:
            keys[_VALUE] = self.sketch.row
        return keys

    def values(self) -> list[Value]:
        if self.sketch is not None:
            return [counted(_COUNT)]
        return [value for value in self.rollup.values if not value.is_sketch]


_VALUE, _COUNT, _SET = "_value", "_count", "_set"


def topicless_acks() -> Rollup:
    """Acks that name only their publication: only they need :func:`acks_with_topic`'s join."""
    return Rollup("_topicless_acks", {}, (counted("acks"),), rows=is_kind("ack") & F.col(
        "topic").isNull() & F.col("publication").isNotNull())


def compute_all(records: DataFrame, rollups: tuple[Rollup, ...]
                ) -> tuple[dict[str, DataFrame], DataFrame]:
    """Every rollup of ``records``, the rows :meth:`Rollup.compute` gives, from one read of
    the records and one aggregation, where computing each rollup by itself reads (or caches)
    the records once per rollup. Each record becomes one row per grouping set it counts in
    (:class:`_Set`), its keys and values in typed slots shared by all sets; one group-by
    folds them. Sketches come from per-value counts (a small histogram, except for values that
    are all distinct), expanded back and sketched per key; ``from_rollup`` rollups aggregate
    their base rollup's rows. The aggregated rows are cached and computed here (one job), so
    the rollups read them, never the records (returned second: unpersist them once the
    rollups are used). An ack that
    names only its publication makes ``ack_topics`` be computed by itself (its join reads the
    records again)."""
    direct = [rollup for rollup in rollups if rollup.from_rollup is None]
    sets = [_Set(topicless_acks())]
    for rollup in direct:
        sets.append(_Set(rollup))
        sets.extend(_Set(rollup, value) for value in rollup.values if value.is_sketch)
    columns = [column.alias(f"c{n}") for n, column in enumerate(
        column for stacked in sets for column in (
            *stacked.keys().values(), *(value.row for value in stacked.values())))]
    types = iter(field.dataType.simpleString() for field in records.select(*columns).schema)
    key_slots: dict[str, int] = {}
    value_slots: dict[tuple[str, str], int] = {}
    placed: list[tuple[dict[str, Column], dict[str, Column]]] = []
    for stacked in sets:
        keys, values = {}, {}
        used: dict[str, int] = {}
        for column in stacked.keys().values():
            kind = next(types)
            slot = f"k_{kind}_{used.get(kind, 0)}"
            used[kind] = used.get(kind, 0) + 1
            key_slots[kind] = max(key_slots.get(kind, 0), used[kind])
            keys[slot] = column.cast(kind)
        for value in stacked.values():
            kind = next(types)
            slot = f"v_{value.fold}_{kind}_{used.get((value.fold, kind), 0)}"
            used[(value.fold, kind)] = used.get((value.fold, kind), 0) + 1
            value_slots[(value.fold, kind)] = max(value_slots.get((value.fold, kind), 0),
                                                  used[(value.fold, kind)])
            values[slot] = value.row.cast(kind)
        placed.append((keys, values))
    all_keys = {f"k_{kind}_{n}": kind for kind, count in key_slots.items() for n in range(count)}
    all_values = {f"v_{fold}_{kind}_{n}": (fold, kind)
                  for (fold, kind), count in value_slots.items() for n in range(count)}

    def row_of(number: int, stacked: _Set) -> Column:
        keys, values = placed[number]
        row = F.struct(
            F.lit(number).alias(_SET),
            *(keys.get(slot, F.lit(None).cast(kind)).alias(slot)
              for slot, kind in all_keys.items()),
            *(values.get(slot, F.lit(None).cast(kind)).alias(slot)
              for slot, (_, kind) in all_values.items()))
        return row if stacked.rollup.rows is None else F.when(stacked.rollup.rows, row)

    # a set a record does not count in is a null row, dropped after the explode (a filter
    # over the array is a lambda, which Spark interprets instead of compiling)
    rows = (records.select(F.explode(F.array(*(row_of(number, stacked)
                                               for number, stacked in enumerate(sets))))
                           .alias("row"))
            .where(F.col("row").isNotNull()).select("row.*"))
    folded_rows = rows.groupBy(_SET, *all_keys).agg(*(
        FOLDS[fold](F.col(slot)).alias(slot) for slot, (fold, _) in all_values.items())).cache()
    folded_rows.count()

    def slice_of(number: int) -> DataFrame:
        keys, values = placed[number]
        stacked = sets[number]
        names = [*stacked.keys(), *(value.name for value in stacked.values())]
        return folded_rows.where(F.col(_SET) == number).select(
            *(F.col(slot).alias(name) for slot, name in zip([*keys, *values], names)))

    computed: dict[str, DataFrame] = {}
    needs_join = not slice_of(0).isEmpty()
    for number, stacked in enumerate(sets):
        rollup = stacked.rollup
        if number == 0 or stacked.sketch is not None:
            continue
        if rollup.source is not same_records and needs_join:
            computed[rollup.name] = rollup.compute(records)
            continue
        table = slice_of(number)
        for other, sketched in enumerate(sets):
            if sketched.rollup is rollup and sketched.sketch is not None:
                table = _with_sketch(table, slice_of(other), list(rollup.keys),
                                     sketched.sketch)
        computed[rollup.name] = table.select(*rollup.keys, *(value.name
                                                            for value in rollup.values))
    for rollup in rollups:
        if rollup.from_rollup is not None:
            computed[rollup.name] = rollup.aggregate(computed[rollup.from_rollup])
    return computed, folded_rows


def _with_sketch(table: DataFrame, histogram: DataFrame, keys: list[str],
                 sketch: Value) -> DataFrame:
    """``table`` with the ``sketch`` column of each key, built from the key's value counts (a
    null value counts once: the key still gets its empty sketch)."""
    renamed = [f"_key{n}" for n in range(len(keys))]
    times = F.when(F.col(_VALUE).isNull(), 1).otherwise(F.col(_COUNT)).cast("int")
    sketched = (histogram.select(*(F.col(key).alias(name) for key, name in zip(keys, renamed)),
                                 F.explode(F.array_repeat(_VALUE, times)).alias(_VALUE))
                .groupBy(*renamed).agg(FOLDS[sketch.fold](F.col(_VALUE)).alias(sketch.name)))
    same_key = [F.col(key).eqNullSafe(F.col(name)) for key, name in zip(keys, renamed)]
    condition = same_key[0]
    for other in same_key[1:]:
        condition = condition & other
    return table.join(sketched, condition, "left").drop(*renamed)

ROLLUPS_FOLDER = "_rollups"
"""Where ``compact`` stores the rollups of closed days: ``<rollup>/realm=<r>/date=<d>/``, one
Parquet file each (Spark's listing of the logs skips names starting with ``_``)."""


def stored_rollup(logs: str, name: str) -> str:
    return join(logs, ROLLUPS_FOLDER, name)


def store_rollup(rollup: Rollup, records: DataFrame, logs: str) -> None:
    """Store ``rollup`` of ``records`` (whole days, with ``realm`` and ``date`` columns), one
    file per day; the session's dynamic partition overwrite replaces only these days."""
    rows = rollup.compute(records, by_day=True).repartition(*DAY_COLUMNS)
    rows.write.mode("overwrite").partitionBy(*DAY_COLUMNS).parquet(
        stored_rollup(logs, rollup.name))


def read_stored_rollup(spark: SparkSession, logs: str, rollup: Rollup,
                       days: list[tuple[str, str]]) -> DataFrame:
    """The stored ``rollup`` of the (realm, date) ``days`` as one DataFrame. The schema is
    the rollup's own (a day without rows for a rollup has no folder there); the day filter
    is on partition columns, so Spark opens only those days' files."""
    schema = rollup.compute(spark.createDataFrame([], event_ddl()), by_day=True).schema
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
