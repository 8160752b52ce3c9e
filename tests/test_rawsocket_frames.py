"""RawSocket framing on the router's side (``RouterRawSocketProtocol.dataReceived``), over a
plain socket so the test decides how the octets are cut: a frame of many reads arrives
whole, a frame cut inside its length prefix too, and a length over the listener's maximum
is refused (the connection dropped) however its prefix arrives."""

from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from tests.clients import msgpack_frame
from tests.harness import RouterProcess, realm_file

MAX_MESSAGE_SIZE = 2**24
"""16 MiB: the listener's limit (announced as such, a power of two)."""
TIMEOUT = 30.0
HELLO, WELCOME, SUBSCRIBE, SUBSCRIBED, PUBLISH, PUBLISHED, EVENT = 1, 2, 32, 33, 16, 17, 36


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    listeners = [{"type": "rawsocket", "host": "127.0.0.1", "port": 0,
                  "max_message_size": MAX_MESSAGE_SIZE,
                  "max_buffered_bytes": 4 * MAX_MESSAGE_SIZE}]
    process = RouterProcess(tmp_path_factory.mktemp("rawsocket-frames"), [realm_file("realm1")],
                            listeners=listeners,
                            extra_config={"eventlog": {"enabled": False}}).start()
    yield process
    process.stop()


class Peer:
    """A RawSocket msgpack client on a blocking socket (largest frames both ways)."""

    def __init__(self, router) -> None:
        host, port, _ = router.address("rawsocket")
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.received = bytearray()
        self.sock.sendall(bytes([0x7F, 0xF2, 0, 0]))
        reply = self._read(4)
        assert reply[0] == 0x7F and reply[1] & 0x0F == 2, reply

    def _read(self, size: int) -> bytes:
        while len(self.received) < size:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the router")
            self.received.extend(chunk)
        data = bytes(self.received[:size])
        del self.received[:size]
        return data

    def recv(self) -> list:
        length, = struct.unpack("!I", self._read(4))
        return msgpack.unpackb(self._read(length))

    def closed_by_router(self) -> bool:
        """Reads until the router closes (True) or sends something (False)."""
        try:
            return not self.sock.recv(1 << 16)
        except ConnectionResetError:
            return True

    def join_and_subscribe(self, topic: str) -> None:
        self.sock.sendall(msgpack_frame([HELLO, "realm1", {"roles": {"publisher": {},
                                                               "subscriber": {}}}]))
        assert self.recv()[0] == WELCOME
        self.sock.sendall(msgpack_frame([SUBSCRIBE, 1, {}, topic]))
        assert self.recv()[0] == SUBSCRIBED

    def close(self) -> None:
        self.sock.close()


def test_a_16_mib_frame_arrives_whole(router):
    """A publication just under the 16 MiB limit, sent in 64 KiB pieces (hundreds of reads
    gathered into one frame), comes back to its publisher whole, and the next frame, in
    the same piece as the big one's last octets, is read after it."""
    peer = Peer(router)
    try:
        peer.join_and_subscribe("frames.big")
        big = "z" * (MAX_MESSAGE_SIZE - 100)
        data = (msgpack_frame([PUBLISH, 2, {"acknowledge": True, "exclude_me": False}, "frames.big",
                        [big]])
                + msgpack_frame([PUBLISH, 3, {"acknowledge": True, "exclude_me": False}, "frames.big",
                          ["small"]]))
        for start in range(0, len(data), 65536):
            peer.sock.sendall(data[start:start + 65536])
        replies = [peer.recv() for _ in range(4)]
        events = [reply[4][0] for reply in replies if reply[0] == EVENT]
        assert events == [big, "small"]
        assert [reply[1] for reply in replies if reply[0] == PUBLISHED] == [2, 3]
    finally:
        peer.close()


def test_a_frame_cut_inside_its_length_prefix_arrives(router):
    """The 4-octet prefix in two pieces, then the rest: one message (whether the router
    reads the pieces apart or together, it must come out the same)."""
    peer = Peer(router)
    try:
        peer.join_and_subscribe("frames.cut")
        data = msgpack_frame([PUBLISH, 2, {"acknowledge": True, "exclude_me": False}, "frames.cut",
                       ["cut"]])
        for piece in (data[:2], data[2:3], data[3:9], data[9:]):
            peer.sock.sendall(piece)
        replies = [peer.recv(), peer.recv()]
        assert sorted(reply[0] for reply in replies) == [PUBLISHED, EVENT]
        assert [reply[4] for reply in replies if reply[0] == EVENT] == [["cut"]]
    finally:
        peer.close()


@pytest.mark.parametrize("cut", [None, 1, 3], ids=["whole", "prefix-1+3", "prefix-3+1"])
def test_a_frame_of_a_reserved_type_is_refused(router, cut):
    """A prefix whose first octet is a frame type the spec reserves (3: a length over the
    24 bits a frame has, 16 MiB, read as 32) drops the connection, before its octets
    arrive, whether the prefix came in one piece or two (after a frame begun in an
    earlier read)."""
    peer = Peer(router)
    try:
        peer.join_and_subscribe("frames.over")
        prefix = struct.pack("!I", 3 * MAX_MESSAGE_SIZE + 1)
        if cut is None:
            peer.sock.sendall(prefix + b"\x00" * 1000)
        else:
            peer.sock.sendall(prefix[:cut])
            peer.sock.sendall(prefix[cut:] + b"\x00" * 1000)
        assert peer.closed_by_router()
    finally:
        peer.close()


def test_a_ping_is_answered_with_a_pong_and_the_session_goes_on(router):
    """RawSocket frame type 1 (PING) gets frame type 2 (PONG) with the same payload; it was
    read as a 16 MiB length and the connection dropped ("over the limit")."""
    peer = Peer(router)
    try:
        peer.join_and_subscribe("frames.ping")
        payload = b"are you there?"
        peer.sock.sendall(bytes([1]) + len(payload).to_bytes(3, "big") + payload
                          + bytes([2, 0, 0, 0]))  # and an unasked PONG, which needs nothing
        assert peer._read(4 + len(payload)) == bytes([2]) + len(payload).to_bytes(3, "big") \
            + payload
        peer.sock.sendall(msgpack_frame([PUBLISH, 2, {"acknowledge": True}, "frames.ping", []]))
        assert peer.recv()[:2] == [PUBLISHED, 2]
    finally:
        peer.close()
