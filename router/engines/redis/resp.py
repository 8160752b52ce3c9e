"""A small Redis (RESP2) client: what the Redis engine needs and nothing more.

Measured against the libraries before writing it (50,000 PUBLISH of 200 bytes, one
core): ``txredisapi`` 62 us of client CPU per command (a Deferred, a callback chain and
a string join each), ``redis`` asyncio 20 us when pipelined and an asyncio reactor for
the whole router; this client writes a pre-encoded command and counts the reply.
The codec is sans-I/O (:func:`command`, :func:`parse`); :class:`RespProtocol` puts it on
a Twisted connection, :class:`BlockingRedis` on a plain socket for start-up only.
"""

from __future__ import annotations

import socket
from collections import deque
from enum import Enum
from typing import Any, Callable, TypeAlias

from twisted.internet import defer, protocol

Reply: TypeAlias = Any
"""A decoded reply: ``bytes``, ``int``, ``str`` (a status), ``None``, a :class:`RedisError`
or a list of replies. Which one is the command's business: the code that sent it reads
the shape it asked for, so the parser cannot type it more narrowly than this."""
Arg: TypeAlias = "bytes | str | int | float"
"""One argument of a command, as :func:`command` encodes it."""
Command: TypeAlias = "tuple[Arg, ...]"
"""A command not encoded yet (name and arguments), for :class:`BlockingRedis`."""

INCOMPLETE = None
"""What :func:`parse` returns while a reply has not fully arrived."""


class RedisError(Exception):
    """An error reply (``-ERR ...``)."""


def command(*args: Arg) -> bytes:
    """One command as RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buffer: bytearray, position: int) -> tuple[Reply, int] | None:
    """(reply, position after it) of the reply starting at ``position``, or INCOMPLETE."""
    end = buffer.find(b"\r\n", position)
    if end < 0:
        return INCOMPLETE
    kind = buffer[position]
    line = bytes(buffer[position + 1:end])
    after = end + 2
    if kind == 0x24:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return INCOMPLETE
        return bytes(buffer[after:after + size]), after + size + 2
    if kind == 0x2A:  # * array
        size = int(line)
        if size < 0:
            return None, after
        items = []
        for _ in range(size):
            parsed = parse(buffer, after)
            if parsed is None:
                return INCOMPLETE
            item, after = parsed
            items.append(item)
        return items, after
    if kind == 0x3A:  # : integer
        return int(line), after
    if kind == 0x2B:  # + simple string
        return line.decode(), after
    if kind == 0x2D:  # - error
        return RedisError(line.decode()), after
    raise ValueError(f"not a RESP reply: {bytes(buffer[position:end + 2])!r}")


class _Mark(Enum):
    SKIPPED = "skipped"


SKIPPED = _Mark.SKIPPED
"""Stands for a reply :meth:`RespProtocol.request` does not wait for, but whose error
fails the request (``None`` stands for a reply nobody waits for at all)."""


class Busy(ConnectionError):
    """Not sent: ``max_pending`` commands are waiting for their replies already."""


class RespProtocol(protocol.Protocol):
    """Commands in order, replies matched in order; pushes (pub/sub messages) to ``on_push``.

    :meth:`send` is for commands whose reply only matters as "it arrived" (PUBLISH on
    the hot path): no Deferred is made for it.

    Bounded: at most ``max_pending`` commands wait for their replies (what a stopped or slow
    Redis has not answered, with what Twisted still buffers for it). Past that a command is
    not sent (:meth:`send` returns False, :meth:`request` fails with :class:`Busy`).
    ``on_pressure(True)`` runs when half of the bound is waiting, ``on_pressure(False)``
    once a quarter is left (or the connection is gone): the node stops reading from
    publishers meanwhile, so the bound is rarely reached.
    """

    factory: "RespFactory | None" = None

    def __init__(self, max_pending: int = 10_000) -> None:
        self._buffer = bytearray()
        self._waiting: deque[defer.Deferred[Reply] | _Mark | None] = deque()
        self._batch_error: RedisError | None = None
        """The first error among the skipped replies of the request being answered."""
        self.max_pending = max_pending
        self._high = max(1, max_pending // 2)
        self._low = max_pending // 4
        self.pressed = False
        self.on_pressure: Callable[[bool], None] = lambda pressed: None
        self.on_push: Callable[[list[Reply]], None] | None = None
        """Set on a subscribed connection: every reply is a push then."""
        self.on_lost: Callable[[], None] | None = None

    @property
    def pending(self) -> int:
        """Commands sent whose replies have not arrived."""
        return len(self._waiting)

    def connectionMade(self) -> None:
        """Select the database first, then tell the factory's owner the connection is usable."""
        factory = self.factory
        if factory is not None:
            if factory.db:
                self.send(command("SELECT", factory.db))
            factory.connected(self)

    def request(self, data: bytes, skipped: int = 0) -> defer.Deferred[Reply]:
        """Send encoded commands; the Deferred fires with the reply of the last one (errback:
        RedisError, also when one of the ``skipped`` replies before it, not waited for, was
        an error: a batch is stored only if all of it is). Fails with
        :class:`Busy`, sending nothing, when the bound has no room for them all."""
        waiting = self._waiting
        if len(waiting) + skipped + 1 > self.max_pending:
            return defer.fail(Busy(f"{len(waiting)} commands unanswered by Redis"))
        waiter: defer.Deferred[Reply] = defer.Deferred()
        waiting.extend([SKIPPED] * skipped)
        waiting.append(waiter)
        self._write(data)
        return waiter

    def send(self, data: bytes, replies: int = 1) -> bool:
        """Send encoded commands whose ``replies`` are not waited for; False (and nothing
        sent) when that would take the commands waiting past ``max_pending``."""
        waiting = self._waiting
        if len(waiting) + replies > self.max_pending:
            return False
        waiting.extend([None] * replies)
        self._write(data)
        return True

    def _write(self, data: bytes) -> None:
        # connected before any command (the node sends only once connected); Twisted's
        # interfaces are zope ones, whose methods mypy reads without ``self``
        self.transport.write(data)  # type: ignore[union-attr, call-arg, misc]
        if not self.pressed and len(self._waiting) >= self._high:
            self.pressed = True
            self.on_pressure(True)

    def dataReceived(self, data: bytes) -> None:
        """Parse every complete reply in the buffer and hand each to its waiter, in order."""
        buffer = self._buffer
        buffer += data
        position = 0
        while position < len(buffer):
            parsed = parse(buffer, position)
            if parsed is None:
                break
            reply, position = parsed
            self._reply(reply)
        del buffer[:position]

    def _reply(self, reply: Reply) -> None:
        if self.on_push is not None:
            self.on_push(reply)
            return
        waiter = self._waiting.popleft()
        if self.pressed and len(self._waiting) <= self._low:
            self.pressed = False
            self.on_pressure(False)
        if waiter is None:
            return
        if waiter is SKIPPED:
            if isinstance(reply, RedisError) and self._batch_error is None:
                self._batch_error = reply
            return
        error, self._batch_error = self._batch_error, None
        if isinstance(reply, RedisError):
            error = reply
        if error is not None:
            waiter.errback(error)
        else:
            waiter.callback(reply)

    def connectionLost(self, reason: Any = None) -> None:
        """Fail every request still waiting (their commands may or may not have run) and release
        the pressure on publishers."""
        waiting, self._waiting = self._waiting, deque()
        self._batch_error = None
        for waiter in waiting:
            if isinstance(waiter, defer.Deferred):
                waiter.errback(ConnectionError("the connection to Redis was lost"))
        if self.pressed:
            self.pressed = False
            self.on_pressure(False)
        if self.on_lost is not None:
            self.on_lost()


