"""`specviz loadtest`: many users at once against a running app, through its JSON API only.

    specviz loadtest --url http://127.0.0.1:7860 --users 20 --seconds 30 [--json OUT] [--pid PID]

Every user is a `gradio_client.Client` of its own (a separate session, like a browser tab), all
started together. They mix runs, replays and inputs the server must refuse with one clear sentence;
some users drop a streaming run mid-way. Reported: throughput, queue waits, and every surprise.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import httpx
from gradio_client import Client
from gradio_client.utils import QueueError, Status

PROMPT = "the man said that it was good and"
KINDS = ("generate", "race", "replay", "same_distribution",  # valid; then bad inputs the server must refuse
         "empty_prompt", "zero_k", "unknown_trace", "greedy_distribution")
QUEUED = {Status.STARTING, Status.JOINING_QUEUE, Status.IN_QUEUE}


@dataclass(frozen=True)
class Request:
    kind: str
    api: str
    args: dict
    expect: str | None = None  # None: a valid request; else a word the server's refusal must contain


@dataclass(frozen=True)
class Record:
    kind: str
    valid: bool
    outcome: str  # "ok", "refused" (bad input, clearly), "dropped" (disconnected on purpose), "error", "queue_full"
    message: str = ""
    wait: float | None = None  # seconds from submit until the job left the queue
    rank: int | None = None  # the furthest back in the queue it was seen (0 = next to run)
    seconds: float = 0.0


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
        if not (isinstance(last, dict) and last.get("event") == "done"):
            return "error", f"ended without a 'done' message: {str(last)[:120]}"
        return "ok", ""
    if error is None:
        return "error", f"bad input accepted: {request.args}"
    if outputs:  # a refusal comes before any result, never after a partial one
        return "error", f"streamed {len(outputs)} messages, then refused: {text}"
    if not one_sentence(text) or request.expect not in text.lower():
        return "error", f"unclear refusal (wanted one sentence about {request.expect!r}): {text!r}"
    return "refused", text


def call(client: Client, request: Request, poll: float, timeout: float) -> Record:
    """One request, watched from this thread: when it leaves the queue and how far back it stood."""
    start, wait, rank = time.monotonic(), None, None
    job = client.submit(api_name=request.api, **request.args)
    while not job.done():
        status = job.status()
        if status.code == Status.IN_QUEUE and status.rank is not None:
            rank = max(rank or 0, status.rank)
        if wait is None and status.code not in QUEUED:
            wait = time.monotonic() - start
        if time.monotonic() - start > timeout:
            job.cancel()
            return Record(request.kind, request.expect is None, "error", f"no answer in {timeout} s", wait, rank,
                          timeout)
        time.sleep(poll)
    outcome, message = judge(request, job.exception(), job.outputs())
    seconds = time.monotonic() - start  # the wait, too, if it finished between two looks (an upper bound)
    return Record(request.kind, request.expect is None, outcome, message, seconds if wait is None else wait, rank,
                  seconds)


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

    def summary(self) -> dict:
        waits = [r.wait for r in self.records if r.wait is not None]
        outcomes = Counter((r.kind, r.outcome) for r in self.records)
        done = sum(r.valid and r.outcome == "ok" for r in self.records)
        return {"users": self.users, "seconds": round(self.seconds, 3),
                "requests": {k: {o: n for (k2, o), n in sorted(outcomes.items()) if k2 == k}
                             for k in sorted({k for k, _ in outcomes})},
                "throughput": done / self.seconds if self.seconds > 0 else 0.0,
                "wait_s": percentiles(waits),
                "max_queue_rank": max((r.rank for r in self.records if r.rank is not None), default=None),
                "rss_mb": {k: None if v is None else round(v / 2**20, 1)
                           for k, v in (("before", self.rss_before), ("after", self.rss_after))},
                "errors": [f"{r.kind}: {r.message}" for r in self.records if r.outcome == "error"]}


def percentiles(values: list[float]) -> dict:
    if len(values) < 2:  # statistics.quantiles needs two points
        return dict.fromkeys(("p50", "p95", "max"), values[0] if values else None)
    q = statistics.quantiles(values, n=100, method="inclusive")  # q[i]: the (i+1)th percentile
    return {"p50": q[49], "p95": q[94], "max": max(values)}


def rss_bytes(pid: int) -> int:
    import psutil  # only for --pid

    return psutil.Process(pid).memory_info().rss


def run_load(url: str, users: int, seconds: float | None = None, requests_per_user: int | None = None,
             mix=KINDS, disconnect: int = 1, max_new_tokens: int = 8, samples: int = 16,
             disconnect_tokens: int = 256, seed: int = 0, poll: float = 0.02, timeout: float = 120.0,
             pid: int | None = None) -> LoadResult:
    """`users` users at once, each taking requests round-robin from the seeded shuffle of `mix` until it
    has made `requests_per_user` or `seconds` have passed (whichever first), and `disconnect` more users
    that each drop one long stream. With `pid`, the server's RSS before and after."""
    if seconds is None and requests_per_user is None:
        raise ValueError("give seconds, requests_per_user or both: otherwise the load never stops")
    url = url.rstrip("/")
    probe = Client(url, verbose=False)
    try:
        trace = next(iter(probe.predict(api_name="/info")["shipped_traces"]), None)
    finally:
        probe.close()
    order = requests(mix, trace, max_new_tokens, samples)
    random.Random(seed).shuffle(order)
    started: list[float] = []  # set by the barrier, once every user has connected
    ended: list[float] = []  # when each user's last request finished (closing a client is no load)
    barrier = threading.Barrier(users + disconnect, action=lambda: started.append(time.monotonic()))
    rss_before = rss_bytes(pid) if pid else None

    def user(index: int) -> list[Record]:
        client = None
        try:
            client = Client(url, verbose=False)
            barrier.wait(timeout)
            out = [drop_stream(url, client, disconnect_tokens, timeout)] if index >= users else []
            while index < users and (requests_per_user is None or len(out) < requests_per_user):
                if seconds is not None and time.monotonic() - started[0] > seconds:
                    break
                # user i goes round the mix from its own place in it: every kind is in flight at once
                out.append(call(client, order[(index + len(out)) % len(order)], poll, timeout))
            ended.append(time.monotonic())
            return out
        except Exception as e:  # noqa: BLE001 - a user that fails must not leave the others at the barrier
            barrier.abort()
            return [Record("user", True, "error", f"{type(e).__name__}: {e}")]
        finally:
            if client is not None:
                client.close()

    with ThreadPoolExecutor(users + disconnect) as pool:
        records = [r for rs in pool.map(user, range(users + disconnect)) for r in rs]
    elapsed = max(ended) - started[0] if started and ended else 0.0
    return LoadResult(users, elapsed, records, rss_before, rss_bytes(pid) if pid else None)


