"""The local admin socket: ``retained list|purge`` and ``status`` on the router's own machine,
with no user to create, no secret to keep and nothing listening on the network.

The router listens on a Unix domain socket (``<data_dir>/admin.sock`` unless the
``admin_socket`` key moves it or turns it off), mode 0600, owned by the user the router runs
as. File permissions decide who is an operator: whoever may open the socket may also read
the database next to it, so the socket grants nothing the data dir does not already give.
Where the kernel names a socket's peer (Linux ``SO_PEERCRED``), a peer that is neither the
router's user nor root is refused too, so a wider mode or directory changes nothing.

The protocol is one JSON object per line each way:

- ``{"realm": R, "call": P, "args": [...], "kwargs": {...}}`` calls the router procedure
  ``P`` of realm ``R`` (the very functions a WAMP client's CALL reaches, e.g.
  ``wamp.retained.list``, see :mod:`router.core.meta`), as a caller no role restricts;
- ``{"metrics": true}`` answers the node's Prometheus text (what a metrics listener serves);

answered with ``{"result": ...}`` or ``{"error": URI, "message": text}``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Any, Callable

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver

from router.core import errors
from router.core.errors import RouterError
from router.core.model import SessionInfo
from router.core.router import Router

SOCKET_MODE = 0o600
MAX_REQUEST_BYTES = 64 * 1024
"""A request line's bound: a longer one closes the connection (requests are a few dozen
bytes; answers are bounded by the procedures' own limits, e.g. ``limit`` of the list)."""
MAX_CONNECTIONS = 8
"""Admin connections open at once; one more is answered with an error and closed."""
OPERATOR = "admin-socket"
"""authid and authrole of the admin socket's caller (what logs and procedures see)."""


class NotRunning(Exception):
    """No router answers on the admin socket; the message says why and what to check."""


class AdminProtocol(LineOnlyReceiver):
    """One operator connection: requests answered in order, one line each."""

    delimiter = b"\n"
    MAX_LENGTH = MAX_REQUEST_BYTES
    factory: "AdminFactory"

    def connectionMade(self) -> None:
        refusal = None
        if len(self.factory.open) >= MAX_CONNECTIONS:
            refusal = f"too many admin connections (at most {MAX_CONNECTIONS})"
        elif not _same_user(self.transport.getHandle()):
            refusal = "only the router's own user (or root) may use the admin socket"
        if refusal is not None:
            self._answer({"error": errors.NOT_AUTHORIZED, "message": refusal})
            self.transport.loseConnection()
            return
        self.factory.open.add(self)
        self._turn = defer.succeed(None)

    def connectionLost(self, reason=None) -> None:
        self.factory.open.discard(self)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._answer({"error": errors.INVALID_ARGUMENT,
                      "message": f"request over {MAX_REQUEST_BYTES} bytes"})
        self.transport.loseConnection()

    def lineReceived(self, line: bytes) -> None:
        if self not in self.factory.open:  # refused: its connection is closing
            return
        # answers keep the requests' order even when a procedure answers later (a Deferred)
        self._turn.addCallback(lambda _: self._handle(line)).addCallback(self._answer)

    def _handle(self, line: bytes) -> defer.Deferred:
        try:
            request = json.loads(line)
            if type(request) is not dict:
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            return defer.succeed({"error": errors.INVALID_ARGUMENT, "message": str(exc)})
        answer = defer.maybeDeferred(self.factory.handle, request)
        answer.addCallbacks(lambda result: {"result": result}, _error)
        return answer

    def _answer(self, message: dict) -> None:
        self.transport.write(json.dumps(message, default=str).encode() + b"\n")


def _error(failure) -> dict:
    if failure.check(RouterError):
        return {"error": failure.value.uri, "message": failure.value.message or ""}
    return {"error": "wamp.error.runtime_error", "message": str(failure.value)}


def _same_user(handle: socket.socket) -> bool:
    """Whether the peer runs as this process's user or root (True where the kernel cannot
    say: then the socket file's mode alone decides)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    credentials = handle.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    return uid in (os.getuid(), 0)


class AdminFactory(Factory):
    """The admin socket's connections, answered from the node's router and metrics."""

    protocol = AdminProtocol
    noisy = False

    def __init__(self, router: Router, metrics_text: Callable[[], bytes]) -> None:
        self.router = router
        self.metrics_text = metrics_text
        self.open: set[AdminProtocol] = set()

    def handle(self, request: dict) -> Any:
        if request.get("metrics") is True:
            return self.metrics_text().decode()
        realm = self.router.realms.get(request.get("realm"))  # type: ignore[arg-type]
        if realm is None:
            raise RouterError(errors.NO_SUCH_REALM,
                              f"no realm {request.get('realm')!r} (realms: "
                              f"{', '.join(self.router.realms)})")
        procedure = realm.dealer.procedures.get(request.get("call"))  # type: ignore[arg-type]
        if procedure is None:
            raise RouterError(errors.NO_SUCH_PROCEDURE,
                              f"no router procedure {request.get('call')!r}")
        args, kwargs = request.get("args", []), request.get("kwargs", {})
        if type(args) is not list or type(kwargs) is not dict:
            raise RouterError(errors.INVALID_ARGUMENT, "'args' is a list, 'kwargs' an object")
        caller = SessionInfo(0, realm.name, OPERATOR, OPERATOR, protocol="admin-socket")
        return procedure(caller, args, kwargs)


def ask(path: Path, request: dict, timeout: float = 30.0) -> Any:
    """Send one request to the admin socket at ``path`` and return its result; RouterError
    with the router's error, NotRunning when no router answers there."""
    if not path.exists():
        raise NotRunning(f"no socket at {path}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        try:
            client.connect(str(path))
        except PermissionError as exc:
            raise NotRunning(f"{path}: permission denied: only the user the router runs as "
                             "(or root) may use it") from exc
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            raise NotRunning(f"{path} refuses connections ({exc.strerror}): left by a router "
                             "that was killed?") from exc
        client.sendall(json.dumps(request).encode() + b"\n")
        received = bytearray()
        while not received.endswith(b"\n"):
            chunk = client.recv(1 << 16)
            if not chunk:
                raise NotRunning(f"the router closed {path} without an answer")
            received += chunk
    answer = json.loads(received)
    if "error" in answer:
        raise RouterError(answer["error"], answer.get("message"))
    return answer["result"]
