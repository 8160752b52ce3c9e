"""Prometheus metrics, ``$SYS`` topics and router stats (see docs/metrics.md)."""
