"""`specviz engines`: the policy (refused before any connection, time-outs, size cap, one sentence each), the
Prometheus difference, each adapter on answers shaped as its engine's source defines them (llama.cpp's recorded
from the real server, vLLM's and SGLang's written from their source: tests/data/engines/README.md), the race's
aggregation and prediction on made-up results, and `specviz engines race` end to end.

The end-to-end test runs the real llama-server pair where this machine has the build and the embedded GGUF
files, and a replay of that pair's recorded answers where it has not (a fresh CI machine): see its docstring.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specviz.analysis.predict import CostModel, predicted_speedup
from specviz.engine.config import DecodeConfig
from specviz.engine.sampling import SamplingParams
from specviz.remote import llama_server, llamacpp, sglang, vllm, vllm_server
from specviz.cli import main
from specviz.commands.engines import register, run
from specviz.remote.engine import complete, connect
from specviz.remote.policy import EngineError, EnginePolicy, base_url
from specviz.remote.prometheus import difference, read_counters
from specviz.remote.race import DRAFT, PLAIN, SPEC, Prompt, Run, race_order
from specviz.remote.report import build_report, format_table, write_html
from specviz.remote.results import RequestResult, SpecStats, combine
from specviz.remote.stream import chat_body, measure
from specviz.remote.summary import summarise
from specviz.remote.transport import get_text, make_client, sse_data, stream_events

DATA = Path(__file__).parent / "data" / "engines"
LLAMA = DATA / "llamacpp-0.3.36"  # recorded from the real server: see the README there
VLLM_REAL = DATA / "vllm-0.32.0"  # recorded from real vLLM CPU servers (capture_engine_fixtures.py --engine vllm)
VLLM, SGLANG = DATA / "vllm-0.29", DATA / "sglang"


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and message.count(". ") == 0


def events(path: Path) -> list[dict]:
    return [json.loads(payload) for _, payload in sse_data([(0.0, path.read_bytes())])]


def files(*pairs: tuple[str, Path]):
    """A `Get` answering each path with a recorded file (None: the endpoint is absent)."""
    table = dict(pairs)
    return lambda path: table[path].read_text() if path in table else None


def llama_get(lane: str, metrics: str = "after"):
    return files(("/props", LLAMA / f"{lane}-props.json"), ("/slots", LLAMA / f"{lane}-slots.json"),
                 ("/v1/models", LLAMA / f"{lane}-models.json"), ("/metrics", LLAMA / f"{lane}-metrics-{metrics}.txt"))


# ---------------------------------------------------------------------------------------------- the policy


def recording_transport(calls: list, handler=None) -> httpx.MockTransport:
    def handle(request):
        calls.append(str(request.url))
        return handler(request) if handler else httpx.Response(200, text="{}")
    return httpx.MockTransport(handle)


@pytest.mark.parametrize("url,allowed,loopback,fragment", [
    ("http://10.1.2.3:8000", ("http://10.1.2.4:8000",), False, "not allowed: only the engines the operator listed"),
    ("http://10.1.2.3:8001", ("http://10.1.2.3:8000",), False, "not allowed"),  # another port: another origin
    ("http://127.0.0.1:8081", (), False, "loopback is not allowed unless the operator says so"),
    ("http://user:secret@10.1.2.3:8000", ("http://10.1.2.3:8000",), False, "carries credentials"),
    ("file:///etc/passwd", (), True, "is not an http:// or https:// URL"),
])
def test_a_url_not_allowed_is_refused_before_any_connection(url, allowed, loopback, fragment):
    calls = []
    policy = EnginePolicy(allowed=allowed, allow_loopback=loopback)
    with make_client(policy, recording_transport(calls)) as client:
        for attempt in (lambda: get_text(client, policy, url + "/metrics"), lambda: connect(client, policy, url)):
            with pytest.raises(EngineError) as e:
                attempt()
            assert fragment in str(e.value) and one_sentence(str(e.value)) and "secret" not in str(e.value)
    assert calls == []


def test_allowed_origins_and_loopback():
    policy = EnginePolicy(allowed=("http://gpu-box:8000/v1",))
    assert policy.check("http://GPU-box:8000/metrics")  # the origin, any path, the host's case aside
    assert EnginePolicy(allow_loopback=True).check("http://[::1]:9000") and \
        EnginePolicy(allow_loopback=True).check("http://localhost:1")
    assert base_url("http://gpu-box:8000/v1/") == "http://gpu-box:8000"
    with pytest.raises(EngineError):
        EnginePolicy(allowed=("gpu-box:8000",))  # a bad entry fails when the policy is made


class Sleepy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        time.sleep(1.5)
        try:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"late")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should have

    def log_message(self, *args):
        pass


@contextmanager
def serving(handler, server_class=http.server.ThreadingHTTPServer):
    server = server_class(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_slow_engine_times_out_in_one_sentence():
    with serving(Sleepy) as (_, url):
        policy = EnginePolicy(allow_loopback=True, read_s=0.2)
        with make_client(policy) as client, pytest.raises(EngineError) as e:
            get_text(client, policy, url + "/metrics")
    assert str(e.value) == f"the engine at {url} did not answer within 0.2 s."


def test_nothing_listening_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    policy = EnginePolicy(allow_loopback=True)
    with make_client(policy) as client, pytest.raises(EngineError) as e:
        get_text(client, policy, f"http://127.0.0.1:{port}/health")
    assert str(e.value).startswith(f"could not connect to the engine at http://127.0.0.1:{port}")
    assert one_sentence(str(e.value))


def test_an_oversized_answer_is_cut_in_one_sentence():
    policy = EnginePolicy(allowed=("http://box:1",), max_bytes=1000)
    big = httpx.MockTransport(lambda r: httpx.Response(200, content=b"x" * 5000 if r.method == "GET" else
                                                       b"data: {\"choices\": []}\n\n" * 300))
    with make_client(policy, big) as client:
        with pytest.raises(EngineError) as e:
            get_text(client, policy, "http://box:1/metrics")
        assert str(e.value) == ("the engine at http://box:1 sent more than 1,000 bytes for /metrics; "
                                "specviz stopped reading.")
        with pytest.raises(EngineError, match="more than 1,000 bytes for /v1/chat/completions"):
            list(stream_events(client, policy, "http://box:1/v1/chat/completions", {}))


def test_errors_redirects_and_absent_endpoints():
    policy = EnginePolicy(allowed=("http://box:1",))
    answers = {"/bad": httpx.Response(400, json={"error": {"message": "max_tokens must be positive.\nSee docs"}}),
               "/moved": httpx.Response(302, headers={"Location": "http://169.254.169.254/"}),
               "/gone": httpx.Response(404),
               "/loading": httpx.Response(503, json={"error": {"message": "Loading model"}})}
    with make_client(policy, httpx.MockTransport(lambda r: answers[r.url.path])) as client:
        with pytest.raises(EngineError) as e:
            get_text(client, policy, "http://box:1/bad")
        assert str(e.value) == "the engine at http://box:1 answered 400 to /bad: max_tokens must be positive; See docs."
        with pytest.raises(EngineError, match="does not follow redirects"):
            get_text(client, policy, "http://box:1/moved")
        assert get_text(client, policy, "http://box:1/gone") is None
        with pytest.raises(EngineError, match="answered 503 to /loading: Loading model"):
            get_text(client, policy, "http://box:1/loading")


# ---------------------------------------------------------------------------------------------- counters


def test_llamacpp_counter_difference_from_the_real_server():
    before = read_counters((LLAMA / "spec-metrics-before.txt").read_text(), "llamacpp:")
    after = read_counters((LLAMA / "spec-metrics-after.txt").read_text(), "llamacpp:")
    assert before.per_position == ()  # the per-position series appears after the first speculative request
    d = difference(before, after)
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position) == (2, 5, 5, (2, 1, 1, 1))


def test_vllm_counters_sum_engine_cores_and_skip_created():
    before = read_counters((VLLM / "metrics-before.txt").read_text(), "vllm:")
    after = read_counters((VLLM / "metrics-after.txt").read_text(), "vllm:")
    assert (after.drafts, after.draft_tokens, after.accepted, after.per_position) == (17, 51, 23, (13, 6, 4))
    d = difference(before, after)
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position) == (3, 9, 4, (2, 1, 1))


def test_vllm_probe_counters_and_per_request_on_the_real_servers_answers():
    """vLLM 0.32.0's CPU build serving the embedded pair (K = 4): its version, model and K read from its pages, its
    labelled counters (with their `_created` samples skipped) differenced around one request, and that request's
    own statistics on the final usage event, which agree with the counters."""
    def get(lane, metrics="before"):
        return files(("/version", VLLM_REAL / f"{lane}-version.json"),
                     ("/v1/models", VLLM_REAL / f"{lane}-models.json"),
                     ("/metrics", VLLM_REAL / f"{lane}-metrics-{metrics}.txt"))

    spec = vllm.probe("http://127.0.0.1:8092", get("spec"))
    assert (spec.kind, spec.version, spec.speculative, spec.k, spec.counters) == ("vllm", "0.32.0", True, 4, "vllm:")
    assert spec.model.endswith("target-bfloat16")
    plain = vllm.probe("http://127.0.0.1:8091", get("plain"))
    assert plain.speculative is False and plain.k is None
    d = difference(*(read_counters((VLLM_REAL / f"spec-metrics-{w}.txt").read_text(), "vllm:")
                     for w in ("before", "after")))
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position) == (2, 8, 5, (2, 1, 1, 1))
    assert vllm.per_request(events(VLLM_REAL / "spec-stream.sse")) == SpecStats(8, 5, 2, (2, 1, 1, 1), "per-request")
    assert vllm.per_request(events(VLLM_REAL / "plain-stream.sse")) is None


def test_a_page_that_is_not_prometheus_text():
    with pytest.raises(EngineError) as e:
        read_counters("<html>Not here</html>", "vllm:")
    assert one_sentence(str(e.value))


# ---------------------------------------------------------------------------------------------- adapters


def test_llamacpp_probe_and_per_request_on_the_real_servers_answers():
    spec = llamacpp.probe("http://127.0.0.1:18282", llama_get("spec"))
    assert (spec.kind, spec.speculative, spec.counters, spec.k, spec.version) == \
           ("llamacpp", True, "llamacpp:", 4, "b0-unknown")
    assert spec.model.endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") and spec.notes == ()
    plain = llamacpp.probe("http://127.0.0.1:18281", llama_get("plain", "before"))
    assert plain.speculative is False and plain.k is None
    assert llamacpp.per_request(events(LLAMA / "spec-stream.sse")) == SpecStats(5, 5, None, None, "per-request")
    assert llamacpp.per_request(events(LLAMA / "plain-stream.sse")) is None  # no draft_n: it drafted nothing
    no_metrics = llamacpp.probe("u", files(("/props", LLAMA / "spec-props.json")))
    assert no_metrics.counters is None and any("--metrics" in n for n in no_metrics.notes)


def test_the_real_stream_measured():
    timed = [(10.0 + 0.1 * i, e) for i, e in enumerate(events(LLAMA / "spec-stream.sse"))]
    s = measure(9.5, timed, 12.0)
    assert s.tokens == 8 and s.text.startswith("```python")  # usage.completion_tokens, the deltas joined
    first = next(t for t, e in timed if e["choices"] and e["choices"][0]["delta"].get("content"))
    last = max(t for t, e in timed if e["choices"] and e["choices"][0]["delta"].get("content"))
    assert s.ttft_s == pytest.approx(first - 9.5) and s.decode_s == pytest.approx(last - first)
    assert s.decode_tokens_per_s == pytest.approx(7 / (last - first)) and s.total_s == 2.5


@pytest.mark.parametrize("fixture", ["stream-detailed.sse", "stream-choice-stats.sse"])
def test_vllm_per_request(fixture):
    assert vllm.per_request(events(VLLM / fixture)) == SpecStats(9, 4, 3, (2, 1, 1), "per-request")


def test_vllm_probe():
    get = files(("/version", VLLM / "version.json"), ("/v1/models", VLLM / "models.json"),
                ("/metrics", VLLM / "metrics-before.txt"))
    info = vllm.probe("http://gpu:8000", get)
    assert (info.version, info.model, info.speculative, info.k, info.counters) == \
           ("0.29.0", "Qwen/Qwen3-8B", True, 3, "vllm:")
    plain = vllm.probe("http://gpu:8001", files(("/metrics", SGLANG / "metrics.txt")))  # a page without them
    assert plain.speculative is False and plain.counters is None


@pytest.mark.parametrize("fixture", ["stream-meta-old.sse", "stream-meta-new.sse"])
def test_sglang_per_request(fixture):
    assert sglang.per_request(events(SGLANG / fixture)) == SpecStats(9, 4, 3, (2, 1, 1), "per-request")


def test_sglang_probe():
    info = sglang.probe("http://gpu:30000", files(("/get_server_info", SGLANG / "get_server_info.json")))
    assert (info.speculative, info.k, info.version, info.counters) == (True, 3, "0.5.4", None)
    assert sglang.extra_body(DecodeConfig()) == {"return_meta_info": True}


def test_request_bodies():
    greedy = chat_body("hi", DecodeConfig(max_new_tokens=5, seed=3), "m", llamacpp.extra_body(DecodeConfig()))
    assert greedy["messages"] == [{"role": "user", "content": "hi"}] and greedy["temperature"] == 0
    assert (greedy["max_tokens"], greedy["seed"], greedy["model"], greedy["min_p"]) == (5, 3, "m", 0.0)
    assert "top_k" not in greedy and greedy["stream_options"] == {"include_usage": True}
    warm = DecodeConfig(sampling=SamplingParams(temperature=0.7, top_p=0.9), seed=None)
    body = chat_body("hi", warm, None, llamacpp.extra_body(warm))
    assert body["top_k"] == 0 and "seed" not in body and "model" not in body  # llama.cpp's top-k 40 turned off
    assert "top_k" not in chat_body("hi", warm, None, vllm.extra_body(warm))
    k20 = DecodeConfig(sampling=SamplingParams(temperature=0.7, top_k=20))
    assert chat_body("hi", k20, None, llamacpp.extra_body(k20))["top_k"] == 20


def test_combine_marks_polluted_counters():
    own = SpecStats(5, 5, None, None, "per-request")
    same = combine(own, SpecStats(5, 5, 2, (2, 1, 1, 1), "metrics-diff"))
    assert (same.drafts, same.accepted_per_position, same.source) == (2, (2, 1, 1, 1), "per-request+metrics-diff")
    assert "concurrent traffic" in same.note
    polluted = combine(own, SpecStats(12, 9, 5, (5, 2, 1, 1), "metrics-diff"))
    assert (polluted.drafts, polluted.accepted_per_position) == (None, None) and "other traffic" in polluted.note
    assert combine(None, None) is None and combine(own, None) is own


# ---------------------------------------------------------------------------------------------- a replay


class Replay(http.server.ThreadingHTTPServer):
    """A server stand-in answering with one recorded server's answers (llama-server's, or vLLM's from `recorded`);
    its counters advance by the recorded request's difference for every chat completion it serves (as the real
    server's do)."""

    def __init__(self, address, lane: str, recorded: Path = LLAMA):
        super().__init__(address, ReplayHandler)
        self.lane, self.served, self.lock, self.recorded = lane, 0, threading.Lock(), recorded

    def metrics(self) -> str:
        sample = re.compile(r"^([^#\s]\S*)\s+(\S+)$")
        recorded_before = (self.recorded / f"{self.lane}-metrics-before.txt").read_text()
        before = dict(m.groups() for line in recorded_before.splitlines() if (m := sample.match(line)))
        lines = []
        for line in (self.recorded / f"{self.lane}-metrics-after.txt").read_text().splitlines():
            m = sample.match(line)
            if m:
                b = float(before.get(m[1], 0))
                if self.served == 0 and m[1] not in before:
                    continue  # as the real server: no per-position series before a speculative request
                line = f"{m[1]} {b + self.served * (float(m[2]) - b):g}"
            lines.append(line)
        return "\n".join(lines) + "\n"


class ReplayHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each event its own segment

    def reply(self, body: bytes, kind: str = "application/json"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        lane = self.server.lane
        paths = {path: f"{lane}-{name}.json" for path, name in (("/props", "props"), ("/slots", "slots"),
                                                                ("/v1/models", "models"), ("/version", "version"))
                 if (self.server.recorded / f"{lane}-{name}.json").is_file()}
        if self.path == "/metrics":
            with self.server.lock:
                self.reply(self.server.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            self.reply(b'{"status":"ok"}')
        elif self.path in paths:
            self.reply((self.server.recorded / paths[self.path]).read_bytes())
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        pieces = [p for p in (self.server.recorded / f"{self.server.lane}-stream.sse").read_bytes().split(b"\n\n")
                  if p.strip()]
        try:
            for i, piece in enumerate(pieces):
                if i == len(pieces) - 1:  # before [DONE]: the server ends the request (and counts its drafts)
                    with self.server.lock:  # before a later /metrics request is served
                        self.server.served += 1
                self.wfile.write(piece + b"\n\n")
                self.wfile.flush()
                time.sleep(0.005)  # the events arrive apart, as a decoding server sends them
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at [DONE]
        self.close_connection = True

    def log_message(self, *args):
        pass


@contextmanager
def replay_pair(recorded: Path = LLAMA):
    with serving(lambda *a: ReplayHandler(*a), lambda addr, h: Replay(addr, "spec", recorded)) as (_, spec), \
            serving(lambda *a: ReplayHandler(*a), lambda addr, h: Replay(addr, "plain", recorded)) as (_, plain):
        yield spec, plain


def test_complete_on_the_replayed_server():
    with replay_pair() as (spec_url, _):
        policy = EnginePolicy(allowed=(spec_url,))
        with make_client(policy) as client:
            engine = connect(client, policy, spec_url)
            assert engine.info.kind == "llamacpp" and engine.info.speculative
            result = complete(client, policy, engine, "hi", DecodeConfig(max_new_tokens=8))
    s = result.stats
    assert (result.tokens, s.drafted, s.accepted, s.drafts) == (8, 5, 5, 2)
    assert s.accepted_per_position == (2, 1, 1, 1) and s.source == "per-request+metrics-diff"
    assert s.acceptance == 1.0 and s.mean_accepted_length == 3.5
    assert result.ttft_s > 0 and result.decode_tokens_per_s > 0


# ---------------------------------------------------------------------------------------------- the race


def result(tokens: int, decode_s: float, ttft: float, stats: SpecStats | None = None) -> RequestResult:
    return RequestResult("x", tokens, ttft, (tokens - 1) / decode_s, decode_s, ttft + decode_s, stats)


def fake_runs(n_prompts: int = 4, draft_lane: bool = False) -> list[Run]:
    runs = []
    for i in range(n_prompts):
        p = Prompt(f"p{i}", "text")
        spec = SpecStats(12, 9, 4, (4, 3, 1, 1), "per-request")  # K = 4
        runs += [Run(p, 0, SPEC, 3 * i, result(17, 1.0 + 0.1 * i, 0.5, spec)),
                 Run(p, 0, PLAIN, 3 * i + 1, result(17, 2.0 + 0.3 * i, 0.4))]
        if draft_lane:
            runs.append(Run(p, 0, DRAFT, 3 * i + 2, result(17, 0.5, 0.1)))
    return runs


def test_race_order_is_shuffled_paired_and_repeatable():
    prompts = [Prompt(f"p{i}", "t") for i in range(5)]
    order = race_order(prompts, [SPEC, PLAIN], repeats=2, seed=0)
    assert len(order) == 20 and order == race_order(prompts, [SPEC, PLAIN], repeats=2, seed=0)
    pairs = [order[i:i + 2] for i in range(0, 20, 2)]
    assert all(a[1] is b[1] and {a[2], b[2]} == {SPEC, PLAIN} for a, b in pairs)  # a prompt's lanes back to back
    assert [p.id for _, p, _ in order[:10:2]] != [p.id for p in prompts] or order[0][2] != order[2][2]


def test_summary_intervals_and_the_cost_models_prediction():
    runs = fake_runs(draft_lane=True)
    s = summarise(runs, verify_ratio=1.5)
    spec, plain, draft = s.lanes
    assert spec.decode_tokens_per_s.value == pytest.approx(64 / 4.6) and plain.decode_tokens_per_s.value == \
           pytest.approx(64 / 9.8)
    assert s.speedup.value == pytest.approx(9.8 / 4.6)
    for e in (s.speedup, spec.decode_tokens_per_s, plain.ttft_s):
        assert e.ci95 is not None and e.ci95[0] <= e.value <= e.ci95[1]
    a = s.acceptance
    assert (a.drafted, a.accepted, a.rounds) == (48, 36, 16) and a.acceptance.value == 0.75
    assert a.mean_accepted_length.value == pytest.approx(1 + 36 / 16)
    assert a.conditional == pytest.approx((1.0, 0.75, 1 / 3, 1.0)) and a.per_position == (1.0, 0.75, 0.25, 0.25)
    p = s.prediction
    c = (64 / 9.8) / (64 / 2.0)  # draft step / target step, from the lanes' decode rates
    assert (p.k, p.draft_cost_from) == (4, "draft-alone lane") and p.draft_cost == pytest.approx(c)
    assert p.predicted_speedup == pytest.approx(predicted_speedup(a.conditional, CostModel(1.0, c, (1.5,) * 5), 4))
    assert p.implied_round_cost == pytest.approx(a.mean_accepted_length.value / s.speedup.value)
    given = summarise(fake_runs(), draft_cost=0.2).prediction
    assert given.draft_cost_from == "--draft-cost" and given.predicted_speedup == pytest.approx(
        predicted_speedup(a.conditional, CostModel(1.0, 0.2, (1.0,) * 5), 4))


def test_summary_below_three_prompts_and_without_statistics():
    s = summarise(fake_runs(2))
    assert s.speedup.ci95 is None and s.acceptance.acceptance.ci95 is None and s.speedup.value is not None
    bare = [Run(r.prompt, 0, r.lane, r.order, result(17, 1.0, 0.5)) for r in fake_runs()]
    none = summarise(bare)
    assert none.acceptance is None and none.prediction.predicted_speedup is None
    assert "reported none" in format_table(none, {})


def test_report_json_table_and_html(tmp_path):
    runs = fake_runs(draft_lane=True)
    s = summarise(runs)
    info = llamacpp.probe("http://127.0.0.1:18282", llama_get("spec"))
    report = build_report(s, {SPEC: info}, tuple(runs), {"machine": "test"})
    json.dumps(report)  # plain JSON: no dataclass, no NaN
    assert report["summary"]["acceptance"]["conditional"] == [1.0, 0.75, 0.3333, 1.0]
    table = format_table(s, {SPEC: info})
    assert "measured speedup (decode rates): 2.13x [" in table and "cost model predicts" in table
    page = write_html(report, table, tmp_path / "race.html").read_text()
    assert "plotly" in page and "Acceptance by draft position" in page


# ---------------------------------------------------------------------------------------------- llama-server


HELP = (LLAMA / "llama-server-help.txt").read_text()


def test_the_servers_commands_from_this_builds_help():
    assert llama_server.draft_flags(HELP, 6, 0.0) == ["--spec-type", "draft-simple", "--spec-draft-n-max", "6",
                                                       "--spec-draft-p-min", "0"]
    old = "--draft-max, --draft N  number of tokens to draft\n--draft-p-min P  minimum probability\n"
    assert llama_server.draft_flags(old, 6, 0.5) == ["--draft-max", "6", "--draft-p-min", "0.5"]
    settings = llama_server.LlamaSettings(port=9000, k=6, p_min=0.0, threads=2, ctx=2048, draft_alone=True)
    plain, spec, draft = llama_server.commands(Path("/b/llama-server"), Path("t.gguf"), Path("d.gguf"), settings, HELP)
    assert plain[plain.index("--port") + 1] == "9000" and "-md" not in plain and "--metrics" in plain
    assert spec[spec.index("--port") + 1] == "9001" and spec[spec.index("-md") + 1] == "d.gguf"
    assert draft[draft.index("--port") + 1] == "9002" and draft[draft.index("-m") + 1] == "d.gguf"
    with pytest.raises(EngineError, match="cannot set K"):
        llama_server.draft_flags("-m FNAME", 6, 0.0)


def test_the_vllm_servers_commands_and_environment(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    settings = vllm_server.VllmSettings(port=9000, k=4, max_len=2048, eager=False, draft_alone=True)
    plain, spec, draft = vllm_server.commands(python, Path("/c/target-bfloat16"), Path("/c/draft-bfloat16"), settings)
    assert plain[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # (the CPU build's `vllm` script fails)
    assert plain[plain.index("--port") + 1] == "9000" and "--speculative-config" not in plain
    assert plain[plain.index("--host") + 1] == "127.0.0.1" and "--enforce-eager" not in plain
    config = json.loads(spec[spec.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "/c/draft-bfloat16", "num_speculative_tokens": 4}
    assert spec[spec.index("--port") + 1] == "9001" and "--per-request-spec-decode-metrics" in spec
    assert draft[draft.index("--model") + 1] == "/c/draft-bfloat16" and draft[draft.index("--port") + 1] == "9002"
    eager = vllm_server.VllmSettings(port=9000, k=4, max_len=2048, eager=True)
    assert "--enforce-eager" in vllm_server.commands(python, Path("t"), Path("d"), eager)[0]
    env = vllm_server.environment(python, 2, 1.0)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert str(tmp_path / "venv" / "lib" / "libiomp5.so") in env["LD_PRELOAD"]


def test_no_vllm_venv_or_too_little_memory_is_one_sentence(tmp_path):
    with pytest.raises(EngineError) as e:
        vllm_server.vllm_python(tmp_path / "bin" / "python")
    assert "scripts/setup_vllm_cpu.sh" in str(e.value) and one_sentence(str(e.value))
    with pytest.raises(EngineError) as e:
        vllm_server.check_memory(2, available=9e9)
    assert "16 GB" in str(e.value) and "9.0 GB free" in str(e.value) and one_sentence(str(e.value))
    vllm_server.check_memory(2, available=20e9)  # enough: nothing said


def test_missing_binary_and_busy_port_are_one_sentence(tmp_path):
    with pytest.raises(EngineError) as e:
        llama_server.server_binary(tmp_path)
    assert "scripts/build_llamacpp.sh" in str(e.value) and one_sentence(str(e.value))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(EngineError, match="is in use; choose another with --port"):
            llama_server.port_free(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the command


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specviz")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["engines", *argv])


def counters(url: str, prefix: str = "llamacpp:") -> dict[str, float]:
    """The speculative server's own counters, read here by a regex (independent of specviz's parser); vLLM's carry
    labels (one engine here)."""
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return {name: float(m[1]) if (m := re.search(rf"^{prefix}spec_decode_num_{name}_total(?:{{[^}}]*}})? (\S+)$",
                                                 text, re.M))
            else 0.0 for name in ("drafts", "draft_tokens", "accepted_tokens")}


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            llama_server.port_free(port + 1)
            return port
        except EngineError:
            continue
    raise RuntimeError("no two free ports in a row")


@contextmanager
def pair_for_this_machine():
    """The real llama-server pair where the build and the embedded GGUF files are here, else the replay.

    One thread per server: llama.cpp's threads poll (spin) while they wait for work, and on 2 cores already busy
    (the other pytest worker, the other server) a 16-token request took 43 s with two threads, 6 s with one."""
    try:
        llama_server.server_binary()
        llama_server.embedded_ggufs()
    except EngineError:
        with replay_pair() as urls:
            yield (*urls, "replay")
        return
    with llama_server.llama_servers(llama_server.LlamaSettings(port=free_port_pair(), k=4, threads=1, ctx=2048)) \
            as servers:
        yield servers.spec_url, servers.plain_url, "real"


def race_against(spec_url: str, plain_url: str, out: Path, capsys, engine: str = "llamacpp",
                 prompts: Path | None = None, tokens: int = 16) -> tuple[dict, dict, dict]:
    """`specviz engines race` on 2 prompts (the shipped set's first two, or `prompts`), `tokens` tokens, no warm-up;
    (report, counters before, after)."""
    prefix = f"{engine}:"
    before = counters(spec_url, prefix)
    rc = run(cli("race", "--spec", spec_url, "--plain", plain_url, "--limit", "2", "--max-new-tokens", str(tokens),
                 "--warmup", "0", "--engine", engine, "--json", str(out),
                 *(["--prompts", str(prompts)] if prompts else [])))
    after = counters(spec_url, prefix)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "measured speedup" in captured.out
    return json.loads(out.read_text()), before, after


def check_acceptance_is_the_servers_own(report: dict, before: dict, after: dict) -> None:
    acc = report["summary"]["acceptance"]
    assert acc["drafted"] == after["draft_tokens"] - before["draft_tokens"] > 0
    assert acc["accepted"] == after["accepted_tokens"] - before["accepted_tokens"]
    assert acc["rounds"] == after["drafts"] - before["drafts"]
    assert acc["acceptance"]["value"] == pytest.approx(acc["accepted"] / acc["drafted"], abs=1e-4)
    spec_runs = [r for r in report["runs"] if r["lane"] == SPEC]
    assert len(spec_runs) == 2 and all(r["source"] == "per-request+metrics-diff" for r in spec_runs)
    assert all("other traffic" not in r["note"] for r in spec_runs)  # each request's own figures = its counters
    assert {r["lane"] for r in report["runs"]} == {SPEC, PLAIN} and len(report["runs"]) == 4


# Two short prompts: the shipped set's first two are 80 and 170 tokens under the chat template, and their prefill on
# the busy cores was most of the race. On the real pair, greedy, 8 tokens each, the target rejects one draft of each
# of these (12 drafted, 10 accepted here), so the drafted and accepted sums the test compares with the counters
# differ, as the shipped prompts' did at 16 tokens (26 and 23).
SHORT_PROMPTS = ('{"id": "recursion", "prompt": "Explain recursion in one sentence.", "kind": "prose"}\n'
                 '{"id": "maximum", "prompt": "Write a Python function that returns the maximum of a list.", '
                 '"kind": "code"}\n')


def test_race_end_to_end_acceptance_is_the_servers_own(llamacpp_pair, tmp_path, capsys):
    """`specviz engines race` on 2 short prompts (`SHORT_PROMPTS`), 8 tokens, lanes in a shuffled order. Where this
    machine has llama.cpp's build (scripts/build_llamacpp.sh) and the embedded GGUF files, against the real
    llama-server pair (the target alone, the target with its draft at K = 4; seconds on 2 busy cores); where it
    has not (a fresh CI machine), against the replay of that pair's recorded answers
    (tests/data/engines/llamacpp-0.3.36/): the HTTP, the stream, the probes, the counters' difference and the
    report then run on real answers, only the decoding is not live. Either way the acceptance the race reports
    must be the speculative server's own: its /metrics counters, read here before and after the race by a regex,
    moved by exactly the drafted, accepted and rounds the report sums (no warm-up, one request at a time, so
    nothing else ran on it in between), and each request's own `draft_n` agrees with them (source
    per-request+metrics-diff, no note of other traffic)."""
    spec_url, plain_url, mode = llamacpp_pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(SHORT_PROMPTS)
    report, before, after = race_against(spec_url, plain_url, tmp_path / "race.json", capsys, prompts=prompts,
                                         tokens=8)
    print(f"ran against the {mode} llama-server pair")
    check_acceptance_is_the_servers_own(report, before, after)


def test_race_on_the_replayed_pair(tmp_path, capsys):
    """The same race and checks on the replay everywhere (the test above runs it only where no build is), plus
    what the recorded answers fix exactly: each request drafted 5 in 2 rounds and all were accepted."""
    with replay_pair() as (spec_url, plain_url):
        report, before, after = race_against(spec_url, plain_url, tmp_path / "race.json", capsys)
    check_acceptance_is_the_servers_own(report, before, after)
    acc = report["summary"]["acceptance"]
    assert (acc["drafted"], acc["accepted"], acc["rounds"]) == (10, 10, 4)
    assert acc["mean_accepted_length"]["value"] == 3.5 and acc["conditional"] == [1.0, 0.5, 1.0, 1.0]


def test_race_on_the_replayed_vllm_pair(tmp_path, capsys):
    """The race against the real vLLM CPU servers' recorded answers (vLLM 0.32.0, the embedded pair in bf16, K = 4,
    the first shipped prompt, 8 tokens): its acceptance is the speculative server's own counters' difference, each
    request's own per-request block agrees with them, and the per-position counters add up to the accepted total.
    The recorded request drafted 8 in 2 rounds and 5 were accepted (a round that took all 4, one that took 1)."""
    with replay_pair(VLLM_REAL) as (spec_url, plain_url):
        report, before, after = race_against(spec_url, plain_url, tmp_path / "race.json", capsys, engine="vllm")
    check_acceptance_is_the_servers_own(report, before, after)
    acc = report["summary"]["acceptance"]
    assert (acc["drafted"], acc["accepted"], acc["rounds"]) == (16, 10, 4)
    assert report["engines"]["speculative"]["kind"] == "vllm" and report["engines"]["speculative"]["k"] == 4
    per_position = [r["accepted_per_position"] for r in report["runs"] if r["lane"] == SPEC]
    assert all(sum(p) == 5 for p in per_position)  # each request's positions add up to its accepted tokens


def test_the_command_fails_in_one_sentence(capsys):
    """An engine refused (1) and a refused input (2), each one line naming the subcommand (`cli.fault` says both)."""
    assert main(["engines", "race", "--spec", "ftp://box", "--plain", "http://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "specviz engines race: 'ftp://box' is not an http:// or https:// URL."
    assert main(["engines", "race", "--spec", "http://a:1", "--plain", "http://b:1", "--repeats", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("specviz engines race: --repeats and --limit must be at least 1, "
                                               "--warmup at least 0.")
