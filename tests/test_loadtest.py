"""The load test: a real `specviz serve` (a subprocess on loopback, the tiny pair) under 20 users at once.

The users mix runs, replays and bad inputs, and one more drops a streaming run mid-way. Every valid
request must end with its "done" message, every bad one with one clear sentence, it must still serve
afterwards, and a second phase of the same load must grow its memory by less a request than a request
that kept a copy of the pair's weights would. The server runs in a process of
its own so that its memory is measured alone. Every wait is bounded: a hang fails instead of stalling.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from types import SimpleNamespace

import httpx
import pytest

from specviz.bench.loadtest import (
    KINDS, Load, LoadResult, Record, Request, call, connect, judge, one_sentence, requests, rss_bytes, run_load,
)

USERS = 20
REQUESTS_PER_USER = 3  # 60 requests: every kind of the mix 7 or 8 times
START_SECONDS = 120  # the bound on the server's start (imports and the tiny pair's warm-up)
SECONDS = 240  # the bound on the load test itself; it normally takes well under a minute
REQUEST_SECONDS = 60  # the bound on one request, queue wait included
# The leak bound, per request of a later load phase (the first phase's growth includes first-use allocations and
# fills what the server keeps by design, bounded: Gradio's state of each browser session, ~170 KB for each new
# client, up to `--max-sessions`; the recorded answers, up to `--recorded-mb`). The server here keeps 10 sessions and
# 1 MB of recordings, so both are full before the second phase and what it adds is what is not bounded. Measured on
# the tiny pair (AMD EPYC Zen 4, 2 cores, 2026-11-27): healthy 0.041-0.058 MB a request over a phase of 69 requests;
# a server made to keep a 0.66 MB copy in `Session.stream` for every model job 0.131-0.148 MB a request, failing.
# (With the defaults, 200 sessions and 64 MB, the healthy growth was 0.14 MB a request, a bound of 0.3 MB sat above
# it, and that copy, at 0.24 MB a request, passed: the same leak, hidden by the sessions still filling.)
LEAK_BOUND_PER_REQUEST = 0.1 * 2**20
EACH = ["ok"] * 4 + ["refused"] * 4  # the outcomes of KINDS: four valid requests, then four bad ones
# A word each refusal must contain (the server's own sentences, in specviz.runs)
REFUSALS = {"empty_prompt": "empty", "zero_k": "k must be between", "unknown_trace": "not one of the shipped traces",
            "greedy_distribution": "temperature above 0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(proc: subprocess.Popen, url: str, log) -> None:
    start = time.monotonic()
    with httpx.Client(timeout=5) as http:  # one client: not a new one (and its TLS setup) every look
        while time.monotonic() - start < START_SECONDS:
            assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if http.get(f"{url}/gradio_api/info").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    pytest.fail(f"the server did not answer within {START_SECONDS} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`specviz serve` on the tiny pair in a subprocess: `served.url`, `served.pid`. Killed when done."""
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "server.log"
    # one intra-op thread: the tiny pair gains nothing from more, and spinning OpenMP threads fight the clients.
    # Heartbeats every 0.25 s (Gradio's own end-to-end tests' rate; 15 s by default): a closing client waits for its
    # heartbeat stream's next line, up to 1 s, and the test closes one after every phase
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                        "GRADIO_HEARTBEAT_INTERVAL": "0.25"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "specviz.cli", "serve", "--draft", "tiny", "--target", "tiny",
                                 "--draft-quant", "none", "--host", "127.0.0.1", "--port", str(port),
                                 "--max-sessions", "10", "--recorded-mb", "1"],  # full in a phase: LEAK_BOUND's note
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(proc, url, log)
        yield SimpleNamespace(url=url, pid=proc.pid, log=log)
    finally:
        proc.kill()  # nothing here tests its shutdown
        proc.wait(10)


def one_of_each(url: str) -> list[Record]:
    """Every kind of request once, one after another, from a client of its own."""
    client = connect(url)
    try:
        trace = client.predict(api_name="/info")["shipped_traces"][0]
        return [call(client, r, poll=0.02, timeout=REQUEST_SECONDS) for r in requests(KINDS, trace)]
    finally:
        client.close()


def load_phase(served, seed: int):
    """20 users at once (3 requests each, one more dropping a stream), then a settle and every kind once
    more: the records of both, and how many requests reached the server."""
    result = run_load(served.url, Load(USERS, requests_per_user=REQUESTS_PER_USER, disconnect=1, seed=seed),
                      timeout=REQUEST_SECONDS)
    # the server still serves (and refuses) as before, after all that. No pause is needed first for the dropped
    # stream's run to end: that run held the model before these were sent, and jobs take the model in turn (first
    # come, first served), so the first of them runs only once it has ended
    final = one_of_each(served.url)
    return result, final, len(result.records) + len(final)


