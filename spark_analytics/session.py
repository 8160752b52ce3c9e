"""A quiet SparkSession sized for the input, shared by the report and the stream jobs."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from collections.abc import Iterable
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark_analytics.class_archive import ClassArchive
from spark_analytics.progress import relay_jvm_stderr
from spark_analytics.rollups import is_stored_rollup
from spark_analytics.storage import Entry

SHUFFLE_BYTES_PER_PARTITION = 64 * 1024 * 1024
MAX_SHUFFLE_PARTITIONS = 200
QUICK_JIT_MAX_BYTES = 32 * 1024 * 1024
PARQUET_EXPANSION = 10
"""A byte of compacted Parquet holds the records of about ten bytes of JSON parts (11 on
bench/eventlog_report.py's log). The records make a run long, so Parquet bytes count ten
times when a session is sized: else a compacted log of a million records (21 MiB) chose the
quick-compile JIT, whose small code cache filled up and left the JVM interpreting."""
STORED_ROLLUP_WEIGHT = 0.1
"""A byte of a compacted day's stored rollups (all a report reads of that day) counts as a
tenth of a byte of JSON parts: the report over them is dozens of small distinct queries,
where C2's compiles cost far more than they save. A fresh report over a compacted
10M-record log (29 MiB of rollups; bench/eventlog_report.py's log), 2 cores: 67.9 s of CPU
with C2, 44.5 s with C1 alone, of which the tasks 13.7 s and 15.5 s: the quick tier stays
ahead up to a few hundred MiB of rollups."""
# The writer closes a part every 300 s by default: 288 small files per realm and day. Spark
# packs files into read partitions up to maxPartitionBytes, counting each file as at least
# openCostInBytes; its 4 MiB default makes a small part cost as much as a big one, so a log of
# many small parts became thousands of tasks. (Spark still spreads the input over every core.)
FILE_OPTIONS = {"spark.sql.files.maxPartitionBytes": str(512 * 1024 * 1024),
                "spark.sql.files.openCostInBytes": str(256 * 1024)}
# Percentiles (percentile_approx) aggregate through Spark's object hash aggregation, which
# falls back to sorting all of a task's rows once it holds more than 128 groups: the topics
# table (one group per topic) and the slowest consumers (one per session) spent most of their
# time sorting. A group's buffer holds no more than that group's values (compressed as it
# grows), so the memory stays bounded by the task's rows however many groups there are.
AGGREGATE_OPTIONS = {"spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "16384"}
# ``compact`` writes rollups and records partitioned by realm and date: a folder ``realm=007``
# must read back as the realm "007", not the number 7; and an overwrite replaces only the
# days written, not every other day of the folder.
PARTITION_OPTIONS = {"spark.sql.sources.partitionColumnTypeInference.enabled": "false",
                     "spark.sql.sources.partitionOverwriteMode": "dynamic"}

# Spark's default log4j2 profile prints INFO/WARN chatter and a banner; this one keeps errors
# only, on stderr, so stdout carries nothing but what the command itself prints.
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
# pyspark's gateway counts as a Spark shell, which would announce its own default log level
logger.shell.name = org.apache.spark.api.python.PythonGatewayServer
logger.shell.level = error
"""


def shuffle_partitions_for(input_bytes: int) -> int:
    """One shuffle partition per 64 MiB of input: the aggregates are small, and Spark's
    default of 200 partitions makes a small log take seconds of task overhead."""
    wanted = math.ceil(input_bytes / SHUFFLE_BYTES_PER_PARTITION)
    return max(1, min(MAX_SHUFFLE_PARTITIONS, wanted))


@dataclass(frozen=True)
class Sizing:
    """What the size of a run's input decides about its session."""

    shuffle_partitions: int
    quick_jit: bool = False
    """Compile with the JVM's quick C1 tier only: on a small input the run is over before
    C2's slower, better compiles would pay for themselves (a small report runs ~30 % faster)."""

    @classmethod
    def for_input(cls, input_bytes: int) -> Sizing:
        """Sized for this many bytes of JSON parts."""
        return cls(shuffle_partitions_for(input_bytes), input_bytes < QUICK_JIT_MAX_BYTES)

    @classmethod
    def for_files(cls, files: Iterable[Entry]) -> Sizing:
        """Sized for the files a run reads: compacted records weighed as the JSON they
        replaced, stored rollups by :data:`STORED_ROLLUP_WEIGHT`."""
        return cls.for_input(round(sum(entry.size * input_weight(entry) for entry in files)))


def input_weight(entry: Entry) -> float:
    """What a byte of this file counts as, in bytes of JSON parts (see :class:`Sizing`)."""
    if is_stored_rollup(entry):
        return STORED_ROLLUP_WEIGHT
    return PARQUET_EXPANSION if entry.name.endswith(".parquet") else 1


def _point_java_home() -> None:
    """Spark needs Java 17; point JAVA_HOME at the ``java`` on PATH when it is not set."""
    if os.environ.get("JAVA_HOME"):
        return
    java = shutil.which("java")
    if java is None:
        raise SystemExit("Spark needs Java 17: install it (Debian: apt-get install "
                         "openjdk-17-jre-headless) or set JAVA_HOME")
    os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)


LATE_C2_OPTIONS = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4CompileThreshold=60000 "
                   "-XX:Tier4BackEdgeThreshold=400000")
