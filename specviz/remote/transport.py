"""HTTP to an engine under an `EnginePolicy`: every URL checked first, time-outs on connect and read, a
deadline per request, a size cap per response, and every failure as one sentence (`EngineError`).

Streaming responses are Server-Sent Events (`data: {json}` lines, `data: [DONE]` at the end), read chunk by
chunk so each event keeps the time its bytes arrived: the client-side clock is what times the first token
and the decode rate, as a user of the engine would see them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx

from specviz.remote.policy import EngineError, EnginePolicy, display

ABSENT = (404, 405, 501)  # an endpoint this engine (or this version, or its flags) does not offer


def make_client(policy: EnginePolicy, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    timeout = httpx.Timeout(connect=policy.connect_s, read=policy.read_s, write=policy.read_s, pool=policy.connect_s)
    return httpx.Client(timeout=timeout, follow_redirects=False, transport=transport, trust_env=False,
                        headers={"User-Agent": "specviz-engines"})


def short(text: str, limit: int = 160) -> str:
    """One line, one sentence (an engine's own ". " becomes "; "), no trailing full stop, at most `limit`
    characters: for inside a sentence of ours."""
    line = " ".join(str(text).split()).rstrip(".").replace(". ", "; ")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def error_text(body: bytes) -> str:
    """The message an engine's error body carries (OpenAI's {"error": {"message"}}, FastAPI's {"detail"})."""
    try:
        obj = json.loads(body)
    except ValueError:
        return short(body.decode("utf-8", "replace")) or "no message"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        for value in (err.get("message") if isinstance(err, dict) else err, obj.get("detail"), obj.get("message")):
            if isinstance(value, str) and value.strip():
                return short(value)
    return short(json.dumps(obj))


@contextmanager
def failures(url: str, policy: EnginePolicy):
    """httpx's exceptions as one sentence each, naming the engine by its origin only."""
    where = display(url)
    try:
        yield
    except httpx.ConnectTimeout:
        raise EngineError(f"the engine at {where} did not accept a connection within {policy.connect_s:g} s.") from None
    except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
        raise EngineError(f"the engine at {where} did not answer within {policy.read_s:g} s.") from None
    except httpx.ConnectError as e:
        raise EngineError(f"could not connect to the engine at {where} ({short(e, 80) or 'refused'}).") from None
    except httpx.RemoteProtocolError:
        raise EngineError(f"the engine at {where} closed the connection in the middle of a response.") from None
    except httpx.HTTPError as e:
        raise EngineError(f"the request to the engine at {where} failed ({short(e, 80)}).") from None


def checked_chunks(response: httpx.Response, url: str, policy: EnginePolicy, started: float) -> Iterator[bytes]:
    """The body's chunks, stopping with one sentence past `max_bytes` or past the request's deadline."""
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > policy.max_bytes:
            raise EngineError(f"the engine at {display(url)} sent more than {policy.max_bytes:,} bytes for "
                              f"{urlsplit(url).path or '/'}; specviz stopped reading.")
        if time.perf_counter() - started > policy.total_s:
            raise EngineError(f"the engine at {display(url)} did not finish within {policy.total_s:g} s.")
        yield chunk


def raise_for_status(response: httpx.Response, url: str, policy: EnginePolicy, started: float) -> None:
    if response.status_code >= 400:
        body = b"".join(checked_chunks(response, url, policy, started))
        raise EngineError(f"the engine at {display(url)} answered {response.status_code} to "
                          f"{urlsplit(url).path or '/'}: {error_text(body)}.")
    if 300 <= response.status_code < 400:  # never followed: it could lead off the allow-list
        raise EngineError(f"the engine at {display(url)} redirected {urlsplit(url).path or '/'} elsewhere; "
                          "specviz does not follow redirects.")


def get_text(client: httpx.Client, policy: EnginePolicy, url: str) -> str | None:
    """A GET's body as text; None when the engine does not offer the endpoint (404, 405, 501)."""
    policy.check(url)
    started = time.perf_counter()
    with failures(url, policy), client.stream("GET", url) as response:
        if response.status_code in ABSENT:
            return None
        raise_for_status(response, url, policy, started)
        return b"".join(checked_chunks(response, url, policy, started)).decode("utf-8", "replace")


def sse_data(chunks: Iterable[tuple[float, bytes]]) -> Iterator[tuple[float, str]]:
    """(arrival time, payload) of each `data:` line, from (arrival time, bytes) chunks; stops at [DONE]."""
    pending = b""
    for arrived, chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue  # comments, `event:` lines, the blank line between events
            payload = line[5:].strip().decode("utf-8", "replace")
            if payload == "[DONE]":
                return
            yield arrived, payload


def stream_events(client: httpx.Client, policy: EnginePolicy, url: str, body: dict,
                  started: float | None = None) -> Iterator[tuple[float, dict]]:
    """POST `body` and yield (arrival time on `time.perf_counter`, event JSON) for each streamed event."""
    policy.check(url)
    started = time.perf_counter() if started is None else started
    with failures(url, policy), client.stream("POST", url, json=body) as response:
        raise_for_status(response, url, policy, started)
        timed = ((time.perf_counter(), chunk) for chunk in checked_chunks(response, url, policy, started))
        for arrived, payload in sse_data(timed):
            try:
                event = json.loads(payload)
            except ValueError:
                raise EngineError(f"the engine at {display(url)} streamed a line that is not JSON: "
                                  f"{short(payload, 60)}.") from None
            if isinstance(event, dict) and event.get("error"):
                raise EngineError(f"the engine at {display(url)} stopped with an error: "
                                  f"{error_text(json.dumps(event).encode())}.")
            yield arrived, event