def test_twenty_users_at_once_all_served_bad_inputs_refused_no_leak(served):
    start = time.monotonic()
    warm = one_of_each(served.url)  # first-use allocations (the endpoints' paths, caches) must not count
    assert [r.outcome for r in warm] == EACH, warm

    result, final, _ = load_phase(served, seed=0)
    summary = result.summary()
    print(summary)
    assert summary["errors"] == []
    records = result.records
    assert len(records) == USERS * REQUESTS_PER_USER + 1
    assert {r.kind for r in records} == set(KINDS) | {"disconnect"}  # every kind was in the mix

    valid = [r for r in records if r.valid and r.kind != "disconnect"]
    assert [r.outcome for r in valid] == ["ok"] * len(valid)  # each ended with its "done" message
    assert summary["max_queue_rank"] >= 1  # 20 users, one run at a time: requests really waited their turn

    bad = [r for r in records if not r.valid]
    for r in bad:  # one error each, before any result: a sentence naming what was wrong
        assert r.outcome == "refused" and one_sentence(r.message), r
        assert REFUSALS[r.kind] in r.message.lower(), r
    assert [r.outcome for r in records if r.kind == "disconnect"] == ["dropped"]
    assert [r.outcome for r in final] == EACH, final

    # the leak: what each of two more phases of the same load adds, per request, the smaller kept: a leak adds in
    # every phase, while the heap's one-off growth (a new arena or pool page) lands in one (once 0.1003 MB a request,
    # a fresh clone's full run, AMD EPYC Zen 4, 2026-11-28; alone it passed). On a 2-core Xeon (family 6 model 207):
    # healthy 0.076 then 0.042 MB a request; the 0.66 MB copy of LEAK_BOUND's note 0.14 (the smaller), failing
    growth = []
    for seed in (1, 2):
        before = rss_bytes(served.pid)
        result, final, n = load_phase(served, seed=seed)
        after = rss_bytes(served.pid)
        assert result.summary()["errors"] == [] and [r.outcome for r in final] == EACH
        growth.append((after - before) / n)
        print(f"RSS before phase {seed + 1} {before / 2**20:.1f} MB, after {after / 2**20:.1f} MB: "
              f"{growth[-1] / 2**20:.3f} MB a request over {n}")
    per_request = min(growth)
    assert per_request < LEAK_BOUND_PER_REQUEST, f"the server grew by {per_request / 2**20:.2f} MB a request"
    assert time.monotonic() - start < SECONDS


def test_summary_counts_outcomes_and_takes_percentiles_of_queue_waits():
    ok = [Record("generate", True, "ok", wait=float(w), rank=w % 3, seconds=w + 0.5) for w in range(1, 10)]
    records = ok + [Record("empty_prompt", False, "refused", "the prompt is empty.", wait=10.0),
                    Record("race", True, "error", "boom", wait=11.0), Record("disconnect", True, "dropped")]
    s = LoadResult(users=3, seconds=4.5, records=records, rss_before=2**20, rss_after=3 * 2**20).summary()
    assert s["requests"] == {"disconnect": {"dropped": 1}, "empty_prompt": {"refused": 1}, "generate": {"ok": 9},
                             "race": {"error": 1}}
    assert s["throughput"] == 2.0  # 9 completed valid runs in 4.5 s
    # waits 1..11 s: inclusive percentiles interpolate between the sorted waits (p95: index 9.5 -> 10.5)
    assert s["wait_s"] == {"p50": 6.0, "p95": 10.5, "max": 11.0}
    assert s["max_queue_rank"] == 2
    assert s["rss_mb"] == {"before": 1.0, "after": 3.0}
    assert s["errors"] == ["race: boom"]


def test_judge_wants_done_for_valid_and_one_clear_sentence_for_bad():
    valid, bad = Request("generate", "/generate", {}), Request("empty_prompt", "/generate", {}, "empty")
    assert judge(valid, None, [{"event": "round"}, {"event": "done"}]) == ("ok", "")
    assert judge(valid, None, [{"event": "round"}])[0] == "error"  # cut short
    refusal = "the prompt is empty: type something."
    assert judge(bad, ValueError(refusal), []) == ("refused", refusal)
    assert judge(bad, None, [{"event": "done"}])[0] == "error"  # accepted
    assert judge(bad, ValueError("The prompt is empty. Try again."), [])[0] == "error"  # two sentences
    assert judge(bad, ValueError("something went wrong."), [])[0] == "error"  # does not say what
    assert judge(bad, ValueError("the prompt is empty."), [{"event": "round"}])[0] == "error"  # after a result


