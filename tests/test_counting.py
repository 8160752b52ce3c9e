"""The router's TCP transport (``router/counting.py``) in-process, over a real socket:
what it shows of itself in logs once its connection is lost."""

from __future__ import annotations

import socket

from twisted.internet import reactor
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from router.core.incidents import Incidents
from router.counting import CountingServer, counting_port
from router.limits import ConnectionLimits, LimitSettings


class _Listener(Factory):
    protocol = Protocol

    def __init__(self) -> None:
        self.limits = ConnectionLimits(reactor, Incidents(), LimitSettings(), "mqtt", None)


def test_a_lost_connection_keeps_its_log_prefix_and_repr():
    """Twisted deletes a lost connection's protocol; log lines that print the transport
    (``%r``, the log prefix) still name the connection as they did while it was open."""
    port = counting_port(reactor.listenTCP(0, _Listener(), interface="127.0.0.1"))
    client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=10)
    try:
        port.doRead()  # accept, as the reactor would
        transport = next(reader for reader in reactor.getReaders()
                         if isinstance(reader, CountingServer))
        open_repr, open_prefix = repr(transport), transport.logstr
        assert open_repr.startswith("<Protocol #") and "127.0.0.1" in open_prefix
        transport.connectionLost(Failure(ConnectionDone()))
        assert not hasattr(transport, "protocol")
        assert (repr(transport), transport.logstr) == (open_repr, open_prefix)
    finally:
        client.close()
        # the reactor does not run here: the port and the accepted socket are closed now,
        # not at a later turn that never comes
        for reader in reactor.getReaders():
            if isinstance(reader, CountingServer):
                reactor.removeReader(reader)
                reader.socket.close()
        reactor.removeReader(port)
        port.socket.close()
