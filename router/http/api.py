"""The ``http`` listener: a REST API and Server-Sent Events over Twisted Web, for one realm.

Every request is authenticated (:mod:`router.http.login`) and authorized by the realm's
role rules as the same principal's WAMP, MQTT or AMQP session would be; the handlers only
translate HTTP to the core's calls (publish, call, subscribe, the retained store, the
history, the session and subscription tables). docs/http.md documents every route and
status; ``router/http/openapi.json`` (served at ``/openapi.json``) describes them, and a
test keeps the two route lists equal.

Errors are ``{"error": <WAMP error URI>, "message": ...}`` with the status of
:data:`STATUS`.
"""

from __future__ import annotations

import heapq
import io
import itertools
import json
import logging
import time
from datetime import datetime
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable
from urllib.parse import unquote

from twisted.internet import defer, task, threads
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from router.config import HttpSettings
from router.core import errors
from router.core.errors import ProtocolViolation, RouterError
from router.core.history import TimeWindow, rfc3339
from router.core.model import LONGEST_EXPIRY, Publication, SessionInfo
from router.core.options import CallOptions, parse_publish_options
from router.core.payload import from_bytes
from router.core.realm import Realm
from router.core.router import Router
from router.core.stats import family
from router.core.topic import (display, from_mqtt, from_uri, mqtt_pattern, valid_topic_filter,
                               valid_topic_name)
from router.core.uri import EXACT, MATCH_POLICIES, PREFIX
from router.http.caller import CALL_REQUEST, NDJSON, HttpCaller, result_json
from router.http.events import dumps, event_json, parse_event_id
from router.http.login import Busy, HttpLogin, LoginFailed
from router.http.stream import EventStream
from router.http.tokens import RECHECK_INTERVAL, TokenFile
from router.limits import GatedProtocol

log = logging.getLogger(__name__)

NO_SUCH_RETAINED = "wamp.error.no_such_retained"
"""404 of ``GET /retained/{topic}``: the topic holds no retained event the caller may see."""
NOT_FOUND = "wamp.error.not_found"
"""404 of a path the API does not have."""
PAYLOAD_TOO_LARGE = "wamp.error.payload_size_exceeded"

STATUS = {
    errors.INVALID_ARGUMENT: 400, errors.INVALID_URI: 400, errors.PROTOCOL_VIOLATION: 400,
    errors.OPTION_NOT_ALLOWED: 400, errors.NOT_AUTHORIZED: 403,
    errors.NO_SUCH_PROCEDURE: 404, errors.NO_SUCH_SESSION: 404,
    errors.NO_SUCH_SUBSCRIPTION: 404, errors.NO_SUCH_REGISTRATION: 404, NO_SUCH_RETAINED: 404,
    NOT_FOUND: 404, PAYLOAD_TOO_LARGE: 413, errors.LIMIT_EXCEEDED: 429,
    errors.UNAVAILABLE: 503, errors.TIMEOUT: 504, errors.CANCELED: 502,
}
"""HTTP status per WAMP error URI; any other URI (an application error a callee raised)
is 502."""

# the names whose ``call`` permission an operator route needs: a role gets the route
# exactly when its rules grant that (as they grant the WAMP procedure of the name, where
# there is one; wamp.admin.kill_session and wamp.router.incidents are HTTP-only names)
PURGE = from_uri("wamp.retained.purge")
SESSION_LIST = from_uri("wamp.session.list")
SESSION_KILL = from_uri("wamp.admin.kill_session")
"""Not under ``wamp.session.``: realms grant that prefix for the read-only session meta API,
and closing sessions must not come with it."""
SUBSCRIPTION_LIST = from_uri("wamp.subscription.list")
GET_EVENTS = from_uri("wamp.subscription.get_events")
STATS = from_uri("wamp.router.stats")
INCIDENTS = from_uri("wamp.router.incidents")

DEFAULT_PAGE, MAX_PAGE = 100, 1000
"""Items per page of a listing unless ``limit`` says otherwise, and the most it may say."""


