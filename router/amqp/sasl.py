"""The server side of the AMQP 1.0 SASL layer (spec part 5.3), sans I/O.

python-qpid-proton's bundled SASL without Cyrus only offers stubs, so the router
runs the exchange itself and hands proton the plain AMQP stream that follows:

    client: "AMQP" 3 1 0 0                 server: "AMQP" 3 1 0 0 + sasl-mechanisms
    client: sasl-init (mechanism, initial response)
                                           server: sasl-outcome (ok = 0 / auth = 1)
    client: "AMQP" 0 1 0 0 ...  (from here on, proton's business)

Supported mechanisms: PLAIN (``authzid NUL authcid NUL password``) and, where the
realm has an anonymous role, ANONYMOUS. A client that sends the plain AMQP header
straight away skips SASL; the caller decides whether that is acceptable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

from proton import Data, Described, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_FRAME_TYPE = 1
MAX_SASL_FRAME = 64 * 1024

SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44
OK, AUTH, SYS, SYS_PERM, SYS_TEMP = 0, 1, 2, 3, 4


class SaslFailure(Exception):
    """The peer broke the SASL layer (bad header, bad frame)."""


@dataclass(frozen=True)
class Identity:
    authid: str
    authrole: str
    authmethod: str


Answer = Callable[["Identity | int"], None]
"""Takes the identity, or the sasl-outcome code of a refusal (AUTH, or SYS_TEMP: busy)."""
Authenticator = Callable[[str, bytes, Answer], None]
"""(mechanism, initial response, answer): calls ``answer`` at once or later on the reactor."""


def frame(body: bytes) -> bytes:
    """A SASL frame (doff 2, type 1, channel 0) around an encoded performative."""
    return struct.pack(">IBBH", 8 + len(body), 2, SASL_FRAME_TYPE, 0) + body


def encode(descriptor: int, fields: list) -> bytes:
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    return bytes(data.encode())


def mechanisms_frame(names: list[str]) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(SASL_MECHANISMS)
    data.put_list()
    data.enter()
    data.put_array(False, Data.SYMBOL)
    data.enter()
    for name in names:
        data.put_symbol(name)
    data.exit()
    data.exit()
    data.exit()
    return frame(bytes(data.encode()))


def outcome_frame(code: int) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(SASL_OUTCOME)
    data.put_list()
    data.enter()
    data.put_ubyte(code)
    data.exit()
    data.exit()
    return frame(bytes(data.encode()))


def decode_performative(body: bytes) -> tuple[int, list]:
    data = Data()
    try:
        data.decode(body)
        data.rewind()
        data.next()
        value = data.get_object()
    except Exception as exc:  # proton raises its own DataException family
        raise SaslFailure(f"undecodable SASL frame: {exc}") from exc
    if not isinstance(value, Described) or not isinstance(value.value, list):
        raise SaslFailure("a SASL frame must hold a described list")
    # binary values are views into the Data's memory: copy them before it is freed
    return int(value.descriptor), [bytes(item) if isinstance(item, memoryview) else item
                                   for item in value.value]


def parse_plain(response: bytes) -> tuple[str, str] | None:
    """(authcid, password) of a PLAIN initial response, or None if malformed."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None


