"""``compact``: rewrite closed days of JSON parts as Parquet, which later reports read instead.

The writer leaves hundreds of small JSON parts per realm and day (a part every 300 s by
default); parsing them is most of a report's cost. A closed day (before today, UTC, with no
part still open, on any node) becomes one Parquet folder ``<logs>/_parquet/realm=<r>/date=<d>/``
holding every node's records of that day (``node`` is kept as a column); Spark's
file listing skips names starting with ``_``, so the JSON read of ``<logs>`` never sees it.
The JSON parts stay where they are (the writer's retention removes them); the report reads
the Parquet for a day once its ``_SUCCESS`` marker exists, and the JSON otherwise.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from router.eventlog.schema import DAY_COLUMNS
from spark_analytics.reader import (JSON_OPTIONS, compacted_days, compacted_folder, day_files,
                                    day_of, event_ddl)
from spark_analytics.storage import Files, HadoopFiles, join, to_url

OPEN_PART_GLOB = ".part-*.jsonl"


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

    Each day is one single-task job (one output file), so the days run as concurrent jobs,
    as many at a time as Spark has cores: one after the other they left all cores but one
    idle."""
    logs = to_url(logs)
    files = HadoopFiles(spark)
    today = today or datetime.now(timezone.utc).date()
    done = set(compacted_days(files, logs))
    days = [day for day in closed_days(files, logs, realm, today) if day not in done]

    def compact_day(day: tuple[str, str]) -> None:
        source = join(logs, f"realm={day[0]}", f"date={day[1]}")
        records = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS).json(source)
                   .where(F.col("kind").isNotNull()).drop(*DAY_COLUMNS))
        # one file per day: a day is a few hundred MiB of JSON at most, far less as Parquet
        records.coalesce(1).write.mode("overwrite").parquet(compacted_folder(logs, *day))

    with ThreadPoolExecutor(max(1, spark.sparkContext.defaultParallelism)) as pool:
        list(pool.map(compact_day, days))
    return days
