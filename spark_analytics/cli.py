"""``python -m spark_analytics report|stream|compact``: the command line over the jobs."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

from spark_analytics.compact import compact_logs
from spark_analytics.reader import input_files
from spark_analytics.report import NoEvents, build_report, describe_scope
from spark_analytics.session import Sizing, start_session
from spark_analytics.stream import DEFAULT_WATERMARK_MINUTES, STATE_PARTITIONS, run_stream


def iso_date(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {value!r}") from None


def existing_folder(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {value}")
    return path.resolve()


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m spark_analytics",
                                   description="Spark analytics over the router's event logs.")
    commands = root.add_subparsers(dest="command", required=True)

    def spark_options(command: argparse.ArgumentParser, out: bool = True) -> None:
        command.add_argument("--logs", type=existing_folder, required=True,
                             help="event-log folder holding realm=<name>/date=<day>/part-<n>.jsonl "
                                  "(a cluster's: .../date=<day>/node=<name>/part-<n>.jsonl)")
        if out:
            command.add_argument("--out", type=Path, required=True, help="output folder")
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
    stream.add_argument("--checkpoint", type=Path, required=True,
                        help="checkpoint folder; a restart with the same one resumes")
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


def no_files(args: argparse.Namespace, files: list[Path]) -> bool:
    """Say so (on stderr) when no part file matches the command's realm and dates."""
    if files:
        return False
    print(f"no event-log files under {args.logs} ({describe_scope(args.realm, args.since)})",
          file=sys.stderr)
    return True


def report_command(args: argparse.Namespace) -> int:
    files = input_files(args.logs, args.realm, args.since)
    if no_files(args, files):
        return 1
    input_bytes = sum(path.stat().st_size for path in files)
    started = time.perf_counter()
    spark = start_session(Sizing.for_input(input_bytes), args.master, args.driver_memory)
    print(f"Spark {spark.version} on {args.master} started in "
          f"{time.perf_counter() - started:.1f} s; reading {len(files):,} files, "
          f"{input_bytes / 2**20:,.1f} MiB", file=sys.stderr)
    try:
        page = build_report(spark, args.logs, args.out.resolve(), args.realm, args.since)
    except NoEvents as error:
        print(error, file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(page)
    return 0


def stream_command(args: argparse.Namespace) -> int:
    if args.once and no_files(args, input_files(args.logs, args.realm, args.since)):
        return 1
    spark = start_session(Sizing(STATE_PARTITIONS), args.master, args.driver_memory)
    try:
        run_stream(spark, args.logs, args.out.resolve(), args.checkpoint.resolve(),
                   args.trigger_seconds, args.once, args.watermark_minutes,
                   realm=args.realm, since=args.since)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        spark.stop()
    return 0


def compact_command(args: argparse.Namespace) -> int:
    # no shuffle: each day is read and written by itself
    spark = start_session(Sizing(shuffle_partitions=1), args.master, args.driver_memory)
    try:
        written = compact_logs(spark, args.logs, args.realm)
    finally:
        spark.stop()
    for realm, day in written:
        print(f"compacted realm={realm}/date={day}")
    return 0


COMMANDS = {"report": report_command, "stream": stream_command, "compact": compact_command}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return COMMANDS[args.command](args)