"""For a JVM that runs many distinct queries on C2 (a report over more than
:data:`QUICK_JIT_MAX_BYTES`): a method is compiled by C2 after ten times the JVM's default
calls and loop iterations (4 times its combined count), so C2 compiles the scans' and
aggregations' hot loops, not the thousands of methods each query's planning, generated code
and writers warm up once. Report over 3M records on JSON, fresh processes, 2 cores, load
3.6-7, 4 pairs alternating with the defaults: C2's CPU 10-18 s lower (26-28 s against
38-44 s), the process's 0-20 % lower (130-144 s against 139-166 s; the tasks' at times a
little higher). The bare read (one query) gains nothing from it (CPU 36-37 s against
37-42 s, wall no better), and a larger threshold (30 times) did worse."""
ARCHIVE_WRITE_SECONDS = 600
"""How long the first report waits for its JVM to write the class archive (seconds)."""
_ARCHIVES_AT_EXIT: list[ClassArchive] = []
"""The class archive this process's driver JVM writes when it exits (at most one)."""


def start_session(sizing: Sizing, master: str = "local[*]", driver_memory: str = "2g",
                  app_name: str = "wamp-eventlog", share_classes: bool = False,
                  many_queries: bool = False) -> SparkSession:
    """Start (or reuse) the SparkSession; times are UTC so minutes and dates match the paths.

    A local master binds to the loopback address; with a cluster's master the driver binds
    as Spark decides (``SPARK_LOCAL_IP`` / ``spark.driver.host`` choose otherwise), since the
    executors must reach it. ``share_classes``: the driver JVM starts from the class archive
    of :mod:`spark_analytics.class_archive`, or writes it (stop with :func:`stop_session`).
    ``many_queries``: the run is dozens of distinct queries (a report): see
    :data:`LATE_C2_OPTIONS`."""
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _point_java_home()
    archive = ClassArchive.for_java(os.environ["JAVA_HOME"]) if share_classes else None
    handle, log_config = tempfile.mkstemp(prefix="spark-analytics-log4j2-", suffix=".properties")
    with os.fdopen(handle, "w") as config_file:
        config_file.write(QUIET_LOG4J2)
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    # a cluster's executors run the same short tasks: the same JIT choice helps them too. C1
    # alone reserves 48 MiB of code cache, which the report's many queries fill (the JVM then
    # stops compiling and interprets); tiered compilation's default reservation is kept
    executor_options = ("-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
                        if sizing.quick_jit else LATE_C2_OPTIONS if many_queries else "")
    if executor_options:
        java_options += " " + executor_options
    if archive is not None:
        java_options += " " + archive.java_options()
        if archive.usable() is None:
            _ARCHIVES_AT_EXIT.append(archive)
    try:
        with relay_jvm_stderr():
            spark = (SparkSession.builder.master(master).appName(app_name)
                     .config("spark.driver.memory", driver_memory)
                     .config("spark.driver.extraJavaOptions", java_options)
                     .config("spark.executor.extraJavaOptions", executor_options)
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.session.timeZone", "UTC")
                     .config("spark.sql.shuffle.partitions", sizing.shuffle_partitions)
                     .config(map=FILE_OPTIONS)
                     .config(map=PARTITION_OPTIONS)
                     .config(map=AGGREGATE_OPTIONS)
                     .getOrCreate())
    finally:
        Path(log_config).unlink()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the session. When its driver JVM writes the class archive as it exits, end the
    JVM now and wait for the archive (once per installation: the first report takes longer)."""
    spark.stop()
    if not _ARCHIVES_AT_EXIT:
        return
    archive = _ARCHIVES_AT_EXIT.pop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    print("saving the JVM's classes for the next reports ...", file=sys.stderr, flush=True)
    process = gateway.proc
    gateway.shutdown()
    process.stdin.close()  # the gateway's JVM exits at the end of its stdin
    try:
        status = process.wait(ARCHIVE_WRITE_SECONDS)
    except subprocess.TimeoutExpired:
        return  # left to finish alone; never used (not renamed), removed once stale
    SparkContext._gateway = SparkContext._jvm = None
    archive.finish(status)
