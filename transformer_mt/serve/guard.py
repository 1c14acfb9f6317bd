"""What the server checks about a request before it reads the body, and how it reads the body: the Host
allow-list, the size of the request head, the API key, JSON from browsers, and a body cut off past its
size or its time.

uvicorn bounds connections and idle time (`jobs/serve.py` passes it `limits.*`); it has no limit on a head
that arrives in one piece, on a body's size or on how long a body takes, so those are here.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from transformer_mt.config import ServeConfig
from transformer_mt.errors import ConfigError

# A browser marks the requests a page sends with one of these; curl and scripts send neither.
BROWSER_HEADERS = (b"origin", b"sec-fetch-site")
# JSON escapes a character in at most 6 bytes (\uXXXX); texts and prefixes both count; 64 KiB for the rest.
BYTES_PER_CHAR = 6
BODY_OVERHEAD = 65_536


def allowed_hosts(cfg: ServeConfig) -> set[str]:
    """The Host names answered: allowed_hosts, plus host= as the printed URL names it (the user chose it;
    with 0.0.0.0, that is what a browser opening the URL sends)."""
    hosts = {h.lower() for h in cfg.allowed_hosts}
    hosts.add(f"[{cfg.host}]" if ":" in cfg.host else cfg.host.lower())
    return hosts


# What a client without the API key may still ask: the page (it asks for the key) and the liveness check.
PUBLIC = {("GET", "/"), ("GET", "/health")}
KEY_HEADERS = (b"authorization", b"x-api-key")


def api_key(cfg: ServeConfig) -> bytes | None:
    """The API key requests must carry: api_key, or the first line of api_key_file; None for none."""
    if cfg.api_key is not None and cfg.api_key_file is not None:
        raise ConfigError("api_key and api_key_file are both set; give the key one way")
    key = cfg.api_key
    if cfg.api_key_file is not None:
        try:
            key = Path(cfg.api_key_file).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as ex:
            why = getattr(ex, "strerror", None) or ex
            raise ConfigError(f"api_key_file={cfg.api_key_file}: cannot read it ({why}); give a UTF-8 file "
                              "holding the key") from None
    if key is not None and len(key.strip()) < 16:
        raise ConfigError("the API key has fewer than 16 characters; use a long random one, e.g. "
                          "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return key.strip().encode() if key is not None else None


def loopback(host: str) -> bool:
    """Whether host= listens on this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: what it resolves to is not known here
        return False


def check_exposure(cfg: ServeConfig) -> None:
    """A server other machines reach must ask for a key, unless the user says their network is trusted."""
    key = api_key(cfg)  # (a key that cannot be read or is too short is refused here too)
    if key is None and not loopback(cfg.host) and not cfg.open_without_key:
        raise ConfigError(f"host={cfg.host} lets other machines use the server, and no API key is set: set "
                          "api_key_file= (a file holding a long random key), or open_without_key=true on a "
                          "network you trust")


def max_body_bytes(cfg: ServeConfig) -> int:
    """The largest body a request within limits.max_texts and limits.max_chars can need."""
    return 2 * cfg.limits.max_texts * cfg.limits.max_chars * BYTES_PER_CHAR + BODY_OVERHEAD


def host_name(header: str) -> str:
    """The name part of a Host header (`[::1]:8000` → `[::1]`), lowercased."""
    name = header if header.endswith("]") else header.rsplit(":", 1)[0]
    return name.lower()


class RequestGuard:
    """ASGI middleware refusing, in one line of JSON and before the app runs, a request whose Host is not
    allowed (DNS rebinding), whose head is over limits.max_header_bytes, that lacks the API key (when the
    server has one), or that a browser sent with a content type other than application/json (a page on
    another site can only send forms unasked)."""

    def __init__(self, app: ASGIApp, cfg: ServeConfig) -> None:
        self.app = app
        self.hosts = allowed_hosts(cfg)
        self.any_host = "*" in self.hosts
        self.max_header_bytes = cfg.limits.max_header_bytes
        self.key = api_key(cfg)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, one-line reason) for a request refused before the app sees it, else None."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(k) + len(v) + 4 for k, v in headers)  # ": " and CRLF
        if size > self.max_header_bytes:
            return 431, (f"the request line and headers take {size} bytes; the limit is "
                         f"{self.max_header_bytes} (limits.max_header_bytes)")
        found = {k: v.decode("latin-1") for k, v in headers}
        host = host_name(found.get(b"host", ""))
        if not self.any_host and host not in self.hosts:
            return 400, (f"this server does not answer Host {host or '(none)'!r}; to serve it, add it to "
                         f"allowed_hosts (now {sorted(self.hosts)}), or allowed_hosts=[*] to answer any")
        public = (scope["method"], scope["path"]) in PUBLIC
        if self.key is not None and not public and not self.keyed(headers):
            return 401, ("this server needs its API key: send it as `Authorization: Bearer <key>` or "
                         "`X-API-Key: <key>`")
        media = found.get(b"content-type", "").split(";")[0].strip().lower()
        from_browser = any(k in found for k in BROWSER_HEADERS)
        if scope["method"] == "POST" and from_browser and media != "application/json":
            return 415, (f"a request from a browser must be sent as application/json, not "
                         f"{media or 'no content type'}")
        return None


    def keyed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a key header holds the key (compared in constant time: its bytes leak no timing)."""
        assert self.key is not None
        for name, value in headers:
            if name == b"authorization" and not value.startswith(b"Bearer "):
                continue  # another scheme (Basic, a bare key): not ours
            if name in KEY_HEADERS and hmac.compare_digest(value.removeprefix(b"Bearer ").strip(), self.key):
                return True
        return False


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refused with 413 past `limit` bytes (by its Content-Length before reading, and
    while reading) and with 408 when it is not all there within timeout_s."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []

    async def gather() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(gather(), timeout_s)
    except ClientDisconnect:  # the client hung up, or the server is stopping: nobody reads the answer
        raise HTTPException(400, "the connection closed before the body arrived") from None
    except asyncio.TimeoutError:
        raise HTTPException(408, f"the body did not arrive within {timeout_s:g} s (limits.body_timeout_s); "
                            "send it at once", headers={"Connection": "close"}) from None
    return b"".join(chunks)


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"the body is larger than {limit} bytes, the limit that limits.max_texts and "
                         "limits.max_chars allow: split the request",
                         headers={"Connection": "close"})
