"""The wire side of a bridge: one MQTT client connection on Twisted, over our sans-I/O codec.

:class:`BridgeProtocol` turns bytes into packets for its :class:`Wire` owner (the bridge)
and packets into bytes; it registers itself as the transport's push producer's consumer so
that the bridge knows when the remote stops reading. TLS options come from the bridge's
``tls`` block (:func:`client_tls`). Nothing here blocks: connect, read and write are the
reactor's.
"""

from __future__ import annotations

from typing import Protocol as Interface

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from router.bridge.settings import BridgeTls
from router.mqtt.codec import MqttCodec
from router.mqtt.packets import Packet
from router.mqtt.primitives import MqttProtocolError
from router.tls import pem_blocks

MAX_PACKET_SIZE = 16 * 1024 * 1024
"""Largest packet accepted from the remote broker (a bigger one closes the connection)."""


class Wire(Interface):
    """What the bridge offers its connection."""

    def connected(self, connection: "BridgeProtocol") -> None:
        """TCP (and TLS) is up: send CONNECT."""

    def received(self, connection: "BridgeProtocol", packet: Packet) -> None:
        """One packet from the remote broker."""

    def writable(self, connection: "BridgeProtocol", writable: bool) -> None:
        """The transport stopped (False) or resumed (True) taking our writes."""

    def lost(self, connection: "BridgeProtocol", reason: str) -> None:
        """The connection is gone (or never came up)."""


@implementer(IPushProducer)
class BridgeProtocol(Protocol):
    """One connection to the remote broker."""

    def __init__(self, owner: Wire) -> None:
        self.owner = owner
        self.codec = MqttCodec(client_side=True, max_packet_size=MAX_PACKET_SIZE)
        self.closed = False
        self.reason: str | None = None
        """Why we closed it (said to the bridge rather than "aborted locally")."""

    def connectionMade(self) -> None:
        self.transport.registerProducer(self, True)
        self.owner.connected(self)

    def dataReceived(self, data: bytes) -> None:
        self.codec.receive_data(data)
        try:
            while not self.closed:
                packet = self.codec.next_packet()
                if packet is None:
                    return
                self.owner.received(self, packet)
        except MqttProtocolError as exc:
            self.abort(f"protocol error from the remote broker: {exc}")

    def send(self, packet: Packet) -> None:
        if not self.closed:
            self.transport.write(self.codec.encode(packet))

    def abort(self, reason: str) -> None:
        """Close at once (a dead or misbehaving remote): the bridge reconnects."""
        if not self.closed:
            self.closed = True
            self.reason = reason
            self.transport.abortConnection()

    def close(self) -> None:
        """Close once what is written is sent (after DISCONNECT)."""
        if not self.closed:
            self.closed = True
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.closed = True
        self.owner.lost(self, self.reason or (reason.getErrorMessage() if reason is not None
                                              else "closed"))

    # IPushProducer: the transport tells us when the remote stops reading ------------------

    def pauseProducing(self) -> None:
        self.owner.writable(self, False)

    def resumeProducing(self) -> None:
        self.owner.writable(self, True)

    def stopProducing(self) -> None:
        """The transport is closing: connectionLost follows."""


class BridgeFactory(ClientFactory):
    """Makes the one connection of an attempt and reports a failed attempt."""

    def __init__(self, owner: Wire) -> None:
        self.owner = owner

    def buildProtocol(self, addr) -> BridgeProtocol:
        return BridgeProtocol(self.owner)

    def clientConnectionFailed(self, connector, reason: Failure) -> None:
        self.owner.lost(None, reason.getErrorMessage())  # type: ignore[arg-type]


def client_tls(tls: BridgeTls, host: str):
    """The client TLS options of a bridge (files read once, when the bridge is built).
    Twisted's TLS (pyOpenSSL) is imported here, not with the module: a router whose
    configuration asks for no TLS runs without it (:func:`router.tls.leave_out_tls`)."""
    from twisted.internet import ssl

    trust = (ssl.trustRootFromCertificates(
        [ssl.Certificate.loadPEM(block) for block in pem_blocks(tls.ca.read_bytes())])
             if tls.ca is not None else ssl.platformTrust())
    client = None
    if tls.cert is not None and tls.key is not None:
        client = ssl.PrivateCertificate.loadPEM(tls.cert.read_bytes() + b"\n"
                                                + tls.key.read_bytes())
    if tls.verify_hostname:
        return ssl.optionsForClientTLS(host, trustRoot=trust, clientCertificate=client)
    return ssl.CertificateOptions(
        trustRoot=trust, raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        **({} if client is None else {"privateKey": client.privateKey.original,
                                      "certificate": client.original}))