def table(summary: dict) -> str:
    w, rss = summary["wait_s"], summary["rss_mb"]
    lines = [f"{summary['users']} users, {summary['seconds']:.1f} s: {summary['throughput']:.2f} completed runs/s",
             "queue wait s: " + "  ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in w.items())
             + f"  (furthest back in the queue: {summary['max_queue_rank']})"]
    lines += [f"server RSS MB: {rss['before']} before, {rss['after']} after"] if rss["before"] is not None else []
    lines += [f"  {kind:<20} " + "  ".join(f"{o} {n}" for o, n in outcomes.items())
              for kind, outcomes in summary["requests"].items()]
    return "\n".join(lines + ([f"error: {e}" for e in summary["errors"]] or ["no unexpected errors"]))


def cmd_loadtest(args) -> int:
    seconds = 30.0 if args.seconds is None and args.requests is None else args.seconds
    result = run_load(args.url, args.users, seconds, args.requests, disconnect=args.disconnect,
                      max_new_tokens=args.max_new_tokens, samples=args.samples, seed=args.seed, pid=args.pid,
                      timeout=args.timeout)
    summary = result.summary()
    print(table(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary | {"records": [asdict(r) for r in result.records]}, f, indent=1)
    return 1 if summary["errors"] else 0


def register(sub) -> None:
    p = sub.add_parser("loadtest", help="many users at once against a running app: throughput, queue waits, errors")
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--seconds", type=float, default=None, help="start no request after this (default: 30, "
                                                               "or none with --requests)")
    p.add_argument("--requests", type=int, default=None, help="requests per user")
    p.add_argument("--disconnect", type=int, default=1, help="more users, each dropping a streaming run mid-way")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per run (short runs: a test, not a bench)")
    p.add_argument("--samples", type=int, default=16, help="samples per side of /same_distribution")
    p.add_argument("--seed", type=int, default=0, help="shuffles the order of the request mix")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a request may take, its queue wait included, before it counts as an error")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the summary and every request")
    p.add_argument("--pid", type=int, default=None, help="the server's process id: its RSS before and after")
    p.set_defaults(func=cmd_loadtest)
