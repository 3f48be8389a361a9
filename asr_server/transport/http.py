"""The plain HTTP routes served beside the WebSocket: health, metrics, tokens, the captioning page.

:func:`route` answers any request that is not the WebSocket handshake on
``/v1/listen`` (it returns None for that one, to let the handshake go on),
and refuses a handshake that access control turns away (HTTP 401, 403) before
any WebSocket exists. When API keys are configured, every route but
``/healthz`` and the page's files needs one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import json
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import SecurityError
from websockets.http11 import Request, Response
from websockets.streams import StreamReader

from .. import __version__
from ..access import ANONYMOUS, Principal
from ..errors import AsrError, ClientError, InvalidOption, NotReady, OverloadError, TokensDisabled, wire_info
from ..metrics import OPENMETRICS, TEXT
from ..options import whole_number
from ..protocol.client_json import read_json
from ..protocol.openai_realtime import CLIENT_SECRETS_PATH, REALTIME_PATH, OpenAiDialect, default_realtime_options
from ..protocol.twilio import TWILIO_PATH
from .fanout import SESSIONS_PATH, parse_follow_path, session_list, sse_events, transcript_response
from .gate import LINGER_S, Refusal, Ticket
from .static import StaticFile
from ..scheduler.policy import Priority

if TYPE_CHECKING:
    from ..server import AsrServer

__all__ = ["LISTEN_PATH", "REALTIME_PATH", "TOKENS_PATH", "select_subprotocol", "route", "health", "response", "error_response", "OneRequestConnection"]

LISTEN_PATH = "/v1/listen"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
DEEPGRAM_SUBPROTOCOLS = ("token", "bearer")  # Deepgram's browser clients: the scheme, then the key or token
TOKENS_PATH = "/v1/tokens"
GRANT_PATH = "/v1/auth/grant"  # Deepgram's temporary-token request (its SDKs' ``auth.v1.tokens.grant``)
TOKEN_PATHS = (TOKENS_PATH, GRANT_PATH, CLIENT_SECRETS_PATH)  # POST: a single-use token, in our shape or a vendor's
RESUME_TOKEN_HEADER = "Asr-Resume-Token"  # a session's own resume token: its transcript, without a key
MAX_HELD_BYTES = 64 * 1024  # bytes after a request head held until its answer is out (a WebSocket client sends none)
MAX_HEAD_BYTES = 64 * 1024  # a request head held whole until its end, up to this (longer: websockets judges it as it comes)
MAX_BODY_BYTES = 16 * 1024  # a request body read (a token request's JSON); a larger or chunked one is refused unread
TLS_HANDSHAKE_S = 10.0  # a TLS handshake is cut off after this long (websockets' own default for it)
TLS_SHUTDOWN_S = 10.0  # ... and a TLS close that the client does not answer
CLIENT_PREFIX = "/client/"  # the browser client's modules, which allowed origins' pages may import
# Headers read as one value: a request that repeats one is refused (websockets' Headers.get raised,
# and the client got a 500 and the log a traceback). List-valued ones are read joined (``_joined``).
SINGLE_HEADERS = ("Host", "Authorization", "Origin", RESUME_TOKEN_HEADER, "Last-Event-ID")


def route(server: "AsrServer", connection: "OneRequestConnection", request: Request) -> Response | Awaitable[Response] | None:
    repeated = next((name for name in SINGLE_HEADERS if len(request.headers.get_all(name)) > 1), None)
    if repeated is not None:
        return error_response(ClientError(f"the {repeated} header came more than once; send it once"))
    if connection.sent_body and not _reads_body(request, connection):
        return error_response(_refused_body(request))
    if request.method == "HEAD" and _headable(server, urlsplit(request.path).path):
        # Uptime monitors and load balancers often ask HEAD: the GET answer's status and headers.
        answer = _route(server, connection, dataclasses.replace(request, method="GET"))
        assert isinstance(answer, Response)  # the health check and the page's files answer at once
        return dataclasses.replace(answer, body=b"")
    return _route(server, connection, request)


def _reads_body(request: Request, connection: "OneRequestConnection") -> bool:
    return request.method == "POST" and urlsplit(request.path).path in TOKEN_PATHS and connection.body is not None


def _refused_body(request: Request) -> ClientError:
    if request.method == "POST" and urlsplit(request.path).path in TOKEN_PATHS:
        return ClientError(f"a token request's body is a JSON object of at most {MAX_BODY_BYTES} bytes, sent with Content-Length")
    return ClientError("this server reads no request body here: options go in the query string")


def _joined(headers: Headers, name: str) -> str:
    """A list-valued header, sent once or more (RFC 9110 5.3: the same as one comma-separated line)."""
    return ", ".join(headers.get_all(name))


def _headable(server: "AsrServer", path: str) -> bool:
    return path == "/healthz" or path in server.static


def _route(server: "AsrServer", connection: "OneRequestConnection", request: Request) -> Response | Awaitable[Response] | None:
    parts = urlsplit(request.path)
    path = parts.path
    post = path in TOKEN_PATHS
    followed = parse_follow_path(path)
    transcribed = parse_follow_path(path, "transcript")
    if request.method == "OPTIONS" and transcribed is not None:
        return _preflight(server, request)
    if request.method != ("POST" if post else "GET"):
        return response(http.HTTPStatus.METHOD_NOT_ALLOWED, b'{"error": "method not allowed"}', "application/json",
                        extra=[("Allow", "POST" if post else "GET, HEAD" if _headable(server, path) else "GET")])
    if path == "/healthz":
        status = http.HTTPStatus.OK if server.ready else http.HTTPStatus.SERVICE_UNAVAILABLE
        return response(status, json.dumps(health(server)).encode(), "application/json")
    if path in (LISTEN_PATH, REALTIME_PATH, TWILIO_PATH, *TOKEN_PATHS, "/metrics", SESSIONS_PATH) or followed or transcribed:
        query = parse_qs(parts.query)
        upgrade = "websocket" in _joined(request.headers, "Upgrade").lower()
        handshake = path in (LISTEN_PATH, REALTIME_PATH, TWILIO_PATH) or (followed is not None and upgrade)
        resume_token = request.headers.get(RESUME_TOKEN_HEADER) if transcribed is not None else None
        try:
            if resume_token is not None:
                # A session's own client may read its transcript with its resume token, whatever it streamed with.
                _check_origin(server, request.headers)
                return _shared(transcript_response(server, ANONYMOUS, transcribed, query, resume_token), request)
            # Only a handshake may use a token (a token cannot mint another, nor read metrics).
            principal = _authorize(server, request, handshake, query.get("token", [None])[0] if handshake else None)
        except AsrError as error:
            server.refused_access(error, path)
            return error_response(error)
        if handshake:
            connection.principal = principal
            return None  # go on with the WebSocket handshake
        if post:
            return _mint(server, principal, path, query, connection.body)
        if path == SESSIONS_PATH:
            return response(http.HTTPStatus.OK, json.dumps({"sessions": session_list(server, principal)}).encode(), "application/json")
        if transcribed is not None:
            return _shared(transcript_response(server, principal, transcribed, query), request)
        if followed is not None:
            return sse_events(server, principal, followed, request, query)  # awaited by websockets
        return _metrics(server, request)
    page = server.static.get(path)
    if page is not None:
        return _static(server, request, path, page)
    return response(http.HTTPStatus.NOT_FOUND, b'{"error": "not found"}', "application/json")


def _preflight(server: "AsrServer", request: Request) -> Response:
    """A browser's CORS preflight for a transcript read from an allowed origin's page (its
    ``Asr-Resume-Token`` or ``Authorization`` header needs one): 204 with what it may send, or
    403 ``origin_not_allowed``."""
    origin = request.headers.get("Origin")
    try:
        _check_origin(server, request.headers)
    except AsrError as error:
        return error_response(error)
    return response(http.HTTPStatus.NO_CONTENT, b"", "text/plain", extra=[
        *_cors_headers(origin), ("Access-Control-Allow-Methods", "GET"),
        ("Access-Control-Allow-Headers", f"{RESUME_TOKEN_HEADER}, Authorization"), ("Access-Control-Max-Age", "600")])


def _check_origin(server: "AsrServer", headers: Headers) -> None:
    """Refuse (``origin_not_allowed``) a browser request whose page is neither the server's own nor allowed."""
    server.access.check_origin(headers.get("Origin"), server.own_origins(headers.get("Host")))


