"""Reads the router's event logs with the writer's own schema, never inferring one.

The last line of a part file may be torn by a crash, or be still being written in a part the
router has open; with an explicit schema in PERMISSIVE mode Spark turns it into a row of
nulls, which is dropped by requiring ``kind``.

A part the router is still writing is named ``.part-<n>.jsonl``, and Spark's file listing
skips hidden names (also when a file is named explicitly). A batch read that wants the
latest records copies those parts, as they are at that moment, to a folder of its own under
visible names (:func:`read_json_events` with ``snapshot``).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from router.eventlog.schema import PARTITION_COLUMNS, spark_ddl
from spark_analytics.storage import Entry, Files, HadoopFiles, join

PART_FILE_GLOB = "*.jsonl"
OPEN_PART_GLOB = ".part-*.jsonl"
"""A part the router is still writing (renamed without the dot once closed)."""
COMPACTED = "_parquet"
"""Where ``compact`` writes closed days as Parquet; Spark's listing skips ``_`` names."""
COMPACTED_FILE_GLOB = "*.parquet"
COMPACTED_MARKER = "_COMPACTED"
"""Written in a compacted day's folder once its records and rollups are all stored."""
JSON_OPTIONS = {"mode": "PERMISSIVE", "pathGlobFilter": PART_FILE_GLOB}


def event_ddl() -> str:
    """The writer's fields plus the path's partition columns, kept as strings (realm names
    and ISO dates; inference would turn ``date`` into a date and a numeric realm into an int).
    ``node`` is a folder only in a cluster's logs; elsewhere (and in compacted days, where it
    is a column of the Parquet) the same declaration reads it as a data column."""
    partitions = ", ".join(f"`{name}` string" for name in PARTITION_COLUMNS)
    return f"{spark_ddl()}, {partitions}"


def compacted_folder(logs: str, realm: str, day: str) -> str:
    return join(logs, COMPACTED, f"realm={realm}", f"date={day}")


def in_scope(day: tuple[str, str], since: date | None) -> bool:
    return since is None or day[1] >= since.isoformat()


def day_of(folder_names: list[str]) -> tuple[str, str]:
    """(realm, date) from folder names, nearest first: the first ``date=<d>`` and
    ``realm=<r>`` among them (a cluster node's ``node=<name>`` folder may come before)."""
    day = next(name for name in folder_names if name.startswith("date="))
    realm = next(name for name in folder_names if name.startswith("realm="))
    return realm.removeprefix("realm="), day.removeprefix("date=")


def day_files(files: Files, logs: str, realm: str | None, name_glob: str) -> list[Entry]:
    """Files matching ``name_glob`` in every day folder: a single node's parts lie in the day
    folder, a cluster's in one ``node=<name>`` folder per node below it."""
    day_glob = join(logs, f"realm={realm or '*'}", "date=*")
    return [*files.glob(join(day_glob, name_glob)),
            *files.glob(join(day_glob, "node=*", name_glob))]


def compaction_markers(files: Files, logs: str, realm: str | None = None,
                       since: date | None = None) -> list[Entry]:
    """The marker of each day in scope that ``compact`` finished writing."""
    markers = files.glob(join(logs, COMPACTED, f"realm={realm or '*'}", "date=*",
                              COMPACTED_MARKER))
    return [marker for marker in markers if in_scope(day_of(marker.parent_names), since)]


def compacted_days(files: Files, logs: str, realm: str | None = None,
                   since: date | None = None) -> list[tuple[str, str]]:
    """(realm, date) of each day in scope that ``compact`` finished writing."""
    return [day_of(marker.parent_names)
            for marker in compaction_markers(files, logs, realm, since)]


def input_files(files: Files, logs: str, realm: str | None = None,
                since: date | None = None) -> list[Entry]:
    """The part files a read with these filters will touch (Parquet for compacted days, JSON
    for the others, the parts still open included: see :func:`is_open`), to size the session
    and to say clearly when there is nothing to read."""
    compacted = compacted_days(files, logs, realm, since)
    return [*(entry for day in sorted(compacted)
              for entry in files.glob(join(compacted_folder(logs, *day), COMPACTED_FILE_GLOB))),
            *json_parts(files, logs, realm, since, compacted)]


def is_open(entry: Entry) -> bool:
    """Whether a part file is one the router is still writing (Hadoop's glob lists hidden
    names, Spark's listing skips them)."""
    return entry.name.startswith(".")


