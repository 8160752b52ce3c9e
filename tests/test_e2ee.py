"""End-to-end encryption through the router: autobahn's cryptobox ``KeyRing`` (pynacl) on the
publisher, subscriber, caller and callee; the router routes, retains and logs the
ciphertext and never holds the plaintext: not in its memory (read from /proc/<pid>/mem),
its event log or its SQLite file. A subscriber without the key cannot read it."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pytest

from tests.clients import TIMEOUT, connect, raw_connect, run  # selects txaio's asyncio first
from tests.harness import RouterProcess
from tests.mqtt_clients import mqtt_realm

from autobahn.wamp.cryptobox import KeyRing  # noqa: E402
from autobahn.wamp.types import PublishOptions, SubscribeOptions  # noqa: E402
from nacl.exceptions import CryptoError  # noqa: E402
from nacl.public import Box, PrivateKey  # noqa: E402

TOPIC = "com.secret.readings"
PROCEDURE = "com.secret.lookup"
EVENT = 36


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(
        tmp_path_factory.mktemp("e2ee"), [mqtt_realm("realm1")],
        extra_config={"eventlog": {"flush_interval": 0.2,
                                   "realms": {"realm1": {"payloads": True}}}}).start()
    yield process
    process.stop()


def keyring(private_key: str) -> KeyRing:
    ring = KeyRing()
    ring.set_key("com.secret.", private_key)
    return ring


def memory_holds(pid: int, needle: bytes) -> bool:
    """Does any readable mapping of process ``pid`` contain ``needle``?"""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] in (
                    "[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            start, end = (int(part, 16) for part in fields[0].split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, ValueError, OverflowError):
                continue  # a mapping that cannot be read (guard pages)
    return False


def files_hold(folder: Path, needle: bytes) -> bool:
    return any(needle in path.read_bytes() for path in folder.rglob("*") if path.is_file())


def wait_until(condition, what: str, timeout: float = 30.0) -> None:
    """Poll a condition the router reaches on its own timer (the event log's flush)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


def test_router_routes_and_retains_ciphertext_it_cannot_read(router):
    secret = f"plaintext-{uuid.uuid4().hex}"
    control = f"cleartext-{uuid.uuid4().hex}"
    answer = f"answer-{uuid.uuid4().hex}"
    private_key, _ = KeyRing().generate_key()
    stranger_key, _ = KeyRing().generate_key()

    async def scenario():
        publisher = await connect(router, "rawsocket", "cbor")
        subscriber = await connect(router, "websocket", "json")
        stranger = await connect(router, "websocket", "msgpack")
        publisher.set_payload_codec(keyring(private_key))
        subscriber.set_payload_codec(keyring(private_key))
        stranger.set_payload_codec(keyring(stranger_key))
        live: asyncio.Queue = asyncio.Queue()
        strange: asyncio.Queue = asyncio.Queue()
        await subscriber.subscribe(lambda reading, details=None: live.put_nowait(
            (reading, details.retained)), TOPIC, options=SubscribeOptions(details=True))
        await stranger.subscribe(lambda *args, **kwargs: strange.put_nowait(args), TOPIC)
        # a raw peer that takes autobahn's dialect sees only the ciphertext
        eavesdropper = await raw_connect(router, "websocket", "msgpack")
        roles = {"subscriber": {"features": {"payload_transparency": True}}}
        assert (await eavesdropper.hello("realm1", {"roles": roles}))[0] == 2
        eavesdropper.send([32, 1, {}, TOPIC])
        assert (await eavesdropper.recv())[0] == 33

        await publisher.publish(TOPIC, secret, options=PublishOptions(acknowledge=True,
                                                                      retain=True))
        assert await asyncio.wait_for(live.get(), TIMEOUT) == (secret, None)
        event = await eavesdropper.recv()
        assert event[0] == EVENT and event[3]["enc_algo"] == "cryptobox"
        ciphertext = event[4]
        assert type(ciphertext) is bytes and secret.encode() not in ciphertext
        with pytest.raises(CryptoError):  # any key but the right one fails
            Box(PrivateKey.generate(), PrivateKey.generate().public_key).decrypt(ciphertext)

        late = await connect(router, "rawsocket", "json")
        late.set_payload_codec(keyring(private_key))
        await late.subscribe(lambda reading, details=None: live.put_nowait(
            (reading, details.retained)), TOPIC,
            options=SubscribeOptions(details=True, get_retained=True))
        assert await asyncio.wait_for(live.get(), TIMEOUT) == (secret, True)

        callee = await connect(router, "rawsocket", "msgpack")
        caller = await connect(router, "websocket", "cbor")
        callee.set_payload_codec(keyring(private_key))
        caller.set_payload_codec(keyring(private_key))
        asked: list = []

        def lookup(question):
            asked.append(question)
            return answer

        await callee.register(lookup, PROCEDURE)
        assert await caller.call(PROCEDURE, secret) == answer
        assert asked == [secret]

        # the stranger's keyring cannot open what it got: autobahn drops the event
        plain = await connect(router, "rawsocket", "json")
        await plain.publish("com.plain.readings", control,
                            options=PublishOptions(acknowledge=True, retain=True))
        await stranger.subscribe(lambda *args: strange.put_nowait(("plain",) + args),
                                 "com.plain.readings", options=SubscribeOptions(
                                     get_retained=True))
        assert await asyncio.wait_for(strange.get(), TIMEOUT) == ("plain", control)
        assert strange.empty()
        for session in (publisher, subscriber, stranger, late, callee, caller, plain):
            await session.close()
        eavesdropper.close()

    run(scenario())
    data = router.workdir / "data"
    # the control (published in clear) shows each place can be searched; the secrets never
    # appear in any of them
    wait_until(lambda: files_hold(data / "eventlog", control.encode()),
               "the event log has the clear publication")
    assert memory_holds(router.proc.pid, control.encode())
    assert any(control.encode() in path.read_bytes() for path in data.rglob("*.sqlite*"))
    for needle in (secret.encode(), answer.encode()):
        assert not memory_holds(router.proc.pid, needle)
        assert not files_hold(data, needle)
    assert not re.search(secret, "\n".join(router.log_lines))