# ---------------------------------------------------------------- a workshop (issue 31)

WORKSHOP_USERS = 30
# seconds added to each target forward: the model's time, not the in-process clients' and Gradio's, then makes the
# waits, as on the real pair; with 10 ms, a machine busy with other work made the waits 1.5x the estimates, and with
# 30 ms a CI run under the other test worker made them 1.55x (within 2x 71 %): the burst of example replays at the
# start slows the first races 2.5x, which no estimate made before them can know (2 cores, 2 busy threads beside:
# 30 ms, waits 1.35x the estimates; 50 ms, 1.11x)
SLOW_FORWARD = 0.05


@pytest.fixture
def workshop_server():
    """The app in-process as `specviz serve --room` serves it (recorded answers, the examples recorded after
    loading), on the tiny pair slowed by SLOW_FORWARD a target forward."""
    from specviz.engine import DecodeConfig
    from specviz.models import PairSpec
    from specviz.models.tiny import tiny_pair
    from specviz.settings.limits import Limits
    from specviz.serving.recorded import Recordings
    from specviz.runs.room import ROOM_DEFAULTS, ROOM_LIMITS, record_examples
    from specviz.serving.session import Session
    from specviz.settings.spec import flat_values
    from specviz.server import build_server, launch
    from specviz.ui.examples import EXAMPLES

    session = Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), recordings=Recordings(2**26))
    forward = session.pair.target.forward

    def slow(*args, **kwargs):
        time.sleep(SLOW_FORWARD)
        return forward(*args, **kwargs)

    session.pair.target.forward = slow
    limits, defaults = Limits(**ROOM_LIMITS), DecodeConfig(**ROOM_DEFAULTS)
    demo = build_server(session, limits, defaults=defaults)
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True, limits=limits)
    try:
        record_examples(session, limits, [p for _, p in EXAMPLES], flat_values(defaults)).join(120)
        assert len(session.recordings) == len(EXAMPLES)
        yield url
    finally:
        demo.close()


def test_a_workshop_of_thirty_examples_stream_at_once_every_request_is_served_the_estimates_hold(workshop_server):
    from specviz.bench.workshop import BAD, workshop_requests

    bad = len(BAD) + 1
    load = Load(WORKSHOP_USERS, disconnect=1, plan=partial(workshop_requests, n=2 * WORKSHOP_USERS, seed=0, bad=bad))
    # the visitors in a process of their own, as browsers are: in the server's, their threads' Python work would
    # take turns with the model's thread for the interpreter's lock at every torch op and slow its jobs past the
    # estimates (a busy Python thread made the embedded target's step 80x slower, a busy process 1.1x)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as visitors:
        result = visitors.submit(run_load, workshop_server, load, timeout=REQUEST_SECONDS * 2, poll=0.2).result()
    s = result.summary()
    print({k: s[k] for k in ("wait_by_kind", "first_token_by_kind", "estimates", "requests")})
    assert s["errors"] == []
    records = result.records
    assert len(records) == 2 * WORKSHOP_USERS + bad + 1
    valid = [r for r in records if r.valid and r.kind != "disconnect"]
    assert [r.outcome for r in valid] == ["ok"] * len(valid)  # nothing lost
    assert {r.kind for r in valid} == {"example", "own", "replay", "whatif", "distribution"}
    for r in (r for r in records if not r.valid):
        assert r.outcome == "refused" and one_sentence(r.message), r
    assert [r.outcome for r in records if r.kind == "disconnect"] == ["dropped"]
    examples = [r for r in valid if r.kind == "example"]
    assert all(r.recorded for r in examples) and not [r for r in valid if r.kind == "own" and r.recorded]
    assert not [r for r in examples if r.estimate is not None]  # an example click never waits for the model...
    # ...and streams at once while own prompts wait. Medians, and the slowest example against the typical own
    # prompt: the clients share the server's process, so a burst of 30 submits stalls a few examples for a
    # moment (a 2-core CI run under the other test worker: example p95 4.6 s, own p50 17.9 s; p50 0.63 s)
    waits = s["wait_by_kind"]
    assert waits["example"]["p50"] < waits["own"]["p50"] / 4
    assert waits["example"]["max"] < waits["own"]["p50"]
    assert s["max_queue_rank"] >= 5  # the own prompts really queued (the real pair's 2 s: the README's room)
    e = s["estimates"]  # each waiting job's first estimate against the wait that followed it
    assert e["n"] >= 5 and e["within_2x"] >= 0.8 and 0.5 <= e["real_to_estimate"]["p50"] <= 2.0, e
