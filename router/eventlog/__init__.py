"""Per-realm event logs (JSON lines) for the Spark analytics in ``spark_analytics``."""
