"""Spark analytics over the per-realm event logs that ``router.eventlog`` writes.

``python -m spark_analytics report`` turns the logs into tables, charts and an HTML page;
``python -m spark_analytics stream`` keeps per-topic counters current as new part files appear.
"""