def _cors_headers(origin: str | None) -> list[tuple[str, str]]:
    return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")] if origin else []


def _static(server: "AsrServer", request: Request, path: str, page: StaticFile) -> Response:
    """A page file, or 304 when the browser holds this version (``If-None-Match``): the files are
    checked on every load (``no-cache``), and sent again only when the server's copy changed."""
    extra = [("ETag", page.etag), *_module_cors(server, request, path)]
    if page.etag in _joined(request.headers, "If-None-Match"):
        # No Content-Length: in a 304 it would have to be the file's, and no body follows.
        headers = Headers([("Cache-Control", "no-cache"), ("Connection", "close"), *extra])
        return Response(http.HTTPStatus.NOT_MODIFIED.value, http.HTTPStatus.NOT_MODIFIED.phrase, headers, b"")
    return response(http.HTTPStatus.OK, page.body, page.content_type, cache="no-cache", extra=extra)


def _module_cors(server: "AsrServer", request: Request, path: str) -> list[tuple[str, str]]:
    """CORS headers for the browser client's files (``/client/``) fetched by an allowed origin's page:
    a module script and an audio worklet from another origin load only with them. Other pages get
    the files without (their browser then refuses the import); nothing is refused here."""
    if not path.startswith(CLIENT_PREFIX):
        return []
    origin = request.headers.get("Origin")
    try:
        _check_origin(server, request.headers)
    except AsrError:
        origin = None
    return _cors_headers(origin) or [("Vary", "Origin")]  # one answer per origin, for any cache between


