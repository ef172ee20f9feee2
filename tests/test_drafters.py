"""Drafters: prompt lookup by hand, the model drafter's q is the distribution it really sampled from,
early stopping, the hybrid's choice, adaptive K, and a target-only pair with a model-free drafter."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.config import next_k
from specviz.engine.acceptance import AcceptanceModel, FEATURES, shipped_model
from specviz.engine.cuts import confidence_cut, predicted_cut
from specviz.engine.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter, make_drafter
from specviz.engine.sampling import logits_to_probs, make_generator

CPU = torch.device("cpu")


@pytest.mark.parametrize("history,k,expected", [
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # the 3-gram [4, 1, 2] never occurred before; the 2-gram [1, 2] did
    ([5, 6, 7, 5, 6, 8, 5, 6], 2, [8, 5]),  # the LATEST earlier occurrence wins
    ([1, 2, 9, 1, 2], 5, [9, 1, 2]),  # fewer than k tokens follow
    ([7, 3, 1, 2, 3], 2, [1, 2]),  # longest n-gram first: [2, 3] is new, [3] occurred at index 1
    ([1, 2, 3, 4], 3, []),  # nothing repeats
    ([4], 3, []),
    ([4, 4], 3, [4]),
])
def test_prompt_lookup_continuation(history, k, expected):
    assert PromptLookupDrafter(vocab_size=10, device=CPU).continuation(history, k) == expected


def test_prompt_lookup_proposes_point_masses():
    drafter = PromptLookupDrafter(vocab_size=10, device=CPU)
    draft = drafter.propose(torch.tensor([[1, 2, 3, 1, 2]]), [1, 2, 3, 1, 2], 2)
    assert draft.tokens.tolist() == [3, 1] and draft.k == 2
    torch.testing.assert_close(draft.q, torch.eye(10)[[3, 1]])
    assert drafter.propose(torch.tensor([[1, 2, 3]]), [1, 2, 3], 4).k == 0
    assert drafter.propose(torch.tensor([[1, 2, 3, 1, 2]]), [1, 2, 3, 1, 2], 0).k == 0


@torch.inference_mode()
def full_forward_probs(model, ids: list[int], sampling: SamplingParams) -> torch.Tensor:
    """The draft's warped next-token distribution after `ids`, by one cache-free forward."""
    return logits_to_probs(model(torch.tensor([ids])).logits[0, -1].float(), sampling)


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, 10, 0.9)])
def test_model_drafter_q_is_the_distribution_it_sampled_from(tiny, sampling):
    """The transformers #32867 trap: a greedy draft must report a point mass, not its softmax."""
    ids = tiny.tokenizer("she said that")["input_ids"]
    drafter = ModelDrafter(tiny.draft, sampling, make_generator(CPU, 0), tiny.vocab_size)
    draft = drafter.propose(torch.tensor([ids]), ids, 5)
    assert draft.k == 5
    for j in range(5):
        expected = full_forward_probs(tiny.draft, ids + draft.tokens[:j].tolist(), sampling)
        torch.testing.assert_close(draft.q[j], expected, atol=1e-5, rtol=1e-4)
        assert draft.q[j, draft.tokens[j]] > 0
    if sampling.greedy:
        assert set(draft.q.flatten().tolist()) == {0.0, 1.0}


def test_model_drafter_continues_from_its_cache_after_rollback(tiny):
    """After a rollback the next proposal is what a fresh drafter would propose from the same context."""
    greedy = SamplingParams(0.0)
    ids = tiny.tokenizer("the a of")["input_ids"]
    drafter = ModelDrafter(tiny.draft, greedy, make_generator(CPU, 0), tiny.vocab_size)
    first = drafter.propose(torch.tensor([ids]), ids, 4).tokens.tolist()
    drafter.rollback(len(ids) + 1)  # keep one drafted token, then the "target" says 7
    context = ids + first[:1] + [7]
    again = drafter.propose(torch.tensor([context]), context, 3).tokens.tolist()
    fresh = ModelDrafter(tiny.draft, greedy, make_generator(CPU, 0), tiny.vocab_size)
    assert again == fresh.propose(torch.tensor([context]), context, 3).tokens.tolist()


