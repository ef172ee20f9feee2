"""`specviz loadtest`: many users at once against a running app, through its JSON API only.

    specviz loadtest --url http://127.0.0.1:7860 --users 20 --seconds 30 [--json OUT] [--pid PID]
    specviz loadtest --mix workshop --users 30          # a room: bench/workshop.py

Every user is a `gradio_client.Client` of its own (a separate session, like a browser tab), all
started together. They mix runs, replays and inputs the server must refuse with one clear sentence;
some users drop a streaming run mid-way. Reported: throughput, waits (by kind of request), how the
queue's estimates compared with the waits that followed, and every surprise. The command:
`specviz.commands.loadtest`.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from gradio_client import Client
from gradio_client.utils import QueueError, Status

from specviz.bench.load_summary import by_kind, estimates, percentiles

PROMPT = "the man said that it was good and"
KINDS = ("generate", "race", "replay", "same_distribution",  # valid; then bad inputs the server must refuse
         "empty_prompt", "zero_k", "unknown_trace", "greedy_distribution")


@dataclass(frozen=True)
class Request:
    kind: str
    api: str
    args: dict
    expect: str | None = None  # None: a valid request; else a word the server's refusal must contain
    streams: bool = True  # its last message says "done"; else it answers once (/whatif)


@dataclass(frozen=True)
class Record:
    kind: str
    valid: bool
    outcome: str  # "ok", "refused" (bad input, clearly), "dropped" (disconnected on purpose), "error", "queue_full"
    message: str = ""
    wait: float | None = None  # seconds from submit until its first result (a queue update is none) or its end
    rank: int | None = None  # the furthest back in the queue it was seen (0 = next to run)
    seconds: float = 0.0
    first_token: float | None = None  # seconds from submit until a message carried a token (runs and races)
    estimate: float | None = None  # the queue's first estimate of the wait, in seconds
    estimated_wait: float | None = None  # the wait that followed that estimate, in seconds
    recorded: bool = False  # answered from the server's recording of the same request


@dataclass
class Watch:
    """What one request's messages said, and when they were seen."""

    start: float
    result: float | None = None  # the first message that is not a queue update
    token: float | None = None
    rank: int | None = None
    estimate: tuple[float, float] | None = None  # (when, seconds) of the first queue update with an estimate
    recorded: bool = False

    def see(self, message, now: float) -> None:
        if not isinstance(message, dict):
            self.result = self.result or now
            return
        if message.get("event") == "queued":
            self.rank = max(self.rank or 0, message["position"] - 1)
            if self.estimate is None and message.get("estimate_s") is not None:
                self.estimate = (now, message["estimate_s"])
            return
        self.result = self.result or now
        self.recorded = self.recorded or bool(message.get("recorded_at"))
        if self.token is None and tokens(message):
            self.token = now


def tokens(message: dict) -> int:
    """The tokens a run's or a race's message shows (0 for other messages)."""
    if message.get("event") == "round":
        return len(message["round"]["new_token_ids"])
    lanes = [message.get(k) for k in ("ar", "spec")]
    return sum(lane["tokens"] for lane in lanes if isinstance(lane, dict))


def requests(kinds, trace: str | None, max_new_tokens: int = 8, samples: int = 16) -> list[Request]:
    small = {"prompt": PROMPT, "max_new_tokens": max_new_tokens}
    sampled = {"prompt": PROMPT, "samples": samples, "temperature": 1.0}
    every = {
        "generate": Request("generate", "/generate", small),
        "race": Request("race", "/race", small),
        "replay": Request("replay", "/replay", {"trace": trace}),
        "same_distribution": Request("same_distribution", "/same_distribution", sampled),
        "empty_prompt": Request("empty_prompt", "/generate", small | {"prompt": ""}, "empty"),
        "zero_k": Request("zero_k", "/generate", small | {"k": 0}, "k must be"),
        "unknown_trace": Request("unknown_trace", "/replay", {"trace": "no_such_trace.json"}, "shipped"),
        "greedy_distribution": Request("greedy_distribution", "/same_distribution", sampled | {"temperature": 0.0},
                                       "temperature"),
    }
    return [every[k] for k in kinds if k != "replay" or trace is not None]  # no shipped trace: nothing to replay


def one_sentence(message: str) -> bool:
    """One line, one sentence: it ends with a period and has no sentence break (". " before a capital)."""
    m = message.strip()
    return bool(m) and "\n" not in m and m.endswith(".") and not re.search(r"[.!?]\s+[A-Z]", m)


def judge(request: Request, error: BaseException | None, outputs: list) -> tuple[str, str]:
    """(outcome, message) of one finished request."""
    text = str(error or "")
    if isinstance(error, QueueError):
        return "queue_full", text
    if request.expect is None:
        last = outputs[-1] if outputs else None
        if error is not None:
            return "error", text or type(error).__name__
        if request.streams and not (isinstance(last, dict) and last.get("event") == "done"):
            return "error", f"ended without a 'done' message: {str(last)[:120]}"
        if last is None:
            return "error", "no answer"
        return "ok", ""
    if error is None:
        return "error", f"bad input accepted: {request.args}"
    if outputs:  # a refusal comes before any result, never after a partial one
        return "error", f"streamed {len(outputs)} messages, then refused: {text}"
    if not one_sentence(text) or request.expect not in text.lower():
        return "error", f"unclear refusal (wanted one sentence about {request.expect!r}): {text!r}"
    return "refused", text