def _shared(answer: Response | Awaitable[Response], request: Request) -> Response | Awaitable[Response]:
    """A transcript answer that an allowed origin's page may read (its origin was checked before)."""
    extra = _cors_headers(request.headers.get("Origin"))
    if not extra:
        return answer
    if isinstance(answer, Response):
        for name, value in extra:
            answer.headers[name] = value
        return answer

    async def shared() -> Response:
        return _shared(await answer, request)  # type: ignore[return-value]

    return shared()


def _authorize(server: "AsrServer", request: Request, handshake: bool, token: str | None) -> Principal:
    """Who a request comes from. Only a stream's handshake may use a minted token: as ``?token=``,
    or where a key would go."""
    headers = request.headers
    _check_origin(server, headers)
    authorization = headers.get("Authorization")
    if authorization is None and handshake:
        authorization = _subprotocol_credentials([p.strip() for p in _joined(headers, "Sec-WebSocket-Protocol").split(",")])
    return server.access.authenticate(authorization, token, server.clock(), tokens=handshake)


def _subprotocol_credentials(offered: Sequence[str]) -> str | None:
    """Browsers cannot set headers on a WebSocket, so their clients put the credentials in its
    subprotocols: OpenAI's as ``openai-insecure-api-key.KEY``, Deepgram's as the pair ``token``,
    KEY or ``bearer``, TOKEN. As an ``Authorization`` header, or None."""
    key = next((p[len(KEY_SUBPROTOCOL):] for p in offered if p.startswith(KEY_SUBPROTOCOL)), None)
    if key:
        return f"Bearer {key}"
    scheme = next((i for i, p in enumerate(offered[:-1]) if p.lower() in DEEPGRAM_SUBPROTOCOLS), None)
    return None if scheme is None else f"{offered[scheme]} {offered[scheme + 1]}"


def select_subprotocol(connection: ServerConnection, subprotocols: Sequence[str]) -> str | None:
    """OpenAI's browser clients offer ``realtime`` (and the key subprotocol): answer ``realtime``.
    Deepgram's offer ``token`` (or ``bearer``) and the secret: answer the scheme, never the secret
    (Chromium fails a handshake whose offered subprotocols get no answer)."""
    if "realtime" in subprotocols:
        return "realtime"
    return next((p for p in subprotocols if p.lower() in DEEPGRAM_SUBPROTOCOLS), None)


