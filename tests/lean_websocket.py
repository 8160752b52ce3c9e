"""A minimal RFC 6455 WebSocket client transport, for load generators.

autobahn's WebSocket client spends about 20 us of Python per frame (a masker object per
frame sent, a dozen callbacks per frame received); with eight subscriber processes on two
cores that, not the router, set the WebSocket numbers. This client does only what a WAMP
peer needs: the opening handshake (checked: status 101, Sec-WebSocket-Accept, the
subprotocol), masked client frames, unmasked server frames (fragmented or not), ping ->
pong and the closing handshake.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from typing import Callable

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame: header, a fresh 4-octet mask, the masked payload."""
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    mask = os.urandom(4)
    key = (mask * (length // 4 + 1))[:length]
    masked = (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        length, "little")
    return header + mask + masked


class LeanWebSocketProtocol(asyncio.Protocol):
    """Calls ``on_message(payload)`` per data message and ``on_close()`` once at the end."""

    def __init__(self, host: str, port: int, path: str, subprotocol: str,
                 on_message: Callable[[bytes], None], on_close: Callable[[], None]) -> None:
        self._request_key = base64.b64encode(os.urandom(16))
        self._request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                         f"Sec-WebSocket-Key: {self._request_key.decode()}\r\n"
                         f"Sec-WebSocket-Version: 13\r\n"
                         f"Sec-WebSocket-Protocol: {subprotocol}\r\n\r\n").encode()
        self._subprotocol = subprotocol
        self._on_message = on_message
        self._on_close = on_close
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._close_sent = False
        self.opened: asyncio.Future = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self._request)

    def send_messages(self, payloads: list[bytes], binary: bool) -> None:
        opcode = _BINARY if binary else _TEXT
        self.transport.write(b"".join([masked_frame(opcode, data) for data in payloads]))

    def close(self) -> None:
        """Start (or answer) the closing handshake: one Close frame, never two."""
        if not self._close_sent and not self.transport.is_closing():
            self._close_sent = True
            self.transport.write(masked_frame(_CLOSE, struct.pack("!H", 1000)))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self.opened.done():
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            error = self._handshake_error(bytes(buffer[:end]))
            del buffer[:end + 4]
            if error:
                self.opened.set_exception(ConnectionError(error))
                self.transport.close()
                return
            self.opened.set_result(self)
        offset, end = 0, len(buffer)
        while end - offset >= 2:
            first, second = buffer[offset], buffer[offset + 1]
            length, start = second & 0x7F, offset + 2
            if second & 0x80:
                self._fail("a server frame must not be masked")
                return
            if length == 126:
                if end - start < 2:
                    break
                length, = struct.unpack_from("!H", buffer, start)
                start += 2
            elif length == 127:
                if end - start < 8:
                    break
                length, = struct.unpack_from("!Q", buffer, start)
                start += 8
            if end - start < length:
                break
            self._frame(first & 0x80, first & 0x0F, bytes(buffer[start:start + length]))
            offset = start + length
        del buffer[:offset]

    def _handshake_error(self, head: bytes) -> str | None:
        lines = head.decode("latin-1").split("\r\n")
        if " 101 " not in lines[0] + " ":
            return f"handshake refused: {lines[0]}"
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:])}
        accept = base64.b64encode(hashlib.sha1(self._request_key + _GUID).digest()).decode()
        if headers.get("sec-websocket-accept") != accept:
            return "wrong Sec-WebSocket-Accept"
        if headers.get("sec-websocket-protocol") != self._subprotocol:
            return f"subprotocol {headers.get('sec-websocket-protocol')!r} not accepted"
        return None

    def _frame(self, final: int, opcode: int, payload: bytes) -> None:
        if opcode in (_TEXT, _BINARY, _CONTINUATION):
            self._fragments.append(payload)
            if final:
                message = b"".join(self._fragments) if len(self._fragments) > 1 else payload
                self._fragments = []
                self._on_message(message)
        elif opcode == _PING:
            self.transport.write(masked_frame(_PONG, payload))
        elif opcode == _CLOSE:
            self.close()
            self.transport.close()

    def _fail(self, reason: str) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(reason))
        self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the handshake"))
        self._on_close()
