"""``compact``: turn closed days of JSON parts into rollups and Parquet records.

The writer leaves hundreds of small JSON parts per realm and day (a part every 300 s by
default); parsing them is most of a report's cost. A closed day (before today, UTC, with no
part still open, on any node) is parsed once, into

- its records, every node's, as one Parquet folder ``<logs>/_parquet/realm=<r>/date=<d>/``
  (``node`` is kept as a column), for queries of one's own;
- its rollups (:mod:`spark_analytics.rollups`), computed from that Parquet, one small file
  each under ``<logs>/_rollups/<rollup>/realm=<r>/date=<d>/``, which later reports merge
  instead of reading the day's records again;
- last, the marker ``<logs>/_parquet/realm=<r>/date=<d>/_COMPACTED``: only a day with it
  counts as compacted, so a day a crash left half done is compacted again.

Spark's file listing skips names starting with ``_``, so the JSON read of ``<logs>`` never
sees either. The JSON parts stay where they are (the writer's retention removes them).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from router.eventlog.schema import DAY_COLUMNS
from spark_analytics.aggregates import USED_COLUMNS
from spark_analytics.progress import Progress
from spark_analytics.reader import (COMPACTED, COMPACTED_FILE_GLOB, COMPACTED_MARKER,
                                    JSON_OPTIONS, OPEN_PART_GLOB, compacted_days,
                                    compacted_folder, day_files, day_of, event_ddl)
from spark_analytics.rollups import ROLLUPS_FOLDER, Rollup, all_rollups, store_rollup
from spark_analytics.storage import Files, HadoopFiles, join, shown, to_url


@dataclass(frozen=True)
class Plan:
    """What a ``compact`` run finds: the days it compacts, and why it leaves the others."""

    todo: list[tuple[str, str]]
    """(realm, date) of each closed day not compacted yet."""
    done: int
    """Closed days compacted already."""
    waiting: int
    """Days not closed yet: today (UTC), or a part of the day still open on some node."""

    def why_nothing(self) -> str:
        """The reason there is nothing to do, for the operator."""
        return (f"{self.done:,} closed day(s) compacted already; {self.waiting:,} day(s) not "
                f"closed yet (today, UTC, or a part the router still writes)")


def plan(files: Files, logs: str, realm: str | None, today: date) -> Plan:
    """The days in ``logs`` (of ``realm``) a run on ``today`` compacts, and the others."""
    folders = files.glob(join(logs, f"realm={realm or '*'}", "date=*"))
    open_days = {day_of(entry.parent_names)
                 for entry in day_files(files, logs, realm, OPEN_PART_GLOB)}
    days = [day_of([folder.name, *folder.parent_names]) for folder in folders]
    closed = [day for day in days if day[1] < today.isoformat() and day not in open_days]
    done = set(compacted_days(files, logs, realm))
    return Plan([day for day in closed if day not in done],
                sum(1 for day in closed if day in done), len(days) - len(closed))


def compact_logs(spark: SparkSession, logs: str | os.PathLike, realm: str | None = None,
                 today: date | None = None, progress: Progress | None = None
                 ) -> list[tuple[str, str]]:
    """Compact every closed day not compacted yet; returns the (realm, date) pairs written.

    Each day's records become one Parquet file, the days as concurrent single-task jobs (as
    many at a time as Spark has cores: one after the other they left all cores but one idle).
    Then each rollup of all those days is one job over the Parquet just written (columns, not
    JSON, are read again); the rollups run as concurrent jobs too. Last, each day's marker.
    Each of those steps is a line on ``progress`` (stderr by default) as it ends."""
    logs = to_url(logs)
    files = HadoopFiles(spark)
    today = today or datetime.now(timezone.utc).date()
    days = plan(files, logs, realm, today).todo
    if not days:
        return []
    rollups = all_rollups()
    progress = progress or Progress(len(days) + len(rollups) + 1)

    def write_records(day: tuple[str, str]) -> None:
        source = join(logs, f"realm={day[0]}", f"date={day[1]}")
        with progress.task(f"records of realm={day[0]}/date={day[1]} to Parquet"):
            records = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS).json(source)
                       .where(F.col("kind").isNotNull()).drop(*DAY_COLUMNS))
            # one file per day: a day is a few hundred MiB of JSON at most, far less as Parquet
            records.coalesce(1).write.mode("overwrite").parquet(compacted_folder(logs, *day))

    def write_rollup(rollup: Rollup) -> None:
        with progress.task(f"rollup {rollup.name}"):
            store_rollup(rollup, records, logs)

    parallel = max(1, spark.sparkContext.defaultParallelism)
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(write_records, days))
    records = (spark.read.schema(event_ddl()).option("basePath", join(logs, COMPACTED))
               .parquet(*(compacted_folder(logs, *day) for day in days))
               .select(*USED_COLUMNS, "date"))
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(write_rollup, rollups))
    with progress.stage("markers"):
        for day in days:
            files.touch(join(compacted_folder(logs, *day), COMPACTED_MARKER))
    return days


def describe_compacted(spark: SparkSession, logs: str, days: list[tuple[str, str]]) -> str:
    """What a run wrote: a line per day with its records, then the files written."""
    files = HadoopFiles(spark)
    counts = (spark.read.option("basePath", join(logs, COMPACTED))
              .parquet(*(compacted_folder(logs, *day) for day in days))
              .groupBy(*DAY_COLUMNS).count().collect())
    records = {(row["realm"], row["date"]): row["count"] for row in counts}
    parquet = sum(len(files.glob(join(compacted_folder(logs, *day), COMPACTED_FILE_GLOB)))
                  for day in days)
    rollup_files = sum(len(files.glob(join(logs, ROLLUPS_FOLDER, "*", f"realm={day[0]}",
                                           f"date={day[1]}", COMPACTED_FILE_GLOB)))
                       for day in days)
    lines = [f"compacted realm={realm}/date={day}: {records.get((realm, day), 0):,} records"
             for realm, day in days]
    lines.append(f"{len(days):,} day(s), {sum(records.values()):,} records: wrote {parquet:,} "
                 f"Parquet record file(s) under {shown(join(logs, COMPACTED))} and "
                 f"{rollup_files:,} rollup file(s) under {shown(join(logs, ROLLUPS_FOLDER))}")
    return "\n".join(lines)