class HttpError(Exception):
    """A request refused before it reached the core."""

    def __init__(self, uri: str, message: str) -> None:
        super().__init__(message)
        self.uri = uri
        self.message = message


def bad(message: str) -> HttpError:
    return HttpError(errors.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """The OpenAPI path template (``/retained/{topic}``)."""
    handler: str
    """The HttpApi method that answers it."""
    authenticated: bool = True


ROUTES = (
    Route("GET", "/openapi.json", "openapi", authenticated=False),
    Route("POST", "/publish", "publish"),
    Route("POST", "/call", "call"),
    Route("GET", "/retained", "retained_list"),
    Route("DELETE", "/retained", "retained_purge"),
    Route("GET", "/retained/{topic}", "retained_get"),
    Route("DELETE", "/retained/{topic}", "retained_delete"),
    Route("GET", "/history", "history"),
    Route("GET", "/subscribe", "subscribe"),
    Route("GET", "/sessions", "sessions"),
    Route("DELETE", "/sessions/{id}", "kick"),
    Route("GET", "/subscriptions", "subscriptions"),
    Route("GET", "/stats", "stats"),
    Route("GET", "/incidents", "incidents"),
)


def openapi_document() -> bytes:
    """The OpenAPI file shipped in the package (package data)."""
    return resources.files("router.http").joinpath("openapi.json").read_bytes()


class BoundedRequest(Request):
    """A request whose body is kept in memory only up to the listener's limit: past it the
    rest is read and dropped, and the request is answered 413."""

    max_body = 1024 * 1024
    too_large = False

    def gotLength(self, length: int | None) -> None:
        self.content = io.BytesIO()
        if length is not None and length > self.max_body:
            self.too_large = True

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        if self.content.tell() + len(data) > self.max_body:
            self.too_large = True
            self.content = io.BytesIO()
            return
        self.content.write(data)


class HttpApi(Resource):
    """Every route of one ``http`` listener."""

    isLeaf = True

    def __init__(self, router: Router, realm: Realm, settings: HttpSettings,
                 payload_mapping: str, tokens: TokenFile, clock,
                 figures: Callable[[Realm], dict], queued: Callable[[Any], int]) -> None:
        """``figures``: the realm's ``wamp.router.stats``; ``queued``: the messages waiting
        in one session's own queue (what the metrics' ``router_queued_messages`` sums)."""
        super().__init__()
        self.router = router
        self.realm = realm
        self.settings = settings
        self.payload_mapping = payload_mapping
        self.login = HttpLogin(router, realm, tokens, settings)
        self.tokens = tokens
        try:  # at start-up, before the first request
            tokens.replace(tokens.refresh())
        except (OSError, ValueError, TypeError) as exc:
            self._tokens_unreadable(str(exc))
        self._token_watch = task.LoopingCall(self._reload_tokens)
        self._token_watch.clock = clock
        self._token_watch.start(RECHECK_INTERVAL, now=False)
        self.clock = clock
        self.figures = figures
        self.queued = queued
        self.openapi_json = openapi_document()
        """Read once at start-up: serving it then touches no disk."""
        self.streams: set[EventStream] = set()
        self.pages: dict[str, Resource] = {}
        """Pages outside the API by path prefix (``/console``): a request under one is
        handed to that resource's ``render`` as it is, before any route or login."""

    def _reload_tokens(self) -> defer.Deferred:
        """Look at the token file again, in a thread (its stat and read are disk I/O)."""
        looked = threads.deferToThreadPool(self.clock, self.clock.getThreadPool(),
                                           self.tokens.refresh)
        looked.addCallbacks(self.tokens.replace,
                            lambda failure: self._tokens_unreadable(failure.getErrorMessage()))
        return looked

    def _tokens_unreadable(self, reason: str) -> None:
        log.warning("%s unreadable, the tokens read before stay: %s", self.tokens.path, reason)

    # dispatch --------------------------------------------------------------------------

    def render(self, request: Request) -> Any:
        path = request.path.decode("utf-8", "replace")
        for prefix, resource in self.pages.items():
            if path == prefix or path.startswith(prefix + "/"):
                return resource.render(request)
        method = request.method.decode("ascii", "replace")
        found = match_route(method, path)
        if found is None:
            allowed = [route.method for route in ROUTES
                       if match_path(route.path, path) is not None]
            if allowed:
                request.setHeader(b"allow", ", ".join(allowed).encode())
                return self._error(request, 405, errors.INVALID_ARGUMENT,
                                   f"{method} is not allowed on {path}")
            return self._error(request, 404, NOT_FOUND, f"no such path: {path}")
        route, params = found
        if getattr(request, "too_large", False):
            return self._error(request, 413, PAYLOAD_TOO_LARGE,
                               f"the body is over the listener's max_message_size "
                               f"({request.max_body} bytes)")
        handler = getattr(self, route.handler)
        if not route.authenticated:
            return handler(request, None, **params)
        peer = _peer(request)

        def identified(result) -> None:
            if isinstance(result, LoginFailed):
                self.clock.callLater(result.delay, self._unauthorized, request, result.message)
            elif isinstance(result, Busy):
                self._answer(request, HttpError(errors.UNAVAILABLE, str(result)))
            else:
                self._run(request, handler, result, params)

        self.login.identify(request.getHeader(b"authorization"), peer, identified)
        return NOT_DONE_YET

    def _run(self, request: Request, handler, info: SessionInfo, params: dict) -> None:
        try:
            result = handler(request, info, **params)
        except Exception as exc:  # a refusal, or a bug (logged): answered either way
            self._answer(request, exc)
            return
        if isinstance(result, defer.Deferred):
            result.addCallbacks(lambda value: self._answer(request, value),
                                lambda failure: self._answer(request, failure.value))
        elif result is not NOT_DONE_YET:
            self._answer(request, result)

    def _answer(self, request: Request, result: Any) -> None:
        """Write a handler's JSON result, or its error, and finish (unless the client left)."""
        if _gone(request):
            return
        if isinstance(result, (HttpError, RouterError)):
            self._write_error(request, result.uri, result.message or result.uri)
            return
        if isinstance(result, Exception):
            log.error("HTTP %s %s failed", request.method, request.path, exc_info=result)
            self._write_error(request, errors.UNAVAILABLE, "the answer could not be made")
            return
        request.setHeader(b"content-type", b"application/json")
        request.write(dumps(result))
        request.finish()

    def _write_error(self, request: Request, uri: str, message: str,
                     args: list | None = None, kwargs: dict | None = None) -> None:
        if _gone(request):
            return
        body = self._error(request, STATUS.get(uri, 502), uri, message, args, kwargs)
        request.write(body)
        request.finish()

    def _error(self, request: Request, status: int, uri: str, message: str,
               args: list | None = None, kwargs: dict | None = None) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        body: dict = {"error": uri, "message": message}
        body.update(result_json(args, kwargs))
        return dumps(body)

    def _unauthorized(self, request: Request, message: str) -> None:
        if _gone(request):
            return
        request.setHeader(b"www-authenticate", b'Basic realm="' + self.realm.name.encode()
                          + b'", Bearer')
        request.write(self._error(request, 401, "wamp.error.authentication_failed", message))
        request.finish()

    # helpers -----------------------------------------------------------------------------

    def _operator(self, info: SessionInfo, procedure: tuple[str, ...]) -> None:
        """Raise not_authorized unless the role may call the router procedure."""
        self.realm.authorize(info, "call", procedure)

    # routes ------------------------------------------------------------------------------

    def openapi(self, request: Request, info: None) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return self.openapi_json

    def publish(self, request: Request, info: SessionInfo) -> Any:
        """``POST /publish``: a JSON body (topic, args, kwargs, options), or, when the query
        names the topic, the body as the payload (JSON too), mapped as an MQTT payload is."""
        content_type = (request.getHeader(b"content-type") or b"").decode("latin-1")
        body = request.content.getvalue()
        query = _query(request)
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "application/json" and "topic" not in query and "mqtt_topic" not in query:
            spec = _json_object(body)
            payload = properties = None
            args, kwargs = spec.get("args"), spec.get("kwargs")
            if args is not None and type(args) is not list:
                raise bad("'args' must be a list")
            if kwargs is not None and type(kwargs) is not dict:
                raise bad("'kwargs' must be an object")
        else:
            spec = {key: _query_value(key, value) for key, value in query.items()}
            payload = body
            args, kwargs = from_bytes(body, self.payload_mapping)
            properties = {"content_type": content_type} if content_type else {}
            if media.startswith("text/"):
                properties["payload_format_indicator"] = 1
        topic, name_kind = _publish_topic(spec)
        options = _publish_options(spec, empty=not args and not kwargs and not payload)
        expires_in = spec.get("expires_in")
        if expires_in is not None and (type(expires_in) not in (int, float)
                                       or not 0 <= expires_in <= LONGEST_EXPIRY):  # (not NaN)
            raise bad(f"'expires_in' must be a non-negative number of seconds, at most "
                      f"{LONGEST_EXPIRY}")
        if name_kind == "uri":
            self.realm.check_uri(spec["topic"])
        answer: defer.Deferred = defer.Deferred()

        def durable(publication: Publication, ok: bool) -> None:
            if ok:
                answer.callback({"publication": publication.publication_id})
            else:
                answer.errback(RouterError(errors.UNAVAILABLE, "the event was delivered but "
                                           "could not be stored as the retained event"))

        publication = self.realm.publish(
            info, topic, args, kwargs, options, durable if options.acknowledge else None,
            len(body), payload=payload or None, properties=properties or None,
            expires_at=time.time() + expires_in if expires_in is not None else None,
            **{name_kind: spec[name_kind if name_kind == "mqtt_topic" else "topic"]})
        if options.acknowledge:
            return answer
        return {"publication": publication.publication_id}

    def call(self, request: Request, info: SessionInfo) -> Any:
        """``POST /call``: ``{"procedure", "args", "kwargs", "timeout"}``."""
        spec = _json_object(request.content.getvalue())
        procedure = spec.get("procedure")
        if type(procedure) is not str or not procedure:
            raise bad("'procedure' (a string) is required")
        args, kwargs = spec.get("args"), spec.get("kwargs")
        if args is not None and type(args) is not list:
            raise bad("'args' must be a list")
        if kwargs is not None and type(kwargs) is not dict:
            raise bad("'kwargs' must be an object")
        limit = self.settings.call_timeout
        timeout = spec.get("timeout", limit)
        if type(timeout) not in (int, float) or not 0 < timeout <= limit:
            raise bad(f"'timeout' must be a number of seconds above 0 and at most {limit:g}")
        progressive = NDJSON in (request.getHeader(b"accept") or b"")
        caller = HttpCaller(self.realm, info, request, progressive, self._write_error)
        self.realm.call(caller, CALL_REQUEST, procedure, args, kwargs,
                        CallOptions(progressive, int(timeout * 1000)))
        return NOT_DONE_YET

    def retained_list(self, request: Request, info: SessionInfo) -> dict:
        """``GET /retained``: the retained events a subscription of the pattern would get,
        one per topic, in topic order, a page at a time (``cursor``: the last topic of the
        previous page)."""
        query = _query(request)
        pattern, match = _pattern(query, self.realm)
        limit = _int(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        cursor = query.get("cursor")
        self.realm.authorize(info, "subscribe", pattern, match)
        retention = self.realm.retention
        if retention is None:
            return {"topics": [], "next": None}
        retention.expire()
        visible = ((display(publication.topic), publication)
                   for publication in retention.for_subscriber(pattern, match, info))
        page = heapq.nsmallest(limit + 1, (item for item in visible
                                           if cursor is None or item[0] > cursor),
                               key=lambda item: item[0])
        more = len(page) > limit
        page = page[:limit]
        return {"topics": [event_json(publication) for _, publication in page],
                "next": page[-1][0] if more else None}

    def retained_get(self, request: Request, info: SessionInfo, topic: str) -> dict:
        levels = _path_topic(topic)
        self.realm.authorize(info, "subscribe", levels)
        retention = self.realm.retention
        if retention is not None:
            retention.expire()
            for publication in retention.for_subscriber(levels, EXACT, info):
                return event_json(publication)
        raise HttpError(NO_SUCH_RETAINED, f"no retained event on {display(levels)}")

    def retained_delete(self, request: Request, info: SessionInfo, topic: str) -> dict:
        """``DELETE /retained/{topic}``: wamp.retained.purge(levels=...)."""
        return {"purged": self._purge(info, {"levels": list(_path_topic(topic))})}

    def retained_purge(self, request: Request, info: SessionInfo) -> dict:
        """``DELETE /retained?prefix=``: wamp.retained.purge(prefix=...); ``prefix=`` (empty)
        purges every topic, as the procedure does."""
        query = _query(request)
        if "prefix" not in query:
            raise bad("give 'prefix' (empty: every topic), or DELETE /retained/{topic}")
        return {"purged": self._purge(info, {"prefix": query["prefix"]})}

    def _purge(self, info: SessionInfo, kwargs: dict) -> int:
        self._operator(info, PURGE)
        if self.realm.retention is None:
            return 0
        return self.realm.dealer.procedures["wamp.retained.purge"](info, [], kwargs)

    def history(self, request: Request, info: SessionInfo) -> defer.Deferred:
        """``GET /history``: what wamp.subscription.get_events gives for the pattern."""
        query = _query(request)
        pattern, match = _pattern(query, self.realm)
        self._operator(info, GET_EVENTS)
        self.realm.authorize(info, "subscribe", pattern, match)
        limit = _int(query, "limit", None, 0, None)
        reverse = _bool(query, "reverse")
        window = TimeWindow(*(_time(query, key) for key in
                              ("from_time", "after_time", "before_time", "until_time")))
        answer: defer.Deferred = defer.Deferred()

        def events(found: list[Publication] | Exception) -> None:
            if isinstance(found, Exception):
                answer.callback(RouterError(errors.UNAVAILABLE,
                                            f"the history cannot be read: {found}"))
            else:
                answer.callback({"events": [event_json(p) for p in found]})

        self.realm.history.read(pattern, match, info, limit, reverse, window, events)
        return answer

    def subscribe(self, request: Request, info: SessionInfo) -> Any:
        """``GET /subscribe``: a Server-Sent Events stream (see :mod:`router.http.stream`)."""
        query = _query(request)
        pattern, match = _pattern(query, self.realm)
        if len(self.streams) >= self.settings.max_streams:
            raise HttpError(errors.UNAVAILABLE, f"the listener has {len(self.streams)} "
                            "event streams open, its max_streams")
        last = request.getHeader(b"last-event-id") or query.get("last_event_id", "").encode()
        resume = parse_event_id(last.decode("latin-1")) if last else None
        if last and resume is None:
            raise bad("Last-Event-ID is not an event id of this router")
        stream = EventStream(self.realm, info, request, self.settings.sse_max_queued,
                             self.settings.sse_keepalive, self.clock, self._stream_closed)
        if resume is not None:
            stream.resuming = []
        self.streams.add(stream)
        self.router.track(stream)
        self.router.connections.add(stream)
        try:
            stream.start(pattern, match, _bool(query, "get_retained") and resume is None)
        except RouterError:
            stream.close()
            raise
        if resume is not None:
            timestamp, publication_id = resume
            self.realm.history.read(pattern, match, info, None, False, TimeWindow(timestamp),
                                    lambda found: stream.resumed(
                                        [] if isinstance(found, Exception) else found,
                                        publication_id))
        return NOT_DONE_YET

    def _stream_closed(self, stream: EventStream) -> None:
        self.streams.discard(stream)
        self.router.connections.discard(stream)
        self.router.forget(stream)

    def sessions(self, request: Request, info: SessionInfo) -> dict:
        """``GET /sessions``: every session of the realm, whatever its protocol."""
        self._operator(info, SESSION_LIST)
        query = _query(request)
        limit = _int(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        offset = _int(query, "offset", 0, 0, None)
        peers = list(self.realm.sessions.values())
        counts: dict[str, int] = {}
        for peer in peers:
            counts[family(peer.info.protocol)] = counts.get(family(peer.info.protocol), 0) + 1
        listed = []
        for peer in itertools.islice(peers, offset, offset + limit):
            session = peer.info
            details = session.details()
            details.update(protocol=session.protocol, joined=rfc3339(session.joined_at),
                           subscriptions=len(self.realm.broker.subscriptions_of(
                               session.session_id)))
            if session.client_id is not None:
                details["client_id"] = session.client_id
            listed.append(details)
        return {"total": len(peers), "by_protocol": counts, "sessions": listed}

    def kick(self, request: Request, info: SessionInfo, id: str) -> dict:
        """``DELETE /sessions/{id}``: close a session, whatever its protocol."""
        self._operator(info, SESSION_KILL)
        if not id.isdigit():
            raise bad("the session id must be an integer")
        peer = self.realm.sessions.get(int(id))
        if peer is None:
            raise RouterError(errors.NO_SUCH_SESSION, f"no session {id} in the realm")
        peer.kill("wamp.close.killed", f"closed by {info.authid} over HTTP")
        return {"killed": int(id)}

    def subscriptions(self, request: Request, info: SessionInfo) -> dict:
        """``GET /subscriptions``: every subscription of the realm (meta ones left out)."""
        self._operator(info, SUBSCRIPTION_LIST)
        query = _query(request)
        limit = _int(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        offset = _int(query, "offset", 0, 0, None)
        broker = self.realm.broker
        every = [sub for sub in itertools.chain(broker.index.by_id.values(),
                                                broker.shared.by_id.values())
                 if not sub.is_meta]
        listed = []
        for subscription in itertools.islice(every, offset, offset + limit):
            details = subscription.details()
            details["subscribers"] = subscription.session_ids()
            listed.append(details)
        return {"total": len(every), "subscriptions": listed}

    def stats(self, request: Request, info: SessionInfo) -> dict:
        """``GET /stats``: the realm's figures (``wamp.router.stats``), and per protocol its
        sessions, messages in and out since start, and messages queued now."""
        self._operator(info, STATS)
        realm = self.realm
        sessions: dict[str, int] = {}
        queued: dict[str, int] = {}
        for peer in realm.sessions.values():
            name = family(peer.info.protocol)
            sessions[name] = sessions.get(name, 0) + 1
            queued[name] = queued.get(name, 0) + self.queued(peer)
        received: dict[str, int] = {}
        delivered: dict[str, int] = {}
        for totals, counters in ((received, realm.stats.received),
                                 (delivered, realm.stats.delivered)):
            for counter in counters:
                for protocol, n in counter.items():
                    totals[family(protocol)] = totals.get(family(protocol), 0) + n
        return {"time": time.time(), "realm": realm.name, "sessions": sessions,
                "received": received, "delivered": delivered, "queued": queued,
                "retained": len(realm.retention) if realm.retention is not None else 0,
                "event_streams": len(self.streams), "figures": self.figures(realm)}

    def incidents(self, request: Request, info: SessionInfo) -> dict:
        """``GET /incidents``: the latest incidents of this realm and the node's, newest
        first, and the totals per (protocol, reason) since start."""
        self._operator(info, INCIDENTS)
        limit = _int(_query(request), "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        incidents = self.router.incidents
        recent = [dict(item, time=rfc3339(item["time"])) for item in reversed(incidents.recent)
                  if item["realm"] in (self.realm.name, "")][:limit]
        totals = [{"protocol": protocol, "reason": reason, "count": n}
                  for (realm, protocol, reason), n in sorted(incidents.totals.items())
                  if realm in (self.realm.name, "")]
        return {"recent": recent, "totals": totals}


class GatedChannel(GatedProtocol, HTTPChannel):
    """An HTTP connection under the listener's connection caps and handshake timeout (the
    handshake: the first request's headers)."""

    def connectionMade(self) -> None:
        super().connectionMade()
        if self.gate is not None and self.gate.refused:
            self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n"
                                 b"content-length: 0\r\n\r\n")
            self.transport.loseConnection()

    def allHeadersReceived(self) -> None:
        super().allHeadersReceived()
        self.handshake_done()


def http_site(api: HttpApi, max_body: int, idle_timeout: float) -> Site:
    """The Twisted web factory of one ``http`` listener: a keep-alive connection idle for
    ``idle_timeout`` seconds between requests is closed (an open response, such as an
    event stream, is not idle)."""
    site = Site(api, timeout=idle_timeout)
    site.protocol = GatedChannel
    site.requestFactory = type("ListenerRequest", (BoundedRequest,), {"max_body": max_body})
    site.log = lambda request: None  # type: ignore[method-assign]
    site.displayTracebacks = False
    return site


# request parsing -------------------------------------------------------------------------

def match_path(template: str, path: str) -> dict[str, str] | None:
    """The parameters of ``path`` under an OpenAPI path ``template`` (a ``{name}`` takes the
    rest of the path when it is the last part: a topic may hold ``/``), or None."""
    head, brace, tail = template.partition("{")
    if not brace:
        return {} if path == template else None
    if not path.startswith(head) or len(path) == len(head):
        return None
    return {tail.rstrip("}"): unquote(path[len(head):])}


def match_route(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    for route in ROUTES:
        if route.method == method:
            params = match_path(route.path, path)
            if params is not None:
                return route, params
    return None


def _gone(request: Request) -> bool:
    """Answered already, or its connection lost (Twisted drops the channel then)?"""
    return bool(request.finished) or request.channel is None


def _peer(request: Request) -> str:
    address = request.getClientAddress()
    return f"{getattr(address, 'host', '?')}:{getattr(address, 'port', '?')}"


def _query(request: Request) -> dict[str, str]:
    """The query's parameters, the last value of each."""
    return {key.decode("utf-8", "replace"): values[-1].decode("utf-8", "replace")
            for key, values in (request.args or {}).items()}


def _query_value(key: str, value: str) -> Any:
    """A query parameter of a raw-body publish, typed as its JSON-body twin would be."""
    if key in ("retain", "acknowledge", "exclude_me", "disclose_me"):
        return _truth(key, value)
    if key in ("qos", "retain_ttl", "expires_in"):
        try:
            return json.loads(value)
        except ValueError:
            raise bad(f"'{key}' must be a number") from None
    if key in ("exclude", "eligible"):
        try:
            return [int(item) for item in value.split(",") if item]
        except ValueError:
            raise bad(f"'{key}' must be session ids separated by commas") from None
    if key in ("exclude_authid", "eligible_authid", "exclude_authrole", "eligible_authrole"):
        return [item for item in value.split(",") if item]
    return value


def _truth(key: str, value: str) -> bool:
    if value in ("true", "1", ""):
        return True
    if value in ("false", "0"):
        return False
    raise bad(f"'{key}' must be true or false")


def _bool(query: dict[str, str], key: str) -> bool:
    return key in query and _truth(key, query[key])


def _int(query: dict[str, str], key: str, default: Any, low: int,
         high: int | None) -> Any:
    if key not in query:
        return default
    try:
        value = int(query[key])
    except ValueError:
        raise bad(f"'{key}' must be an integer") from None
    if value < low or (high is not None and value > high):
        raise bad(f"'{key}' must be between {low} and {high}" if high is not None
                  else f"'{key}' must be at least {low}")
    return value


def _time(query: dict[str, str], key: str) -> float | None:
    if key not in query:
        return None
    try:
        return datetime.fromisoformat(query[key].replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise bad(f"'{key}' must be an RFC 3339 time") from None


def _json_object(body: bytes) -> dict:
    try:
        value = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the body is not JSON: {exc}") from None
    if type(value) is not dict:
        raise bad("the body must be a JSON object")
    return value


def _publish_topic(spec: dict) -> tuple[tuple[str, ...], str]:
    """(levels, the keyword naming the topic's form for the core) of a publish: ``topic``
    is a WAMP URI, ``mqtt_topic`` an MQTT topic name."""
    if "mqtt_topic" in spec:
        name = spec["mqtt_topic"]
        if type(name) is not str or not valid_topic_name(name):
            raise bad("'mqtt_topic' must be an MQTT topic name (no wildcards)")
        return from_mqtt(name), "mqtt_topic"
    name = spec.get("topic")
    if type(name) is not str or not name:
        raise bad("'topic' (a WAMP URI) or 'mqtt_topic' is required")
    return from_uri(name), "uri"


PUBLISH_KEYS = {"topic", "mqtt_topic", "args", "kwargs", "retain", "acknowledge", "qos",
                "retain_ttl", "expires_in", "exclude_me", "disclose_me", "exclude", "eligible",
                "exclude_authid", "eligible_authid", "exclude_authrole", "eligible_authrole"}


def _publish_options(spec: dict, empty: bool):
    """The core's publish options from the request's keys (WAMP's PUBLISH options under
    the same names, ``qos`` and ``retain_ttl`` for ``_qos`` and ``_retain_ttl``)."""
    unknown = set(spec) - PUBLISH_KEYS
    if unknown:
        raise bad(f"unknown key(s): {', '.join(sorted(unknown))}")
    options = {key: spec[key] for key in spec
               if key not in ("topic", "mqtt_topic", "args", "kwargs", "qos", "retain_ttl",
                              "expires_in")}
    options.setdefault("exclude_me", False)
    if "qos" in spec:
        options["_qos"] = spec["qos"]
    if "retain_ttl" in spec:
        options["_retain_ttl"] = spec["retain_ttl"]
    if empty and options.get("retain"):  # an empty retained event clears, as on MQTT
        options["retain"] = False
        options["_retain_clear"] = True
    try:
        return parse_publish_options(options)
    except ProtocolViolation as exc:
        raise bad(str(exc).replace("option ", "").replace("'_", "'")) from None


def _pattern(query: dict[str, str], realm: Realm) -> tuple[tuple[str, ...], str]:
    """(levels, match) of ``topic`` + ``match`` (exact, prefix, wildcard), ``prefix``, or
    ``filter`` (an MQTT topic filter)."""
    given = [key for key in ("topic", "prefix", "filter") if key in query]
    if len(given) != 1:
        raise bad("give exactly one of 'topic', 'prefix' and 'filter'")
    if "filter" in query:
        if not valid_topic_filter(query["filter"]):
            raise bad("'filter' must be an MQTT topic filter")
        return mqtt_pattern(query["filter"])
    if "prefix" in query:
        if query["prefix"]:
            realm.check_uri(query["prefix"], PREFIX)
        return from_uri(query["prefix"]), PREFIX
    match = query.get("match", EXACT)
    if match not in MATCH_POLICIES:
        raise bad(f"'match' must be one of {', '.join(MATCH_POLICIES)}")
    realm.check_uri(query["topic"], match)
    return from_uri(query["topic"]), match


def _path_topic(text: str) -> tuple[str, ...]:
    """A topic in a path, in any form :func:`router.core.topic.display` names it: dotted (a
    WAMP URI), with ``/`` an MQTT topic name, or a JSON list of its levels."""
    if not text:
        raise bad("the topic is missing from the path")
    if text.startswith("["):
        try:
            levels = json.loads(text)
        except ValueError:
            levels = None
        if (type(levels) is not list or not levels
                or any(type(level) is not str for level in levels)):
            raise bad("a topic in brackets must be a JSON list of its levels (strings)")
        try:
            "".join(levels).encode()
        except UnicodeEncodeError:  # a lone surrogate escape ("\ud800"): no topic has it
            raise bad("a topic's levels must be Unicode text (no lone surrogates)") from None
        return tuple(levels)
    return from_mqtt(text) if "/" in text else from_uri(text)