@pytest.mark.parametrize("cut", [confidence_cut, lambda c: predicted_cut(AcceptanceModel(c, (0.0,) * 6), 0.5,
                                                                          "model", 10)],
                         ids=["confidence", "predicted"])
def test_model_drafter_stops_below_the_cut(tiny, cut):
    """A cut no token clears stops after the first token; one every token clears never stops. (For the
    predicted mode the model's bias alone sets the prediction: sigmoid(-20) < 0.5 < sigmoid(20).)"""
    ids = tiny.tokenizer("the a of")["input_ids"]
    stop_now, go_on = (1.01, 1e-9) if cut is confidence_cut else (-20.0, 20.0)
    never = ModelDrafter(tiny.draft, SamplingParams(0.0), make_generator(CPU, 0), tiny.vocab_size, cut(stop_now))
    assert never.propose(torch.tensor([ids]), ids, 6).k == 1  # the token that fell below is still proposed
    always = ModelDrafter(tiny.draft, SamplingParams(0.0), make_generator(CPU, 0), tiny.vocab_size, cut(go_on))
    assert always.propose(torch.tensor([ids]), ids, 6).k == 6


def test_hybrid_uses_lookup_when_the_context_repeats(tiny):
    gen = make_generator(CPU, 0)
    hybrid = HybridDrafter(PromptLookupDrafter(tiny.vocab_size, CPU),
                           ModelDrafter(tiny.draft, SamplingParams(0.0), gen, tiny.vocab_size))
    repeating = [5, 6, 7, 8, 5, 6]
    draft = hybrid.propose(torch.tensor([repeating]), repeating, 3)
    assert draft.tokens.tolist() == [7, 8, 5]
    fresh = [5, 6, 7, 8]
    draft = hybrid.propose(torch.tensor([fresh]), fresh, 3)
    assert draft.k == 3 and draft.q.sum(-1).allclose(torch.ones(3))


def test_make_drafter_checks_its_arguments(tiny):
    gen, alone = make_generator(CPU, 0), replace(tiny, draft=None)
    unknown = SimpleNamespace(drafter="ngram", sampling=SamplingParams(), exit_layer=0)  # (no DecodeConfig holds it)
    assert make_drafter(DecodeConfig(drafter="model"), tiny, gen).name == "model"
    assert make_drafter(DecodeConfig(drafter="hybrid"), tiny, gen).name == "hybrid"
    assert make_drafter(DecodeConfig(drafter="lookup"), alone, gen).name == "lookup"
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter(unknown, tiny, gen)
    with pytest.raises(ValueError, match="no draft model, which the 'model' drafter needs"):
        make_drafter(DecodeConfig(drafter="model"), alone, gen)


def test_target_only_pair_with_prompt_lookup(tiny):
    pair = replace(tiny, draft=None)
    ids = tiny.tokenizer("the a of")["input_ids"]
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=SamplingParams(0.0), drafter="lookup")
    rounds = list(speculative_generate(pair, ids, config))
    assert [t for r in rounds for t in r.new_token_ids] == [s.token.id for s in autoregressive_generate(pair, ids, config)]
    with pytest.raises(ValueError, match="no draft model"):
        next(speculative_generate(pair, ids, replace(config, drafter="model")))


