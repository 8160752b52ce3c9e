"""Holding back a refused login's answer on the transport (see :class:`HeldTransport`)."""

from __future__ import annotations

from typing import Callable


class HeldTransport:
    """Wraps a connection's write/close so that a refused login's answer can be held back.

    Used where the protocol code answers a refusal synchronously (MQTT CONNACK, AMQP
    sasl-outcome): while ``hold`` is set, writes are buffered and the close is deferred
    by that many seconds, then the buffered bytes go out and the connection closes.
    """

    __slots__ = ("clock", "_write", "_close", "hold", "_held", "_closing")

    def __init__(self, clock, write: Callable[[bytes], None], close: Callable[[], None]) -> None:
        self.clock = clock
        self._write = write
        self._close = close
        self.hold = 0.0
        self._held: list[bytes] | None = None
        """What a hold keeps back (made on the first such write)."""
        self._closing = False

    def write(self, data: bytes) -> None:
        if self.hold > 0 or self._closing:
            if self._held is None:
                self._held = []
            self._held.append(data)
        else:
            self._write(data)

    def close(self) -> None:
        if self.hold > 0 and not self._closing:
            self._closing = True
            self.clock.callLater(self.hold, self._release)
        elif not self._closing:
            self._close()

    def _release(self) -> None:
        held, self._held = self._held, None
        try:
            for data in held or ():
                self._write(data)
        finally:
            self._close()
