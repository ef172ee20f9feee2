"""The tree round in the app: branches, the accepted path, struck rejected siblings, hovers and step captions."""

from __future__ import annotations

import re

import pytest

from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, REJECTED
from specviz.ui import render, teach
from specviz.ui.tree_view import tree_html


@pytest.fixture(scope="module")
def tree_rounds(tiny):
    config = DecodeConfig(k=4, max_new_tokens=24, drafter="tree", tree_budget=10, sampling=SamplingParams(0.9),
                          seed=1)
    return list(speculative_generate(tiny, tiny.tokenizer.encode("the man said that the world"), config))


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


def test_the_token_view_shows_the_last_rounds_tree(tree_rounds):
    html = render.rounds_html(tree_rounds, greedy=False)
    assert 'id="sv-tree"' in html and html.count('class="sv-tree"') == 1
    latest = next(r for r in reversed(tree_rounds) if r.tree)
    assert f"Round {latest.index + 1}: a draft tree" in html


def test_the_step_caption_tells_each_sibling_try_in_walk_order(tree_rounds):
    r = rich(tree_rounds)
    caption = teach.step_caption(r, greedy=False)
    tries = re.findall(r"\*\*Try\*\* .*?→ (accepted|rejected)", caption)
    walked = sorted((n for n in r.tree if n.accept_prob is not None), key=lambda n: (n.depth, n.rank))
    assert tries == ["accepted" if n.status == ACCEPTED else "rejected" for n in walked]
    assert f"tree of {len(r.tree)} nodes" in caption and r.emitted.kind.capitalize() in caption
    assert "Walk" in teach.step_caption(r, greedy=False, stage="verify")
