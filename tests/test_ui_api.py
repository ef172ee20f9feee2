"""The named gradio_client endpoints, against the app launched in-process on the real embedded pair."""

from __future__ import annotations

import json

import pytest

from specviz.models import PairSpec
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.server import build_server, launch
from specviz.ui.handlers import Options

from helpers import NO_WAIT

PROMPT = "Write a Python function that returns the square of a number."
NEW = 8  # tokens per run: the API's contract on the real pair as served, not its exactness (test_embedded_e2e)
ENDPOINTS = {"/generate", "/race", "/replay", "/share_html", "/same_distribution", "/info"}  # no /load_pair: the
# pair is fixed unless the server allows switching (tests/test_serving.py)

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def client(served_pair, open_client):
    session = Session(served_pair, PairSpec("embedded", "embedded", dtype="bfloat16", step="eager"))
    demo = build_server(session, Limits(), Options(Pace(0.0, 0.0, NO_WAIT)))
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    try:
        yield open_client(url)
    finally:
        demo.close()


def test_the_named_endpoints_are_published(client):
    api = client.view_api(return_format="dict", print_info=False)
    assert ENDPOINTS <= set(api["named_endpoints"]) and "/load_pair" not in api["named_endpoints"]
    params = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert params[:3] == ["prompt", "k", "max_new_tokens"]


def test_generate_streams_rounds_then_a_summary(client):
    job = client.submit(PROMPT, 4, NEW, api_name="/generate")
    messages = list(job)
    rounds = [m["round"] for m in messages if m["event"] == "round"]
    done = messages[-1]
    assert done["event"] == "done" and done["rounds"] == len(rounds) >= 1
    assert sum(len(r["new_token_ids"]) for r in rounds) == NEW or done["finished"] == "eos"
    assert done["text"] == rounds[-1]["text"] and done["text"].strip()
    assert {d["status"] for r in rounds for d in r["drafted"]} <= {"accepted", "rejected", "not_verified"}
    assert 0.0 <= done["stats"]["acceptance_rate"] <= 1.0


def test_race_measures_both_lanes_and_agrees_on_the_invariant_verify(client):
    final = client.predict(PROMPT, 4, NEW, api_name="/race")
    assert final["event"] == "done"
    ar, spec = final["ar"], final["spec"]
    assert ar["clock_s"] > 0 and spec["clock_s"] > 0 and ar["tokens"] == spec["tokens"]
    assert final["speedup"] == pytest.approx(spec["tokens_per_s"] / ar["tokens_per_s"])
    assert final["identical"] is True and final["divergence"] is None  # greedy, rows as the steps: token-identical
    for lane in (ar, spec):  # the prompt's forward apart from decoding
        assert 0 < lane["prefill_s"] < lane["clock_s"]
        assert lane["prefill_s"] + lane["decode_s"] == pytest.approx(lane["clock_s"])
    # the run itself comes back, and the API turns it into the page the app's "Share as HTML" writes
    page = client.predict(json.dumps(final["trace"]), api_name="/share_html")
    assert page.startswith("<!doctype html>") and page.count('class="sv-round') == len(final["trace"]["rounds"])
    assert "http://" not in page and "https://" not in page


def test_replay_a_shipped_trace_by_name(client):
    info = client.predict(api_name="/info")
    assert "trace_embedded_code.json" in info["shipped_traces"]
    final = client.predict("trace_embedded_code.json", api_name="/replay")
    assert final["event"] == "done" and final["rounds"] > 0 and final["race"]["speedup"] > 0
