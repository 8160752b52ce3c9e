"""The cross-protocol matrix, black box: every publisher (WAMP JSON, WAMP MessagePack,
MQTT 3.1.1, MQTT 5, AMQP) x every receiver (the same five) x every payload kind of the
payload table of docs/mqtt-and-amqp.md x live / retained.

The expectations are read from docs/mqtt-and-amqp.md's "Payloads across protocols" table, so the
documentation and the behaviour cannot drift apart: each row says what its publisher
sends and what a WAMP, an MQTT and an AMQP receiver get. One router serves the module;
one scenario per mode (live, retained) subscribes each receiver once to a wildcard,
sends every row's publication once, and records what each receiver got; each cell is
then its own test reading those records.

Values are compared with their types (``5`` is not ``5.0``, ``"5"`` not ``b"5"``; an
AMQP ``int`` is not a ``long``). python-qpid-proton shows an amqp-value null and a
message without a body section alike (``body is None``), so the table's "no body" and
"amqp-value null" are one observation here.
"""

from __future__ import annotations

import ast
import codecs
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.types import PublishOptions
from proton import Message, float32, int32
from proton.utils import BlockingConnection

from tests.amqp_clients import (Receive, Send, amqp_listeners, annotation, connect, received,
                                send, settle)
from tests.clients import connect as wamp_connect
from tests.clients import next_item, run
from tests.harness import RouterProcess
from tests.mqtt_clients import V5, V311, MqttClient, mqtt_realm, publish_properties

PAYLOAD_DOC = Path(__file__).resolve().parent.parent / "docs" / "mqtt-and-amqp.md"
MODES = ("live", "retained")
WAMP_PUBLISHERS = ("wamp_json", "wamp_msgpack")
MQTT_PUBLISHERS = ("mqtt311", "mqtt5")
RECEIVERS = ("wamp_json", "wamp_msgpack", "mqtt311", "mqtt5", "amqp")
SENTINEL = "zz_end"

AMQP_TYPES = {"binary": bytes, "string": str, "long": int, "int": int32, "double": float,
              "float": float32, "map": dict, "list": list}
"""AMQP type names the table uses -> the Python type python-qpid-proton gives them."""
AMQP_NAMES = {kind: name for name, kind in AMQP_TYPES.items()}


# --- the payload table ------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """An AMQP body as python-qpid-proton shows it: section, AMQP type name, value."""
    section: str  # "data", "amqp-value", "amqp-sequence" or "none" (no body or null)
    type: str | None
    value: Any


@dataclass(frozen=True)
class Row:
    """One row of the payload table: what is sent, what each receiver kind gets."""
    ident: str
    kind: str
    protocol: str  # "wamp", "mqtt" or "amqp"
    publishers: tuple[str, ...]
    sent: Any  # (args, kwargs) for WAMP, (payload, format indicator) for MQTT, Body for AMQP
    wamp: tuple[list, dict]
    mqtt: tuple[bytes, int | None]
    amqp: Body


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def wamp_value(cell: str) -> tuple[list, dict]:
    """``args=[...]`` / ``kwargs={...}`` / "no args, no kwargs" -> (args, kwargs)."""
    spans = code_spans(cell)
    if not spans:
        assert "no args, no kwargs" in cell, cell
        return [], {}
    name, _, literal = spans[0].partition("=")
    value = ast.literal_eval(literal)
    return (value, {}) if name == "args" else ([], value)


def mqtt_value(cell: str) -> tuple[bytes, int | None]:
    """Payload bytes (Python escapes) and the MQTT 5 payload format indicator promised."""
    spans = code_spans(cell)
    payload = b"" if not spans else codecs.escape_decode(spans[0].encode("utf-8"))[0]
    assert spans or "empty payload" in cell, cell
    return payload, 1 if "payload format indicator 1" in cell else None


def amqp_value(cell: str) -> Body:
    """``data `b"…"```, ``amqp-value <type> `literal```, ``amqp-sequence `literal```,
    ``amqp-value null``, ``no body``."""
    head = cell.split("`", 1)[0].split()
    if head[:2] in (["no", "body"], ["amqp-value", "null"]):
        return Body("none", None, None)
    value = ast.literal_eval(code_spans(cell)[0])
    if head[0] == "amqp-value":
        return Body("amqp-value", head[1], AMQP_TYPES[head[1]](value))
    assert head[0] in ("data", "amqp-sequence"), cell
    return Body(head[0], None, value)


