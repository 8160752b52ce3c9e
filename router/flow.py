"""Back-pressure for every client connection, on Twisted's producer/consumer interfaces.

Outbound: a :class:`ConnectionFlow` is registered as the streaming producer of its
connection's TCP transport, so Twisted calls :meth:`~ConnectionFlow.pauseProducing`
when the transport's write buffer is full (the client reads slower than we write) and
:meth:`~ConnectionFlow.resumeProducing` once it has drained. While paused, what is
still written is counted; past the listener's bound (bytes or messages) the flow is
*over*: QoS 0 messages to that connection are dropped (the frontends check ``over``,
one attribute read per message) and QoS >= 1 messages wait in their queues, which
are written only while the flow is not paused. A connection that stays over its
bound for ``slow_consumer_timeout`` seconds is told why (the owner's protocol-specific
goodbye) and its transport aborted: a client that does not read cannot be closed
gracefully, and aborting drops the buffered bytes at once.

Writes: :meth:`ConnectionFlow.write` puts a message into Twisted's own buffer of the
connection, as ``transport.write`` does (same order, same producer pausing), but the send is
the router's: :class:`TurnWriter` sends what each connection got during a reactor turn at the
end of that turn, in one ``send`` per connection, instead of asking the reactor to watch the
socket for writability (``epoll_ctl`` twice and a loop iteration per connection and turn).
What the kernel does not take stays in Twisted's buffer and the reactor sends it as before.
A connection that gathers its turn's packets itself (MQTT) hands them over at the turn's end
with :meth:`ConnectionFlow.send`: one ``send`` then and there, the same fallbacks.

Inbound: :class:`IntakeGate` stops reading from every connection that publishes while
the store's writer is behind (see :class:`router.engines.embedded.sqlite.SqliteStore`), so a
publisher faster than the disk is slowed by TCP flow control, not by our memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Protocol

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from router.core.incidents import DISCONNECTED, Incidents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlowLimits:
    """A listener's bound on what may be written to a connection that does not read."""

    max_buffered_bytes: int = 4 * 1024 * 1024
    """Bytes written while the transport's buffer is full, before QoS 0 is dropped."""
    max_buffered_messages: int = 20_000
    """Messages written while the transport's buffer is full, before QoS 0 is dropped."""
    slow_consumer_timeout: float = 30.0
    """Seconds a connection may stay over its bound before it is disconnected."""


class FlowOwner(Protocol):
    """The protocol side of a connection, told when it may write again or must go."""

    def resume_output(self) -> None:
        """The transport drained: write what was held back (QoS >= 1 queues)."""

    def slow_consumer(self) -> None:
        """Over the bound for too long: send the protocol's reason and count it (with
        :func:`disconnect_slow_consumer` when the client is attached)."""


def disconnect_slow_consumer(incidents: Incidents, realm: str, protocol: str, who: str,
                             goodbye: Callable[[], None]) -> None:
    """The one way every frontend lets go of an attached client that stayed over its
    outbound bound: the ``disconnected`` incident, then the protocol's goodbye (``goodbye``:
    best effort, the client is not reading); the flow aborts the transport right after."""
    incidents.count(realm, protocol, DISCONNECTED, f"{who}: slow consumer")
    goodbye()


class IntakeGate:
    """Pauses reading from publishing connections while anything that takes their
    publications is behind (the store's writer, Redis): paused while any of them is."""

    def __init__(self) -> None:
        self.paused = False
        self._behind: set[str] = set()
        self._publishers: set[ConnectionFlow] = set()

    def add(self, flow: "ConnectionFlow") -> None:
        self._publishers.add(flow)
        if self.paused:
            flow.pause_reading()

    def discard(self, flow: "ConnectionFlow") -> None:
        self._publishers.discard(flow)

    def set_paused(self, paused: bool, source: str = "store writer") -> None:
        """``source`` is behind (True) or caught up (False): stop reading from every
        publishing connection while any source is behind."""
        if paused == (source in self._behind):
            return
        if paused:
            self._behind.add(source)
        else:
            self._behind.discard(source)
        log.warning("%s %s: %s reading from %d publishing connection(s)", source,
                    "behind" if paused else "caught up",
                    "pausing" if paused else ("resuming" if not self._behind else "still not"),
                    len(self._publishers))
        if bool(self._behind) == self.paused:
            return
        self.paused = not self.paused
        for flow in list(self._publishers):
            if self.paused:
                flow.pause_reading()
            else:
                flow.resume_reading()


