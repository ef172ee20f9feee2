"""Concurrency and cancellation through the real API (the app in-process on loopback, tiny pair).

Ten users at once each get their own correct result while the queue lets one run use the model at a
time; a cancelled run ends promptly, and the next run is token-identical to an uninterrupted one.
Every wait is bounded, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from gradio_client import Client
from gradio_client.utils import QueueError, Status

from specviz.engine import DecodeConfig, speculative_generate
from specviz.engine.sampling import SamplingParams
from specviz.limits import Limits
from specviz.models import encode_prompt, load_pair
from specviz.models.tiny import WORDS, tiny_pair
from specviz.ui.app import MODEL
from specviz.ui.session import PairSpec, Session

PROMPT = "the man said that it was good and"
LIMITS = Limits(max_new_tokens=200)
USERS = 10
SECONDS = 120  # the bound on the whole concurrent test


class CountingSession(Session):
    """Counts the runs holding the pair at once: the queue, not the lock, should keep it at one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.active = self.most = 0
        self.counter = threading.Lock()

    @contextmanager
    def using(self):
        with self.counter:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            with super().using() as pair:
                yield pair
        finally:
            with self.counter:
                self.active -= 1


@pytest.fixture(scope="module")
def server(serve):
    session = CountingSession(load_pair("tiny", "tiny"), PairSpec("tiny", "tiny"))
    demo, client = serve(session, LIMITS)
    return SimpleNamespace(session=session, demo=demo, client=client)


def until(condition, seconds: float, what: str) -> float:
    """Poll until condition() holds; fail after `seconds`. Returns the time it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.005)
    return time.monotonic() - start


def test_model_events_share_one_queue_slot(server):
    demo = server.demo
    assert demo._queue.default_concurrency_limit == 1 and demo._queue.max_size == LIMITS.max_queue
    model_fns = {"generate", "race", "same_distribution", "load_pair", "on_run", "on_step", "on_race",
                 "on_distribution", "on_load"}
    fns = [fn for fn in demo.fns.values() if fn.name in model_fns]
    assert {fn.name for fn in fns} == model_fns
    assert all(fn.concurrency_id == MODEL and fn.concurrency_limit in ("default", 1) for fn in fns)


def test_ten_concurrent_users_all_get_their_own_correct_result(server):
    pair = tiny_pair()
    prompts = [f"{PROMPT} {WORDS[10 + i]}" for i in range(USERS)]
    expected = []
    for i, prompt in enumerate(prompts):  # sampled with a seed per user: any mix-up changes the text
        config = DecodeConfig(k=4, max_new_tokens=8, sampling=SamplingParams(0.8), seed=i)
        expected.append(list(speculative_generate(pair, encode_prompt(pair.tokenizer, prompt), config))[-1].text)
    assert len(set(expected)) > 1
    url = server.client.src
    ready = threading.Barrier(USERS, timeout=60)

    def user(i: int) -> dict:
        client = Client(url, verbose=False)  # a session of its own, like a separate browser or script
        ready.wait()  # everyone submits at once
        return client.predict(prompts[i], 4, 8, 0.8, 0, 1.0, i, api_name="/generate")

    server.session.most = 0
    pool = ThreadPoolExecutor(USERS)
    futures = [pool.submit(user, i) for i in range(USERS)]
    finished, pending = wait(futures, timeout=SECONDS)
    if pending:  # unblock the stuck clients so their threads can be joined, then fail
        server.demo.close()
    pool.shutdown(wait=True)
    assert not pending, f"{len(pending)} of {USERS} users did not finish within {SECONDS} s"
    results = [f.result() for f in futures]
    assert [r["event"] for r in results] == ["done"] * USERS
    assert [r["text"] for r in results] == expected
    assert server.session.most == 1  # one run on the model at a time; the rest waited in the queue


def slow_target(session, monkeypatch, seconds: float = 0.03) -> list:
    """Make each target forward take a while, so a run lasts long enough to be cancelled mid-round."""
    calls: list = []
    forward = session.pair.target.forward

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(seconds)
        return forward(*args, **kwargs)

    monkeypatch.setattr(session.pair.target, "forward", slow)
    return calls


def tokens_of(endpoint: str, messages: list[dict]):
    """What must be identical between two runs: every round's tokens, or both race lanes' texts."""
    if endpoint == "/generate":
        return [m["round"]["new_token_ids"] for m in messages if m["event"] == "round"], messages[-1]["text"]
    last = messages[-1]
    return last["ar"]["text"], last["spec"]["text"], last["ar"]["tokens"], last["spec"]["tokens"]


@pytest.mark.parametrize("endpoint", ["/generate", "/race"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cancel_mid_run_ends_promptly_and_the_next_run_is_exact(server, monkeypatch, endpoint, temperature):
    args = (PROMPT, 4, 200, temperature, 0, 1.0, 5)
    reference = list(server.client.submit(*args, api_name=endpoint))  # uninterrupted
    assert reference[-1]["event"] == "done"

    calls = slow_target(server.session, monkeypatch)
    job = server.client.submit(*args, api_name=endpoint)
    until(lambda: len(job.outputs()) >= 3, 30, "three streamed messages")
    assert server.session.lock.locked()  # the run holds the pair, mid-run
    job.cancel()
    took = until(lambda: not server.session.lock.locked(), 5, "the pair released after cancel")
    n = len(calls)
    time.sleep(0.2)
    assert len(calls) == n  # nothing runs on after the release
    until(job.done, 5, "the job ended")
    assert job.status().code == Status.CANCELLED
    assert len(job.outputs()) < len(reference) and job.outputs()[-1]["event"] != "done"  # really cut short
    assert took < 5

    monkeypatch.undo()
    again = list(server.client.submit(*args, api_name=endpoint))
    assert tokens_of(endpoint, again) == tokens_of(endpoint, reference)  # no cache or RNG state carried over


def test_a_full_queue_turns_requests_away_and_serves_the_rest(serve, monkeypatch):
    session = Session(tiny_pair(), PairSpec("tiny", "tiny"))
    _, client = serve(session, Limits(max_queue=1))
    slow_target(session, monkeypatch, seconds=0.02)
    running = client.submit(PROMPT, 4, 40, api_name="/generate")
    until(lambda: session.lock.locked(), 30, "the first run started")
    waiting = client.submit(PROMPT, 4, 8, api_name="/generate")
    until(lambda: waiting.status().code == Status.IN_QUEUE, 10, "the second run queued")
    with pytest.raises(QueueError, match="Queue is full"):  # HTTP 503, at once: nothing piles up
        client.predict(PROMPT, 4, 8, api_name="/generate")
    assert running.result(timeout=60)["event"] == "done" and waiting.result(timeout=60)["event"] == "done"
