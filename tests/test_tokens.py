"""The round's shown statistics: the block search for a row's top-n, and the entropy from the logsumexp."""

from __future__ import annotations

import pytest
import torch

from specviz.engine.tokens import BLOCK, entropy, largest, target_stats


def _rows(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 4


@pytest.mark.parametrize("width", [151936, 32000, 4 * 10 * BLOCK + 77, 4 * 10 * BLOCK, 200])
@pytest.mark.parametrize("n", [1, 2, 10])
def test_the_block_search_finds_topk_values_and_ids_that_hold_them(width, n):
    x = _rows((9, width))
    values, ids = largest(x, n)
    assert torch.equal(values, x.topk(n, dim=-1).values)
    assert torch.equal(x.gather(-1, ids), values)


def test_the_top_values_in_the_last_partial_block_are_found():
    x = _rows((3, 4 * 10 * BLOCK + 77))
    x[0, -1], x[1, -40], x[2, -77] = 100.0, 99.0, 98.0  # each row's maximum in the tail
    values, ids = largest(x, 10)
    assert ids[:, 0].tolist() == [x.shape[1] - 1, x.shape[1] - 40, x.shape[1] - 77]
    assert torch.equal(values, x.topk(10, dim=-1).values)


def test_many_top_values_in_one_block_and_ties_and_minus_infinity():
    x = torch.full((2, 151936), float("-inf"))
    x[0, 5 * BLOCK:5 * BLOCK + 12] = torch.arange(12.0)  # the whole top-10 in one block
    x[1, ::997] = 3.0  # ties spread over many blocks
    values, ids = largest(x, 10)
    assert torch.equal(values, x.topk(10, dim=-1).values)
    assert torch.equal(x.gather(-1, ids), values) and len(set(ids[1].tolist())) == 10


def test_a_search_of_one_block_per_value_misses_the_top_n_control():
    """Negative control: keeping only the block of each row's maximum (a wrong shortcut) loses values the block
    search keeps, on the same rows."""
    x = _rows((4, 151936), seed=3)
    best = x[:, :151936 - 151936 % BLOCK].unflatten(-1, (-1, BLOCK)).amax(-1).argmax(-1)
    ids = best[:, None] * BLOCK + torch.arange(BLOCK)
    wrong = x.gather(1, ids).topk(10, dim=-1).values
    assert not torch.equal(wrong, x.topk(10, dim=-1).values)
    assert torch.equal(largest(x, 10)[0], x.topk(10, dim=-1).values)


def test_the_entropy_is_entr_of_the_softmax_and_ignores_tokens_that_cannot_be_said():
    logits = _rows((8, 151936)) * 2
    logits[:, ::3] = float("-inf")
    soft = torch.softmax(logits, -1)
    assert torch.allclose(entropy(logits, soft), torch.special.entr(soft).sum(-1), atol=2e-4, rtol=1e-5)
    point = torch.full((1, 100), float("-inf"))
    point[0, 7] = 0.0
    assert entropy(point, torch.softmax(point, -1)).item() == 0.0


@pytest.mark.parametrize("greedy", [True, False])
def test_the_target_statistics_gap_and_shown_top(greedy):
    logits = _rows((9, 151936))
    p = torch.softmax(logits / 0.7, -1)
    p_soft, stats = target_stats(logits, p, greedy, 10)
    top2 = logits.topk(2, dim=-1).values
    assert torch.equal(stats["gap"], top2[:, 0] - top2[:, 1])
    shown = p_soft if greedy else p
    assert torch.equal(stats["p_top_vals"], shown.topk(10, dim=-1).values)
    assert torch.equal(shown.gather(-1, stats["p_top_ids"]), stats["p_top_vals"])