class TurnWriter:
    """Sends, at the end of each reactor turn, what the turn wrote to each connection.

    Once per turn for the whole router, right after the reactor has handled the turn's
    events (the router's reactor's ``at_turn_end``; another reactor's ``callLater(0)``), one
    ``send`` per connection written to. Only the plain TCP listeners' transports
    (:class:`router.counting.CountingServer`) take this way; the others write with
    ``transport.write``."""

    __slots__ = ("_at_turn_end", "_flows", "_due")

    def __init__(self, clock: Any) -> None:
        self._at_turn_end: Callable[[Callable[[], None]], Any] = getattr(
            clock, "at_turn_end", None) or partial(clock.callLater, 0)
        self._flows: list[ConnectionFlow] = []
        self._due = False

    def add(self, flow: "ConnectionFlow") -> None:
        """``flow``'s transport has unsent bytes of this turn: send them at its end."""
        self._flows.append(flow)
        if not self._due:
            self._due = True
            self._at_turn_end(self._send)

    def _send(self) -> None:
        self._due = False
        flows, self._flows = self._flows, []
        for flow in flows:
            try:
                flow.send_turn()
            except Exception:  # a bug there must not leave the other connections unsent
                log.exception("sending the turn's writes to %s failed", flow.transport)


NO_WRITES: tuple[bytes, ...] = ()
"""The write buffer (Twisted's ``_tempDataBuffer``) of a plain TCP transport with nothing
buffered: shared, never appended to (:class:`router.counting.CountingServer` makes a list
on the first write; an empty list of each idle connection was 56 bytes)."""


def sends_itself(transport: Any) -> bool:
    """Can the router send on this transport itself (:meth:`ConnectionFlow.write`)? A plain
    TCP listener's :class:`router.counting.CountingServer` (Twisted's buffer attributes are
    what :class:`TurnWriter` uses, its empty buffer :data:`NO_WRITES`); not a TLS wrapper,
    which answers for those attributes by forwarding to the socket's."""
    return getattr(transport, "counts_bytes", False) is True


_CLOSED = object()
"""A closed flow's ``_timer``."""


def _send_idle(transport: Any, data: bytes) -> None:
    """Send ``data`` on a plain TCP transport whose buffer is empty; what the kernel does not
    take (or all of it, for ``doWrite`` to see a loss) goes into Twisted's buffer, which
    pauses the producer past its size, and the reactor's write watch sends it."""
    sent = transport.writeSomeData(data)
    if sent == len(data):
        return
    transport.dataBuffer = data
    transport.offset = sent if type(sent) is int else 0
    transport._maybePauseProducer()
    transport.startWriting()


class _NoOwner:
    """Stands in until the protocol side exists, and after the connection is gone."""

    def resume_output(self) -> None:
        pass

    def slow_consumer(self) -> None:
        pass


_NO_OWNER = _NoOwner()


@dataclass(frozen=True)
class FlowContext:
    """What the flows of one listener's connections share (one reference in each flow,
    not four: 32 bytes of every connection)."""

    limits: FlowLimits
    clock: Any
    intake: IntakeGate
    closed: Callable[[], None] = lambda: None
    """Told when a connection is gone (its buffers and queues can be given back)."""
    turn: TurnWriter | None = None
    """Sends the listener's writes at the end of each reactor turn, for a plain TCP
    listener (its transports :func:`sends_itself`); None: each connection writes through
    ``transport.write`` (a TLS listener)."""


