"""Per-listener connection caps, the handshake deadline and the read size, shared by every
transport.

Each listener's factory owns one :class:`ConnectionLimits`. Every accepted TCP connection
asks it for a :class:`Gate` when it is made: the gate says whether the connection is over
``max_connections`` or ``max_connections_per_host`` (the transport then answers with its
protocol's refusal and closes), and arms a timer that aborts the connection unless the
frontend calls :meth:`Gate.passed` within ``handshake_timeout`` seconds. What "the
handshake" is differs per protocol (WAMP: WELCOME or the login refusal; MQTT: CONNECT;
AMQP: OPEN after SASL, or the SASL refusal); each frontend says when it is done. A
protocol that says so through :meth:`GatedProtocol.handshake_done` (WAMP, HTTP) then lets
its gate go: the shared :data:`ADMITTED` stands in for it until the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from twisted.internet import defer
from twisted.internet.interfaces import ISSLTransport
from twisted.internet.protocol import connectionDone

from router.core.incidents import REFUSED, Incidents


@dataclass(frozen=True)
class LimitSettings:
    """The listener keys that bound connections (see docs/configuration.md)."""

    handshake_timeout: float = 10.0
    max_connections: int = 10_000
    max_connections_per_host: int = 10_000


class ConnectionLimits:
    """Counts one listener's open connections, in all and per remote host."""

    def __init__(self, clock, incidents: Incidents, settings: LimitSettings, protocol: str,
                 realm: str | None) -> None:
        self.clock = clock
        self.incidents = incidents
        self.settings = settings
        self.protocol = protocol
        self.realm = realm or ""
        self.open = 0
        self.opened = 0
        """Connections admitted since start (for metrics, like ``bytes_in``/``bytes_out``)."""
        self.bytes_in = 0
        self.bytes_out = 0
        self._per_host: dict[str, int] = {}

    def admit(self, host: str, close: Callable[[], None]) -> "Gate":
        """A gate for a new connection from ``host``; ``close`` aborts it on timeout."""
        settings = self.settings
        if self.open >= settings.max_connections:
            refused = f"max_connections ({settings.max_connections}) reached"
        elif self._per_host.get(host, 0) >= settings.max_connections_per_host:
            refused = f"max_connections_per_host ({settings.max_connections_per_host}) reached"
        else:
            refused = None
            self.open += 1
            self.opened += 1
            self._per_host[host] = self._per_host.get(host, 0) + 1
        if refused is not None:
            self.count(f"{host}: {refused}")
        return Gate(self, host, close, refused)

    def count_bytes(self, protocol: Any) -> None:
        """Add what ``protocol``'s connection reads and writes to this listener's byte
        totals, without a hook in any frontend. A transport that counts by itself
        (``counts_bytes``: plain TCP listeners, see :mod:`router.counting`) needs nothing.
        Otherwise (TLS) the protocol's ``dataReceived`` (once per read) is wrapped in place
        (a slotted protocol is given these totals as ``counted_by`` and adds its reads), and
        so is the transport's ``write``: the bytes before TLS, not its encrypted records. The
        wrappers cost about 500 bytes per connection, which is why plain TCP has none."""
        transport = protocol.transport
        if getattr(transport, "counts_bytes", False):
            return
        if not hasattr(protocol, "__dict__"):
            protocol.counted_by = self  # slotted: it counts its reads itself
        else:
            receive = protocol.dataReceived

            def counted_receive(data: bytes) -> None:
                self.bytes_in += len(data)
                receive(data)

            protocol.dataReceived = counted_receive
        if ISSLTransport.providedBy(transport):
            write = transport.write

            def counted_write(data: bytes) -> None:
                self.bytes_out += len(data)
                write(data)

            transport.write = counted_write
            return
        send = transport.writeSomeData

        def counted_send(data: bytes) -> Any:
            sent = send(data)
            if type(sent) is int:  # else the error that ends the connection
                self.bytes_out += sent
            return sent

        transport.writeSomeData = counted_send

    @staticmethod
    def uncount_bytes(protocol: Any) -> None:
        """Undo :meth:`count_bytes` once the connection is lost. Each wrapper holds a bound
        method of the object it is set on: a reference cycle that would keep the closed
        connection, with whatever its transport still buffers, until a full collection;
        without the wrappers the connection is freed as soon as the last reference goes."""
        transport = getattr(protocol, "transport", None)
        if getattr(transport, "counts_bytes", False):
            return  # nothing was wrapped (and ``vars`` would make the dict it does without)
        if hasattr(protocol, "__dict__"):
            vars(protocol).pop("dataReceived", None)
        if transport is not None:
            vars(transport).pop("writeSomeData", None)
            vars(transport).pop("write", None)

    def count(self, detail: str) -> None:
        """One refused or timed-out connection of this listener."""
        self.incidents.count(self.realm, self.protocol, REFUSED, detail)

    def release_host(self, host: str) -> None:
        """One admitted connection from ``host`` is gone (its :meth:`Gate.release`, or the
        protocol's own for a connection that let go of its gate once past the handshake)."""
        self.open -= 1
        left = self._per_host[host] - 1
        if left:
            self._per_host[host] = left
        else:
            del self._per_host[host]