class SaslServer:
    """Feed bytes; read ``output``; ``identity`` and ``rest`` once ``done``.

    States: "header" (waiting for the protocol header), "init" (sent mechanisms,
    waiting for sasl-init), "verifying" (waiting for the authenticator's answer; later
    bytes are kept), "amqp" (outcome ok sent, waiting for the AMQP header),
    "done" (``rest`` holds the AMQP stream from its header on), "failed".
    """

    def __init__(self, mechanisms: list[str], authenticate: Authenticator,
                 allow_skip: bool, wake: Callable[[], None]) -> None:
        self.mechanisms = mechanisms
        self.authenticate = authenticate
        self.allow_skip = allow_skip
        self.wake = wake
        """Called when an answer comes later: the owner feeds ``b""`` and reads the output."""
        self._receiving = False
        self._mechanism = ""
        self.state = "header"
        self.buffer = b""
        self.output = b""
        self.identity: Identity | None = None
        self.skipped = False
        self.rest = b""
        self.reason = ""

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def take_output(self) -> bytes:
        out, self.output = self.output, b""
        return out

    def receive(self, data: bytes) -> None:
        if self.state in ("done", "failed"):
            return
        self.buffer += data
        self._receiving = True
        try:
            if self.state == "verifying" and len(self.buffer) > MAX_SASL_FRAME:
                raise SaslFailure("too much data while the credentials are checked")
            while self._step():
                pass
        except SaslFailure as exc:
            self.state = "failed"
            self.reason = str(exc)
        finally:
            self._receiving = False

    def _step(self) -> bool:
        if self.state == "header":
            if len(self.buffer) < 8:
                if not SASL_HEADER.startswith(self.buffer[:4]):
                    raise self._bad_header()
                return False
            header, self.buffer = self.buffer[:8], self.buffer[8:]
            if header == SASL_HEADER:
                self.output += SASL_HEADER + mechanisms_frame(self.mechanisms)
                self.state = "init"
                return True
            if header == AMQP_HEADER and self.allow_skip:
                self.skipped = True
                self.rest = header + self.buffer
                self.buffer = b""
                self.state = "done"
                return False
            if header == AMQP_HEADER:
                self.output += SASL_HEADER  # tell the client what it must speak instead
                raise SaslFailure("SASL is required (anonymous access is off)")
            raise self._bad_header()
        if self.state == "init":
            if len(self.buffer) < 8:
                return False
            size, doff, kind, _channel = struct.unpack(">IBBH", self.buffer[:8])
            if size < 8 or doff < 2 or size > MAX_SASL_FRAME or kind != SASL_FRAME_TYPE:
                raise SaslFailure("malformed SASL frame header")
            if len(self.buffer) < size:
                return False
            body = self.buffer[doff * 4:size]
            self.buffer = self.buffer[size:]
            if not body:
                return True  # an empty frame (heartbeat)
            descriptor, fields = decode_performative(body)
            if descriptor != SASL_INIT:
                raise SaslFailure(f"expected sasl-init, got performative 0x{descriptor:x}")
            mechanism = str(fields[0]) if fields else ""
            response = bytes(fields[1]) if len(fields) > 1 and fields[1] is not None else b""
            self.state = "verifying"
            self._mechanism = mechanism or "-"
            if mechanism in self.mechanisms:
                self.authenticate(mechanism, response, self._answer)
            else:
                self._answer(AUTH)
            return self.state == "amqp"  # answered at once: go on with what follows
        if self.state == "amqp":
            if len(self.buffer) < 8:
                if not AMQP_HEADER.startswith(self.buffer[:8]):
                    raise SaslFailure("expected the AMQP protocol header after SASL")
                return False
            if self.buffer[:8] != AMQP_HEADER:
                raise SaslFailure("expected the AMQP protocol header after SASL")
            self.rest, self.buffer = self.buffer, b""
            self.state = "done"
            return False
        return False

    def _answer(self, outcome: "Identity | int") -> None:
        """The sasl-outcome; frames the client sent after sasl-init wait for it."""
        if self.state != "verifying":
            return
        if isinstance(outcome, Identity):
            self.identity = outcome
            self.output += outcome_frame(OK)
            self.state = "amqp"
        else:
            self.output += outcome_frame(outcome)
            self.state = "failed"
            self.reason = (f"authentication failed (mechanism {self._mechanism})"
                           if outcome == AUTH else "refused: server busy")
        if not self._receiving:
            self.wake()

    def _bad_header(self) -> SaslFailure:
        self.output += SASL_HEADER
        return SaslFailure(f"wrong protocol header {self.buffer[:8]!r}")
