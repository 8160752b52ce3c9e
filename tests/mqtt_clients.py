"""MQTT clients for the black-box tests: paho-mqtt (3.1.1 and 5.0, TCP and WebSocket),
a raw-socket client driven packet by packet, and the mosquitto command-line clients.

paho runs its network loop in its own thread; everything it reports goes through
``queue.Queue`` / ``threading.Condition`` so that tests wait with timeouts and never
sleep for correctness.
"""

from __future__ import annotations

import base64
import itertools
import os
import queue
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from router.core.credentials import hash_secret
from router.mqtt.codec import MqttCodec
from router.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Will
from tests.harness import OPEN_ROLE

TIMEOUT = 10.0
V311, V5 = 4, 5
TRANSPORT_LISTENERS = {"tcp": "mqtt", "ws": "mqtt-websocket"}
VERSIONS = (V311, V5)
VERSION_IDS = {V311: "mqtt311", V5: "mqtt5"}
COMBINATIONS = [(version, transport) for version in VERSIONS for transport in ("tcp", "ws")]
COMBINATION_IDS = [f"{VERSION_IDS[v]}-{t}" for v, t in COMBINATIONS]

SECRETS = {"alice": "alice-secret", "limited": "limited-secret"}

_counter = itertools.count(1)


def unique(prefix: str) -> str:
    """A name no other test uses (topic level, client id): lower case, strict-URI safe."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}"


# --- router configuration ------------------------------------------------------------------


def listeners(mqtt_realm: str, wamp: bool = True) -> list[dict]:
    """MQTT over TCP and over WebSocket for ``mqtt_realm``, plus WAMP listeners."""
    result = [{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": mqtt_realm},
              {"type": "mqtt-websocket", "host": "127.0.0.1", "port": 0, "realm": mqtt_realm}]
    if wamp:
        result += [{"type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/ws"},
                   {"type": "rawsocket", "host": "127.0.0.1", "port": 0}]
    return result


def mqtt_realm(name: str = "realm1", anonymous: bool = True, **extra) -> dict:
    """Anonymous may do anything outside wamp.*; 'alice' likewise with a password;
    'limited' may publish and subscribe only under 'com.'."""
    realm = {
        "name": name,
        "anonymous_role": "anonymous" if anonymous else None,
        "roles": {
            "anonymous": OPEN_ROLE,
            "user": OPEN_ROLE,
            "limited": [{"uri": "com.", "match": "prefix", "allow": ["publish", "subscribe"]}],
        },
        "principals": {
            "alice": {"role": "user", "ticket": hash_secret(SECRETS["alice"], 1000)},
            "limited": {"role": "limited", "ticket": hash_secret(SECRETS["limited"], 1000)},
        },
    }
    realm.update(extra)
    return realm


# --- paho ----------------------------------------------------------------------------------


@dataclass
class ConnackInfo:
    reason_code: int
    session_present: bool
    properties: Any


class MqttClient:
    """A paho client whose callbacks feed queues; one instance = one network connection."""

    def __init__(self, router, version: int = V5, transport: str = "tcp",
                 client_id: str | None = None, clean: bool = True,
                 session_expiry: int | None = None, username: str | None = None,
                 password: str | None = None, keepalive: int = 30,
                 will: dict | None = None, connect_properties: dict | None = None) -> None:
        """``connect_properties``: MQTT 5 CONNECT properties by paho name
        (e.g. ``{"TopicAliasMaximum": 4}``)."""
        self.router = router
        self.version = version
        self.transport = transport
        self.client_id = unique("client") if client_id is None else client_id
        self.clean = clean
        self.session_expiry = session_expiry
        self.keepalive = keepalive
        self.connect_properties = dict(connect_properties or {})
        if session_expiry is not None:
            self.connect_properties["SessionExpiryInterval"] = session_expiry
        extra = {} if version == V5 else {"clean_session": clean}
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                  protocol=paho.MQTTv5 if version == V5 else paho.MQTTv311,
                                  transport="websockets" if transport == "ws" else "tcp",
                                  reconnect_on_failure=False, **extra)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(**will)
        self.connacks: queue.Queue[ConnackInfo] = queue.Queue()
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.disconnected = threading.Event()
        self.disconnect_reason: int | None = None
        self._cond = threading.Condition()
        self._acks: dict[int, int] = {}
        self._subacks: dict[int, list[int]] = {}
        self._unsubacks: dict[int, list[int]] = {}
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = lambda client, userdata, message: self.messages.put(message)
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe

    # callbacks (paho's thread)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connacks.put(ConnackInfo(reason_code.value, bool(flags.session_present),
                                      properties))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnect_reason = reason_code.value
        self.disconnected.set()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._cond:
            self._acks[mid] = reason_code.value
            self._cond.notify_all()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._cond:
            self._subacks[mid] = [code.value for code in reason_codes]
            self._cond.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._cond:
            self._unsubacks[mid] = [code.value for code in reason_codes]
            self._cond.notify_all()

    def _wait(self, table: dict, mid: int, what: str, timeout: float) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: mid in table, timeout):
                raise AssertionError(f"no {what} for message id {mid} within {timeout}s")
            return table.pop(mid)

    # operations (test thread)

    def connect(self, timeout: float = TIMEOUT) -> ConnackInfo:
        host, port, path = self.router.address(TRANSPORT_LISTENERS[self.transport])
        if self.transport == "ws":
            self.client.ws_set_options(path=path)
        if self.version == V5:
            properties = None
            if self.connect_properties:
                properties = Properties(PacketTypes.CONNECT)
                for name, value in self.connect_properties.items():
                    setattr(properties, name, value)
            self.client.connect(host, port, self.keepalive, clean_start=self.clean,
                                properties=properties)
        else:
            self.client.connect(host, port, self.keepalive)
        self.client.loop_start()
        try:
            return self.connacks.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no CONNACK within {timeout}s") from None

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0,
                retain: bool = False, properties: Properties | None = None,
                timeout: float = TIMEOUT) -> int:
        """Publish and wait until paho reports it done (PUBACK / PUBCOMP for QoS > 0);
        returns the reason code (MQTT 5 acknowledgement reason, 0 otherwise)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == paho.MQTT_ERR_SUCCESS, f"paho refused to publish: {info.rc}"
        return self._wait(self._acks, info.mid, "PUBACK/PUBCOMP", timeout)

    def subscribe(self, *filters, properties: Properties | None = None,
                  timeout: float = TIMEOUT) -> list[int]:
        """Each filter is ``(topic filter, qos or SubscribeOptions)``; returns SUBACK codes."""
        result, mid = self.client.subscribe(list(filters), properties=properties)
        assert result == paho.MQTT_ERR_SUCCESS, f"paho refused to subscribe: {result}"
        return self._wait(self._subacks, mid, "SUBACK", timeout)

    def unsubscribe(self, *topic_filters: str, timeout: float = TIMEOUT) -> list[int]:
        result, mid = self.client.unsubscribe(list(topic_filters))
        assert result == paho.MQTT_ERR_SUCCESS
        return self._wait(self._unsubacks, mid, "UNSUBACK", timeout)

    def next_message(self, timeout: float = TIMEOUT) -> paho.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"client {self.client_id}: no message within {timeout}s") \
                from None

    def expect(self, topic: str, payload: bytes, timeout: float = TIMEOUT) -> paho.MQTTMessage:
        """The next message must be exactly this one (nothing else arrived before it)."""
        message = self.next_message(timeout)
        assert (message.topic, message.payload) == (topic, payload), \
            f"expected {topic} {payload!r}, got {message.topic} {message.payload!r}"
        return message

    def collect_until(self, payload: bytes, timeout: float = TIMEOUT) -> list[paho.MQTTMessage]:
        """Messages that arrive before the one with ``payload`` (the sentinel)."""
        received = []
        while True:
            message = self.next_message(timeout)
            if message.payload == payload:
                return received
            received.append(message)

    def wait_disconnected(self, timeout: float = TIMEOUT) -> int | None:
        assert self.disconnected.wait(timeout), \
            f"client {self.client_id} still connected after {timeout}s"
        return self.disconnect_reason

    def disconnect(self, timeout: float = TIMEOUT) -> None:
        """A clean DISCONNECT (no will)."""
        if not self.disconnected.is_set():
            self.client.disconnect()
            self.wait_disconnected(timeout)
        self.client.loop_stop()

    def close(self) -> None:
        try:
            if not self.disconnected.is_set() and self.client.is_connected():
                self.client.disconnect()
                self.disconnected.wait(2)
        finally:
            self.client.loop_stop()
            sock = self.client.socket()
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