def _mint(server: "AsrServer", principal: Principal, path: str, query: dict[str, list[str]], body: bytes | None) -> Response:
    """A single-use token for a stream: ours (``POST /v1/tokens``, ``ttl_s`` in the query or a JSON
    body), or in Deepgram's shape (``POST /v1/auth/grant``, ``{"ttl_seconds": N}``) or OpenAI's
    (``POST /v1/realtime/client_secrets``: a client secret with its session's settings)."""
    if principal is ANONYMOUS:
        return error_response(TokensDisabled("this server has no API keys: streams need no token"))
    session: dict | None = None
    settings: str | None = None
    try:
        asked = _json_object(body)
        if path == GRANT_PATH:
            ttl = _seconds("ttl_seconds", asked.get("ttl_seconds"))
        elif path == CLIENT_SECRETS_PATH:
            ttl, settings, session = _client_secret(server, asked)
        else:
            ttl = _seconds("ttl_s", query["ttl_s"][0] if "ttl_s" in query else asked.get("ttl_s"))
        token, lifetime = server.access.mint_token(principal, server.clock(), ttl, settings)
    except AsrError as error:
        return error_response(error)
    server.metrics.tokens_minted.labels(principal.name).inc()
    if path == GRANT_PATH:
        answer: dict = {"access_token": token, "expires_in": lifetime}
    elif session is not None:
        answer = {"value": token, "expires_at": math.floor(time.time() + lifetime), "session": session}
    else:
        answer = {"token": token, "expires_in": lifetime, "key": principal.name}
    return response(http.HTTPStatus.OK, json.dumps(answer).encode(), "application/json")


def _client_secret(server: "AsrServer", asked: dict) -> tuple[float | None, str | None, dict]:
    """An OpenAI client secret's request: ``{"expires_after": {"seconds": N}, "session": {...}}``.
    Its life, its session's settings (checked now, and kept as the session they make, in JSON:
    what the request held besides, up to the body's 16 KiB, is not held for the token's life)
    and that session."""
    if server.runner is None:
        raise NotReady("the model is still loading; retry shortly", retry_after=2.0)
    expires = asked.get("expires_after") or {}
    if not isinstance(expires, dict):
        raise InvalidOption("expires_after must be an object, such as {\"anchor\": \"created_at\", \"seconds\": 600}")
    dialect = OpenAiDialect(default_realtime_options(), server.model_name, tuple(server.runner.languages))
    settings = asked.get("session")
    if settings is not None:
        try:
            dialect.configure(settings)
        except AsrError as error:
            raise InvalidOption(f"session: {error.message}") from None
    session = dialect.session_object()
    return _seconds("expires_after.seconds", expires.get("seconds")), None if settings is None else json.dumps(session), session