def call(client: Client, request: Request, poll: float, timeout: float) -> Record:
    """One request, watched from this thread: how far back in the queue it stood (Gradio's queue, then the
    model's: its "queued" messages), when its first result and its first token came, and what it was told."""
    watch = Watch(time.monotonic())
    job, seen = client.submit(api_name=request.api, **request.args), 0
    while not job.done():
        status = job.status()
        if status.code == Status.IN_QUEUE and status.rank is not None:
            watch.rank = max(watch.rank or 0, status.rank)
        outputs, now = job.outputs(), time.monotonic()
        for m in outputs[seen:]:
            watch.see(m, now)
        seen = len(outputs)
        if now - watch.start > timeout:
            job.cancel()
            return Record(request.kind, request.expect is None, "error", f"no answer in {timeout} s", rank=watch.rank,
                          seconds=timeout)
        time.sleep(poll)
    outputs, end = job.outputs(), time.monotonic()
    for m in outputs[seen:]:  # those that came between the last look and the end: seen at the end (upper bounds)
        watch.see(m, end)
    outcome, message = judge(request, job.exception(), outputs)
    first = watch.result or end
    estimate, estimated_wait = (watch.estimate[1], first - watch.estimate[0]) if watch.estimate else (None, None)
    return Record(request.kind, request.expect is None, outcome, message, first - watch.start, watch.rank,
                  end - watch.start, None if watch.token is None else watch.token - watch.start, estimate,
                  estimated_wait, watch.recorded)


def connect(url: str) -> Client:
    """A `Client` of its own (a session, like a browser tab). Over plain HTTP it skips loading the CA certificates,
    which httpx does for every request (~50 ms of CPU, taken from a server on the same machine); https is verified."""
    return Client(url, verbose=False, ssl_verify=not url.lower().startswith("http://"))


def positional(parameters: list[dict], values: dict) -> list:
    """Gradio's REST API takes every parameter, in order: `values` where given, else the defaults."""
    return [values.get(p["parameter_name"], p.get("parameter_default")) for p in parameters]


def drop_stream(url: str, client: Client, max_new_tokens: int, timeout: float) -> Record:
    """A streaming /generate over Gradio's REST API whose connection is closed after the first round."""
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    data = positional(params, {"prompt": PROMPT, "max_new_tokens": max_new_tokens})
    start, events, name = time.monotonic(), [], None
    with httpx.Client(timeout=timeout) as http:
        event = http.post(f"{url}/gradio_api/call/generate", json={"data": data}).raise_for_status().json()
        with http.stream("GET", f"{url}/gradio_api/call/generate/{event['event_id']}") as stream:
            for line in stream.iter_lines():  # server-sent events: "event: <name>", then "data: ..."
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name != "heartbeat":  # heartbeats come while it waits
                    events.append(name)
                    break  # leaving the block closes the connection mid-stream
    seconds = time.monotonic() - start
    if events == ["generating"]:
        return Record("disconnect", True, "dropped", seconds=seconds)
    return Record("disconnect", True, "error", f"no round to drop the stream after: {events}"[:300], seconds=seconds)


@dataclass
class LoadResult:
    users: int
    seconds: float
    records: list[Record] = field(default_factory=list)
    rss_before: int | None = None
    rss_after: int | None = None
    server: dict = field(default_factory=dict)  # what /info said: the pair, the limits, the app's defaults

    def summary(self) -> dict:
        waits = [r.wait for r in self.records if r.wait is not None]
        outcomes = Counter((r.kind, r.outcome) for r in self.records)
        done = sum(r.valid and r.outcome == "ok" for r in self.records)
        recorded = Counter(r.kind for r in self.records if r.recorded)
        return {"users": self.users, "seconds": round(self.seconds, 3),
                "requests": {k: {o: n for (k2, o), n in sorted(outcomes.items()) if k2 == k}
                             for k in sorted({k for k, _ in outcomes})},
                "throughput": done / self.seconds if self.seconds > 0 else 0.0,
                "wait_s": percentiles(waits),
                "wait_by_kind": by_kind(self.records, lambda r: r.wait),
                "first_token_by_kind": by_kind(self.records, lambda r: r.first_token),
                "recorded_answers": dict(sorted(recorded.items())),
                "estimates": estimates(self.records),
                "max_queue_rank": max((r.rank for r in self.records if r.rank is not None), default=None),
                "rss_mb": {k: None if v is None else round(v / 2**20, 1)
                           for k, v in (("before", self.rss_before), ("after", self.rss_after))},
                "errors": [f"{r.kind}: {r.message}" for r in self.records if r.outcome == "error"]}


