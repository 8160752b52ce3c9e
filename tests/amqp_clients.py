"""AMQP 1.0 clients for the black-box tests: python-qpid-proton's blocking client API
with link options for QoS (settle modes), QoS policy, retained events and durable
sources, plus a raw socket for byte-level cases.

The blocking client waits with timeouts; nothing here sleeps for correctness.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

from proton import (Collector, Connection, Data, Delivery, Link, Message, Session, Terminus,
                    Transport, symbol)
from proton.reactor import ReceiverOption, SenderOption
from proton.utils import BlockingConnection, BlockingReceiver

from tests.mqtt_clients import SECRETS, read_until_closed

TIMEOUT = 10.0
X_OPT_QOS = symbol("x-opt-qos")
X_OPT_RETAIN = symbol("x-opt-retain")


def amqp_listeners(realm: str = "realm1", mqtt: bool = True, wamp: bool = True) -> list[dict]:
    result = [{"type": "amqp", "host": "127.0.0.1", "port": 0, "realm": realm}]
    if mqtt:
        result.append({"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": realm})
    if wamp:
        result.append({"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"})
    return result


def url(router) -> str:
    host, port, _ = router.address("amqp")
    return f"amqp://{host}:{port}"


def connect(router, user: str | None = None, password: str | None = None,
            container_id: str | None = None, mechanism: str | None = None) -> BlockingConnection:
    """A blocking connection: PLAIN with a user, ANONYMOUS without one."""
    kwargs: dict[str, Any] = {"allow_insecure_mechs": True}
    if user is not None:
        kwargs.update(user=user, password=password if password is not None else SECRETS[user],
                      allowed_mechs=mechanism or "PLAIN")
    else:
        kwargs.update(allowed_mechs=mechanism or "ANONYMOUS")
    if container_id is not None:
        kwargs["container_id"] = container_id
    return BlockingConnection(url(router), timeout=TIMEOUT, **kwargs)


class Receive(ReceiverOption):
    """A receiver's QoS (0: settled, 1: unsettled/first, 2: unsettled/second), policy,
    retained events and durability."""

    def __init__(self, qos: int = 1, policy: str | None = None, retained: bool = False,
                 durable: bool = False, retained_capability: bool = False,
                 expiry: int | None = None, timeout: int = 0) -> None:
        self.qos = qos
        self.policy = policy
        self.retained = retained
        self.durable = durable
        self.retained_capability = retained_capability
        self.expiry = expiry
        self.timeout = timeout

    def apply(self, link: Link) -> None:
        if self.qos == 0:
            link.snd_settle_mode = Link.SND_SETTLED
        else:
            link.snd_settle_mode = Link.SND_UNSETTLED
            link.rcv_settle_mode = Link.RCV_SECOND if self.qos == 2 else Link.RCV_FIRST
        properties = {}
        capabilities = []
        if self.policy is not None:
            properties[symbol("qos-policy")] = self.policy
            capabilities.append("qos-policy")
        if self.retained:
            properties[symbol("get-retained")] = True
        if self.retained_capability:
            capabilities.append("retained")
        if properties:
            link.properties = properties
        if capabilities:
            data = link.source.capabilities
            data.put_array(False, Data.SYMBOL)
            data.enter()
            for name in capabilities:
                data.put_symbol(name)
            data.exit()
        if self.durable:
            link.source.durability = Terminus.DELIVERIES
            link.source.expiry_policy = (Terminus.EXPIRE_NEVER if self.expiry is None
                                         else self.expiry)
            link.source.timeout = self.timeout


class Send(SenderOption):
    """A sender's link modes: QoS 0 (settled), 1 (unsettled/first), 2 (unsettled/second);
    ``durable``: a target with durability ``unsettled-state`` (exactly-once receive)."""

    def __init__(self, qos: int = 1, durable: bool = False) -> None:
        self.qos = qos
        self.durable = durable

    def apply(self, link: Link) -> None:
        if self.qos == 0:
            link.snd_settle_mode = Link.SND_SETTLED
        else:
            link.snd_settle_mode = Link.SND_UNSETTLED
            link.rcv_settle_mode = Link.RCV_SECOND if self.qos == 2 else Link.RCV_FIRST
        if self.durable:
            link.target.durability = Terminus.DELIVERIES
            link.target.expiry_policy = Terminus.EXPIRE_NEVER


def message(body: Any = b"", qos: int | None = None, retain: bool = False,
            value: bool = False) -> Message:
    """A message whose bytes body is a data section (or an amqp-value with ``value``)."""
    annotations = {}
    if qos is not None:
        annotations[X_OPT_QOS] = qos
    if retain:
        annotations[X_OPT_RETAIN] = True
    if isinstance(body, str) and not value:
        body = body.encode()
    msg = Message(body=body, inferred=not value)
    if annotations:
        msg.annotations = annotations
    return msg


def body_bytes(msg: Message) -> bytes:
    return bytes(msg.body) if msg.body is not None else b""


def annotation(msg: Message, name: str) -> Any:
    return (msg.annotations or {}).get(symbol(name))


def received(receiver: BlockingReceiver, timeout: float = TIMEOUT) -> tuple[Message, Any]:
    """(next message, its delivery), without settling it."""
    fetcher = receiver.fetcher
    receiver.connection.wait(lambda: fetcher.has_message, timeout=timeout,
                             msg=f"waiting for a message on {receiver.link.name}")
    msg, delivery = fetcher.incoming.popleft()
    return msg, delivery


def expect_body(receiver: BlockingReceiver, body: bytes) -> Message:
    """The next message, which must carry ``body``; accepted once checked."""
    msg, delivery = received(receiver)
    assert body_bytes(msg) == body
    settle(receiver, delivery)
    return msg


def settle(receiver: BlockingReceiver, delivery, state=Delivery.ACCEPTED) -> None:
    if state is not None:
        delivery.update(state)
    delivery.settle()
    receiver.connection.container.process()


def raw_socket(router, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes; everything the router answers until it closes the connection."""
    host, port, _ = router.address("amqp")
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock, timeout)


