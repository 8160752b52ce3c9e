"""The TCP server transport of plain listeners, which counts its listener's bytes itself.

Apart from :mod:`router.limits` because Twisted's ``tcp`` module imports its TLS support
(pyOpenSSL) when it is imported: configuration loading must not, so that a router without
TLS can leave pyOpenSSL out (:func:`router.tls.leave_out_tls`). Only the node imports it.
"""

from __future__ import annotations

import sys
from errno import ENOBUFS, EWOULDBLOCK
from operator import attrgetter
from socket import AF_INET, inet_ntop, inet_pton
from typing import Any, Iterable

from twisted.internet import abstract, main, tcp
from twisted.python.compat import lazyByteSlice

from router.flow import NO_WRITES
from router.limits import READ_CHUNK, ConnectionLimits

SEND_LIMIT = tcp.Connection.SEND_LIMIT
"""The most one ``send`` is given (Twisted's)."""


class CountingServer(tcp.Server):
    """Twisted's TCP server transport that adds what it reads and sends to its listener's
    byte totals (the ``limits`` of the port's factory): no per-connection wrapper.

    It also keeps the transport's instance attributes in CPython's compact per-class form:
    the attributes Twisted sets only on the first write (``dataBuffer``, ``offset``) are
    set when it is made. CPython 3.11 stops adding names to a class's shared attribute
    table once a few dozen instances exist; a name first set later makes that instance a
    full ``__dict__`` (about 830 bytes per connection, measured with
    ``bench/session_memory.py --tracemalloc``), which a batch of accepted connections
    whose first write comes after the batch always did. The read size is
    :data:`READ_CHUNK` for the class, not an attribute of each, and the log prefix and
    repr are made when asked.

    Nothing kept per connection that can be made when asked: the peer's IPv4 address and
    port are one int (not a tuple, its port int and the host text: 88 bytes), the write
    buffer is the shared empty :data:`router.flow.NO_WRITES` until something is written
    (an empty list is 56 bytes of every idle connection), the session number of the log
    prefix is the socket's file descriptor (not an int of its own)."""

    bufferSize = READ_CHUNK
    counts_bytes = True
    """Tells :meth:`ConnectionLimits.count_bytes` that this transport needs no wrappers."""

    def __init__(self, sock, protocol, client, server, sessionno, reactor) -> None:
        self._peer = _packed(client)
        super().__init__(sock, protocol, client, server, sessionno, reactor)
        self._tempDataBuffer = NO_WRITES
        self.dataBuffer = b""
        self.offset = 0
        self.producer = None
        self.streamingProducer = False
        self.limits: ConnectionLimits = server.factory.limits
        del self.fileno

    @property
    def client(self) -> tuple:
        """The peer's (host, port), as accept gave it (made when asked)."""
        peer = self._peer
        if type(peer) is int:
            return (inet_ntop(AF_INET, (peer >> 16).to_bytes(4, "big")), peer & 0xFFFF)
        return peer

    @client.setter
    def client(self, client: tuple) -> None:
        """What Twisted sets when made: kept as :attr:`_peer` already."""

    sessionno = property(lambda self: self.fileno(), lambda self, number: None)

    # the reactor (the port's) and the peer's host (the client's first) are not kept again
    # per connection: 8 bytes each of every connection's attribute values
    reactor = property(attrgetter("server.reactor"), lambda self, reactor: None)
    hostname = property(lambda self: self.client[0], lambda self, host: None)

    # Twisted makes two strings per connection for its log prefix and repr (~160 bytes):
    # made when asked instead (what Twisted sets is dropped), and kept once the connection
    # is lost, when Twisted lets go of the protocol they name
    def _names(self) -> tuple[str, str]:
        """(log prefix, repr): from the protocol, or as they were when it was lost."""
        try:
            protocol = self.protocol
        except AttributeError:
            return self.closed_names
        return (f"{self._getLogPrefix(protocol)},{self.sessionno},{self.hostname}",
                f"<{protocol.__class__.__name__} #{self.sessionno} on "
                f"{self.server._realPortNumber}>")

    logstr = property(lambda self: self._names()[0], lambda self, text: None)
    repstr = property(lambda self: self._names()[1], lambda self, text: None)

    # Twisted keeps the socket's ``fileno`` method per connection (a bound method, 72
    # bytes): dropped once made (the class's method answers the same, about 20 ns more a
    # call where a property cost 85) and set back for the moment Twisted deletes it
    def fileno(self) -> int:
        try:
            return self.socket.fileno()
        except AttributeError:  # the connection is lost
            return -1

    def connectionLost(self, reason: Any) -> None:
        # set back as the socket's own (Twisted deletes it once the socket is out of the
        # reactor): the reactor finds the connection to remove by this number, and with -1
        # it searches all of them, which made closing N connections take N^2 steps (19,800
        # closed at once: 12 s and 9.4 s of CPU, 470 us a close, bench/session_memory.py)
        sock = getattr(self, "socket", None)
        self.fileno = sock.fileno if sock is not None else _no_fileno
        self.closed_names = self._names()
        super().connectionLost(reason)

    # The two calls of every read and every send: Twisted's, in one frame each (theirs
    # went through ``_dataReceived``, and ``untilConcludes`` over a memoryview per send:
    # three Python calls more per RPC call's read and send, ``bench/rpc.py``).
    # Twisted's writes, with the buffer list made on the first write to an empty one (and
    # one frame for ``write``: Twisted's went through its TLS mixin's, which this plain
    # transport never needs)
    def write(self, data: bytes) -> None:
        """Buffer ``data`` and watch for the socket to take it (Twisted's ``write``)."""
        if not isinstance(data, bytes):
            raise TypeError(f"Data must be bytes, not {type(data).__name__}")
        if not self.connected or self._writeDisconnected or not data:
            return
        buffered = self._tempDataBuffer
        if buffered is NO_WRITES:
            self._tempDataBuffer = [data]
        else:
            buffered.append(data)
        self._tempDataLen += len(data)
        self._maybePauseProducer()
        self.startWriting()

    def writeSequence(self, iovec: Iterable[bytes]) -> None:
        """Twisted's ``writeSequence``."""
        if self._tempDataBuffer is NO_WRITES:
            self._tempDataBuffer = []
        abstract.FileDescriptor.writeSequence(self, iovec)

    def doWrite(self) -> Any:
        """Send what is buffered (Twisted's ``doWrite``; the emptied buffer is
        :data:`NO_WRITES` again, not a new list)."""
        remaining = len(self.dataBuffer) - self.offset
        if remaining < SEND_LIMIT and self._tempDataLen:
            buffered = self._tempDataBuffer
            self.dataBuffer = (b"".join([memoryview(self.dataBuffer)[self.offset:], *buffered])
                               if remaining else b"".join(buffered))
            self.offset = 0
            self._tempDataBuffer = NO_WRITES
            self._tempDataLen = 0
        sent = self.writeSomeData(lazyByteSlice(self.dataBuffer, self.offset) if self.offset
                                  else self.dataBuffer)
        if isinstance(sent, Exception) or sent < 0:
            return sent
        self.offset += sent
        if self.offset == len(self.dataBuffer) and not self._tempDataLen:
            self.dataBuffer = b""
            self.offset = 0
            self.stopWriting()
            if self.producer is not None and (not self.streamingProducer
                                              or self.producerPaused):
                self.producerPaused = False
                self.producer.resumeProducing()
            elif self.disconnecting:
                return self._postLoseConnection()
            elif self._writeDisconnecting:
                self._writeDisconnected = True
                return self._closeWriteConnection()
        return None

    def doRead(self) -> Any:
        """Read what the socket has (up to :data:`READ_CHUNK`), count it, hand it to the
        protocol; Twisted's ``doRead`` and ``_dataReceived`` with the count."""
        try:
            data = self.socket.recv(READ_CHUNK)
        except OSError as error:
            return None if error.args[0] == EWOULDBLOCK else main.CONNECTION_LOST
        if not data:
            return main.CONNECTION_DONE
        self.limits.bytes_in += len(data)
        self.protocol.dataReceived(data)
        return None

    def writeSomeData(self, data: bytes) -> Any:
        """Send what the kernel takes of ``data`` and count it: Twisted's (at most
        ``SEND_LIMIT`` octets, 0 when the socket is full, ``CONNECTION_LOST`` on an error)."""
        try:  # (an interrupted send is retried by Python itself, PEP 475)
            sent = self.socket.send(data if len(data) <= SEND_LIMIT
                                    else memoryview(data)[:SEND_LIMIT])
        except OSError as error:
            return 0 if error.args[0] in (EWOULDBLOCK, ENOBUFS) else main.CONNECTION_LOST
        self.limits.bytes_out += sent
        return sent


def _packed(client: tuple) -> int | tuple:
    """An IPv4 peer's (host, port) as one int (host << 16 | port); any other peer's tuple,
    its host text interned (shared by the connections from one host)."""
    if len(client) == 2:
        try:
            return int.from_bytes(inet_pton(AF_INET, client[0]), "big") << 16 | client[1]
        except (OSError, TypeError):
            pass
    return (sys.intern(client[0]),) + tuple(client[1:])


def _no_fileno() -> int:
    """A lost connection's file descriptor (Twisted's ``FileDescriptor.fileno``)."""
    return -1


def counting_port(port: Any) -> Any:
    """``port`` (just made by ``listenTCP``, before it accepted anything) makes
    :class:`CountingServer` transports, when it is Twisted's TCP port of a factory with
    ``limits`` (the TLS port's factory is TLS's own: its connections count as before)."""
    if type(port) is tcp.Port and isinstance(getattr(port.factory, "limits", None),
                                             ConnectionLimits):
        port.transport = CountingServer
    return port