class RespFactory(protocol.ReconnectingClientFactory):
    """Keeps one connection to database ``db`` up; ``connected(protocol)`` runs after
    every (re)connect, once SELECT is sent."""

    maxDelay = 2

    def __init__(self, db: int, connected: Callable[[RespProtocol], None],
                 max_pending: int = 10_000) -> None:
        self.db = db
        self.connected = connected
        self.max_pending = max_pending

    # Twisted types a factory's protocols as ones whose ``factory`` is a plain Factory;
    # this one's protocols know theirs is a RespFactory
    def buildProtocol(self, addr: Any) -> RespProtocol:  # type: ignore[override]
        """A fresh connection with the node's bound; a successful connect resets the reconnect
        delay."""
        self.resetDelay()  # type: ignore[no-untyped-call]  # Twisted leaves it unannotated
        connection = RespProtocol(self.max_pending)
        connection.factory = self
        return connection


class BlockingRedis:
    """Blocking commands on a plain socket: only before the reactor runs (start-up)."""

    def __init__(self, host: str, port: int, db: int, timeout: float = 5.0) -> None:
        self._socket = socket.create_connection((host, port), timeout)
        self._buffer = bytearray()
        if db:
            self.call("SELECT", db)

    def call(self, *args: Arg) -> Reply:
        """Send one command and wait for its reply (an error reply raises :class:`RedisError`)."""
        self._socket.sendall(command(*args))
        while True:
            parsed = parse(self._buffer, 0) if self._buffer else INCOMPLETE
            if parsed is not None:
                reply, position = parsed
                del self._buffer[:position]
                if isinstance(reply, RedisError):
                    raise reply
                return reply
            chunk = self._socket.recv(65536)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            self._buffer += chunk

    def close(self) -> None:
        """Close the start-up connection once the reactor's connections take over."""
        self._socket.close()
