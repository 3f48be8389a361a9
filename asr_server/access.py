"""Who may use the server: API keys, short-lived browser tokens, browser origins, per-key quotas.

Plain objects with no I/O and no clock: the transport passes the request's
headers and query, and ``now``. Secrets are compared in constant time and
never logged or sent: only a key's *name* appears in logs, metrics and the
``session`` message.

* **Keys.** ``Authorization: Bearer KEY`` (or ``Token KEY``, as Deepgram's
  SDKs send it). When no key is configured, every request is let in (the
  command line then listens on loopback only unless told otherwise).
* **Tokens.** Browsers cannot set headers on a WebSocket, so a backend that
  holds a key mints a token (``POST /v1/tokens``, or Deepgram's ``POST
  /v1/auth/grant``) and the page passes it as ``?token=`` (or in the header or
  subprotocol where a key would go). A token is good once, for
  ``token_ttl_s``, with its key's quotas.
* **Origins.** A request with an ``Origin`` header (a browser) is let in only
  from the server's own origin or one given with ``--allowed-origin``, keys
  or no keys: otherwise any page a user visits could drive a server on their
  machine. Requests without ``Origin`` (programs) are not affected.
* **Quotas.** Per key: channels streaming at once, and new streams per
  minute (``quota_exceeded``, retryable, with ``retry_after``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .errors import OriginNotAllowed, QuotaExceeded, Unauthorized
from .options import whole_number
from .scheduler.admission import counted_channels

__all__ = ["ApiKey", "AccessOptions", "Principal", "ANONYMOUS", "Access", "parse_keys", "turn_credentials", "is_loopback", "MAX_TOKENS"]

# Tokens outstanding at most (minted, neither used nor expired): minting past it is refused.
MAX_TOKENS = 10_000


@dataclass(frozen=True)
class ApiKey:
    """A key and its limits (0: no limit)."""

    name: str
    secret: str = field(repr=False)
    max_channels: int = 0
    streams_per_minute: int = 0


@dataclass(frozen=True)
class Principal:
    """Who a request was let in as (the name of its key; ``None`` when the server has no keys)."""

    name: str | None
    max_channels: int = 0
    streams_per_minute: int = 0
    # A token's settings for the session it opens (JSON text: an OpenAI client secret's session).
    settings: str | None = None


ANONYMOUS = Principal(None)


@dataclass(frozen=True)
class AccessOptions:
    keys: tuple[ApiKey, ...] = ()
    # Browser origins let in besides the server's own (``scheme://host[:port]``; ``*``: any).
    allowed_origins: tuple[str, ...] = ()
    token_ttl_s: float = 60.0
    # TURN servers' shared secret: each WebRTC session gets credentials of its own (turn_credentials).
    turn_secret: str | None = field(default=None, repr=False)


def parse_keys(text: str, source: str = "keys file") -> tuple[ApiKey, ...]:
    """``name:key`` per line, optionally followed by ``channels=N`` and ``per_minute=N``; ``#`` comments.

    Raises ValueError naming the line for anything else, so a typo never
    leaves a key silently unusable (or a stale one usable).
    """
    keys: list[ApiKey] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, *limits = line.split()
        name, sep, secret = head.partition(":")
        if not sep or not name or not secret:
            raise ValueError(f"{source} line {number}: expected name:key")
        values = {"channels": 0, "per_minute": 0}
        for item in limits:
            option, eq, value = item.partition("=")
            limit = whole_number(value)
            if option not in values or not eq or limit is None:
                raise ValueError(f"{source} line {number}: unknown limit {item!r} (channels=N, per_minute=N)")
            values[option] = limit
        keys.append(ApiKey(name, secret, values["channels"], values["per_minute"]))
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: a key name appears twice")
    return tuple(keys)


def turn_credentials(secret: str, name: str, now_unix: float, ttl_s: float = 3600.0) -> tuple[str, str]:
    """Short-lived TURN credentials (the TURN REST API scheme coturn's ``use-auth-secret`` checks):
    the username is ``expiry:name``, the credential base64(HMAC-SHA1(secret, username))."""
    username = f"{int(now_unix + ttl_s)}:{name}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


class Access:
    """Keys, tokens and quotas of one server."""

    def __init__(self, options: AccessOptions = AccessOptions()) -> None:
        self.options = options
        self._keys: tuple[ApiKey, ...] = ()
        self._tokens: dict[str, tuple[Principal, float]] = {}  # token -> (principal, expires at)
        self.set_keys(options.keys)
        self._channels: dict[str, int] = {}  # key name -> channels streaming now
        self._starts: dict[str, deque[float]] = {}  # key name -> start times within the last minute

    @property
    def enabled(self) -> bool:
        """Whether requests need a key (or a token)."""
        return bool(self._keys)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self._keys)

    def set_keys(self, keys: Iterable[ApiKey]) -> None:
        """Replace the keys (a reload): a removed key is refused from the next request on;
        streams it opened go on. Tokens minted with a removed key stop working."""
        self._keys = tuple(keys)
        known = set(self.key_names)
        self._tokens = {t: v for t, v in self._tokens.items() if v[0].name in known}

    # -- requests -------------------------------------------------------------------

    def check_origin(self, origin: str | None, own: Iterable[str]) -> None:
        """Refuse a browser request from a page that is neither ours nor allowed."""
        if origin is None:
            return
        allowed = self.options.allowed_origins
        if "*" in allowed or origin.rstrip("/").lower() in {o.rstrip("/").lower() for o in (*allowed, *own)}:
            return
        raise OriginNotAllowed(f"pages from {origin} may not use this server (see --allowed-origin)")

    def authenticate(self, authorization: str | None, token: str | None, now: float, *, tokens: bool = False) -> Principal:
        """The principal of a request's ``Authorization`` header or ``token`` (used up here).
        ``tokens``: a minted token may also stand in the header, as a key does (``Bearer TOKEN``:
        what Deepgram's clients send with a temporary token); only a stream's handshake may."""
        if not self.enabled:
            return ANONYMOUS
        if authorization:
            scheme, _, secret = authorization.strip().partition(" ")
            if scheme.lower() in ("bearer", "token"):
                key = self._key(secret.strip())
                if key is not None:
                    return Principal(key.name, key.max_channels, key.streams_per_minute)
                if tokens and secret.strip():
                    return self._use_token(secret.strip(), now, "neither a valid API key nor a token (unknown, expired or already used)")
            raise Unauthorized("the API key is not valid")
        if token:
            return self._use_token(token, now, "the token is not valid: unknown, expired or already used")
        raise Unauthorized("an API key is required: send Authorization: Bearer KEY, or ?token= from POST /v1/tokens")

    def _use_token(self, token: str, now: float, refusal: str) -> Principal:
        self._expire(now)
        held = self._tokens.pop(token, None)
        if held is not None:
            return held[0]
        raise Unauthorized(refusal)

    def mint_token(self, principal: Principal, now: float, ttl_s: float | None = None, settings: str | None = None) -> tuple[str, float]:
        """A single-use token for ``principal`` and its lifetime in seconds (at most ``token_ttl_s``).
        ``settings``: what the session it opens is to start with (the principal it stands for carries them)."""
        self._expire(now)
        if len(self._tokens) >= MAX_TOKENS:
            raise QuotaExceeded("too many tokens outstanding; retry shortly", retry_after=self.options.token_ttl_s)
        ttl = self.options.token_ttl_s if ttl_s is None else max(1.0, min(ttl_s, self.options.token_ttl_s))
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (replace(principal, settings=settings), now + ttl)
        return token, ttl

    # -- quotas ---------------------------------------------------------------------

    def start(self, principal: Principal, channels: int, now: float, finishing: int = 0) -> None:
        """Count a stream of ``principal`` in, or refuse it (``quota_exceeded``). Pair with :meth:`end`.
        ``finishing``: of the key's channels, those of streams their clients closed, still finishing:
        they count only past as many again as the quota, as for the server's channel limit."""
        name = principal.name
        if name is None:
            return
        busy = self._channels.get(name, 0)
        streaming = counted_channels(busy, finishing, principal.max_channels)
        if principal.max_channels and streaming + channels > principal.max_channels:
            raise QuotaExceeded(
                f"key {name!r} has {streaming} of its {principal.max_channels} channels streaming; end one or retry later", retry_after=5.0,
            )
        starts = self._starts.setdefault(name, deque())
        while starts and starts[0] <= now - 60.0:
            starts.popleft()
        if principal.streams_per_minute and len(starts) >= principal.streams_per_minute:
            raise QuotaExceeded(
                f"key {name!r} started {len(starts)} streams in the last minute, its limit", retry_after=max(0.1, round(starts[0] + 60.0 - now, 1)),
            )
        starts.append(now)
        self._channels[name] = busy + channels

    def end(self, principal: Principal, channels: int) -> None:
        name = principal.name
        if name is None:
            return
        left = self._channels.get(name, 0) - channels
        if left > 0:
            self._channels[name] = left
        else:
            self._channels.pop(name, None)

    def channels(self, name: str) -> int:
        return self._channels.get(name, 0)

    # -- internals ------------------------------------------------------------------

    def _key(self, secret: str) -> ApiKey | None:
        found = None
        for key in self._keys:  # every key compared, in constant time: no timing hint of a near miss
            if hmac.compare_digest(key.secret.encode(), secret.encode()):
                found = key
        return found

    def _expire(self, now: float) -> None:
        expired = [t for t, (_, until) in self._tokens.items() if until <= now]
        for token in expired:
            del self._tokens[token]


def is_loopback(host: str) -> bool:
    """Whether a listening address reaches this machine only."""
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
