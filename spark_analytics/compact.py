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
from datetime import date, datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from router.eventlog.schema import DAY_COLUMNS
from spark_analytics.aggregates import USED_COLUMNS
from spark_analytics.reader import (COMPACTED, COMPACTED_MARKER, JSON_OPTIONS, OPEN_PART_GLOB,
                                    compacted_days, compacted_folder, day_files, day_of,
                                    event_ddl)
from spark_analytics.rollups import all_rollups, store_rollup
from spark_analytics.storage import Files, HadoopFiles, join, to_url


def closed_days(files: Files, logs: str, realm: str | None,
                today: date) -> list[tuple[str, str]]:
    """(realm, date) of each day folder before ``today`` whose parts are all closed."""
    folders = files.glob(join(logs, f"realm={realm or '*'}", "date=*"))
    open_days = {day_of(entry.parent_names)
                 for entry in day_files(files, logs, realm, OPEN_PART_GLOB)}
    days = (day_of([folder.name, *folder.parent_names]) for folder in folders)
    return [day for day in days if day[1] < today.isoformat() and day not in open_days]


def compact_logs(spark: SparkSession, logs: str | os.PathLike, realm: str | None = None,
                 today: date | None = None) -> list[tuple[str, str]]:
    """Compact every closed day not compacted yet; returns the (realm, date) pairs written.

    Each day's records become one Parquet file, the days as concurrent single-task jobs (as
    many at a time as Spark has cores: one after the other they left all cores but one idle).
    Then each rollup of all those days is one job over the Parquet just written (columns, not
    JSON, are read again); the rollups run as concurrent jobs too. Last, each day's marker."""
    logs = to_url(logs)
    files = HadoopFiles(spark)
    today = today or datetime.now(timezone.utc).date()
    done = set(compacted_days(files, logs))
    days = [day for day in closed_days(files, logs, realm, today) if day not in done]
    if not days:
        return []

    def write_records(day: tuple[str, str]) -> None:
        source = join(logs, f"realm={day[0]}", f"date={day[1]}")
        records = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS).json(source)
                   .where(F.col("kind").isNotNull()).drop(*DAY_COLUMNS))
        # one file per day: a day is a few hundred MiB of JSON at most, far less as Parquet
        records.coalesce(1).write.mode("overwrite").parquet(compacted_folder(logs, *day))

    parallel = max(1, spark.sparkContext.defaultParallelism)
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(write_records, days))
    records = (spark.read.schema(event_ddl()).option("basePath", join(logs, COMPACTED))
               .parquet(*(compacted_folder(logs, *day) for day in days))
               .select(*USED_COLUMNS, "date"))
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda rollup: store_rollup(rollup, records, logs), all_rollups()))
    for day in days:
        files.touch(join(compacted_folder(logs, *day), COMPACTED_MARKER))
    return days
