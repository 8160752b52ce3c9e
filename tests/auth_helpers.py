"""Helpers for the authentication and TLS tests: certificates, TLS-aware router, WAMP clients
with autobahn's authenticators (ticket, wampcra, cryptosign, tls)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

from tests.clients import SERIALIZERS, TIMEOUT, JoinFailed

import txaio  # noqa: E402  (tests.clients selected asyncio)
from autobahn.asyncio.rawsocket import WampRawSocketClientFactory  # noqa: E402
from autobahn.asyncio.wamp import ApplicationSession  # noqa: E402
from autobahn.asyncio.websocket import WampWebSocketClientFactory  # noqa: E402
from autobahn.wamp.exception import ApplicationError  # noqa: E402
from autobahn.wamp.auth import create_authenticator  # noqa: E402
from autobahn.wamp.types import ComponentConfig  # noqa: E402

# certificates -------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(folder: Path, client_cns: tuple[str, ...] = ()) -> dict[str, Path]:
    """A CA, a server pair for 127.0.0.1/localhost signed by it, and client pairs per CN;
    plus a self-signed pair made with the README's openssl line."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=Test CA", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost", cwd=folder)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext",
             cwd=folder)
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem",
             "key": folder / "server.key"}
    for cn in client_cns:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{cn}.key", "-out",
                 f"{cn}.csr", "-subj", f"/CN={cn}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{cn}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{cn}.pem", "-days", "2", cwd=folder)
        paths[f"{cn}.cert"] = folder / f"{cn}.pem"
        paths[f"{cn}.key"] = folder / f"{cn}.key"
    return paths


def client_context(certs: dict[str, Path], client_cn: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    if client_cn is not None:
        context.load_cert_chain(certs[f"{client_cn}.cert"], certs[f"{client_cn}.key"])
    return context


# WAMP ------------------------------------------------------------------------------------

class AuthClient(ApplicationSession):
    """Joins with autobahn authenticators (or plain authmethods) and reports the outcome."""

    def __init__(self, config: ComponentConfig, authenticators: list, authmethods, authid,
                 authextra) -> None:
        super().__init__(config)
        self._auth = {a.name: a for a in authenticators}
        self._methods = authmethods or list(self._auth) or ["anonymous"]
        self._authid = authid
        self._authextra = authextra
        if authextra is None:
            merged: dict = {}
            for a in authenticators:
                merged.update(a.authextra or {})
            self._authextra = merged or None
        loop = asyncio.get_running_loop()
        self.joined: asyncio.Future = loop.create_future()

    def onConnect(self) -> None:
        self.join(self.config.realm, authmethods=self._methods, authid=self._authid,
                  authextra=self._authextra)

    def onChallenge(self, challenge):
        return self._auth[challenge.method].on_challenge(self, challenge)

    def onJoin(self, details) -> None:
        self.joined.set_result(details)

    def onLeave(self, details) -> None:
        if not self.joined.done():
            self.joined.set_exception(JoinFailed(details.reason, details.message))
        self.disconnect()

    def onDisconnect(self) -> None:
        if not self.joined.done():
            self.joined.set_exception(JoinFailed("disconnected", None))

    async def close(self) -> None:
        if self.is_attached():
            await self.leave()


def authenticator(method: str, **kwargs):
    return create_authenticator(method, **kwargs)


async def join(router, *authenticators, realm: str = "realm1", transport: str = "websocket",
               authmethods: list[str] | None = None, authid: str | None = None,
               authextra: dict | None = None, ssl_context=None, source: str | None = None,
               serializer: str = "json") -> AuthClient:
    """Connect and join; raises JoinFailed on ABORT. ``source`` binds the client's address
    (127.0.0.x) so that tests of failed logins do not share the router's back-off."""
    loop = asyncio.get_running_loop()
    host, port, path = router.address(transport)
    if authid is None:
        authid = next((a._args.get("authid") for a in authenticators
                       if a._args.get("authid")), None)
    holder: list[AuthClient] = []

    def make() -> AuthClient:
        session = AuthClient(ComponentConfig(realm), list(authenticators), authmethods, authid,
                             authextra)
        holder.append(session)
        return session

    if transport == "websocket":
        scheme = "wss" if ssl_context is not None else "ws"
        factory = WampWebSocketClientFactory(make, url=f"{scheme}://{host}:{port}{path}",
                                             serializers=[SERIALIZERS[serializer]()])
    else:
        factory = WampRawSocketClientFactory(make, serializer=SERIALIZERS[serializer]())
    kwargs = {}
    if ssl_context is not None:
        kwargs.update(ssl=ssl_context, server_hostname="localhost")
    if source is not None:
        kwargs["local_addr"] = (source, 0)
    await loop.create_connection(factory, host, port, **kwargs)
    while not holder:
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.shield(holder[0].joined), TIMEOUT)
    return holder[0]


async def join_fails(router, *authenticators, **kwargs) -> JoinFailed:
    try:
        session = await join(router, *authenticators, **kwargs)
    except JoinFailed as exc:
        return exc
    await session.close()
    raise AssertionError("the join succeeded but should have been refused")


del txaio


async def outcome(coro) -> str:
    """"allowed", "denied" (``wamp.error.not_authorized``) or the other error of a WAMP call."""
    try:
        await coro
        return "allowed"
    except ApplicationError as exc:
        return "denied" if exc.error == "wamp.error.not_authorized" else exc.error
