"""Which engines specviz may talk to, and how long and how much it listens: checked before any request.

An engine URL is an address specviz will send prompts to and read from, so it is the operator's to allow,
never a visitor's: `EnginePolicy.allowed` lists the origins (scheme, host, port) the operator named, and
loopback (127.0.0.0/8, ::1, localhost) is allowed only with `allow_loopback`, so a box's own services are
not reachable unless the operator says so. A URL with credentials in it, or not http(s), is refused.
Redirects are never followed (the client is built with `follow_redirects=False`), so an allowed engine
cannot send specviz on to one that is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from specviz.serving.hosts import is_loopback


class EngineError(ValueError):
    """An engine could not be used; the message is one sentence."""


DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, lower-cased, the port made explicit."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise EngineError(f"{url!r} is not an http:// or https:// URL.")
    if parts.username is not None or parts.password is not None:
        raise EngineError(f"the engine URL {display(url)} carries credentials; give the address alone.")
    if not parts.hostname:
        raise EngineError(f"{url!r} names no host.")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise EngineError(f"{url!r} has no valid port.") from None
    return scheme, parts.hostname.lower(), port


def display(url: str) -> str:
    """The URL without anything a user or password could hide in (for messages)."""
    parts = urlsplit(url.strip())
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def base_url(url: str) -> str:
    """The server's root: no trailing slash, no trailing /v1 (the OpenAI paths are added per request)."""
    scheme, host, port = origin_of(url)
    path = urlsplit(url.strip()).path.rstrip("/")
    path = path.removesuffix("/v1")
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{path}"


@dataclass(frozen=True)
class EnginePolicy:
    allowed: tuple[str, ...] = ()  # URLs (or bare origins) the operator allowed; any path on their origin is
    allow_loopback: bool = False  # this machine's own addresses, on any port
    connect_s: float = 10.0  # to open a connection
    read_s: float = 120.0  # between two reads of one response (a slow CPU engine's first token counts here)
    total_s: float = 900.0  # one request from start to its last byte
    max_bytes: int = 16_000_000  # one response; past it, reading stops

    def __post_init__(self):
        for url in self.allowed:
            origin_of(url)  # a bad entry fails when the policy is made, not at the first request

    def check(self, url: str) -> str:
        """The URL, if this policy allows its origin; otherwise one sentence, before any connection."""
        scheme, host, port = origin_of(url)
        if self.allow_loopback and is_loopback(host):
            return url
        if any(origin_of(a) == (scheme, host, port) for a in self.allowed):
            return url
        hint = ("loopback is not allowed unless the operator says so" if is_loopback(host) else
                "only the engines the operator listed are")
        raise EngineError(f"the engine at {display(url)} is not allowed: {hint}.")

    def with_urls(self, *urls: str) -> EnginePolicy:
        """This policy, also allowing these URLs' origins (the ones an operator named on the command line)."""
        return replace(self, allowed=self.allowed + tuple(u for u in urls if u))
