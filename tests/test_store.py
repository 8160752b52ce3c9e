"""The SQLite store's completion path (every durability callback runs on its own), its
retained rows written in batches of any size, and the retained entry's record."""

from __future__ import annotations

import logging
import queue

import msgpack
import pytest

from router.core.model import Eligibility, Publication, SessionInfo
from router.core.payload import UNMAPPED, JsonPayloadPublication, from_bytes
from router.core.retention import Owner, RetainedEvent
from router.engines.embedded.sqlite import SqliteStore
from router.engines.records import (decode_retained, encode_retained, pack_publication,
                                    unpack_publication)


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


def test_a_write_sqlite_cannot_take_fails_its_batch_and_the_writer_goes_on(tmp_path):
    """A value SQLite refuses to bind (a lone surrogate: UnicodeEncodeError, not an
    sqlite3.Error) answers its batch's callbacks with False, as a failed commit does; the
    writer thread lives on and the next batch is stored and acknowledged."""
    answers: queue.Queue = queue.Queue()
    store = SqliteStore(tmp_path / "store.sqlite3", lambda function, *args: function(*args))
    store.create_schema("CREATE TABLE IF NOT EXISTS item (value TEXT)")
    store.execute("INSERT INTO item VALUES (?)", ("\ud800",))
    store.when_durable(answers.put)
    assert answers.get(timeout=5) is False
    store.execute("INSERT INTO item VALUES (?)", ("kept",))
    store.when_durable(answers.put)
    assert answers.get(timeout=5) is True
    store.close()


def retained_entry(topic: tuple[str, ...], payload: bytes) -> RetainedEvent:
    publication = Publication(7, topic, [payload], None, SessionInfo(1, "realm1", "a", "r"),
                              retain=True, qos=1, payload=payload)
    return RetainedEvent(publication, None, 0, encode_retained(publication, None, None))


@pytest.mark.parametrize("topics", [1, 37, 64, 65, 300])
def test_a_batch_of_retained_writes_of_any_size_is_stored_whole(tmp_path, topics):
    """One turn's retained writes go to the writer as one batch, stored by multi-row
    statements of up to 64 rows (37: one; 300 = 4 x 64 + 44): every topic is there, with
    the newest of its entries, and a cleared topic is gone."""
    answers: queue.Queue = queue.Queue()
    turn_end: list = []
    store = SqliteStore(tmp_path / "store.sqlite3", lambda function, *args: function(*args),
                        at_turn_end=turn_end.append)
    try:
        for round_ in (b"old", b"new"):
            for n in range(topics):
                store.save_retained("realm1", ("t", str(n)), [retained_entry(("t", str(n)),
                                                                             round_)])
        store.when_durable(answers.put)
        turn_end.pop()()  # the end of the reactor turn: the whole batch to the writer
        assert answers.get(timeout=10) is True
        store.save_retained("realm1", ("t", "0"), [])  # a clear: the transaction's path
        store.save_retained("realm1", ("t", "x"), [retained_entry(("t", "x"), b"x")])
        store.when_durable(answers.put)
        turn_end.pop()()
        assert answers.get(timeout=10) is True
        stored = {topic: [decode_retained(blob, "realm1").publication.payload
                          for blob in blobs] for topic, blobs in store.load_retained("realm1")}
    finally:
        store.close()
    assert stored == {("t", "x"): [b"x"],
                      **{("t", str(n)): [b"new"] for n in range(1, topics)}}


def test_the_retained_record_keeps_every_field_and_reads_the_named_form_stored_before():
    publisher = SessionInfo(5, "realm1", "alice", "user")
    for args, kwargs, payload in (("payload", None, b"21.5C"), ([21.5], None, b"21.5"),
                                  (None, {"a": [1]}, b'{"a": [1]}'), (["x"], {"k": 2}, None),
                                  (None, None, None)):
        if args == "payload":
            args = [payload]  # as the MQTT frontend maps bytes that are no JSON
        publication = Publication(9, ("t", "x"), args, kwargs, publisher, True,
                                  Eligibility(exclude=frozenset({3})), False, True, None, 0, 1,
                                  payload, {"content_type": "text/plain"}, 1e10, b"amqp",
                                  timestamp=1234.5)
        blob = encode_retained(publication, 99.0, Owner("authid", "alice"))
        if args == [payload]:
            assert blob.count(payload) == 1  # the payload once, not again as args
        named = {"id": 9, "topic": ["t", "x"], "args": args, "kwargs": kwargs,
                 "publisher": [5, "alice", "user"], "disclose": True,
                 "eligibility": publication.eligibility.to_json(), "exclude_me": False,
                 "ts": 1234.5, "expires": 99.0, "qos": 1, "payload": payload,
                 "properties": {"content_type": "text/plain"}, "amqp": b"amqp",
                 "message_expires": 1e10, "owner": ["authid", "alice"], "passthru": None}
        for stored in (blob, msgpack.packb(named, use_bin_type=True)):
            entry = decode_retained(stored, "realm1")
            assert (entry.expires_at, entry.size, entry.owner) == (
                99.0, len(stored), Owner("authid", "alice"))
            got = entry.publication
            who = got.publisher
            assert (who.session_id, who.authid, who.authrole) == (5, "alice", "user")
            assert (got.publication_id, got.topic, got.args, got.kwargs,
                    got.disclose, got.eligibility, got.exclude_me, got.timestamp, got.qos,
                    got.payload, got.properties, got.amqp, got.expires_at) == (
                9, ("t", "x"), args, kwargs, True, publication.eligibility, False,
                1234.5, 1, payload, {"content_type": "text/plain"}, b"amqp", 1e10)


def _stored_retained(publication: Publication) -> tuple[bytes, Publication]:
    blob = encode_retained(publication, None, None)
    return blob, decode_retained(blob, "realm1").publication


def _forwarded(publication: Publication) -> tuple[bytes, Publication]:
    blob = pack_publication("realm1", publication)
    return blob, unpack_publication(blob)[1]


@pytest.mark.parametrize("form", [_stored_retained, _forwarded],
                         ids=["retained entry", "to another node"])
@pytest.mark.parametrize("payload", [b"21.5C", b"21.5", b'{"a": [1]}', b""])
def test_an_mqtt_payload_is_stored_and_forwarded_once_and_mapped_only_when_read(payload, form):
    publication = JsonPayloadPublication(9, ("t",), UNMAPPED, UNMAPPED, None, payload=payload)
    blob, got = form(publication)
    assert Publication.__dict__["args"].__get__(publication) is UNMAPPED  # storing: no mapping
    assert blob.count(payload) == 1 or not payload
    assert type(got) is JsonPayloadPublication and got.payload == payload
    assert (got.args, got.kwargs) == from_bytes(payload, "json")


def test_a_payload_that_is_its_only_argument_is_forwarded_once():
    payload = b"\xff binary"
    blob, got = _forwarded(Publication(9, ("t",), [payload], None, None, payload=payload))
    assert blob.count(payload) == 1
    assert (got.args, got.kwargs, got.payload) == ([payload], None, payload)