@pytest.mark.parametrize("adaptive,k,drafted,accepted,expected", [
    ("fixed", 3, 3, 0, 3),
    ("confidence", 3, 2, 2, 3),
    ("acceptance", 3, 3, 3, 5),  # a clean sweep grows K by 2 ...
    ("acceptance", 7, 7, 7, 8),  # ... up to the configured K
    ("acceptance", 5, 5, 2, 4),  # a rejection shrinks it by 1 ...
    ("acceptance", 1, 1, 0, 1),  # ... down to 1
    ("acceptance", 4, 0, 0, 4),  # nothing drafted: no evidence either way
])
def test_next_k(adaptive, k, drafted, accepted, expected):
    assert next_k(DecodeConfig(k=8, adaptive=adaptive), k, drafted, accepted) == expected


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(1.0)], ids=["greedy", "T=1"])
def test_predicted_mode_stops_where_the_events_prediction_falls_below_the_cut(tiny, sampling):
    """The stop rule (on the device, while drafting) and the events (on the host, afterwards) compute the same
    prediction: in every round the tokens before the last clear the cut, and a round cut short ends on a token
    that does not. Greedy output stays the target's own: a cut only decides how many tokens to draft."""
    model = AcceptanceModel(-2.0, (5.0, -0.5, -0.2, *[0.0] * (len(FEATURES) - 3)))
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=sampling, adaptive="predicted", confidence=0.6)
    short = 0
    for prompt in ("the a of", "she said that"):
        ids = tiny.tokenizer(prompt)["input_ids"]
        rounds = list(speculative_generate(tiny, ids, config, acceptance_model=model))
        position = 0
        for r in rounds:
            assert all(t.predicted >= 0.6 - 1e-6 for t in r.drafted[:-1]), [t.predicted for t in r.drafted]
            if r.k < min(6, 40 - position - 1):
                short += 1
                assert r.drafted[-1].predicted < 0.6 + 1e-6
            position += r.tokens_emitted
        if sampling.greedy:
            ar = [s.token.id for s in autoregressive_generate(tiny, ids, config)]
            assert [t for r in rounds for t in r.new_token_ids] == ar
    assert short > 0  # the cut did stop some rounds early


def test_every_drafted_token_carries_the_shipped_prediction(tiny):
    ids = tiny.tokenizer("the a of")["input_ids"]
    rounds = list(speculative_generate(tiny, ids, DecodeConfig(k=4, max_new_tokens=12, adaptive="fixed")))
    shipped = shipped_model()
    assert len(shipped.weights) == len(FEATURES)
    for r in rounds:
        for i, t in enumerate(r.drafted):
            top = [c.prob for c in t.q_top]
            assert t.predicted == pytest.approx(
                1 / (1 + math.exp(-(shipped.bias + shipped.weights[0] * top[0] + shipped.weights[2] * i
                                    + shipped.weights[1] * -sum(p * math.log(p) for p in
                                                                [*top, max(0.0, 1 - sum(top))] if p > 0)))))


def test_the_cut_applied_once_a_round_keeps_the_same_drafts_with_one_host_read(monkeypatch):
    """Greedy, the confidence cut: as it drafts (a host read per drafted token) or once a round after all K (one
    read): the same rounds, the same drafts; the round's host reads fall to two (its event, and the cut)."""
    from specviz.bench.syncs import counting_host_reads
    from specviz.engine import speculative
    from specviz.models.tiny import tiny_pair

    pair = tiny_pair(noise=0.15)
    config = DecodeConfig(k=6, max_new_tokens=30, adaptive="confidence", confidence=0.1)
    runs, reads = {}, {}
    for once in (False, True):
        monkeypatch.setattr(speculative, "cut_once", lambda device, once=once: once)
        with counting_host_reads(pair.device) as count:
            rounds = list(speculative_generate(pair, [2, 5, 7], config))
        runs[once] = [([t.id for t in r.drafted], r.new_token_ids) for r in rounds]
        reads[once] = count[0] / len(rounds)
    assert runs[True] == runs[False] and any(len(d) < 6 for d, _ in runs[True])  # the cut did cut
    print("host reads a round, as it drafts and once:", reads)
    assert reads[True] <= 2 < reads[False]