def sent_value(cell: str) -> tuple[str, tuple[str, ...], Any]:
    """The "Publisher sends" cell: protocol, publishers, what to send."""
    protocol, _, rest = cell.partition(" ")
    if protocol == "WAMP":
        return "wamp", WAMP_PUBLISHERS, wamp_value(rest)
    if protocol == "AMQP":
        return "amqp", ("amqp",), amqp_value(rest)
    assert protocol == "MQTT", cell
    if rest.startswith("5 "):
        return "mqtt", ("mqtt5",), mqtt_value(rest)
    return "mqtt", MQTT_PUBLISHERS, mqtt_value(rest)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def read_table() -> list[Row]:
    """The rows of docs/mqtt-and-amqp.md's payload table."""
    text = PAYLOAD_DOC.read_text(encoding="utf-8")
    section = text.split("## Payloads across protocols", 1)[1]
    start = section.index("| Payload kind |")
    lines = section[start:].split("\n\n", 1)[0].splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:3] == ["Payload kind", "Publisher sends", "WAMP receiver gets"], header
    rows = []
    for line in lines[2:]:
        kind, sends, wamp, mqtt, amqp = (cell.strip() for cell in line.strip("|").split(" | "))
        protocol, publishers, sent = sent_value(sends)
        rows.append(Row(slug(f"{kind} {sends}")[:48], kind, protocol, publishers, sent,
                        wamp_value(wamp), mqtt_value(mqtt), amqp_value(amqp)))
    return rows


ROWS = read_table()
EMPTY_RETAIN_CLEARS = "an empty publication with retain clears" in PAYLOAD_DOC.read_text("utf-8")
"""The documented rule for retained empty publications (else they are kept like any other)."""


def topic(mode: str, index: int, publisher: str) -> str:
    """The WAMP URI of one row's publication by one publisher."""
    return f"matrix.{mode}.r{index:02d}_{publisher}"


CELLS = [(mode, index, publisher, receiver)
         for mode in MODES for index, row in enumerate(ROWS) for publisher in row.publishers
         for receiver in RECEIVERS]
CELL_IDS = [f"{mode}-{ROWS[index].ident}-{publisher}-to-{receiver}"
            for mode, index, publisher, receiver in CELLS]


# --- what receivers got ------------------------------------------------------------------------


