"""HTTP clients for the black-box tests of the ``http`` listener: plain ``http.client``
requests and a Server-Sent Events reader on its own thread (nothing here sleeps)."""

from __future__ import annotations

import base64
import http.client
import json
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any

TIMEOUT = 10.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def basic(authid: str, secret: str) -> dict[str, str]:
    pair = base64.b64encode(f"{authid}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def request(router, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None, raw: bytes | None = None,
            timeout: float = TIMEOUT) -> Reply:
    """One request on a new connection: ``body`` is sent as JSON, ``raw`` as it is."""
    host, port, _ = router.address("http")
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    sent_headers = dict(headers or {})
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        sent_headers.setdefault("Content-Type", "application/json")
    try:
        connection.request(method, path, body=data, headers=sent_headers)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read())
    finally:
        connection.close()


@dataclass
class Frame:
    event: str
    id: str | None
    data: Any


class EventReader:
    """``GET /subscribe...`` read on a thread: each frame (comments skipped) into a queue.
    ``read=False`` opens the stream and never reads it (a stopped reader)."""

    def __init__(self, router, path: str, headers: dict[str, str] | None = None,
                 read: bool = True, receive_buffer: int | None = None) -> None:
        host, port, _ = router.address("http")
        self.sock = socket.socket()
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect((host, port))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        lines += [f"{key}: {value}" for key, value in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.frames: queue.Queue[Frame | None] = queue.Queue()
        self.status: int | None = None
        self.closed = threading.Event()
        self._head = threading.Event()
        if read:
            threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        buffer = b""
        try:
            while b"\r\n\r\n" not in buffer:
                buffer += self._recv()
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            self.status = int(head.split(b" ", 2)[1])
            self._head.set()
            chunked = b"transfer-encoding: chunked" in head.lower()
            text = b""
            while True:
                if chunked:
                    while b"\r\n" not in buffer:
                        buffer += self._recv()
                    size_line, buffer = buffer.split(b"\r\n", 1)
                    size = int(size_line.split(b";")[0], 16)
                    if size == 0:
                        break
                    while len(buffer) < size + 2:
                        buffer += self._recv()
                    text += buffer[:size]
                    buffer = buffer[size + 2:]
                else:
                    text += buffer or self._recv()
                    buffer = b""
                while b"\n\n" in text:
                    block, text = text.split(b"\n\n", 1)
                    self._frame(block.decode())
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self._head.set()
            self.closed.set()
            self.frames.put(None)

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        return data

    def _frame(self, block: str) -> None:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":") or not line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            self.frames.put(Frame(fields.get("event", "message"), fields.get("id"),
                                  json.loads(fields["data"])))

    def wait_status(self, timeout: float = TIMEOUT) -> int | None:
        self._head.wait(timeout)
        return self.status

    def next(self, timeout: float = TIMEOUT) -> Frame:
        frame = self.frames.get(timeout=timeout)
        assert frame is not None, "the stream ended"
        return frame

    def close(self) -> None:
        """Close the connection now. ``shutdown`` first: a bare ``close`` while the reading
        thread is blocked in ``recv`` sends nothing until that ``recv`` returns (up to
        TIMEOUT later), so the router went on counting the stream for 10 s."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # never connected, or the router closed it already
        try:
            self.sock.close()
        except OSError:
            pass