def _json_object(body: bytes | None) -> dict:
    """A token request's body: nothing, or a JSON object (ClientError for anything else)."""
    if not body or not body.strip():
        return {}
    try:
        value = read_json(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ClientError("a token request's body must be a JSON object, such as {\"ttl_s\": 30}")
    return value


def _seconds(name: str, raw: object) -> float | None:
    """A token's asked-for life, None for the server's; InvalidOption for anything but a positive
    number of seconds (it used to be the server's default without a word)."""
    if raw is None:
        return None
    try:
        ttl = math.nan if isinstance(raw, bool) else float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past a float's range
        ttl = math.nan
    if not (math.isfinite(ttl) and ttl > 0):
        raise InvalidOption(f"{name} must be a positive number of seconds, got {str(raw)[:20]!r}")
    return ttl


def error_response(error: AsrError) -> Response:
    """A request refused before any WebSocket: the error message's JSON, with the table's HTTP status."""
    info = wire_info(error)
    body: dict = {"type": "error", "code": error.code, "message": error.message, "retryable": info.retryable}
    extra: list[tuple[str, str]] = []
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
        extra.append(("Retry-After", str(max(1, round(error.retry_after)))))
    if info.http_status == http.HTTPStatus.UNAUTHORIZED:
        extra.append(("WWW-Authenticate", 'Bearer realm="asr-server"'))
    status = http.HTTPStatus(info.http_status)
    return response(status, json.dumps(body).encode(), "application/json", extra=extra)


def health(server: "AsrServer") -> dict:
    """``/healthz``: readiness and capacity, for load balancers and dashboards."""
    budget = server.budget
    return {
        "status": "ok" if server.ready else ("stopping" if server.stopping else "starting"),
        "version": __version__,
        "model": server.model_name,
        "api_keys": server.access.enabled,  # whether streams need a key or token (a 401 says as much)
        "active_channels": server.active_channels,
        "finishing_channels": server.finishing_channels,  # closed by their clients: not counted against max_channels
        "max_channels": server.max_channels,
        "capacity": server.capacity.to_wire() if server.capacity else None,
        "load_level": int(server.governor.level),
        "accepting": [p.value for p in Priority if server.governor.admits(p)] if server.ready else [],
        "memory": {**budget.to_wire(), "reserved_mib": server.reserved_bytes >> 20} if budget else None,
    }


def response(status: http.HTTPStatus, body: bytes, content_type: str, cache: str = "no-store", extra: list[tuple[str, str]] | None = None) -> Response:
    headers = Headers([
        ("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", cache),
        ("X-Content-Type-Options", "nosniff"), ("Connection", "close"),  # one request per connection
        *(extra or []),
    ])
    return Response(status.value, status.phrase, headers, body)


def _announces_body(line: bytes) -> bool:
    name, colon, value = line.partition(b":")
    name = name.strip().lower()
    return bool(colon) and (name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"))


def _unreadable(head: bytes) -> str | None:
    """Why websockets' parser would refuse a whole request ``head`` (a version other than HTTP/1.1
    or 1.0, a malformed line, bytes that are not ASCII), or None: it reads it, or answers the
    refusal itself (a line or header block too long: 414, 431)."""
    reader = StreamReader()
    reader.feed_data(head)
    reader.feed_eof()
    try:
        next(Request.parse(reader.read_line))
    except (StopIteration, SecurityError):
        return None
    except Exception as error:  # noqa: BLE001 (whatever the parser raises, the client is told)
        return str(error)[:120] or type(error).__name__
    return None  # not reached: a whole head parses to its end


def _expects_continue(head: bytes) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body."""
    return any(name.strip().lower() == b"expect" and value.strip().lower() == b"100-continue"
               for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:]))


def _readable_length(lines: Sequence[bytes]) -> int | None:
    """The length of a body announced by the head ``lines`` (those that announce one) that is
    read whole before the request is answered: one ``Content-Length`` of at most
    ``MAX_BODY_BYTES``; None for a chunked or larger body, which is dropped unread."""
    if len(lines) != 1:
        return None
    name, _, value = lines[0].partition(b":")
    value = value.strip()
    length = whole_number(value.decode("latin-1"))
    if name.strip().lower() != b"content-length" or length is None or length > MAX_BODY_BYTES:
        return None
    return length


class OneRequestConnection(ServerConnection):
    """A connection that reads one HTTP request before anything else.

    websockets parses the bytes after the handshake request as WebSocket
    frames at once, even when the request is plain HTTP: a pipelined second
    request then failed the connection before the answer to the first was
    written (the client got nothing, and websockets logged an internal
    error). Here what follows the first request is held back until the
    handshake is over: fed on for a WebSocket (a client sends no frame
    before our 101 anyway), dropped for plain HTTP, whose connection closes
    after its one answer. What is held is bounded: past
    ``MAX_HELD_BYTES`` the connection is not read again (an SSE answer may
    wait 8 s for news, and a client sent 90 MiB meanwhile; a WebSocket
    client that sends that much before our 101 broke the protocol, and its
    session ends at its idle timeout).

    The request head itself is held until its end (up to ``MAX_HEAD_BYTES``)
    so that a body it announces can be taken out, and read (a token request's
    small JSON) or refused with an answer (:meth:`_without_body`), and so
    that a head websockets cannot parse gets an answer (:func:`_unreadable`)
    where websockets closed it without one. With ``tls`` the connection runs
    its own TLS handshake after the gate has counted it (:meth:`connection_made`).
    """

    def __init__(
        self, *args: object, admit: Callable[[asyncio.Transport], Ticket | Refusal] | None = None, tls: ssl.SSLContext | None = None,
        handshakes: set[asyncio.Task[None]] | None = None, **kwargs: object,
    ) -> None:
        """``admit``: asked for every accepted connection (:class:`~.gate.ConnectionGate`): a refused one
        is answered 503 ``overloaded`` and closed once its request head has come (or at once).
        ``tls``: serve TLS on the accepted connection, asked of ``admit`` before its handshake (see
        :meth:`connection_made`); ``handshakes`` holds the handshakes under way, for a stop to cancel."""
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._admit = admit
        self._tls = tls
        self._handshakes = handshakes if handshakes is not None else set()
        self._secured = tls is None  # whether websockets' connection has its (TLS) transport
        self._early: list[bytes | None] = []  # what came with the end of the TLS handshake, before it (None: the end)
        self._ticket: Ticket | Refusal | None = None
        self.principal: Principal = ANONYMOUS  # who the handshake was let in as (see route)
        self._reading_head = True  # until the first request head has been fed
        self._tail = b""  # the last bytes of the request head seen so far (to find its end across reads)
        self._held: bytes | None = None  # bytes after the request head, until the handshake is over
        self._head: bytearray | None = bytearray()  # the request head so far, while held whole (None: passed on as it came)
        self.sent_body = False  # the request came with a body, taken out of its head (route refuses it where none is read)
        self.body: bytes | None = None  # that body, when it was small enough to read (MAX_BODY_BYTES)
        self._body_length: int | None = None  # the body still to come before the head goes on to websockets
        self._waiting_head = b""  # ... and that head

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admit is not None:
            self._ticket = self._admit(transport)  # type: ignore[arg-type]
        if self._tls is None:
            self._opened(transport)
            return
        # TLS: the gate counts the connection from its accept, not from the end of its handshake
        # (with asyncio's own TLS a client could hold thousands of handshakes the gate never saw,
        # each up to TLS_HANDSHAKE_S). A refused one is answered after a handshake of LINGER_S at most.
        refused = self._ticket if isinstance(self._ticket, Refusal) else None
        if refused is not None and not refused.linger:
            self._end_unsecured(transport)
            return
        transport.pause_reading()  # the client's hello waits for the TLS layer, not for this protocol
        handshake = self.loop.create_task(self._secure(transport, LINGER_S if refused is not None else TLS_HANDSHAKE_S))
        self._handshakes.add(handshake)
        handshake.add_done_callback(self._handshakes.discard)

    async def _secure(self, transport: asyncio.BaseTransport, timeout_s: float) -> None:
        assert self._tls is not None
        try:
            secured = await self.loop.start_tls(
                transport, self, self._tls, server_side=True, ssl_handshake_timeout=timeout_s,  # type: ignore[arg-type]
                ssl_shutdown_timeout=TLS_SHUTDOWN_S)
        except asyncio.CancelledError:  # the server stops
            self._end_unsecured(transport)
            raise
        except Exception:  # a failed or timed-out handshake; asyncio logs why at debug level
            self._end_unsecured(transport)
            return
        if secured is None or secured.is_closing():  # lost as the handshake ended
            self._end_unsecured(transport)
            return
        self._opened(secured)

    def _opened(self, transport: asyncio.BaseTransport) -> None:
        """The connection can carry HTTP: hand it to websockets, or answer a refusal."""
        self._secured = True
        super().connection_made(transport)
        if isinstance(self._ticket, Refusal):
            self._refuse(self._ticket)
        early, self._early = self._early, []
        for data in early:
            if data is None:
                self.eof_received()
            else:
                self.data_received(data)

    def _end_unsecured(self, transport: asyncio.BaseTransport) -> None:
        """A TLS connection that ends before websockets had it: its place at the gate back, its socket closed."""
        transport.abort()
        if self._ticket is not None:
            self._ticket.close()

    def _refuse(self, refusal: Refusal) -> None:
        """Answer at once; close when the request head is in (closing on unread bytes resets the
        connection, and the client may lose the answer), after ``LINGER_S``, or at once."""
        self.transport.write(error_response(OverloadError(refusal.message, retry_after=1.0)).serialize())
        if refusal.linger:
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ticket is not None:
            self._ticket.close()
        if self._secured:  # else websockets never had it (a TLS handshake that did not end well)
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._secured:  # asyncio's TLS layer reads on as its handshake ends, before start_tls returns
            self._early.append(data)
            return
        refused = isinstance(self._ticket, Refusal)
        if not self._reading_head and not refused:  # the handshake is over: a WebSocket's frames go straight through
            super().data_received(data)
            return
        if self._held is not None:
            self._held += data
            if self._body_length is not None:
                self._read_body()
            elif len(self._held) > MAX_HELD_BYTES:  # stop reading: the answer is due before any more (SSE: up to 8 s)
                self.transport.pause_reading()
            return
        cut = self._head_end(data)
        if refused:  # answered already: the request is read only to close cleanly
            if cut >= 0:
                self.transport.close()
            return
        if cut < 0:
            self._hold_head(data)
            return
        if self._ticket is not None:
            self._ticket.opened()  # its request head is in (an SSE answer may then wait 8 s for news)
        self._held = data[cut:]
        self._head_in(data[:cut])

    def _head_in(self, head: bytes) -> None:
        """The request head's end is in: on to websockets, once a small body it announces is read."""
        if self._head is not None:  # held whole: a body it announces is taken out
            head = self._without_body(bytes(self._head) + head)
            self._head = None
            if (why := _unreadable(head)) is not None:
                # websockets closes such a request without a word: say why first (its close follows).
                self._body_length = None
                self.transport.write(error_response(ClientError(f"this server reads HTTP/1.1 requests only, and this one is not one: {why}")).serialize())
        if self._body_length is not None:  # a small body is read before the request is answered
            self._waiting_head = head
            if len(self._held or b"") < self._body_length and _expects_continue(head):
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it before a body of over 1 KiB
            self._read_body()
            return
        super().data_received(head)

    def _read_body(self) -> None:
        """Once the announced body is in, keep it (``body``) and hand the head on (a body that does
        not come in full is cut off by websockets' opening timeout, as a head that does not)."""
        assert self._held is not None and self._body_length is not None
        if len(self._held) < self._body_length:
            return
        self.body, self._held = self._held[: self._body_length], self._held[self._body_length:]
        self._body_length = None
        head, self._waiting_head = self._waiting_head, b""
        super().data_received(head)

    def _hold_head(self, data: bytes) -> None:
        if self._head is not None and len(self._head) + len(data) <= MAX_HEAD_BYTES:
            self._head += data
            return
        if self._head:
            super().data_received(bytes(self._head))
        self._head = None
        super().data_received(data)

    def _without_body(self, head: bytes) -> bytes:
        """``head`` without the headers that announce a body (websockets closed such a request
        without a word, and ``curl -d``, ``fetch`` with a body or a JSON POST got an empty reply).
        A small body (one ``Content-Length`` up to ``MAX_BODY_BYTES``) is read whole before the head
        goes on (``body``: a token request's JSON); any other is held and dropped like any bytes
        after the head. :func:`route` refuses a body where it reads none."""
        lines = head.split(b"\r\n")
        announcing = [line for line in lines[1:] if _announces_body(line)]
        self.sent_body = bool(announcing)
        if announcing:
            self._body_length = _readable_length(announcing)
        return b"\r\n".join([lines[0]] + [line for line in lines[1:] if not _announces_body(line)])

    def eof_received(self) -> None:
        if not self._secured:
            self._early.append(None)
            return
        super().eof_received()

    def _head_end(self, data: bytes) -> int:
        """Where in ``data`` the request head ends (just past its blank line), or -1 if not yet."""
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        self._tail = seen[-3:]
        return -1 if end < 0 else end + 4 - (len(seen) - len(data))

    async def handshake(self, *args: object, **kwargs: object) -> None:
        try:
            await super().handshake(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self._reading_head = False
        held, self._held = self._held, None
        upgraded = self.response is not None and self.response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS
        if held and upgraded:
            # Reading stays paused past MAX_HELD_BYTES: a WebSocket client may send nothing before
            # our 101, and resuming here would override websockets' own pause on its read-ahead.
            super().data_received(held)


def _metrics(server: "AsrServer", request: Request) -> Response:
    """Prometheus text, or OpenMetrics with exemplars for a scraper whose Accept asks for it."""
    wants_openmetrics = "application/openmetrics-text" in _joined(request.headers, "Accept")
    body = server.metrics.render(openmetrics_format=wants_openmetrics)
    return response(http.HTTPStatus.OK, body, OPENMETRICS if wants_openmetrics else TEXT)