def rss_bytes(pid: int) -> int:
    import psutil  # only for --pid

    return psutil.Process(pid).memory_info().rss


def server_info(url: str) -> dict:
    probe = connect(url)
    try:
        return probe.predict(api_name="/info")
    finally:
        probe.close()


@dataclass(frozen=True)
class Load:
    """What a load test sends: `users` users at once, each taking requests round-robin from the seeded shuffle of
    `mix` until it has made `requests_per_user` or `seconds` have passed (whichever first), and `disconnect` more
    users that each drop one long stream. With `plan` (the server's /info in, requests out), user i makes requests
    i, i + users, … of the plan instead. `think`: a pause of up to this many seconds (seeded) before each request
    after a user's first."""

    users: int
    seconds: float | None = None
    requests_per_user: int | None = None
    mix: tuple[str, ...] = KINDS
    disconnect: int = 1
    max_new_tokens: int = 8  # per run of the test mix
    samples: int = 16  # per side of /same_distribution (the test mix)
    disconnect_tokens: int = 256  # the dropped stream's length (at most what the server allows)
    seed: int = 0
    plan: Callable[[dict], list[Request]] | None = None
    think: float = 0.0

    def __post_init__(self):
        if self.seconds is None and self.requests_per_user is None and self.plan is None:
            raise ValueError("give seconds, requests_per_user or both: otherwise the load never stops")


def request_order(load: Load, info: dict) -> list[Request]:
    """Every request of the load in one order: the plan's, or the mix shuffled by the seed."""
    if load.plan is not None:
        return load.plan(info)
    order = requests(load.mix, next(iter(info["shipped_traces"]), None), load.max_new_tokens, load.samples)
    random.Random(load.seed).shuffle(order)
    return order


def user_requests(load: Load, order: list[Request], index: int) -> Iterator[Request]:
    """User `index`'s requests in turn: its share of the plan, or the mix from its own place in it (every kind in
    flight at once), `requests_per_user` of them or until the time is up."""
    if load.plan is not None:
        yield from order[index::load.users]
        return
    for made in itertools.count() if load.requests_per_user is None else range(load.requests_per_user):
        yield order[(index + made) % len(order)]


@dataclass
class Crowd:
    """A load's users, started together by a barrier once every one has connected; `started` holds when that was
    (set by the barrier), `ended` when each user's last request finished (closing a client is no load)."""

    url: str
    load: Load
    order: list[Request]
    disconnect_tokens: int
    poll: float
    timeout: float
    started: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)
    barrier: threading.Barrier = field(init=False)

    def __post_init__(self):
        self.barrier = threading.Barrier(self.load.users + self.load.disconnect,
                                         action=lambda: self.started.append(time.monotonic()))

    def requests_of(self, client: Client, index: int) -> list[Record]:
        """A dropped stream (the users past `load.users`), or this user's requests until they or the time run out."""
        if index >= self.load.users:
            return [drop_stream(self.url, client, self.disconnect_tokens, self.timeout)]
        out, pauses = [], random.Random(self.load.seed * 7919 + index)
        for request in user_requests(self.load, self.order, index):
            if self.load.seconds is not None and time.monotonic() - self.started[0] > self.load.seconds:
                break
            if self.load.think and out:  # a visitor reads the answer before the next click
                time.sleep(pauses.uniform(0, self.load.think))
            out.append(call(client, request, self.poll, self.timeout))
        return out

    def user(self, index: int) -> list[Record]:
        client = None
        try:
            client = connect(self.url)
            # the session opened (Gradio builds its state at its first queued event), as a browser's is on load
            client.predict(0.5, 1, 0.0, api_name="/whatif")
            self.barrier.wait(self.timeout)
            out = self.requests_of(client, index)
            self.ended.append(time.monotonic())
            return out
        except Exception as e:  # noqa: BLE001 - a user that fails must not leave the others at the barrier
            self.barrier.abort()
            return [Record("user", True, "error", f"{type(e).__name__}: {e}")]
        finally:
            if client is not None:
                client.close()


def run_load(url: str, load: Load, poll: float = 0.02, timeout: float = 120.0, pid: int | None = None) -> LoadResult:
    """`load` against the app at `url`, each request watched every `poll` s and given up after `timeout` s. With
    `pid`, the server's RSS before and after."""
    url = url.rstrip("/")
    info = server_info(url)
    disconnect_tokens = min(load.disconnect_tokens, info["limits"]["max_new_tokens"])  # a long run the server allows
    crowd = Crowd(url, load, request_order(load, info), disconnect_tokens, poll, timeout)
    rss_before = rss_bytes(pid) if pid else None
    everyone = load.users + load.disconnect
    with ThreadPoolExecutor(everyone) as pool:
        records = [r for rs in pool.map(crowd.user, range(everyone)) for r in rs]
    elapsed = max(crowd.ended) - crowd.started[0] if crowd.started and crowd.ended else 0.0
    server = {k: info.get(k) for k in ("pair", "limits", "defaults", "recorded_answers")}
    return LoadResult(load.users, elapsed, records, rss_before, rss_bytes(pid) if pid else None, server)