class EngineClient:
    """A proton engine driven by hand over a socket (SASL ANONYMOUS): for what the blocking
    client cannot do, such as leave a delivery unfinished (some of its transfers sent, the
    last one never)."""

    def __init__(self, router) -> None:
        host, port, _ = router.address("amqp")
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.transport = Transport()
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.connection.collect(Collector())
        self.transport.bind(self.connection)
        self.connection.open()
        self.closed = False
        """The router closed the socket."""

    def session(self) -> Session:
        """A new session, begun."""
        session = self.connection.session()
        session.open()
        return session

    def sender(self, address: str, session: Session | None = None) -> Link:
        """A sender link (unsettled, first) on ``session`` (else on a session of its own),
        attached and given credit."""
        link = (session or self.session()).sender(unique_name(address))
        link.target.address = address
        link.open()
        self.run(lambda: link.credit > 0, f"credit on {address}")
        return link

    def run(self, until: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
        """Exchange bytes with the router until ``until()`` or the router closes."""
        deadline = time.monotonic() + timeout
        while not until():
            if self.closed:
                raise ConnectionError(f"closed while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout}s")
            pending = self.transport.pending()
            if pending > 0:
                self.sock.sendall(self.transport.peek(pending))
                self.transport.pop(pending)
            self.sock.settimeout(0.01)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                continue
            while data and self.transport.capacity() > 0:
                taken = data[:self.transport.capacity()]
                self.transport.push(taken)
                data = data[len(taken):]

    def close(self) -> None:
        self.sock.close()


def unique_name(address: str) -> str:
    return f"{address}-{time.monotonic_ns()}"


TERMINAL = (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED, Delivery.MODIFIED)


def send(sender, msg: Message, timeout: float = TIMEOUT, tag: str | None = None,
         settle_after: bool = True):
    """Send and wait for the outcome; works with receiver settle mode ``second`` too
    (where the router settles only after we do, so BlockingSender.send would wait forever).
    Returns the delivery (its ``remote_state`` is the outcome). ``tag``: the delivery
    tag; ``settle_after=False`` leaves the delivery unsettled (as if the outcome had
    been lost)."""
    link = sender.link
    delivery = link.send(msg, tag=tag)
    if link.snd_settle_mode != Link.SND_SETTLED:
        sender.connection.wait(lambda: delivery.remote_state in TERMINAL or delivery.settled,
                               timeout=timeout, msg=f"waiting for the outcome on {link.name}")
        if not settle_after:
            return delivery  # nothing to flush (and process() would wait for I/O)
        delivery.settle()
    sender.connection.container.process()
    return delivery


def materialized(value):
    """A decoded value with proton's memoryviews (binary) as bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [materialized(item) for item in value]
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    return value
