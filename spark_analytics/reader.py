"""Reads the router's event logs with the writer's own schema, never inferring one.

The last line of a part file may be torn by a crash; with an explicit schema in PERMISSIVE
mode Spark turns it into a row of nulls, which is dropped by requiring ``kind``.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from router.eventlog.schema import PARTITION_COLUMNS, spark_ddl

PART_FILE_GLOB = "*.jsonl"
COMPACTED = "_parquet"
"""Where ``compact`` writes closed days as Parquet; Spark's listing skips ``_`` names."""
COMPACTED_FILE_GLOB = "*.parquet"
JSON_OPTIONS = {"mode": "PERMISSIVE", "pathGlobFilter": PART_FILE_GLOB}


def event_ddl() -> str:
    """The writer's fields plus the path's partition columns, kept as strings (realm names
    and ISO dates; inference would turn ``date`` into a date and a numeric realm into an int).
    ``node`` is a folder only in a cluster's logs; elsewhere (and in compacted days, where it
    is a column of the Parquet) the same declaration reads it as a data column."""
    partitions = ", ".join(f"`{name}` string" for name in PARTITION_COLUMNS)
    return f"{spark_ddl()}, {partitions}"


def compacted_folder(logs: Path, realm: str, day: str) -> Path:
    return logs / COMPACTED / f"realm={realm}" / f"date={day}"


def compacted_days(logs: Path, realm: str | None = None,
                   since: date | None = None) -> list[tuple[str, str]]:
    """(realm, date) of each day ``compact`` finished writing (its ``_SUCCESS`` marker)."""
    days = []
    for marker in sorted((logs / COMPACTED).glob(f"realm={realm or '*'}/date=*/_SUCCESS")):
        day = marker.parent.name.removeprefix("date=")
        if since is None or day >= since.isoformat():
            days.append((marker.parent.parent.name.removeprefix("realm="), day))
    return days


def input_files(logs: Path, realm: str | None = None, since: date | None = None) -> list[Path]:
    """The part files a read with these filters will touch (Parquet for compacted days, JSON
    for the others), to size the session before it starts and to say clearly when there is
    nothing to read."""
    compacted = set(compacted_days(logs, realm, since))
    files = [path for day in sorted(compacted)
             for path in sorted(compacted_folder(logs, *day).glob(COMPACTED_FILE_GLOB))]
    realm_dirs = [logs / f"realm={realm}"] if realm else sorted(logs.glob("realm=*"))
    for realm_dir in realm_dirs:
        for date_dir in sorted(realm_dir.glob("date=*")):
            day = (realm_dir.name.removeprefix("realm="), date_dir.name.removeprefix("date="))
            if (since is None or day[1] >= since.isoformat()) and day not in compacted:
                files.extend(sorted(date_dir.rglob(PART_FILE_GLOB)))
    return files


def read_events(spark: SparkSession, logs: Path, realm: str | None = None,
                since: date | None = None) -> DataFrame:
    """All valid records under ``logs``; the realm/date filters prune whole folders. A day
    that ``compact`` wrote is read from its Parquet, and its JSON parts are skipped."""
    events = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS)
              .option("basePath", str(logs)).json(str(logs)))
    compacted = compacted_days(logs, realm, since)
    if compacted:
        day_key = F.concat_ws("/", "realm", "date")
        # a filter on partition columns only: Spark prunes those folders, never opening them
        events = events.where(~day_key.isin(*(f"{r}/{d}" for r, d in compacted)))
        parquet = (spark.read.schema(event_ddl()).option("basePath", str(logs / COMPACTED))
                   .parquet(*(str(compacted_folder(logs, *day)) for day in compacted)))
        events = events.unionByName(parquet)
    return scoped(events, realm, since)


def scoped(events: DataFrame, realm: str | None, since: date | None) -> DataFrame:
    """Whole records of one realm / from one date on (partition filters: whole folders)."""
    if realm is not None:
        events = events.where(F.col("realm") == realm)
    if since is not None:
        events = events.where(F.col("date") >= since.isoformat())
    return events.where(F.col("kind").isNotNull())


def read_event_stream(spark: SparkSession, logs: Path, max_files_per_trigger: int,
                      realm: str | None = None, since: date | None = None) -> DataFrame:
    """The same records as a stream of new part files under ``logs``."""
    events = (spark.readStream.schema(event_ddl()).options(**JSON_OPTIONS)
              .option("maxFilesPerTrigger", max_files_per_trigger).json(str(logs)))
    return scoped(events, realm, since)
