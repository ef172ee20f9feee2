"""Tree speculation end to end: the tree drafter, one target forward over the tree, the walk, the events.

Exactness here: greedy output identical to the target alone for every budget and depth; a width-1 tree decides
exactly as today's chain; the walk emits every sequence with exactly the target's probability (enumerated over
every branch of a random tree). The sampled output's distribution is checked in test_statistical.py, with a
negative control (top-k children treated as if drawn from q).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace

import pytest
import torch
from helpers import EXACT, TEST_DEVICE, check_rounds, same_greedy, spec_tokens

from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.engine.autoregressive import autoregressive_generate
from specviz.engine.drafters import drafter_problem
from specviz.engine.events import ACCEPTED, CORRECTION, NOT_VERIFIED, REJECTED, round_from_dict
from specviz.compat import forward
from specviz.engine.siblings import walk_point_masses, without
from specviz.engine.tree import depths, path_to
from specviz.engine.tree_drafter import TreeDrafter
from specviz.engine.tree_round import tree_generate

PROMPT = "the man said that the world"


def ids(pair, text=PROMPT):
    return pair.tokenizer.encode(text)


def target_alone(pair, prompt, config):
    """The target alone's greedy steps."""
    return list(autoregressive_generate(pair, prompt, replace(config, drafter="model")))


@pytest.mark.parametrize("budget,k", [(1, 8), (4, 3), (16, 1), (16, 8), (40, 6)])
def test_greedy_tree_output_is_the_target_alone(tiny, budget, k):
    config = DecodeConfig(k=k, max_new_tokens=30, drafter="tree", tree_budget=budget)
    rounds = list(speculative_generate(tiny, ids(tiny), config))
    assert same_greedy(spec_tokens(rounds), target_alone(tiny, ids(tiny), config))
    check_tree_rounds(tiny, rounds, config)
    assert all(0 < len(r.tree) <= budget and max(n.depth for n in r.tree) <= k for r in rounds[:-1])
    if budget > 1:  # the tree is used: more than one candidate somewhere
        assert any(n.rank > 0 for r in rounds for n in r.tree)


def check_tree_rounds(pair, rounds, config):
    """What a consumer relies on in a tree round, on top of a chain round's invariants (`check_rounds`)."""
    check_rounds(pair, rounds, config, tree=True)
    for r in rounds:
        assert r.drafter == "tree" and len(r.tree) <= config.tree_budget
        assert [n.depth for n in r.tree] == depths([n.parent for n in r.tree])
        accepted = [i for i, n in enumerate(r.tree) if n.status == ACCEPTED]
        if accepted:  # the accepted nodes are one path from the root, and the output starts with it
            assert accepted == path_to([n.parent for n in r.tree], accepted[-1])
        assert [r.tree[i].id for i in accepted] == r.new_token_ids[:len(accepted)]
        assert [d.id for d in r.drafted[:r.n_accepted]] == [r.tree[i].id for i in accepted]
        for n in r.tree:
            assert 0 < n.q <= 1 and 0 <= n.p <= 1
            if n.status == NOT_VERIFIED:
                assert n.accept_prob is None and n.u is None
            else:  # tried: the rule's decision is on record
                assert (n.u < n.accept_prob) == (n.status == ACCEPTED)
        # siblings are tried in rank order: a tried node's earlier siblings were tried and rejected
        for i, n in enumerate(r.tree):
            earlier = [m for m in r.tree[:i] if m.parent == n.parent]
            if n.status != NOT_VERIFIED:
                assert all(m.status == REJECTED for m in earlier) and [m.rank for m in earlier] == list(range(n.rank))
        if r.emitted is not None and r.emitted.kind == CORRECTION:  # not among the children it corrects
            end = accepted[-1] if accepted else -1
            assert r.emitted.id not in [n.id for n in r.tree if n.parent == end]


def test_a_width_one_tree_is_the_chain(tiny):
    """Greedy, one child per node: the tree is the chain of the draft's top tokens, and each round decides
    exactly as the chain's rule (same tokens, same acceptances) when the chain drafts K fixed."""
    for k in (1, 3, 6):
        chain = DecodeConfig(k=k, max_new_tokens=30, adaptive="fixed")
        tree = replace(chain, drafter="tree", tree_budget=k)
        a = list(speculative_generate(tiny, ids(tiny), chain))
        b = list(tree_generate(tiny, ids(tiny), tree, drafter=TreeDrafter(tiny.draft, tree.sampling,
                                                                           tiny.vocab_size, width=1)))
        assert [r.new_token_ids for r in a] == [r.new_token_ids for r in b]
        # the tree's drafted tokens are the path the target followed: the chain's, up to its first rejection
        assert all([d.id for d in ra.drafted][:len(rb.drafted)] == [d.id for d in rb.drafted] for ra, rb in zip(a, b))
        assert [r.n_accepted for r in a] == [r.n_accepted for r in b]
        assert [len(r.tree) for r in b[:-1]] == [r.k for r in a[:-1]]


def test_sampled_tree_rounds_keep_their_invariants(tiny):
    config = DecodeConfig(k=5, max_new_tokens=40, drafter="tree", tree_budget=12,
                          sampling=SamplingParams(0.9, top_k=20), seed=3)
    rounds = list(speculative_generate(tiny, ids(tiny), config))
    check_tree_rounds(tiny, rounds, config)
    again = list(speculative_generate(tiny, ids(tiny), config))
    assert spec_tokens(again) == spec_tokens(rounds)  # same seed, same tokens
    assert any(n.status == REJECTED for r in rounds for n in r.tree)
    tried = [n for r in rounds for n in r.tree if n.rank > 0 and n.status != NOT_VERIFIED]
    assert tried, "no second sibling was ever tried"
    assert round_from_dict(json.loads(json.dumps(rounds[0].to_dict()))) == rounds[0]