@implementer(IPushProducer)
class ConnectionFlow:
    """One connection's outbound bound and slow-consumer timer, and its read pausing."""

    __slots__ = ("transport", "owner", "paused", "over", "publisher", "holding", "_context",
                 "_paused_writes", "_timer", "_in_turn")

    def __init__(self, transport: Any, context: FlowContext) -> None:
        self.transport = transport
        self.owner: FlowOwner = _NO_OWNER
        self.paused = False
        """The transport's buffer is full: QoS >= 1 waits (checked per queued write)."""
        self.over = False
        """Paused and over the bound: QoS 0 is dropped (checked per QoS 0 message)."""
        self.publisher = False
        """Registered with the intake gate (on the first publish)."""
        self.holding = False
        """Reads paused by the connection itself (a packet whose work takes several reactor
        turns): the intake gate does not resume them."""
        self._context = context
        self._paused_writes: list[int] | None = None
        """[bytes, messages] written while paused (made at the first: one slot, not two
        ints of every connection)."""
        self._timer: Any = None
        """The slow-consumer clock while it runs; :data:`_CLOSED` once the connection is
        gone (one slot, not a flag of its own besides)."""
        if context.turn is not None and not sends_itself(transport):
            raise TypeError(f"{transport!r} cannot take the turn writer's sends")
        self._in_turn = False
        """Bytes of this turn wait in the transport's buffer for the turn writer."""
        transport.registerProducer(self, True)

    def write(self, data: bytes) -> None:
        """Write ``data`` after everything written before, counted while the transport is
        paused (the outbound bound). The first write of a turn to an idle connection is put
        into Twisted's buffer without waking the reactor's write watch; the turn writer
        sends it, with the rest of the turn's, when the turn ends. A connection that is
        already sending (its buffer not empty) or closing writes the Twisted way."""
        transport = self.transport
        if self._in_turn:
            buffered = transport._tempDataBuffer
            if buffered is NO_WRITES:  # the reactor's doWrite took the turn's first writes
                transport._tempDataBuffer = [data]
            else:
                buffered.append(data)
            transport._tempDataLen += len(data)
            if transport._tempDataLen > transport.bufferSize:
                transport._maybePauseProducer()
        elif (self._context.turn is not None and not transport.dataBuffer
              and not transport._tempDataLen and transport.connected
              and not transport.disconnecting and not transport._aborting):
            transport._tempDataBuffer = [data]  # (it was empty: NO_WRITES)
            transport._tempDataLen = len(data)
            self._in_turn = True
            self._context.turn.add(self)
            if transport._tempDataLen > transport.bufferSize:
                transport._maybePauseProducer()
        else:
            transport.write(data)
        if self.paused:
            self.wrote(len(data))

    def send_turn(self) -> None:
        """The turn ended: send what it wrote (the turn writer calls it), through the
        transport's ``writeSomeData`` (so the listener counts the bytes). What the kernel
        does not take, or a lost connection, is left to the reactor's ``doWrite`` as if
        ``transport.write`` had buffered it; so is a transport with older bytes or a paused
        producer (``doWrite`` resumes it)."""
        self._in_turn = False
        transport = self.transport
        buffered = transport._tempDataBuffer
        if not buffered or transport._aborting or not transport.connected:
            return  # sent by the reactor meanwhile, or dropped with the connection
        if transport.disconnecting or transport.dataBuffer or transport.producerPaused:
            if transport.disconnecting or transport.doWrite() is not None or (
                    transport.dataBuffer or transport._tempDataLen):
                transport.startWriting()
            return
        data = buffered[0] if len(buffered) == 1 else b"".join(buffered)
        transport._tempDataBuffer = NO_WRITES
        transport._tempDataLen = 0
        _send_idle(transport, data)

    def send(self, data: bytes) -> None:
        """Send ``data`` now: for a connection that gathers its turn's packets itself and
        writes them at the turn's end (MQTT), one ``send`` without the write watch, when
        the router sends on this transport and it holds nothing older; else (and for what
        the kernel does not take) Twisted's buffer, producer pausing and ``doWrite``, as
        ``transport.write``. Not counted against the bound: the caller counts."""
        transport = self.transport
        if (self._context.turn is None or self._in_turn or transport.dataBuffer
                or transport._tempDataLen or transport.producerPaused
                or not transport.connected or transport.disconnecting or transport._aborting):
            transport.write(data)
            return
        _send_idle(transport, data)

    @property
    def limits(self) -> FlowLimits:
        """The listener's bound."""
        return self._context.limits

    def counting(self) -> Callable[[bytes], None]:
        """The transport's ``write`` that also counts what is written while the transport
        is paused (a bound method of the flow: no closure per connection, and no bound
        method of the transport kept either)."""
        return self._counted_write

    def _counted_write(self, data: bytes) -> None:
        self.transport.write(data)
        if self.paused:
            self.wrote(len(data))

    def wrote(self, size: int) -> None:
        """Account one message of ``size`` bytes written while paused."""
        counts = self._paused_writes
        if counts is None:
            counts = self._paused_writes = [0, 0]
        counts[0] += size
        counts[1] += 1
        limits = self._context.limits
        if (not self.over and (counts[0] > limits.max_buffered_bytes
                               or counts[1] > limits.max_buffered_messages)):
            self.overflow()

    def overflow(self) -> None:
        """Over the bound (also: a QoS >= 1 queue full while paused): start the clock."""
        self.over = True
        self.stalled()

    def stalled(self) -> None:
        """Something waits for this paused transport (a retained backlog, which writes
        only while the transport accepts and so never crosses the bound): start the
        slow-consumer clock all the same; the next ``resumeProducing`` stops it."""
        if self._timer is None:  # (not running, and not closed)
            self._timer = self._context.clock.callLater(self.limits.slow_consumer_timeout,
                                                self._too_slow)

    def became_publisher(self) -> None:
        """The connection published: its reads pause while the store is behind."""
        self.publisher = True
        if self._timer is not _CLOSED:
            self._context.intake.add(self)

    # IPushProducer (called by the transport) ------------------------------------------

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        self.over = False
        self._paused_writes = None
        self._cancel_timer()
        self.owner.resume_output()

    def stopProducing(self) -> None:
        self.close()

    # reads (the intake gate) ------------------------------------------------------------

    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        if not self.holding:
            self.transport.resumeProducing()

    def hold_reading(self, hold: bool) -> None:
        """Pause reads (``hold``) until the connection has handled what it read; resumed
        unless the intake gate holds them too."""
        self.holding = hold
        if hold:
            self.transport.pauseProducing()
        elif not (self.publisher and self._context.intake.paused):
            self.transport.resumeProducing()

    # life cycle -------------------------------------------------------------------------

    def lose_connection(self) -> None:
        """Close once what was written is sent. The flow goes first: a TLS transport sends
        its close alert only when no producer is registered, so with the flow still there
        a close the router decides (MQTT DISCONNECT, a refusal, a keep-alive timeout)
        would never reach a TLS client."""
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def close(self) -> None:
        """The connection is gone: forget the owner, the timer and the gate (no references)."""
        if self._timer is _CLOSED:
            return
        self._cancel_timer()
        self._timer = _CLOSED
        self._context.intake.discard(self)
        self.owner = _NO_OWNER
        self._context.closed()

    def _cancel_timer(self) -> None:
        timer = self._timer
        if timer is not None and timer is not _CLOSED:
            if timer.active():
                timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        if self._timer is _CLOSED:
            return
        self._timer = None
        log.info("connection %s stayed over its outbound bound for %gs: disconnecting",
                 self.transport.getPeer(), self.limits.slow_consumer_timeout)
        self.owner.slow_consumer()
        self.close()
        self.transport.abortConnection()


class FlowingProtocol:
    """Mixin for a Twisted protocol whose factory has ``new_flow(transport)``: the
    connection's :class:`ConnectionFlow`, made when TCP connects, closed when it goes."""

    __slots__ = ()  # a slotted protocol keeps ``flow`` in its own slots
    flow: ConnectionFlow

    def connectionMade(self) -> None:
        self.flow = self.factory.new_flow(self.transport)
        super().connectionMade()

    def connectionLost(self, reason: Any = None) -> None:
        self.flow.close()
        super().connectionLost(reason)
