"""Durable storage on SQLite (WAL), written by one background thread with group commit."""
