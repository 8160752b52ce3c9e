"""Result tables on disk: one folder per table with the same rows as Parquet and as CSV."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame


def write_table(table: DataFrame, folder: Path) -> None:
    """Replace ``folder/parquet`` and ``folder/csv`` with one sorted file each: the tables are
    small, and one file opens anywhere (a spreadsheet, pandas, DuckDB)."""
    single_file = table.coalesce(1)
    single_file.write.mode("overwrite").parquet(str(folder / "parquet"))
    single_file.write.mode("overwrite").option("header", True).csv(str(folder / "csv"))
