"""The outbound HTTP client of one webhook: Twisted's ``Agent`` on a connection pool of its
own (one persistent connection, since a webhook has one request in flight at a time), so
nothing here waits on the reactor thread: name resolution runs in the reactor's resolver
threads, the request and its answer are events like any client connection's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import defer, protocol
from twisted.python.failure import Failure
from twisted.web.client import (Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool,
                                ResponseDone, ResponseFailed)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IResponse
from zope.interface import implementer


class WebhookClient:
    """POSTs to one URL; each request gets the status of its answer or fails."""

    def __init__(self, reactor: Any, url: str, timeout: float, ca: Path | None = None) -> None:
        """``ca``: the PEM file of the CAs an https target must chain to (read now, at
        start-up); None: the system's."""
        self._reactor = reactor
        self._url = url.encode("ascii")
        self._timeout = timeout
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 1
        trust = (BrowserLikePolicyForHTTPS(trustRoot=_trust_root(ca)) if ca is not None
                 else BrowserLikePolicyForHTTPS())
        self._agent = Agent(reactor, trust, connectTimeout=timeout, pool=self._pool)

    def post(self, headers: dict[str, str], body: bytes) -> "defer.Deferred[int]":
        """The answer's status once its body is read (and dropped: the connection is then
        reused); fails on a refused connection, a broken answer, or ``timeout`` seconds
        without one (the connection is then closed)."""
        request = self._agent.request(
            b"POST", self._url, Headers({name: [value] for name, value in headers.items()}),
            _Body(body))
        request.addCallback(_drain)
        request.addTimeout(self._timeout, self._reactor)
        return request

    def close(self) -> "defer.Deferred[None]":
        """Close the idle connection (at shutdown)."""
        return self._pool.closeCachedConnections()


def _trust_root(ca: Path) -> Any:
    """Every certificate of a PEM file, as the roots an https target must chain to
    (Twisted's TLS imported here: a router with only http targets runs without it)."""
    from twisted.internet.ssl import Certificate, trustRootFromCertificates

    end = b"-----END CERTIFICATE-----"
    blocks = [block + end for block in ca.read_bytes().split(end) if b"-----BEGIN" in block]
    return trustRootFromCertificates([Certificate.loadPEM(block) for block in blocks])


def _drain(response: IResponse) -> "defer.Deferred[int]":
    """Read and drop the answer's body (a target's answer costs no memory), then its status."""
    done: defer.Deferred[int] = defer.Deferred(lambda _: drain.abort())
    drain = _Discard(done, response.code)
    response.deliverBody(drain)
    return done


class _Discard(protocol.Protocol):
    """Swallows an answer's body; fires with the status once it is complete."""

    def __init__(self, done: "defer.Deferred[int]", code: int) -> None:
        self._done = done
        self._code = code

    def dataReceived(self, data: bytes) -> None:
        """Dropped: the status is the answer."""

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self._done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(self._code)
        else:
            self._done.errback(ResponseFailed([reason]))

    def abort(self) -> None:
        """The request timed out while its body arrived: drop the connection."""
        if self.transport is not None:
            self.transport.stopProducing()


@implementer(IBodyProducer)
class _Body:
    """A body already in memory, written at once with its length known (no chunking)."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> "defer.Deferred[None]":
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        """Nothing left to pause: the body was written whole."""

    def resumeProducing(self) -> None:
        """Nothing left to resume."""

    def stopProducing(self) -> None:
        """Nothing left to stop."""
