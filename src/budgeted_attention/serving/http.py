"""Limits a hostile or broken client meets before the application parses anything.

Two layers, because some limits can only be kept where the bytes arrive:

* :class:`GuardedHttpProtocol`, uvicorn's httptools protocol with the request head bounded: more
  than ``max_headers`` header lines, or a head past ``max_header_bytes`` (counted as the bytes
  arrive, so a 20 MB header is refused after about ``max_header_bytes``, not buffered whole),
  get 431; a head not complete within ``header_timeout_s`` of the connection opening (or of its
  previous answer) gets 408 (slow-loris clients). More than ``max_connections`` connections
  open (uvicorn's ``limit_concurrency``, per worker) get 503 and are closed at once, as do requests
  past that many in progress. A request answered before its body was read whole (a GET with a
  body) has the rest of it dropped and its connection closed. On shutdown a request whose body is still arriving is answered 503
  at once instead of holding the exit.
* :class:`RequestGuard`, an ASGI middleware: the Host check, the API key, the body limit (413
  from ``Content-Length`` before a byte of the body is read, or as soon as a streamed body passes
  ``max_body_bytes``), the body's deadline (408: the whole body within ``body_timeout_s`` of its
  head, however it is dripped), client disconnects counted apart from server
  errors (one log line), and a request cancelled by a shutdown past ``shutdown_timeout_s``
  answered 503 instead of uvicorn's text 500.

Every refusal is JSON ``{"error": "..."}``, the one error shape of the server, and closes the
connection (the rest of an oversized body is never read).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("budgeted_attention.serve")

ENV_LIMITS = "BAA_HTTP_LIMITS"  # JSON HeadLimits for uvicorn's protocol in every worker process
PROBES = ("/healthz", "/readyz", "/metrics")  # open to orchestrators and scrapers unless auth_probes

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


# ---------------------------------------------------------------------------- the request head


@dataclass
class HeadLimits:
    """What :class:`GuardedHttpProtocol` enforces (from the server settings).

    Attributes:
        max_headers: header lines per request (431 past it).
        max_header_bytes: bytes of the request line and headers (431 past it).
        header_timeout_s: seconds a request head may take to arrive (408 past it).
        max_body_bytes: bytes of a body (413 from Content-Length, or once a chunked body passes
            it); 0: not checked here (the ASGI guard still checks).
    """

    max_headers: int = 100
    max_header_bytes: int = 16384
    header_timeout_s: float = 10.0
    max_body_bytes: int = 0

    @classmethod
    def from_env(cls) -> HeadLimits:
        raw = os.environ.get(ENV_LIMITS)
        return cls(**json.loads(raw)) if raw else cls()

    @classmethod
    def of(cls, cfg: Any) -> HeadLimits:
        """The limits of a :class:`~budgeted_attention.serving.config.ServeConfig`."""
        return cls(max_headers=cfg.max_headers, max_header_bytes=cfg.max_header_bytes, header_timeout_s=cfg.header_timeout_s,
                   max_body_bytes=cfg.body_limit())


# After a refusal the connection is half-closed and what the client still sends is read and
# dropped for a moment (a "lingering close", as nginx does): closing with unread bytes makes the
# kernel send a reset, and a client still uploading would see "connection reset" instead of the
# answer. Bounded in time and bytes, so a refused upload costs little.
LINGER_S = 2.0
LINGER_BYTES = 8 << 20


def raw_response(status: int, reason: str, message: str, extra: list[tuple[str, str]] = ()) -> bytes:
    """A complete HTTP/1.1 response with a JSON error body that closes the connection."""
    body = error_body(message)
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}", "connection: close"]
    head += [f"{name}: {value}" for name, value in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the protocol answers ``status``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


TOO_LARGE = "Request Header Fields Too Large"
IDLE, HEAD, BODY = "idle", "head", "body"  # where a connection's parser is


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request head and body bounded (see the module docstring)."""

    limits: HeadLimits | None = None

    @classmethod
    def head_limits(cls) -> HeadLimits:
        if cls.limits is None:
            cls.limits = HeadLimits.from_env()
        return cls.limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's own check of limit_concurrency (serve.max_connections) answers in plain text
        # and counts a connection already at the limit as over it: this protocol checks instead.
        self.max_connections, self.limit_concurrency = self.limit_concurrency, None

    def connection_made(self, transport) -> None:  # noqa: ANN001 - asyncio's signature
        super().connection_made(transport)
        self._lingering, self._dropped, self._head_timer = False, 0, None
        # Where the parser is: between messages (IDLE), in a request head (HEAD), in its body (BODY).
        self._phase, self._begins = IDLE, 0
        self._head_bytes, self._head_lines, self._parsed_head, self._body_bytes = 0, 0, 0, 0
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self._over_capacity()
            return
        self._time_head()

    def _over_capacity(self) -> None:
        """Too many connections open: answer 503 and close at once (each one holds a file descriptor)."""
        global _CAPACITY_LOGGED  # noqa: PLW0603
        if _OBSERVER:
            _OBSERVER[-1](503)
        if time.monotonic() - _CAPACITY_LOGGED > 10.0:  # one line per 10 s, not one per refused connection
            _CAPACITY_LOGGED = time.monotonic()
            log.warning("baa serve: 503: %d connections open, refusing more (serve.max_connections = %d)", len(self.connections) - 1, self.max_connections)
        self._lingering = True
        self.transport.write(raw_response(503, "Service Unavailable", f"too many connections (serve.max_connections = {self.max_connections})",
                                          [("retry-after", "1")]))
        self.transport.close()

    def _time_head(self) -> None:
        """The next request head must be complete within header_timeout_s from now."""
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_limits().header_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        if self.transport.is_closing() or self._lingering:
            return
        if self._phase == HEAD:  # a client that started a request and stalled (slow loris)
            self._refuse(408, "Request Timeout", f"request head not complete within {self.head_limits().header_timeout_s:g} s")
        elif self._phase == IDLE and not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()  # an idle connection that sent nothing: close without an answer

    def _linger(self) -> None:
        """Half-close and drop what still arrives (for LINGER_S at most, LINGER_BYTES at most)."""
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.flow.resume_reading()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` with a JSON error, half-close, and drop what still arrives."""
        if self._lingering or self.transport.is_closing():
            return
        log.warning("baa serve: %s from %s: %s", status, self.client[0] if self.client else "?", message)
        if _OBSERVER:
            _OBSERVER[-1](status)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self.scope["baa.refused"] = status  # the ASGI guard: this disconnect is ours, not the client's
            cycle.disconnected = True  # the application's later answer goes nowhere
            cycle.message_event.set()
        self.transport.write(raw_response(status, reason, message, [("retry-after", "1")] if status == 503 else []))
        self._linger()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        before, self._begins = self._phase, 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__ if isinstance(exc.__context__, _Refused) else _Refused(400, "Bad Request", "invalid HTTP request")
            self._refuse(refused.status, refused.reason, refused.message)
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:  # uvicorn answers these in text: ours are JSON
            self._refuse(400, "Bad Request", f"invalid HTTP request ({str(exc)[:80]})")
            return
        if self._phase != HEAD:
            return
        # A head still arriving: count the raw bytes too (a header value is only parsed once it
        # is whole, and a 20 MB one must be refused before that). Only when every byte of this
        # chunk is the head's; when the head began after another message's bytes in it, its
        # parsed part is counted (on_url, on_header) and the raw count starts with the next chunk.
        if (before == HEAD and self._begins == 0) or (before == IDLE and self._begins == 1):
            self._head_bytes += len(data)
        limit = self.head_limits().max_header_bytes
        if self._head_bytes > limit:
            self._refuse(431, TOO_LARGE, f"request head over {limit} bytes (serve.max_header_bytes)")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._begins = HEAD, self._begins + 1
        self._head_bytes, self._head_lines, self._parsed_head, self._body_bytes = 0, 0, 0, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        if self._head_lines > self.head_limits().max_headers:
            raise _Refused(431, TOO_LARGE, f"more than {self.head_limits().max_headers} header lines (serve.max_headers)")
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._parsed_head += n
        limit = self.head_limits().max_header_bytes
        if self._parsed_head > limit:
            raise _Refused(431, TOO_LARGE, f"request head over {limit} bytes (serve.max_header_bytes)")

    def on_headers_complete(self) -> None:
        self._phase = BODY  # from here on the bytes are this message's body, not a head
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self.max_connections is not None and len(self.tasks) >= self.max_connections:
            raise _Refused(503, "Service Unavailable", f"too many requests in progress (serve.max_connections = {self.max_connections})")
        limit = self.head_limits().max_body_bytes
        declared = dict(self.headers).get(b"content-length", b"")
        if limit and declared.isdigit() and int(declared) > limit:  # refused before the app sees it
            raise _Refused(413, "Content Too Large", f"body of {int(declared)} bytes, the limit is serve.max_body_bytes = {limit}")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._lingering:
            return
        self._body_bytes += len(body)
        limit = self.head_limits().max_body_bytes
        if limit and self._body_bytes > limit:
            raise _Refused(413, "Content Too Large", f"body over the limit serve.max_body_bytes = {limit} bytes")
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = IDLE
        if not self._lingering:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)  # a pipelined request whose head is in: it starts now
        super().on_response_complete()
        if self.transport.is_closing() or self._lingering or queued:
            return
        if self._phase == BODY:
            # Answered before its body was read (a GET with a body): drop the rest and close,
            # rather than parse the rest as the next request or answer it twice.
            self._linger()
            return
        self._time_head()  # the next request on this keep-alive connection (perhaps already arriving)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.response_started and cycle.more_body:
            # The body is still arriving: answer now rather than hold the exit until it does.
            self._refuse(503, "Service Unavailable", "server is shutting down")
            return
        super().shutdown()


_CAPACITY_LOGGED = 0.0  # when the last "too many connections" line was logged
_OBSERVER: list[Callable[[int], None]] = []  # counts the protocol's refusals: the latest app's metrics


def guarded_protocol_observer(count: Callable[[int], None]) -> None:
    """Count the refusals of the request-head checks with ``count`` (called with the status)."""
    _OBSERVER[:] = [count]


# What ``uvicorn.run(http=...)`` is given: an import string, so worker processes import the class
# themselves instead of unpickling it.
GUARDED_HTTP = "budgeted_attention.serving.http:GuardedHttpProtocol"


# ---------------------------------------------------------------------------- the ASGI guard


class RequestGuard:
    """ASGI middleware: Host, API key, body size and time, disconnects and shutdown cancellation.

    Args:
        app: the FastAPI application.
        cfg: the server settings (``allowed_hosts``, ``auth_probes``, the body limits).
        api_key: the key ``Authorization: Bearer`` must carry, or None for an open server.
        count: called with the status of each refusal (the metrics).
        disconnected: called once per client that went away before its answer.
    """

    def __init__(self, app: Any, cfg: Any, api_key: str | None, count: Callable[[int], None], disconnected: Callable[[], None]) -> None:
        self.app, self.cfg, self.count, self.disconnected = app, cfg, count, disconnected
        self._key = api_key.encode() if api_key else None
        self.body_limit = cfg.body_limit()

    async def _refuse(self, send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
        self.count(status)
        body = error_body(message)
        await send({
            "type": "http.response.start", "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close"), *headers],
        })
        await send({"type": "http.response.body", "body": body})

    def _host_allowed(self, headers: dict[bytes, bytes]) -> bool:
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if host.startswith("["):  # an IPv6 literal: [::1]:8000
            host = host[1 : host.find("]")] if "]" in host else host
        else:
            host = host.rsplit(":", 1)[0]
        return any(host == allowed or (allowed.startswith("*.") and host.endswith(allowed[1:])) for allowed in self.cfg.allowed_hosts)

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["headers"]
        if len(head) > self.cfg.max_headers or sum(len(n) + len(v) + 4 for n, v in head) > self.cfg.max_header_bytes:
            return await self._refuse(send, 431, "request headers over serve.max_headers / serve.max_header_bytes")
        for name in (b"host", b"authorization"):
            # One each: dict() keeps the last of several, the framework reads the first, so two
            # Host headers could pass the allowed_hosts check with one name and be served as another.
            if sum(1 for n, _ in head if n.lower() == name) > 1:
                return await self._refuse(send, 400, f"more than one {name.decode().title()} header")
        headers = {n.lower(): v for n, v in head}
        probe = scope["path"] in PROBES
        if self.cfg.allowed_hosts and not probe and not self._host_allowed(headers):
            host = headers.get(b"host", b"").decode("latin-1")[:100]
            return await self._refuse(send, 400, f"Host {host!r} is not one of serve.allowed_hosts")
        if self._key is not None and (not probe or self.cfg.auth_probes) and not self._authorised(headers):
            return await self._refuse(send, 401, "missing or wrong API key (send 'Authorization: Bearer <key>')", [(b"www-authenticate", b"Bearer")])
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._read_body(scope, receive, send, headers)
            if body is None:
                return
            receive = _replay(body, receive)
        await self._call_app(scope, receive, send)

    async def _read_body(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]) -> bytes | None:
        """The whole body, or None once the request was refused or the client left."""
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await self._refuse(send, 400, "Content-Length is not a number")
            if int(declared) > self.body_limit:
                return await self._refuse(send, 413, f"body of {int(declared)} bytes, the limit is serve.max_body_bytes = {self.body_limit}")
        parts, size = [], 0
        # One deadline for the whole body, from the end of its head: a wait per part would let a
        # client that drips a byte just inside the timeout hold the connection (and what it sent) forever.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return await self._refuse(send, 408, f"request body not complete within {self.cfg.body_timeout_s:g} s (serve.body_timeout_s)")
            if message["type"] == "http.disconnect":
                if "baa.refused" not in scope:  # not the protocol's own refusal (counted there)
                    self.disconnected()
                    client = (scope.get("client") or ("?",))[0]
                    log.info("baa serve: client %s disconnected while sending its body (%s %s)", client, scope["method"], scope["path"])
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.body_limit:
                return await self._refuse(send, 413, f"body over the limit serve.max_body_bytes = {self.body_limit} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _call_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # A shutdown past serve.shutdown_timeout_s cancels what still runs: answer 503, not
            # uvicorn's text 500, and end the task normally (one log line, no traceback).
            log.warning("baa serve: %s %s cancelled by the shutdown", scope["method"], scope["path"])
            if not started:
                await self._refuse(send, 503, "server is shutting down", [(b"retry-after", b"1")])


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already read body once, then the connection's own messages
    (``http.disconnect`` when the client goes away)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