def probe_until_received(publisher: MqttClient, subscriber: MqttClient, topic: str,
                         probe: bytes = b"probe", timeout: float = 30.0) -> None:
    """Publish QoS 0 probes on ``topic`` until one reaches ``subscriber``: on the Redis
    engine, its node's interest has then reached the publisher's node."""
    deadline = time.monotonic() + timeout
    while True:
        publisher.publish(topic, probe)
        try:
            subscriber.next_message(timeout=0.05)
            return
        except AssertionError:
            assert time.monotonic() < deadline, f"the interest in {topic} never arrived"


class ClientPool:
    """Opens paho clients for one test and closes them all at its end."""

    def __init__(self, router) -> None:
        self.router = router
        self.opened: list[MqttClient] = []

    def new(self, version: int = V5, transport: str = "tcp", router=None,
            **kwargs) -> MqttClient:
        client = MqttClient(router or self.router, version, transport, **kwargs)
        self.opened.append(client)
        return client

    def __call__(self, version: int = V5, transport: str = "tcp", router=None,
                 **kwargs) -> MqttClient:
        """A connected client (the CONNACK must be a success)."""
        client = self.new(version, transport, router, **kwargs)
        connack = client.connect()
        assert connack.reason_code == 0, f"CONNACK refused: 0x{connack.reason_code:02x}"
        return client

    def close(self) -> None:
        for client in self.opened:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass


def publish_properties(**values) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def options(qos: int = 0, no_local: bool = False, retain_as_published: bool = False,
            retain_handling: int = 0) -> SubscribeOptions:
    return SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=retain_as_published,
                            retainHandling=retain_handling)


# --- raw socket ----------------------------------------------------------------------------


class RawMqtt:
    """A TCP MQTT client driven packet by packet (router.mqtt.codec, client side)."""

    def __init__(self, router, listener: str = "mqtt", source: str | None = None) -> None:
        """``source``: a local address to connect from (a loopback address of its own)."""
        host, port, _ = router.address(listener)
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT,
                                             source_address=(source, 0) if source else None)
        self.codec = MqttCodec(client_side=True)
        self.bytes_sent = 0
        self.bytes_received = 0
        """What this client wrote and read (before any TLS), to check the router's counts."""

    def send(self, packet) -> None:
        self.send_bytes(self.codec.encode(packet))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.bytes_sent += len(data)

    def connect(self, version: int = V311, client_id: str = "", clean: bool = True,
                keep_alive: int = 0, will: Will | None = None, username: str | None = None,
                password: bytes | None = None, properties: dict | None = None):
        self.send(Connect("MQTT", version, clean, keep_alive, client_id, will, username,
                          password, properties or {}))
        return self.recv()

    def connect_ok(self, *args, **kwargs) -> Connack:
        connack = self.connect(*args, **kwargs)
        assert isinstance(connack, Connack) and connack.reason_code == 0, connack
        return connack

    def recv(self, timeout: float = TIMEOUT):
        """The next packet from the router (AssertionError on timeout or close)."""
        deadline = time.monotonic() + timeout
        while True:
            packet = self.codec.next_packet()
            if packet is not None:
                return packet
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no packet from the router within {timeout}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise AssertionError(f"no packet from the router within {timeout}s") from None
            if not data:
                raise ConnectionError("the router closed the connection")
            self.bytes_received += len(data)
            self.codec.receive_data(data)

    def wait_closed(self, timeout: float = 5.0) -> bytes:
        """Read until the router closes the connection; returns what it sent before."""
        rest = read_until_closed(self.sock, timeout)
        self.bytes_received += len(rest)
        return rest

    def connect_and_ping(self, client_id: str, **login) -> None:
        """CONNECT (``login``: username, password) and PINGREQ, each answered: an exchange
        whose every byte both sides have handled when this returns."""
        self.connect_ok(client_id=client_id, **login)
        self.send(Pingreq())
        assert isinstance(self.recv(), Pingresp)

    def drop(self) -> None:
        """Close the socket without DISCONNECT (an abnormal close for the router)."""
        self.sock.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    received = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the router did not close the connection within {timeout}s "
                                 f"(received {bytes(received)!r})")
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return bytes(received)
        if not data:
            return bytes(received)
        received += data