READ_CHUNK = 16384
"""Bytes one read takes from a socket (Twisted's default is 64 KiB). Everything a read
brings in is routed before the reactor serves the next connection; 64 publishes of 1 KB
fanned out took 13 ms (under load), a quarter of that keeps every connection's turn short."""


def _never_called() -> None:
    """A passed gate's ``_close``: its timer is never armed again."""


class Gate:
    """One connection's admission: ``refused`` (why, or None) and its handshake timer."""

    __slots__ = ("limits", "host", "refused", "_close", "counted", "_passed", "_timer")

    def __init__(self, limits: ConnectionLimits, host: str, close: Callable[[], None],
                 refused: str | None) -> None:
        self.limits = limits
        self.host = host
        self.refused = refused
        self._close = close
        self.counted = refused is None
        """Holds a place under the caps (given back once, on :meth:`release`)."""
        self._passed = False
        self._timer = None
        self._arm()

    def passed(self) -> None:
        """The protocol handshake is complete (or its refusal decided): stop the timer, and
        let go of the way to abort (a bound method, 64 bytes per connection)."""
        self._passed = True
        self._stop()
        self._close = _never_called

    def verifying(self, active: bool) -> None:
        """A password check (bounded by the verifier's queue) stops the clock; once it is
        answered, the rest of the handshake gets a full ``handshake_timeout`` again."""
        if active:
            self._stop()
        elif not self._passed and self._timer is None:
            self._arm()

    def _arm(self) -> None:
        self._timer = self.limits.clock.callLater(self.limits.settings.handshake_timeout,
                                                  self._expired)

    def _stop(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def release(self) -> None:
        """The connection is gone: stop the timer and free its place under the caps."""
        self.passed()
        if self.counted:
            self.counted = False
            self.limits.release_host(self.host)

    def _expired(self) -> None:
        self._timer = None
        if self.refused is None:  # a refused connection was counted when it came
            self.limits.count(f"{self.host}: handshake timeout "
                              f"({self.limits.settings.handshake_timeout:g}s)")
        self._close()


class _Admitted:
    """The gate of every connection past its handshake, one for all (a :class:`Gate` is 88
    bytes of every connection): there is no timer left, and the connection's place under
    the caps is given back by its host, read again from its transport when it goes."""

    __slots__ = ()
    refused = None

    def passed(self) -> None:
        """Done already."""

    def verifying(self, active: bool) -> None:
        """No clock left to stop."""


ADMITTED = _Admitted()


def peer_host(transport: Any) -> str:
    """The remote host a connection counts under (``max_connections_per_host``)."""
    return getattr(transport.getPeer(), "host", "unknown")


class GatedProtocol:
    """Mixin (first base) for a listener's Twisted protocol: admitted when the connection
    is made, released when it is lost. The factory has ``limits`` (:class:`ConnectionLimits`).
    """

    __slots__ = ()  # a slotted protocol keeps ``gate`` in its own slots
    gate: Gate | _Admitted | None = None

    def connectionMade(self) -> None:
        super().connectionMade()  # type: ignore[misc]
        transport = self.transport  # type: ignore[attr-defined]
        # under TLS the socket is read by the TCP transport beneath the TLS protocol
        reader = getattr(transport, "transport", transport)
        if getattr(reader, "bufferSize", None) != READ_CHUNK:
            reader.bufferSize = READ_CHUNK
        limits = self.factory.limits  # type: ignore[attr-defined]
        self.gate = limits.admit(peer_host(transport), transport.abortConnection)
        limits.count_bytes(self)

    def connectionLost(self, reason=connectionDone) -> None:
        self.release()
        super().connectionLost(reason)  # type: ignore[misc]
        ConnectionLimits.uncount_bytes(self)

    def deny_if_refused(self) -> None:
        """WebSocket: an over-cap connection's opening handshake gets HTTP 503."""
        if self.gate is not None and self.gate.refused:
            # imported here: the config imports this module, before the CLI decides whether
            # TLS libraries are needed (autobahn's imports load pyOpenSSL when they can)
            from autobahn.websocket.types import ConnectionDeny
            raise ConnectionDeny(ConnectionDeny.SERVICE_UNAVAILABLE, self.gate.refused)

    def handshake_done(self) -> None:
        """The protocol handshake is complete: an admitted connection lets its gate go
        (:data:`ADMITTED` stands in for it)."""
        gate = self.gate
        if type(gate) is Gate:
            gate.passed()
            if gate.counted:
                self.gate = ADMITTED

    def verifying(self, active: bool) -> None:
        if self.gate is not None:
            self.gate.verifying(active)

    def release(self) -> None:
        gate = self.gate
        if gate is ADMITTED:
            self.gate = None  # released once
            self.factory.limits.release_host(peer_host(self.transport))  # type: ignore[attr-defined]
        elif type(gate) is Gate:
            gate.release()


_Slotted = TypeVar("_Slotted", bound="SlottedGatedProtocol")


class SlottedGatedProtocol(GatedProtocol):
    """A :class:`GatedProtocol` whose connections keep no instance dict: what all the
    connections of a listener share is in the listener's own subclass
    (:meth:`for_listener`), not in 8-byte slots of each connection."""

    __slots__ = ()
    factory: Any
    """The listener's factory (a class attribute of the listener's subclass)."""
    counted_by: ConnectionLimits | None = None
    """Where its reads are counted, when its transport does not count them (TLS, see
    :meth:`ConnectionLimits.count_bytes`: a slot of a TLS listener's subclass)."""

    @classmethod
    def for_listener(cls: type[_Slotted], factory: Any, tls: bool) -> type[_Slotted]:
        """The listener's own subclass: ``factory`` a class attribute, and under TLS a slot
        for ``counted_by``."""
        return type(cls.__name__, (cls,), {"__slots__": ("counted_by",) if tls else (),
                                           "factory": factory, "__module__": cls.__module__})


class ReleasesClosedFuture:
    """Mixin (first base) for an autobahn protocol: autobahn resolves ``is_closed`` with
    the protocol itself, a reference cycle (protocol -> Deferred -> protocol) that keeps
    every closed connection, and what it still references, until a full collection. Once
    the connection is lost the future is replaced by one resolved with None: nothing in
    the router waits on it."""

    def connectionLost(self, reason=connectionDone) -> None:
        super().connectionLost(reason)  # type: ignore[misc]
        self.is_closed = defer.succeed(None)
