"""``GET /subscribe``: one Server-Sent Events stream, a subscriber of the core like any
other session (it counts in the sessions and subscriptions, and is authorized by the same
rules).

Order on the wire: with ``get_retained``, the retained events the subscription covers
(``event: retained``), paced by the socket as the core paces every subscriber's backlog;
with ``Last-Event-ID``, the events of the topic's history after that id (live ones arriving
meanwhile wait, and are not sent twice); then live events. Each event has an ``id:`` a
later request can resume from.

Bounds: while the socket does not drain (Twisted pauses the stream as a producer) events
wait in a queue of ``sse_max_queued``; one more closes the stream, counted as
``disconnected`` (a slow consumer, :func:`router.flow.disconnect_slow_consumer`), and
every other receiver goes on. A comment line every ``sse_keepalive`` seconds keeps
proxies from closing an idle stream.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from twisted.internet import task
from twisted.web.server import Request

from router.core.model import Publication, SessionInfo
from router.core.options import SubscribeOptions
from router.core.peer import Subscription
from router.core.realm import Realm
from router.core.topic import Topic
from router.flow import disconnect_slow_consumer
from router.http.events import dumps, event_id, event_json

PROTOCOL = "http"


class EventStream:
    """The core's Peer behind one open ``text/event-stream`` response."""

    def __init__(self, realm: Realm, info: SessionInfo, request: Request, max_queued: int,
                 keepalive: float, clock, closed: Callable[["EventStream"], None]) -> None:
        self.realm = realm
        self.info = info
        self.request = request
        self.max_queued = max_queued
        self.core: Subscription | None = None
        self.queue: deque[bytes] = deque()
        """Frames written while the socket is paused, oldest first."""
        self.paused = False
        self.open = True
        """Events may still be written (False once the stream ends or is cut)."""
        self.left = False
        """The stream has left the realm."""
        self.resuming: list[Publication] | None = None
        """Live events that arrived while the history of a resume was read (None: not
        resuming)."""
        self._closed = closed
        self._clock = clock
        self._keepalive = task.LoopingCall(self._write, b": keep-alive\n\n")
        self._keepalive.clock = clock
        self._keepalive_interval = keepalive

    def start(self, topic: Topic, match: str, get_retained: bool) -> None:
        """Subscribe (raises RouterError when refused), send the headers, and the retained
        events if asked (call :meth:`close` if it raises)."""
        self.realm.attach(self)
        self.core = self.realm.subscribe(self, topic, SubscribeOptions(match, get_retained))
        request = self.request
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-accel-buffering", b"no")
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(lambda _: self.close())
        self._write(b": subscribed\n\n")
        self._keepalive.start(self._keepalive_interval, now=False)
        if get_retained:
            self.realm.send_retained(self, self.core, self.max_queued)

    # the core's Peer ---------------------------------------------------------------------

    def send_event(self, subscription: Subscription, publication: Publication,
                   retained: bool = False) -> None:
        if not self.open or self.core is None or subscription.id != self.core.id:
            return
        if self.resuming is not None and not retained:
            if len(self.resuming) >= self.max_queued:
                self._too_slow()
            else:
                self.resuming.append(publication)
            return
        if retained:
            self._write(frame(publication, True))
            return
        cache = publication.encodings()  # one encode per publication, whatever the streams
        data = cache.get(_CACHE_KEY)
        if data is None:
            data = cache[_CACHE_KEY] = frame(publication, False)
        self._write(data)

    def resumed(self, history: list[Publication], after: int | None) -> None:
        """The history read for ``Last-Event-ID`` is here: send what follows the event
        ``after`` (all of it if that event is no longer kept), then what came live."""
        pending, self.resuming = self.resuming or [], None
        if not self.open:
            return
        ids = [publication.publication_id for publication in history]
        if after in ids:
            history = history[ids.index(after) + 1:]
        sent = set()
        for publication in history:
            sent.add(publication.publication_id)
            self._write(frame(publication, False))
        for publication in pending:
            if publication.publication_id not in sent:
                self._write(frame(publication, False))

    def ready(self) -> bool:
        return self.open and not self.paused

    def backlog_room(self) -> bool:
        return self.open and not self.paused and not self.queue

    def supports(self, role: str, feature: str) -> bool:
        return False

    def kill(self, reason: str, message: str | None) -> None:
        """Close the stream (shutdown, a kick): the client sees the response end."""
        if self.open:
            self._write(b"event: closed\ndata: " + dumps({"reason": reason, "message": message})
                        + b"\n\n")
            self.request.finish()

    def subscription_revoked(self, subscription: Subscription, reason: str) -> None:
        """A reload took the permission away: the stream ends, on the next reactor turn
        (not inside the reload's walk over the subscriptions)."""
        self._clock.callLater(0, self.kill, "wamp.close.killed", reason)

    def registration_revoked(self, registration: object, reason: str) -> None:
        """An event stream never registers."""

    def send_invocation(self, invocation) -> None:
        """An event stream is never a callee."""

    def send_interrupt(self, invocation, mode: str, reason: str) -> None:
        """An event stream is never a callee."""

    def send_result(self, call_request: int, args, kwargs, progress: bool) -> None:
        """An event stream never calls."""

    def send_call_error(self, call_request: int, error: str, args, kwargs) -> None:
        """An event stream never calls."""

    # the socket (Twisted's push producer interface) ---------------------------------------

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        while self.queue and not self.paused and self.open:
            self.request.write(self.queue.popleft())
        if not self.queue and self.open:
            self.realm.backlogs.resume(self)

    def stopProducing(self) -> None:
        self.close()

    def _write(self, data: bytes) -> None:
        if not self.open:
            return
        if self.paused or self.queue:
            if len(self.queue) >= self.max_queued:
                self._too_slow()
                return
            self.queue.append(data)
            return
        self.request.write(data)

    def _too_slow(self) -> None:
        """Over the bound: counted, nothing more written, and the connection aborted (the
        reader is not reading); the stream leaves the realm when the abort ends the
        request, on a later reactor turn, not inside the dispatch that found it full."""
        disconnect_slow_consumer(self.realm.incidents, self.realm.name, PROTOCOL,
                                 f"event stream {self.info.session_id} ({self.info.authid})",
                                 lambda: None)
        self.open = False
        self.queue.clear()
        channel = self.request.channel
        if channel is not None:
            channel.transport.abortConnection()

    def close(self) -> None:
        """Leave the realm (once): the subscription goes with the session."""
        if self.left:
            return
        self.left = True
        self.open = False
        self.queue.clear()
        if self._keepalive.running:
            self._keepalive.stop()
        self.realm.detach(self)
        self._closed(self)


_CACHE_KEY = "sse"
"""The live SSE frame's key in :meth:`Publication.encodings` (the same bytes for every
stream: nothing in it depends on the receiver)."""


def frame(publication: Publication, retained: bool) -> bytes:
    """One SSE frame: ``event: retained`` for a retained event, the id, the JSON data."""
    head = b"event: retained\n" if retained else b""
    return (head + b"id: " + event_id(publication).encode() + b"\ndata: "
            + dumps(event_json(publication)) + b"\n\n")
