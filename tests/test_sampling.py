"""Sampling warps: temperature, top-k, top-p and greedy, against distributions computed here with numpy.

The reference `warp` below is written from the definitions (HF order: temperature, then top-k on
the scaled logits, then softmax, then the nucleus), not from specviz's code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import softmax
from scipy.stats import chisquare

from specviz.engine.sampling import SamplingParams, first_max, logits_to_probs, make_generator, sample

LOGITS = [2.0, -1.0, 0.5, 3.1, 1.2, -0.3, 0.0, 2.6]  # no ties, so top-k / top-p sets are unambiguous


def warp(logits, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return np.eye(len(z))[int(np.argmax(z))]
    z = z / temperature
    if top_k:
        kth = np.sort(z)[::-1][min(top_k, len(z)) - 1]
        z = np.where(z >= kth, z, -np.inf)
    p = softmax(z)
    if top_p < 1:
        keep, mass = np.zeros(len(p), bool), 0.0
        for i in np.argsort(-p, kind="stable"):  # the smallest most-likely set holding >= top_p
            keep[i], mass = True, mass + p[i]
            if mass >= top_p:
                break
        p = np.where(keep, p, 0.0)
        p = p / p.sum()
    return p


def probs(logits, **params) -> np.ndarray:
    return logits_to_probs(torch.tensor(logits), SamplingParams(**params)).numpy()


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 1.5, 2.0])  # 2: the top of the settings range
def test_temperature_is_softmax_of_scaled_logits(temperature):
    np.testing.assert_allclose(probs(LOGITS, temperature=temperature), warp(LOGITS, temperature), atol=1e-6)


@pytest.mark.parametrize("top_k", [1, 2, 3, 7, 8, 50])
def test_top_k_keeps_the_k_largest_and_renormalises(top_k):
    got = probs(LOGITS, temperature=0.8, top_k=top_k)
    np.testing.assert_allclose(got, warp(LOGITS, 0.8, top_k=top_k), atol=1e-6)
    assert (got > 0).sum() == min(top_k, len(LOGITS))


def test_top_k_2_by_hand():
    # logits 3.1 and 2.6 survive: p = e^3.1 / (e^3.1 + e^2.6) = 1 / (1 + e^-0.5)
    got = probs(LOGITS, temperature=1.0, top_k=2)
    a = 1 / (1 + np.exp(-0.5))
    expected = np.zeros(8)
    expected[3], expected[7] = a, 1 - a
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_top_k_breaks_ties_by_token_id():
    np.testing.assert_allclose(probs([1.0, 2.0, 2.0, 0.0], temperature=1.0, top_k=2), [0, 0.5, 0.5, 0], atol=1e-7)
    # three tokens tie for two places: the lower ids win, exactly k are kept
    np.testing.assert_allclose(probs([2.0, 1.0, 2.0, 2.0], temperature=1.0, top_k=2), [0.5, 0, 0.5, 0], atol=1e-7)


def test_top_p_breaks_ties_by_token_id():
    # four equal tokens: a nucleus of 0.5 is the two with the lowest ids
    np.testing.assert_allclose(probs([0.0] * 4, temperature=1.0, top_p=0.5), [0.5, 0.5, 0, 0], atol=1e-7)


@pytest.mark.parametrize("params", [SamplingParams(1.0, top_k=7), SamplingParams(0.8, top_p=0.6),
                                    SamplingParams(1.2, top_k=20, top_p=0.9)])
def test_a_row_alone_and_in_a_batch_keep_the_same_tokens(params):
    """A verify warps K+1 rows at once, the draft one row at a time: with many tied logits (coarse values,
    as low precision makes them) both must keep exactly the same tokens."""
    rows = torch.randint(0, 4, (9, 4096), generator=torch.Generator().manual_seed(0)).float()
    batch = logits_to_probs(rows, params)
    for i, row in enumerate(rows):
        assert torch.equal(logits_to_probs(row, params) > 0, batch[i] > 0)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.72, 0.9, 0.99])
def test_top_p_keeps_the_smallest_nucleus(top_p):
    np.testing.assert_allclose(probs(LOGITS, temperature=1.0, top_p=top_p), warp(LOGITS, 1.0, top_p=top_p),
                               atol=1e-6)


def test_top_p_by_hand():
    # probabilities 1/2, 1/4, 1/8, 1/8: a nucleus of 0.7 needs the first two, of 0.8 the first three
    logits = np.log([0.125, 0.5, 0.125, 0.25]).tolist()
    np.testing.assert_allclose(probs(logits, temperature=1.0, top_p=0.7), [0, 2 / 3, 0, 1 / 3], atol=1e-6)
    got = probs(logits, temperature=1.0, top_p=0.8)
    assert (got > 0).sum() == 3 and got[1] == pytest.approx(0.5 / 0.875, abs=1e-6)


def test_top_p_always_keeps_the_most_likely_token():
    got = probs(LOGITS, temperature=1.0, top_p=1e-9)
    np.testing.assert_array_equal(got, np.eye(8)[3])
    with pytest.raises(ValueError, match="greater than 0"):  # top-p 0 would keep nothing: refused
        SamplingParams(1.0, top_p=0.0)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, 0.8), (1.3, 3, 0.95), (1.0, 6, 0.4)])
def test_temperature_top_k_and_top_p_together(temperature, top_k, top_p):
    np.testing.assert_allclose(probs(LOGITS, temperature=temperature, top_k=top_k, top_p=top_p),
                               warp(LOGITS, temperature, top_k, top_p), atol=1e-6)


def test_warps_apply_per_row_of_a_batch():
    rng = np.random.default_rng(0)
    batch = rng.normal(size=(3, 4, 50)) * 2
    got = logits_to_probs(torch.tensor(batch, dtype=torch.float32), SamplingParams(0.9, 10, 0.8)).numpy()
    expected = np.array([[warp(row, 0.9, 10, 0.8) for row in rows] for rows in batch])
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_missing_vocabulary_entries_get_zero_probability():
    logits = LOGITS + [float("-inf")] * 3  # what pad_vocab appends for ids a model does not have
    got = probs(logits, temperature=1.0, top_k=4, top_p=0.9)
    assert np.all(got[8:] == 0)
    np.testing.assert_allclose(got[:8], warp(LOGITS, 1.0, 4, 0.9), atol=1e-6)


def test_greedy_is_a_point_mass_on_the_argmax():
    got = probs([[0.3, 5.0, -2.0, 4.9], [7.0, 0.0, 6.99, 1.0]], temperature=0.0, top_k=2, top_p=0.5)
    np.testing.assert_array_equal(got, [[0, 1, 0, 0], [1, 0, 0, 0]])
    assert SamplingParams(0.0).greedy and not SamplingParams(0.5).greedy


def test_sample_from_a_point_mass_is_that_token():
    gen = make_generator(torch.device("cpu"), 0)
    p = torch.eye(6)[[4, 0, 5]]
    for _ in range(20):
        assert sample(p, gen).tolist() == [4, 0, 5]


def test_sample_keeps_the_batch_shape():
    p = torch.full((2, 3, 7), 1 / 7)
    assert sample(p, make_generator(torch.device("cpu"), 1)).shape == (2, 3)


def test_sample_respects_the_seed():
    p = torch.tensor(warp(LOGITS, 1.0), dtype=torch.float32).expand(400, -1)
    draws = [sample(p, make_generator(torch.device("cpu"), seed)).tolist() for seed in (7, 7, 8)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]
    unseeded = [sample(p, make_generator(torch.device("cpu"), None)).tolist() for _ in range(2)]
    assert unseeded[0] != unseeded[1]


def test_sample_draws_from_the_given_distribution():
    expected = warp(LOGITS, 1.0)
    n = 200_000
    draws = sample(torch.tensor(expected, dtype=torch.float32).expand(n, -1), make_generator(torch.device("cpu"), 3))
    counts = np.bincount(draws.numpy(), minlength=len(expected))
    assert chisquare(counts, expected * n).pvalue > 0.01
    assert 0.5 * np.abs(counts / n - expected).sum() < 0.01


def test_sample_needs_no_normalised_rows_and_never_draws_a_zero():
    p = torch.tensor([[0.0, 0.2, 0.0, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 0.7]]).expand(5_000, -1, -1)
    draws = sample(p, make_generator(torch.device("cpu"), 5))
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 1].tolist()) == {4}
    assert torch.equal(sample(4 * p, make_generator(torch.device("cpu"), 5)), draws)  # scale-free (x4: exact in floats)


def test_greedy_takes_the_lowest_id_among_equal_maxima_as_argmax_does():
    """`first_max` (max's indices, faster than argmax on a CPU) against argmax, with ties spread over a 152k row so
    the threads' parts each hold some; the control: the last of the maxima is another id."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 151936, generator=gen)
    ties = torch.randint(0, 151936, (9, 3), generator=gen)
    logits.scatter_(-1, ties, float(logits.max()) + 1)
    assert torch.equal(first_max(logits), logits.argmax(-1)) and torch.equal(first_max(logits), ties.min(-1).values)
    assert torch.equal(first_max(logits[4]), logits[4].argmax())
    assert not torch.equal(first_max(logits), ties.max(-1).values)