@torch.inference_mode()
def test_the_tree_drafter_reads_each_node_as_its_path_alone(tiny):
    """Each node's q is the draft's softmax after the prompt and the path to it (the draft's tree mask and
    positions are right), the nodes are the most likely paths, and after `keep` the draft's cache continues
    exactly like a fresh read of the accepted path."""
    drafter = TreeDrafter(tiny.draft, SamplingParams(), tiny.vocab_size)
    prompt = torch.tensor([ids(tiny)], device=TEST_DEVICE)
    drafter.prefill(prompt)
    tree = drafter.grow(prompt, depth=4, budget=10)
    parents = tree.parents
    assert tree.n == 10 and max(depths(parents)) >= 2
    score = []
    for i in range(tree.n):
        path = [tree.tokens[j] for j in path_to(parents, i)]
        logits = tiny.draft(torch.tensor([ids(tiny) + path[:-1]], device=TEST_DEVICE)).logits[0, -1].float()
        assert tree.q[i] == pytest.approx(float(torch.softmax(logits, -1)[path[-1]]), rel=1e-4 if EXACT else 2e-2)
        score.append(math.prod(tree.q[j] for j in path_to(parents, i)))
    # every child is less likely than its parent, so the budget's best paths form a tree
    assert all(score[i] <= score[p] + 1e-9 for i, p in enumerate(parents) if p >= 0)
    leaf = max((i for i in range(tree.n) if tree.slots[i] >= 0), key=lambda i: depths(parents)[i])
    path = path_to(parents, leaf)
    drafter.keep(tree, path)
    committed = ids(tiny) + [tree.tokens[j] for j in path] + [5]
    after = forward(drafter.model, torch.tensor([[5]], device=TEST_DEVICE), drafter.cache, 0).logits[0, -1]
    fresh = tiny.draft(torch.tensor([committed], device=TEST_DEVICE)).logits[0, -1]
    torch.testing.assert_close(after, fresh, **(dict(atol=1e-5, rtol=1e-4) if EXACT else dict(atol=5e-2, rtol=5e-2)))


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    """A random tree of n nodes, children of one parent with distinct tokens."""
    parents, tokens = [], []
    for i in range(n):
        parent = rng.randrange(-1, i)
        used = {t for t, p in zip(tokens, parents) if p == parent}
        choices = [t for t in range(vocab) if t not in used]
        if not choices:
            parent, choices = -1, [t for t in range(vocab) if t not in {t for t, p in zip(tokens, parents) if p == -1}]
        parents.append(parent), tokens.append(rng.choice(choices))
    order = sorted(range(n), key=lambda i: depths(parents)[i])  # parents first
    index = {o: i for i, o in enumerate(order)}
    return [-1 if parents[o] < 0 else index[parents[o]] for o in order], [tokens[o] for o in order]


@pytest.mark.parametrize("seed", range(6))
def test_at_every_node_the_walk_emits_the_targets_next_token_distribution(seed):
    """The analytic identity at every node: enumerating every branch of the walk over a random tree (each tried
    node accepted or rejected, weighted by its accept probability; then the correction from what is left of p,
    or the bonus), the chance that the walk reaches node v and then emits y (by accepting v's child y, or as
    the correction or bonus there) is exactly P(reach v) * p_v(y), with P(reach v) the product of p along the
    path to v: the output is the target's, token by token."""
    rng = random.Random(seed)
    vocab, n = 5, 7
    parents, tokens = random_tree(rng, n, vocab)
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64) * 2, -1)
    if seed % 2:  # zeros in p: a child the target rules out, a token only the target says
        p[:, 0] = 0.0
        p = p / p.sum(-1, keepdim=True)
    p_at = [float(p[parent + 1, t]) for parent, t in zip(parents, tokens)]
    through: dict[tuple[int, int], float] = {}  # (node v, token y): P(the walk reaches v, then emits y)
    seen, total = set(), 0.0
    for choice in itertools.product((0.0, 1.0), repeat=n):  # u = 0 accepts (when possible), u = 1 rejects
        verdict, tried = walk_point_masses(parents, p_at, list(choice))
        key = tuple((i, t.accepted) for i, t in zip(tried, verdict.tries))
        if key in seen:
            continue
        seen.add(key)
        weight = math.prod(t.accept_prob if t.accepted else 1 - t.accept_prob for t in verdict.tries)
        total += weight
        for v, child in zip([-1, *verdict.path], verdict.path):
            through[v, tokens[child]] = through.get((v, tokens[child]), 0.0) + weight
        end = verdict.path[-1] if verdict.path else -1
        row = p[end + 1] if verdict.bonus else without(p[end + 1], [tokens[i] for i in tried if parents[i] == end])
        for y in range(vocab):
            through[end, y] = through.get((end, y), 0.0) + weight * float(row[y])
    assert total == pytest.approx(1.0, abs=1e-12)
    assert len(seen) > 3
    for v in range(-1, n):
        reach = math.prod(p_at[j] for j in path_to(parents, v)) if v >= 0 else 1.0
        for y in range(vocab):
            assert through.get((v, y), 0.0) == pytest.approx(reach * float(p[v + 1, y]), abs=1e-12), (v, y)


def test_the_tree_drafter_needs_the_targets_tokenizer(tiny):
    assert drafter_problem("tree", tiny.draft, tiny.target, 0) is None
    assert "tokenizer" in drafter_problem("tree", tiny.draft, tiny.target, 0, vocab_map=object())
    assert "no draft model" in drafter_problem("tree", None, tiny.target, 0)