def raw_string(value: str | bytes) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack(">H", len(data)) + data


def remaining_length(value: int) -> bytes:
    encoded = bytearray()
    while True:
        value, digit = divmod(value, 128)
        encoded.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(encoded)


def raw_packet(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + remaining_length(len(body)) + body


def raw_connect(protocol_name: str = "MQTT", level: int = 4, flags: int = 0x02,
                keep_alive: int = 0, client_id: str = "raw", properties: bytes = b"") -> bytes:
    """CONNECT bytes for any protocol name and level (MQTT 5 needs ``properties=b'\\x00'``)."""
    body = (raw_string(protocol_name) + bytes((level, flags)) + struct.pack(">H", keep_alive)
            + properties + raw_string(client_id))
    return raw_packet(0x10, body)


# --- mosquitto command-line clients --------------------------------------------------------


def mosquitto(tool: str, router, *args: str, version: int = V311,
              timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    host, port, _ = router.address("mqtt")
    command = [tool, "-h", host, "-p", str(port), "-V", "mqttv5" if version == V5 else "mqttv311",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


class MosquittoSub:
    """``mosquitto_sub -d``: started, then ready once its SUBACK is printed."""

    def __init__(self, router, *args: str, version: int = V311) -> None:
        host, port, _ = router.address("mqtt")
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-d", "-W", str(int(TIMEOUT) + 5), "-h", host,
             "-p", str(port),
             "-V", "mqttv5" if version == V5 else "mqttv311", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, predicate, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"mosquitto_sub printed nothing expected within {timeout}s")
            if line is None:
                raise AssertionError("mosquitto_sub exited: "
                                     + (self.proc.stderr.read() if self.proc.stderr else ""))
            if predicate(line):
                return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- raw WebSocket -------------------------------------------------------------------------


class RawWebSocketMqtt:
    """MQTT over a hand-made WebSocket (RFC 6455) connection: message boundaries are ours."""

    def __init__(self, router, path: str | None = None, subprotocol: str | None = "mqtt") -> None:
        host, port, default_path = router.address("mqtt-websocket")
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path or default_path} HTTP/1.1", f"Host: {host}:{port}",
                 "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
                 "Sec-WebSocket-Version: 13"]
        if subprotocol:
            lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._buffer = bytearray()
        while b"\r\n\r\n" not in self._buffer:
            data = self.sock.recv(65536)
            if not data:
                break
            self._buffer += data
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        self._buffer = bytearray(rest)
        self.status = int(head.split(b" ", 2)[1]) if head else 0
        self.codec = MqttCodec(client_side=True)
        self.closed = False

    def send_message(self, data: bytes, opcode: int = 0x2) -> None:
        mask = os.urandom(4)
        length = len(data)
        if length < 126:
            header = bytes((0x80 | opcode, 0x80 | length))
        elif length < 1 << 16:
            header = bytes((0x80 | opcode, 0x80 | 126)) + struct.pack(">H", length)
        else:
            header = bytes((0x80 | opcode, 0x80 | 127)) + struct.pack(">Q", length)
        masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def encode(self, packet) -> bytes:
        return self.codec.encode(packet)

    def _frame(self, timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            frame = self._parse_frame()
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no WebSocket frame within {timeout}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                raise ConnectionError("the router closed the connection")
            self._buffer += data

    def _parse_frame(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        opcode, length, offset = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
        if length == 126:
            if len(buffer) < 4:
                return None
            length, offset = struct.unpack(">H", buffer[2:4])[0], 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            length, offset = struct.unpack(">Q", buffer[2:10])[0], 10
        if len(buffer) < offset + length:
            return None
        payload = bytes(buffer[offset:offset + length])
        del buffer[:offset + length]
        return opcode, payload

    def recv(self, timeout: float = TIMEOUT):
        """The next MQTT packet; ConnectionError once the router sends a close frame."""
        while True:
            packet = self.codec.next_packet()
            if packet is not None:
                return packet
            opcode, payload = self._frame(timeout)
            if opcode == 0x8:
                self.closed = True
                raise ConnectionError("WebSocket close frame")
            if opcode == 0x2:
                self.codec.receive_data(payload)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
