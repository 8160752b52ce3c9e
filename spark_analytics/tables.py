"""Result tables on disk: one folder per table with the same rows as Parquet and as CSV."""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_analytics.storage import join


def write_table(table: DataFrame, folder: str) -> None:
    """Replace ``folder/parquet`` and ``folder/csv`` with one sorted file each: the tables are
    small, and one file opens anywhere (a spreadsheet, pandas, DuckDB). ``folder`` is a URL."""
    single_file = table.coalesce(1)
    single_file.write.mode("overwrite").parquet(join(folder, "parquet"))
    single_file.write.mode("overwrite").option("header", True).csv(join(folder, "csv"))
