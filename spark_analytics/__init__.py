"""Spark analytics over the per-realm event logs (filled in by the event-log work)."""
