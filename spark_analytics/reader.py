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
JSON_OPTIONS = {"mode": "PERMISSIVE", "pathGlobFilter": PART_FILE_GLOB}


def event_ddl() -> str:
    """The writer's fields plus the path's partition columns, kept as strings (realm names
    and ISO dates; inference would turn ``date`` into a date and a numeric realm into an int)."""
    partitions = ", ".join(f"`{name}` string" for name in PARTITION_COLUMNS)
    return f"{spark_ddl()}, {partitions}"


def input_files(logs: Path, realm: str | None = None, since: date | None = None) -> list[Path]:
    """The part files a read with these filters will touch, to size the session before it
    starts and to say clearly when there is nothing to read."""
    realm_dirs = [logs / f"realm={realm}"] if realm else sorted(logs.glob("realm=*"))
    files = []
    for realm_dir in realm_dirs:
        for date_dir in sorted(realm_dir.glob("date=*")):
            if since is None or date_dir.name.removeprefix("date=") >= since.isoformat():
                files.extend(sorted(date_dir.glob(PART_FILE_GLOB)))
    return files


def read_events(spark: SparkSession, logs: Path, realm: str | None = None,
                since: date | None = None) -> DataFrame:
    """All valid records under ``logs``; the realm/date filters prune whole folders."""
    events = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS)
              .option("basePath", str(logs)).json(str(logs)))
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
