"""``POST /call``: the caller side of one call, as the core's dealer sees a caller.

The result is one JSON object ``{"args": [...], "kwargs": {...}}``; with ``Accept:
application/x-ndjson`` each progressive result is a line as it comes, and the final result
(or the error) the last line. A client that goes away before the answer cancels the call
(the callee gets an INTERRUPT if it supports call canceling).
"""

from __future__ import annotations

from typing import Callable

from twisted.web.server import Request

from router.core.model import SessionInfo
from router.core.realm import Realm
from router.http.events import dumps

NDJSON = b"application/x-ndjson"
CALL_REQUEST = 1
"""The one call of this caller: its request id as the dealer knows it."""


def result_json(args: list | None, kwargs: dict | None) -> dict:
    result: dict = {}
    if args:
        result["args"] = args
    if kwargs:
        result["kwargs"] = kwargs
    return result


class HttpCaller:
    """The core's Peer of one HTTP call: answers the request, then is gone."""

    def __init__(self, realm: Realm, info: SessionInfo, request: Request, progressive: bool,
                 failed: Callable[[Request, str, str, list | None, dict | None], None]) -> None:
        self.realm = realm
        self.info = info
        self.request = request
        self.progressive = progressive
        self.answered = False
        self._failed = failed
        request.notifyFinish().addErrback(lambda _: self._gone())

    def send_result(self, call_request: int, args: list | None, kwargs: dict | None,
                    progress: bool) -> None:
        if self.answered:
            return
        line = dumps(result_json(args, kwargs))
        if progress:
            if self.progressive:
                self._start_stream()
                self.request.write(line + b"\n")
            return
        self.answered = True
        if self.progressive:
            self._start_stream()
            self.request.write(line + b"\n")
        else:
            self.request.setHeader(b"content-type", b"application/json")
            self.request.write(line)
        self.request.finish()

    def send_call_error(self, call_request: int, error: str, args: list | None,
                        kwargs: dict | None) -> None:
        if self.answered:
            return
        self.answered = True
        if self.progressive and self.request.startedWriting:
            body: dict = {"error": error, "message": _message(args)}
            body.update(result_json(args, kwargs))
            self.request.write(dumps(body) + b"\n")
            self.request.finish()
            return
        self._failed(self.request, error, _message(args) or error, args, kwargs)

    def _start_stream(self) -> None:
        if not self.request.startedWriting:
            self.request.setHeader(b"content-type", NDJSON)

    def _gone(self) -> None:
        """The client left before the answer: the dealer settles the call (and tells the
        callee, if it can hear it)."""
        if not self.answered:
            self.answered = True
            self.realm.dealer.remove_session(self)

    def supports(self, role: str, feature: str) -> bool:
        return role == "caller" and feature == "progressive_call_results" and self.progressive

    def send_event(self, subscription, publication, retained: bool = False) -> None:
        """A caller never subscribes."""

    def ready(self) -> bool:
        return False

    def backlog_room(self) -> bool:
        return False

    def send_invocation(self, invocation) -> None:
        """A caller is never a callee."""

    def send_interrupt(self, invocation, mode: str, reason: str) -> None:
        """A caller is never a callee."""

    def kill(self, reason: str, message: str | None) -> None:
        if not self.answered:
            self.send_call_error(CALL_REQUEST, "wamp.error.canceled", [message or reason], None)

    def subscription_revoked(self, subscription, reason: str) -> None:
        """A caller never subscribes."""

    def registration_revoked(self, registration, reason: str) -> None:
        """A caller never registers."""


def _message(args: list | None) -> str:
    """The error's message: its first argument when that is text (WAMP's habit)."""
    return args[0] if args and isinstance(args[0], str) else ""