def json_parts(files: Files, logs: str, realm: str | None, since: date | None,
               compacted: list[tuple[str, str]]) -> list[Entry]:
    """The JSON parts a read with these filters parses: those of the days in scope not
    ``compacted`` (:func:`compacted_days`), the parts still open included."""
    skipped = set(compacted)
    return [entry for entry in day_files(files, logs, realm, PART_FILE_GLOB)
            if (day := day_of(entry.parent_names)) not in skipped and in_scope(day, since)]


def read_json_events(spark: SparkSession, logs: str, compacted: list[tuple[str, str]],
                     realm: str | None = None, since: date | None = None,
                     snapshot: str | None = None) -> DataFrame:
    """The valid records of the JSON parts under ``logs``, skipping the ``compacted`` days'
    folders; the realm/date filters prune whole folders. With a ``snapshot`` folder (the
    caller deletes it once the records are read), the parts the router has open are read
    too, as they are now."""
    copied = copy_open_parts(HadoopFiles(spark), logs, compacted, realm, since,
                             snapshot) if snapshot is not None else {}
    events = (spark.read.schema(event_ddl()).options(**JSON_OPTIONS)
              .option("basePath", logs).json(logs))
    if compacted:
        day_key = F.concat_ws("/", "realm", "date")
        # a filter on partition columns only: Spark prunes those folders, never opening them
        events = events.where(~day_key.isin(*(f"{r}/{d}" for r, d in compacted)))
    # a part closed since it was copied is in the listing just made: read once, from there
    listed = {_part_key(url) for url in events.inputFiles()}
    fresh = [url for key, url in copied.items() if key not in listed]
    if fresh:
        events = events.unionByName(spark.read.schema(event_ddl()).options(**JSON_OPTIONS)
                                    .option("basePath", snapshot).json(fresh))
    return scoped(events, realm, since)


def _part_key(url: str) -> tuple[str, ...]:
    """A part by its folders and closed name, the same for a part, its copy and its closed
    self: (realm, date, name) or (realm, date, node, name)."""
    names = url.rstrip("/").split("/")
    start = next(i for i, name in enumerate(names) if name.startswith("realm="))
    return (*names[start:-1], names[-1].lstrip("."))


def copy_open_parts(files: HadoopFiles, logs: str, compacted: list[tuple[str, str]],
                    realm: str | None, since: date | None, snapshot: str) -> dict[tuple, str]:
    """Copy the parts the router has open now into ``snapshot``, in the same folders under
    their closed names; returns the copies' URLs by :func:`_part_key`. A part closed before
    its copy began is skipped (the listing of closed parts, made after this, has it)."""
    copies = {}
    for entry in day_files(files, logs, realm, OPEN_PART_GLOB):
        day = day_of(entry.parent_names)
        if not in_scope(day, since) or day in compacted:
            continue
        key = _part_key(entry.url)
        target = join(snapshot, *key)
        if files.copy(entry.url, target):
            copies[key] = target
    return copies


def read_events(spark: SparkSession, files: Files, logs: str, realm: str | None = None,
                since: date | None = None) -> DataFrame:
    """All valid records under ``logs``: a day that ``compact`` wrote is read from its
    Parquet, and its JSON parts are skipped."""
    compacted = compacted_days(files, logs, realm, since)
    events = read_json_events(spark, logs, compacted, realm, since)
    if compacted:
        parquet = (spark.read.schema(event_ddl()).option("basePath", join(logs, COMPACTED))
                   .parquet(*(compacted_folder(logs, *day) for day in compacted)))
        events = events.unionByName(scoped(parquet, realm, since))
    return events


def scoped(events: DataFrame, realm: str | None, since: date | None) -> DataFrame:
    """Whole records of one realm / from one date on (partition filters: whole folders)."""
    if realm is not None:
        events = events.where(F.col("realm") == realm)
    if since is not None:
        events = events.where(F.col("date") >= since.isoformat())
    return events.where(F.col("kind").isNotNull())


def read_event_stream(spark: SparkSession, logs: str, max_files_per_trigger: int,
                      realm: str | None = None, since: date | None = None) -> DataFrame:
    """The same records as a stream of new part files under ``logs``."""
    events = (spark.readStream.schema(event_ddl()).options(**JSON_OPTIONS)
              .option("maxFilesPerTrigger", max_files_per_trigger).json(logs))
    return scoped(events, realm, since)
