"""The ``metrics`` listener: the Prometheus text format over HTTP(S), on Twisted web.

A scrape renders the node's own registry on the reactor thread: it reads counters the
router keeps anyway (no I/O, no locks), so it costs about as much as one meta API call
per realm and session.
"""

from __future__ import annotations

import base64
import hmac

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from router.config import MetricsAuth


def _authorized(header: bytes | None, auth: MetricsAuth) -> bool:
    """Does the Authorization header carry the configured credential (constant time)?"""
    if header is None:
        return False
    scheme, _, value = header.partition(b" ")
    if auth.bearer_token is not None:
        return (scheme.lower() == b"bearer"
                and hmac.compare_digest(value.strip(), auth.bearer_token.encode()))
    expected = f"{auth.username}:{auth.password}".encode()
    try:
        given = base64.b64decode(value.strip(), validate=True)
    except ValueError:
        return False
    return scheme.lower() == b"basic" and hmac.compare_digest(given, expected)


class MetricsResource(Resource):
    """``GET path``: the registry's metrics; 401 without the configured credential."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry, path: str, auth: MetricsAuth | None) -> None:
        super().__init__()
        self.registry = registry
        self.path = path.encode()
        self.auth = auth

    def render_GET(self, request: Request) -> bytes:
        if request.path != self.path:
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"not found: the metrics are at " + self.path + b"\n"
        if self.auth is not None and not _authorized(request.getHeader(b"authorization"),
                                                     self.auth):
            request.setResponseCode(401)
            scheme = b"Bearer" if self.auth.bearer_token is not None else b"Basic"
            request.setHeader(b"www-authenticate", scheme + b' realm="metrics"')
            return b"unauthorized\n"
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self.registry)


def metrics_site(registry: CollectorRegistry, path: str, auth: MetricsAuth | None) -> Site:
    """The Twisted web factory of one metrics listener (no access log: scrapes are routine)."""
    site = Site(MetricsResource(registry, path, auth))
    site.log = lambda request: None  # type: ignore[method-assign]
    site.displayTracebacks = False
    return site
