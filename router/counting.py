"""The TCP server transport of plain listeners, which counts its listener's bytes itself.

Apart from :mod:`router.limits` because Twisted's ``tcp`` module imports its TLS support
(pyOpenSSL) when it is imported: configuration loading must not, so that a router without
TLS can leave pyOpenSSL out (:func:`router.tls.leave_out_tls`). Only the node imports it.
"""

from __future__ import annotations

import sys
from errno import ENOBUFS, EWOULDBLOCK
from operator import attrgetter
from typing import Any

from twisted.internet import main, tcp

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
    repr are made when asked."""

    bufferSize = READ_CHUNK
    counts_bytes = True
    """Tells :meth:`ConnectionLimits.count_bytes` that this transport needs no wrappers."""

    def __init__(self, sock, protocol, client, server, sessionno, reactor) -> None:
        # the peer's host text, one per connection from accept (58 bytes for an IPv4
        # address), shared by the connections from one host (interned: freed with the last)
        client = (sys.intern(client[0]),) + tuple(client[1:])
        super().__init__(sock, protocol, client, server, sessionno, reactor)
        self.dataBuffer = b""
        self.offset = 0
        self.producer = None
        self.streamingProducer = False
        self.limits: ConnectionLimits = server.factory.limits
        del self.fileno

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
