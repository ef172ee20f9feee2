"""The tree round in the app: branches, the accepted path, struck rejected siblings, hovers and step captions."""

from __future__ import annotations

import re

import pytest

from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, REJECTED
from specviz.runs.trace import RunMeta, Trace
from specviz.ui import render, teach
from specviz.ui.decode import main_view
from specviz.ui.tree_view import latest_tree_html, tree_html


PROMPT = "the man said that the world"
CONFIG = DecodeConfig(k=4, max_new_tokens=24, drafter="tree", tree_budget=10, sampling=SamplingParams(0.9), seed=1)


@pytest.fixture(scope="module")
def tree_rounds(tiny):
    return list(speculative_generate(tiny, tiny.tokenizer.encode(PROMPT), CONFIG))


def rich(rounds):
    """A round where a sibling was rejected and the walk still went on or corrected."""
    return next(r for r in rounds if any(n.status == REJECTED for n in r.tree) and r.emitted is not None)


def test_the_tree_is_drawn_with_every_node_and_its_outcome(tree_rounds):
    r = rich(tree_rounds)
    html = tree_html(r, greedy=False)
    spans = re.findall(r'<span class="sv-tok sv-(\w+)[^"]*" title="([^"]*)"', html)
    assert len(spans) == len(r.tree) + 1  # every node, and the correction or bonus
    statuses = [s for s, _ in spans]
    assert statuses.count("rejected") == sum(n.status == REJECTED for n in r.tree)
    assert statuses.count("accepted") == sum(n.status == ACCEPTED for n in r.tree)
    assert statuses.count("not_verified") == sum(n.status == NOT_VERIFIED for n in r.tree)
    assert r.emitted.kind in statuses
    rejected_tip = next(t for s, t in spans if s == "rejected")
    assert "u = " in rejected_tip and "mass left" in rejected_tip and "q = " in rejected_tip
    assert f"{len(r.tree)} nodes" in html


def test_before_the_verdict_the_tree_is_only_a_proposal(tree_rounds):
    r = rich(tree_rounds)
    html = tree_html(r, greedy=False, stage="draft")
    assert "sv-accepted" not in html and "sv-rejected" not in html and r.emitted.kind not in html
    assert html.count("sv-drafted") == len(r.tree)


def test_the_live_view_and_the_decode_tab_show_the_tree(tree_rounds):
    latest = next(r for r in reversed(tree_rounds) if r.tree)
    html = latest_tree_html(tree_rounds, greedy=False)
    assert html.count('class="sv-tree"') == 1 and f"Round {latest.index + 1}: a draft tree" in html
    assert latest_tree_html(tree_rounds[:0], greedy=False) == ""
    assert 'class="sv-tree"' not in render.rounds_html(tree_rounds, greedy=False)  # the text stays the text


def test_the_decode_tab_shows_the_selected_rounds_tree(tiny, tree_rounds):
    r = rich(tree_rounds)
    record = Trace(RunMeta.of(tiny, PROMPT, tiny.tokenizer.encode(PROMPT), CONFIG), tree_rounds)
    view = main_view(record, selected=r.index)
    assert f"Round {r.index + 1}: a draft tree" in view.tokens and view.tokens.count('class="sv-tree"') == 1
    assert "**Try**" in view.caption


def test_the_step_caption_tells_each_sibling_try_in_walk_order(tree_rounds):
    r = rich(tree_rounds)
    caption = teach.step_caption(r, greedy=False)
    tries = re.findall(r"\*\*Try\*\* .*?→ (accepted|rejected)", caption)
    walked = sorted((n for n in r.tree if n.accept_prob is not None), key=lambda n: (n.depth, n.rank))
    assert tries == ["accepted" if n.status == ACCEPTED else "rejected" for n in walked]
    assert f"tree of {len(r.tree)} nodes" in caption and r.emitted.kind.capitalize() in caption
    assert "Walk" in teach.step_caption(r, greedy=False, stage="verify")
