"""The Engines tab: its handler on the replay of a recorded llama-server pair, and the tab in a real browser against
the real llama-server pair where this machine has llama.cpp's build and the embedded GGUF files (else the replay)."""

from __future__ import annotations

import shutil

import gradio as gr
import pytest
from test_engines import VLLM_REAL, replay_pair

from specviz.remote.policy import EnginePolicy
from specviz.models import PairSpec
from specviz.models.tiny import tiny_pair
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.server import build_server, launch
from specviz.ui.engines import NO_ENGINE, race_engines
from specviz.ui.handlers import Options

from helpers import NO_WAIT

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def test_the_tab_streams_both_lanes_then_the_engines_own_acceptance():
    with replay_pair() as (spec, plain):
        views = list(race_engines(EnginePolicy(allowed=(spec, plain)), Limits(), spec, plain, "hi", 8, 0.0))
    streaming = [v for v in views if "streaming:" in v.spec or "streaming:" in v.plain]
    assert len(streaming) >= 2  # the text grew in view, event by event
    last = views[-1]
    assert "8 tokens:" in last.spec and "8 tokens:" in last.plain and "tokens/s decoding" in last.spec
    # the recorded request drafted 5 in 2 rounds, all accepted: 3.5 tokens per verify round
    assert "accepted 5 of 5 drafted tokens (100%)" in last.summary and "3.50" in last.summary
    assert "Measured:" in last.summary and "c decides it" in last.summary
    assert list(last.positions.data[0].y) == [1.0, 0.5, 0.5, 0.5]  # rounds that accepted each position


def test_the_tab_races_the_recorded_vllm_pair_and_reads_its_acceptance():
    """The same tab on answers recorded from real vLLM CPU servers (K = 4): 8 drafted in 2 rounds, 5 accepted."""
    with replay_pair(VLLM_REAL) as (spec, plain):
        last = list(race_engines(EnginePolicy(allowed=(spec, plain)), Limits(), spec, plain, "hi", 8, 0.0))[-1]
    assert "8 tokens:" in last.spec and "8 tokens:" in last.plain
    assert "accepted 5 of 8 drafted tokens (62%)" in last.summary and "per-request+metrics-diff" in last.summary
    assert list(last.positions.data[0].y) == [1.0, 0.5, 0.5, 0.5]


def test_an_engine_not_allowed_or_none_allowed_is_one_sentence():
    with replay_pair() as (spec, plain):
        with pytest.raises(gr.Error, match="is not allowed: only the engines the operator listed are") as e:
            list(race_engines(EnginePolicy(allowed=(spec,)), Limits(), spec, "http://10.0.0.1:8000", "hi", 8, 0.0))
        assert "Traceback" not in str(e.value)
        with pytest.raises(gr.Error, match="No engine is allowed on this server"):
            list(race_engines(EnginePolicy(), Limits(), spec, plain, "hi", 8, 0.0))
        with pytest.raises(gr.Error, match="the prompt is empty"):
            list(race_engines(EnginePolicy(allowed=(spec, plain)), Limits(), spec, plain, "  ", 8, 0.0))
        with pytest.raises(gr.Error, match="must be between"):
            list(race_engines(EnginePolicy(allowed=(spec, plain)), Limits(), spec, plain, "hi", 0, 0.0))
    assert "--allow-engine" in NO_ENGINE


@pytest.mark.browser
def test_the_engines_tab_races_the_llamacpp_pair_in_a_browser(llamacpp_pair):
    """The app served with the two engines allowed; a visitor opens the tab and races them on the prompt, 8 tokens
    (the replay's recorded length). On the real pair a prompt whose drafts the target mostly takes: speculation's
    lane decoded the haiku this test used before in 3.3 s on a busy core (3 of 10 drafts accepted), this in 1.0 s."""
    from playwright.sync_api import sync_playwright

    spec, plain, mode = llamacpp_pair
    session = Session(tiny_pair(), PairSpec("tiny", "tiny"))
    demo = build_server(session, Limits(), Options(Pace(0.05, 0.0, NO_WAIT), engines=(spec, plain)))
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_selector("#sv-run", timeout=60_000)
            page.fill("#sv-prompt textarea", "Explain recursion in one sentence.")
            page.get_by_role("tab", name="Engines").click()
            page.locator("#sv-engines-tokens input[type=number]").fill("8")
            page.locator("#sv-engines-tokens input[type=number]").press("Enter")
            page.click("#sv-engines-run")
            page.wait_for_function("document.querySelector('#sv-engines-summary')?.innerText.includes('Measured')",
                                   timeout=240_000)
            spec_lane, plain_lane = (page.inner_text(f"#sv-engines-{lane}-lane") for lane in ("spec", "plain"))
            summary = page.inner_text("#sv-engines-summary")
            browser.close()
    finally:
        demo.close()
    print(mode, "|", spec_lane.replace("\n", " "), "|", plain_lane.replace("\n", " "), "|", summary)
    assert "tokens/s decoding" in spec_lane and "tokens/s decoding" in plain_lane
    assert "drafted tokens" in summary and "tokens per verify round" in summary
