"""The stream job: the counters that only grow, kept current as new part files appear.

Two queries read the same file source, each with its own checkpoint folder:

* ``topic_totals``: per realm and topic published to, events, bytes, QoS split and retained counts, as a
  complete-mode aggregation. Spark keeps the running totals in the checkpoint's state store
  and each micro-batch rewrites the whole table (Parquet and CSV) from them. Writing absolute
  totals is idempotent: a batch replayed after a crash writes the same table again, and a
  restart resumes from the committed offsets and state, so no record is counted twice.
* ``events_per_minute``: per realm and topic, one-minute windows of publishes and bytes,
  appended to a Parquet file sink once the watermark (``--watermark-minutes``, default 10)
  has passed the window, so each row is final: a minute appears only once records at least
  that much newer have been read, so a short log that stops leaves its last minutes out. The sink's own log (``_spark_metadata``) makes the appends exactly-once; read it with
  Spark (``spark.read.parquet``), which honours that log, not file by file.

The file source reads each part file once, when it first sees it: a part must be complete
when it appears under its ``part-<n>.jsonl`` name.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import date
from typing import TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_analytics.aggregates import is_kind, topic_counters
from spark_analytics.reader import read_event_stream
from spark_analytics.storage import join, to_url
from spark_analytics.tables import write_table

MAX_FILES_PER_TRIGGER = 50
# The state store keeps as many partitions as the first run had; the state is small
# (realms x topics, plus the open windows), so a few partitions keep batches fast.
STATE_PARTITIONS = 4
# The writer closes a part after at most eventlog.max_file_age (default 300 s), so a minute's
# records can show up that much later; a window is final once no part can still hold records
# for it. 10 minutes covers the default age with room; raise it with a longer max_file_age.
DEFAULT_WATERMARK_MINUTES = 10
PROGRESS_POLL_SECONDS = 0.5


def report_new_batches(queries: list[StreamingQuery], reported: dict[str, int],
                       out: TextIO) -> None:
    """One line per finished micro-batch not reported yet: query, records read, duration."""
    for query in queries:
        for progress in query.recentProgress:
            if progress.batchId > reported.get(progress.name, -1):
                reported[progress.name] = progress.batchId
                out.write(f"[{progress.name}] batch {progress.batchId}: "
                          f"{progress.numInputRows:,} records in "
                          f"{progress.batchDuration / 1000:.1f} s\n")
    out.flush()


def topic_totals(events: DataFrame) -> DataFrame:
    return (events.where(F.col("topic").isNotNull())
            .groupBy("realm", "topic")
            .agg(*(counter.alias(name) for name, counter in topic_counters().items())))


def events_per_minute(events: DataFrame, watermark_minutes: int) -> DataFrame:
    windows = (events.where(is_kind("publish"))
               .withColumn("at", F.timestamp_seconds("ts"))
               .withWatermark("at", f"{watermark_minutes} minutes")
               .groupBy("realm", "topic", F.window("at", "1 minute"))
               .agg(F.count("*").alias("events"),
                    F.coalesce(F.sum("payload_bytes"), F.lit(0)).alias("bytes")))
    return windows.select("realm", "topic",
                          F.col("window.start").cast("timestamp_ntz").alias("minute"),
                          "events", "bytes")


def rewrite_totals(folder: str) -> Callable[[DataFrame, int], None]:
    """foreachBatch writer: replace the table with the complete totals of this batch."""
    def write(batch: DataFrame, batch_id: int) -> None:
        # topics only subscribed to (exact subscribes carry a topic) are no rows of this table
        totals = batch.where(F.col("events") > 0).orderBy(F.desc("events"), "realm", "topic").persist()
        write_table(totals, folder)
        totals.unpersist()
    return write


def start_queries(spark: SparkSession, logs: str, out: str, checkpoint: str,
                  trigger_seconds: float, once: bool, watermark_minutes: int,
                  realm: str | None, since: date | None) -> list[StreamingQuery]:
    events = read_event_stream(spark, logs, MAX_FILES_PER_TRIGGER, realm, since)
    trigger = {"availableNow": True} if once else {"processingTime": f"{trigger_seconds} seconds"}
    totals = (topic_totals(events).writeStream.queryName("topic_totals")
              .outputMode("complete").foreachBatch(rewrite_totals(join(out, "topic_totals")))
              .option("checkpointLocation", join(checkpoint, "topic_totals"))
              .trigger(**trigger).start())
    minutes = (events_per_minute(events, watermark_minutes).writeStream
               .queryName("events_per_minute").outputMode("append").format("parquet")
               .option("path", join(out, "events_per_minute"))
               .option("checkpointLocation", join(checkpoint, "events_per_minute"))
               .trigger(**trigger).start())
    return [totals, minutes]


def run_stream(spark: SparkSession, logs: str | os.PathLike, out: str | os.PathLike,
               checkpoint: str | os.PathLike, trigger_seconds: float = 30, once: bool = False,
               watermark_minutes: int = DEFAULT_WATERMARK_MINUTES,
               progress: TextIO = sys.stderr, realm: str | None = None,
               since: date | None = None) -> None:
    """Run both queries until stopped (Ctrl-C), or with ``once`` until every file present at
    the start is processed; prints each micro-batch to ``progress``. A failed query raises.
    Locations are local paths or Hadoop file-system URLs."""
    queries = start_queries(spark, to_url(logs), to_url(out), to_url(checkpoint),
                            trigger_seconds, once, watermark_minutes, realm, since)
    reported: dict[str, int] = {}
    try:
        while True:
            finished = [query for query in queries if not query.isActive]
            report_new_batches(queries, reported, progress)
            for query in finished:
                query.awaitTermination()  # raises the query's failure, if it had one
            if len(finished) == len(queries):
                return
            time.sleep(PROGRESS_POLL_SECONDS)
    finally:
        for query in queries:
            query.stop()
