"""The SQLite store's completion path: every durability callback runs on its own."""

from __future__ import annotations

import logging
import queue

from router.engines.embedded.sqlite import SqliteStore


def test_one_failing_durability_callback_does_not_cost_the_others(tmp_path, caplog):
    answers: queue.Queue = queue.Queue()
    store = SqliteStore(tmp_path / "store.sqlite3", lambda function, *args: function(*args))
    store.create_schema("CREATE TABLE IF NOT EXISTS item (value TEXT)")

    def broken(ok: bool) -> None:
        raise RuntimeError("a bug in one acknowledgement")

    with caplog.at_level(logging.ERROR, logger="router.engines.embedded.sqlite"):
        store.execute("INSERT INTO item VALUES (?)", ("a",))
        store.when_durable(lambda ok: answers.put(("first", ok)))
        store.when_durable(broken)
        store.when_durable(lambda ok: answers.put(("last", ok)))
        assert answers.get(timeout=5) == ("first", True)
        assert answers.get(timeout=5) == ("last", True)
        store.close()
    assert "durability callback failed" in caplog.text


def test_a_failed_commit_answers_every_waiting_callback_with_false(tmp_path):
    answers: queue.Queue = queue.Queue()
    store = SqliteStore(tmp_path / "store.sqlite3", lambda function, *args: function(*args),
                        max_bytes=12 * 4096)
    store.create_schema("CREATE TABLE IF NOT EXISTS item (value BLOB)")
    for _ in range(20):
        store.execute("INSERT INTO item VALUES (?)", (b"x" * 8000,))
    store.when_durable(answers.put)
    store.when_durable(answers.put)
    assert (answers.get(timeout=5), answers.get(timeout=5)) == (False, False)
    store.close()
