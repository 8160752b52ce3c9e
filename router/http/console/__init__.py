"""``/console``: the operator console, three static files the browser runs against the REST
API of the same listener (docs/console.md). Nothing here reads or changes router state: the
page's script does that through the API, with the credentials typed at its login, so the
console can do exactly what that principal may do over HTTP.

The files ship as package data and are read once when the listener is built, never on the
reactor per request.
"""

from __future__ import annotations

from importlib.resources import files

from twisted.web.resource import Resource
from twisted.web.server import Request

ASSETS = {"": ("index.html", b"text/html; charset=utf-8"),
          "console.js": ("console.js", b"text/javascript; charset=utf-8"),
          "console.css": ("console.css", b"text/css; charset=utf-8")}
"""Path under /console/ -> (file beside this module, its Content-Type)."""

SECURITY_HEADERS = {
    b"Content-Security-Policy": b"default-src 'self'; img-src 'self' data:; "
                                b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    b"X-Content-Type-Options": b"nosniff",
    b"Referrer-Policy": b"no-referrer",
    b"Cache-Control": b"no-cache",
}
"""Only our own script and style run (no inline code), the page cannot be framed, and a
browser revalidates after an upgrade instead of running an old script."""


class ConsoleResource(Resource):
    """``/console`` redirects to ``/console/`` (so the page's relative links resolve below
    it, wherever the listener is mounted); ``/console/`` is the page, then its script and
    style sheet; anything else below is 404. A leaf: it is handed every path under the
    prefix it is mounted at."""

    isLeaf = True

    def __init__(self, prefix: str = "/console") -> None:
        super().__init__()
        self.prefix = prefix
        folder = files(__name__)
        self.assets = {f"{prefix}/{path}": (folder.joinpath(name).read_bytes(), content_type)
                       for path, (name, content_type) in ASSETS.items()}

    def render_GET(self, request: Request) -> bytes:
        path = request.path.decode("utf-8", "replace")
        if path == self.prefix:
            request.redirect(self.prefix.rsplit("/", 1)[-1].encode() + b"/")
            return b""
        found = self.assets.get(path)
        if found is None:
            request.setResponseCode(404)
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            return b"no such console file\n"
        body, content_type = found
        request.setHeader(b"Content-Type", content_type)
        for name, value in SECURITY_HEADERS.items():
            request.setHeader(name, value)
        return body
