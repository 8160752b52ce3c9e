"""``python -m spark_analytics report|stream|compact``: the command line over the jobs."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import date, datetime, timezone

from pyspark.sql import SparkSession

from spark_analytics.compact import compact_logs, describe_compacted, plan
from spark_analytics.reader import input_files, is_open
from spark_analytics.report import NoEvents, build_report, describe_scope, report_inputs
from spark_analytics.session import Sizing, start_session, stop_session
from spark_analytics.storage import (Entry, Files, HadoopFiles, LocalFiles, local_path, shown,
                                     to_url)
from spark_analytics.stream import DEFAULT_WATERMARK_MINUTES, STATE_PARTITIONS, run_stream


def iso_date(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {value!r}") from None


def location(value: str) -> str:
    """A local path or a Hadoop file-system URL, as a URL."""
    return to_url(value)


def existing_folder(value: str) -> str:
    """A location to read; a local one must exist now, a remote one is listed once Spark runs."""
    url = to_url(value)
    folder = local_path(url)
    if folder is not None and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {value}")
    return url


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m spark_analytics",
                                   description="Spark analytics over the router's event logs.")
    commands = root.add_subparsers(dest="command", required=True)

    def spark_options(command: argparse.ArgumentParser, out: bool = True) -> None:
        command.add_argument("--logs", type=existing_folder, required=True,
                             help="event-log folder holding realm=<name>/date=<day>/part-<n>.jsonl "
                                  "(a cluster's: .../date=<day>/node=<name>/part-<n>.jsonl): a "
                                  "local path or a Hadoop URL (file://, hdfs://, s3a://)")
        if out:
            command.add_argument("--out", type=location, required=True,
                                 help="output folder: a local path or a Hadoop URL")
        command.add_argument("--master", default="local[*]",
                             help="Spark master URL (default: local[*], every core here)")
        command.add_argument("--driver-memory", default="2g",
                             help="JVM heap of the Spark driver (default: 2g)")

    def scope_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--realm", help="only this realm")
        command.add_argument("--since", type=iso_date,
                             help="only dates from this one on (YYYY-MM-DD)")

    report = commands.add_parser("report", help="tables, charts and report.html over the logs")
    spark_options(report)
    scope_options(report)

    stream = commands.add_parser("stream", help="keep per-topic totals and per-minute counts "
                                                "current as new part files appear")
    spark_options(stream)
    scope_options(stream)
    stream.add_argument("--checkpoint", type=location, required=True,
                        help="checkpoint folder (a local path or a Hadoop URL); a restart "
                             "with the same one resumes")
    stream.add_argument("--trigger-seconds", type=float, default=30,
                        help="seconds between micro-batches (default: 30)")
    stream.add_argument("--watermark-minutes", type=int, default=DEFAULT_WATERMARK_MINUTES,
                        help="how late a record may arrive and still count in its minute; a "
                             "minute is written once records this much newer were read; keep it "
                             "above the writer's eventlog.max_file_age "
                             f"(default: {DEFAULT_WATERMARK_MINUTES})")
    stream.add_argument("--once", action="store_true",
                        help="process the files present now, then stop")
    compact = commands.add_parser(
        "compact", help="rewrite closed days (before today, UTC, no open part) as Parquet "
                        "under LOGS/_parquet/, which later reports read instead of the JSON")
    spark_options(compact, out=False)
    compact.add_argument("--realm", help="only this realm")
    return root


def no_files(args: argparse.Namespace, files: list[Entry], still_open: int = 0) -> bool:
    """Say so (on stderr) when no part file matches the command's realm and dates, and how
    many parts that the command leaves out are still being written."""
    if files:
        return False
    waiting = (f"; {still_open:,} part(s) still being written by the router, read once "
               f"closed (eventlog.max_file_age)" if still_open else "")
    print(f"no event-log files under {shown(args.logs)} "
          f"({describe_scope(args.realm, args.since)}){waiting}", file=sys.stderr)
    return True


Listing = Callable[[Files, str, str | None, date | None], list[Entry]]
"""Lists the files a command reads: (file system, logs URL, realm, since)."""


def sized_session(args: argparse.Namespace, fixed: Sizing | None = None,
                  closed_only: bool = False, share_classes: bool = False,
                  many_queries: bool = False, listing: Listing = input_files
                  ) -> tuple[SparkSession | None, list[Entry]]:
    """The session for the input, with the files it will read (``closed_only``: not the
    parts the router still writes; ``share_classes``, ``many_queries``: see
    :func:`start_session`); no
    session (None) when there is nothing to read. ``listing`` lists the files the command
    reads. A local input is listed before the session starts, so its size can choose the
    JVM's options; any other is listed through the session's Hadoop file system, and its size
    sets the shuffle partitions afterwards."""
    spark = None
    if local_path(args.logs) is not None:
        files = listing(LocalFiles(), args.logs, args.realm, args.since)
    else:
        spark = start_session(fixed or Sizing.for_input(0), args.master, args.driver_memory,
                              share_classes=share_classes, many_queries=many_queries)
        files = listing(HadoopFiles(spark), args.logs, args.realm, args.since)
    listed = len(files)
    if closed_only:
        files = [entry for entry in files if not is_open(entry)]
    if no_files(args, files, listed - len(files)):
        if spark is not None:
            stop_session(spark)
        return None, []
    sizing = fixed or Sizing.for_files(files)
    if spark is None:
        spark = start_session(sizing, args.master, args.driver_memory,
                              share_classes=share_classes, many_queries=many_queries)
    else:
        spark.conf.set("spark.sql.shuffle.partitions", sizing.shuffle_partitions)
    return spark, files


def describe_input(files: list[Entry]) -> str:
    """``12 files, 3.4 MiB``, saying how many of them the router is still writing."""
    still_open = sum(1 for entry in files if is_open(entry))
    writing = (f" ({still_open:,} still being written by the router: read as they are now)"
               if still_open else "")
    return (f"{len(files):,} files{writing}, "
            f"{sum(entry.size for entry in files) / 2**20:,.1f} MiB")


def report_command(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    spark, files = sized_session(args, share_classes=True, many_queries=True,
                                 listing=report_inputs)
    if spark is None:
        return 1
    print(f"Spark {spark.version} on {args.master} started in "
          f"{time.perf_counter() - started:.1f} s; reading {describe_input(files)}",
          file=sys.stderr)
    try:
        page = build_report(spark, args.logs, args.out, args.realm, args.since)
    except NoEvents as error:
        print(error, file=sys.stderr)
        return 1
    finally:
        stop_session(spark)
    print(shown(page))
    return 0


def stream_command(args: argparse.Namespace) -> int:
    if args.once:
        # the stream reads a part once it is closed (a file source reads a file once)
        spark, _ = sized_session(args, Sizing(STATE_PARTITIONS), closed_only=True)
        if spark is None:
            return 1
    else:
        spark = start_session(Sizing(STATE_PARTITIONS), args.master, args.driver_memory)
    try:
        run_stream(spark, args.logs, args.out, args.checkpoint,
                   args.trigger_seconds, args.once, args.watermark_minutes,
                   realm=args.realm, since=args.since)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        spark.stop()
    return 0


def compact_command(args: argparse.Namespace) -> int:
    """Compact what is due, saying what was written, or that nothing was due and why: a local
    log is planned before Spark starts, so a run with nothing to do starts none."""
    started = time.perf_counter()
    today = datetime.now(timezone.utc).date()
    if local_path(args.logs) is not None:
        planned = plan(LocalFiles(), args.logs, args.realm, today)
        if not planned.todo:
            print(f"nothing to compact under {shown(args.logs)}: {planned.why_nothing()}")
            return 0
        print(f"compacting {len(planned.todo):,} day(s) under {shown(args.logs)}",
              file=sys.stderr)
    # no shuffle: each day is read and written by itself
    spark = start_session(Sizing(shuffle_partitions=1), args.master, args.driver_memory)
    try:
        written = compact_logs(spark, args.logs, args.realm, today)
        if not written:
            planned = plan(HadoopFiles(spark), args.logs, args.realm, today)
            print(f"nothing to compact under {shown(args.logs)}: {planned.why_nothing()}")
            return 0
        print(describe_compacted(spark, args.logs, written))
    finally:
        spark.stop()
    print(f"done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


COMMANDS = {"report": report_command, "stream": stream_command, "compact": compact_command}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return COMMANDS[args.command](args)