def strict(value: Any) -> Any:
    """A value with its type made part of equality (``1 == 1.0 == True`` otherwise)."""
    if isinstance(value, Body):
        return ("body", value.section, value.type, strict(value.value))
    if isinstance(value, dict):
        return ("dict", sorted((strict(k), strict(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("list", [strict(item) for item in value])
    if isinstance(value, memoryview):
        value = bytes(value)
    return (type(value).__name__, repr(value))


def amqp_observed(msg: Message) -> Body:
    body = msg.body
    if body is None:
        return Body("none", None, None)
    if isinstance(body, memoryview):
        body = bytes(body)
    if msg.inferred:
        return Body("data" if isinstance(body, bytes) else "amqp-sequence", None, body)
    return Body("amqp-value", AMQP_NAMES.get(type(body), type(body).__name__), body)


@dataclass
class Got:
    """One delivery as the receiver saw it: the value and whether it came as retained."""
    value: Any
    retained: bool


# --- the traffic ---------------------------------------------------------------------------------


class Matrix:
    """Publishers and receivers of every kind on one router, and what each receiver got."""

    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.got: dict[tuple[str, str, str], list[Got]] = {}
        self.clients: list[Any] = []
        self.amqp: BlockingConnection = connect(router)

    def mqtt_client(self, version: int) -> MqttClient:
        client = MqttClient(self.router, version)
        self.clients.append(client)
        connack = client.connect()
        assert connack.reason_code == 0
        return client

    def record(self, mode: str, receiver: str, uri: str, value: Any, retained: bool) -> None:
        self.got.setdefault((mode, uri, receiver), []).append(Got(value, retained))

    async def scenario(self, mode: str) -> None:
        """Publish every row once per publisher and collect every receiver's deliveries:
        live rows after the receivers subscribed, retained rows before."""
        wamp_pubs = {name: await wamp_connect(self.router, "websocket", name.split("_")[1])
                     for name in WAMP_PUBLISHERS}
        wamp_subs = {name: await wamp_connect(self.router, "rawsocket" if "msgpack" in name
                                              else "websocket", name.split("_")[1])
                     for name in WAMP_PUBLISHERS}
        self.clients += list(wamp_pubs.values()) + list(wamp_subs.values())
        mqtt_pubs = {"mqtt311": self.mqtt_client(V311), "mqtt5": self.mqtt_client(V5)}
        mqtt_subs = {"mqtt311": self.mqtt_client(V311), "mqtt5": self.mqtt_client(V5)}
        retained = mode == "retained"
        if retained:
            await self.publish_all(mode, wamp_pubs, mqtt_pubs)
        queues = {name: await session.events(f"matrix.{mode}.", match="prefix",
                                             get_retained=retained)
                  for name, session in wamp_subs.items()}
        for client in mqtt_subs.values():
            assert client.subscribe((f"matrix/{mode}/#", 1)) == [1]
        receiver = self.amqp.create_receiver(f"prefix:matrix.{mode}.", credit=1000,
                                             options=Receive(1, retained=retained))
        if not retained:
            await self.publish_all(mode, wamp_pubs, mqtt_pubs)
        mqtt_pubs["mqtt5"].publish(f"matrix/{mode}/{SENTINEL}", b"end", qos=1)
        end = f"matrix.{mode}.{SENTINEL}"
        for name, events in queues.items():
            while True:
                args, kwargs, details = await next_item(events)
                if details.topic == end:
                    break
                self.record(mode, name, details.topic, (args, kwargs), bool(details.retained))
        for name, client in mqtt_subs.items():
            for message in client.collect_until(b"end"):
                props = getattr(message, "properties", None)
                indicator = getattr(props, "PayloadFormatIndicator", None) if props else None
                self.record(mode, name, message.topic.replace("/", "."),
                            (message.payload, indicator), bool(message.retain))
        while True:
            msg, delivery = received(receiver)
            settle(receiver, delivery)
            if msg.address == end:
                break
            self.record(mode, "amqp", msg.address, amqp_observed(msg),
                        annotation(msg, "x-opt-retain") is True)
        receiver.close()

    async def publish_all(self, mode: str, wamp_pubs: dict, mqtt_pubs: dict) -> None:
        retain = mode == "retained"
        for index, row in enumerate(ROWS):
            for publisher in row.publishers:
                uri = topic(mode, index, publisher)
                if retain and row.kind == "empty":  # something for the empty one to clear
                    mqtt_pubs["mqtt5"].publish(uri.replace(".", "/"), b"old", qos=1, retain=True)
                if row.protocol == "wamp":
                    args, kwargs = row.sent
                    await wamp_pubs[publisher].publish(
                        uri, *args, options=PublishOptions(acknowledge=True, retain=retain),
                        **kwargs)
                elif row.protocol == "mqtt":
                    payload, indicator = row.sent
                    properties = (publish_properties(PayloadFormatIndicator=indicator)
                                  if indicator is not None else None)
                    code = mqtt_pubs[publisher].publish(uri.replace(".", "/"), payload, qos=1,
                                                        retain=retain, properties=properties)
                    assert code == 0, f"{uri}: PUBACK 0x{code:02x}"
                else:
                    self.amqp_publish(uri, row.sent, retain)

    def amqp_publish(self, uri: str, body: Body, retain: bool) -> None:
        # inferred: bytes go as a data section, a list as an amqp-sequence
        msg = Message(body=body.value, inferred=body.section != "amqp-value")
        if retain:
            msg.annotations = {"x-opt-retain": True}
        sender = self.amqp.create_sender(uri, options=Send(1))
        delivery = send(sender, msg)
        assert delivery.remote_state == delivery.ACCEPTED, f"{uri}: {delivery.remote_state}"
        sender.close()

    async def close(self) -> None:
        for client in self.clients:
            if isinstance(client, MqttClient):
                client.close()
            else:
                await client.close()
        self.amqp.close()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    router = RouterProcess(tmp_path_factory.mktemp("matrix"), [mqtt_realm("realm1")],
                           listeners=amqp_listeners("realm1") + [
                               {"type": "rawsocket", "host": "127.0.0.1", "port": 0}]).start()
    result = Matrix(router)

    async def traffic() -> None:
        try:
            for mode in MODES:
                await result.scenario(mode)
        finally:
            await result.close()

    try:
        run(traffic(), timeout=120)
        yield result
    finally:
        router.stop()


def expected(row: Row, receiver: str) -> Any:
    if receiver.startswith("wamp"):
        return row.wamp
    if receiver == "mqtt5":
        return row.mqtt
    if receiver == "mqtt311":
        return row.mqtt[0], None  # no properties in MQTT 3.1.1
    return row.amqp


def test_table_has_every_kind_from_every_protocol():
    """The table covers the matrix: each payload kind from WAMP, MQTT and AMQP."""
    assert len({row.ident for row in ROWS}) == len(ROWS), "two rows say the same"
    kinds = {"binary", "UTF-8 text", "JSON object", "JSON list", "number", "empty"}
    assert {row.kind for row in ROWS} == kinds
    for kind in kinds:
        assert {row.protocol for row in ROWS if row.kind == kind} == {"wamp", "mqtt", "amqp"}


@pytest.mark.parametrize("mode,index,publisher,receiver", CELLS, ids=CELL_IDS)
def test_cell(matrix, mode, index, publisher, receiver):
    row = ROWS[index]
    got = matrix.got.get((mode, topic(mode, index, publisher), receiver), [])
    if mode == "retained" and row.kind == "empty" and EMPTY_RETAIN_CLEARS:
        assert got == [], "the empty publication should have cleared the retained one"
        return
    assert len(got) == 1, f"expected one delivery, got {got}"
    want = expected(row, receiver)
    assert strict(got[0].value) == strict(want), f"got {got[0].value!r}, want {want!r}"
    assert got[0].retained is (mode == "retained")
