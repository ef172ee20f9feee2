"""The draft's head over part of the vocabulary (FR-Spec, `models/draft/vocab.py`): exact, cheaper, and checked.

Exactness: the drafter samples from the q the subset head makes (zero outside the subset) and the rule reads that
same q, so speculative decoding still draws from the target's distribution: 3,000 end-to-end runs on the
statistical tests' pair, its draft's head cut to 10 of the 16 ids (the six left out hold about a third of the
draft's mass), against the exact distribution, with the always-accept control. The mutant the cut invites, a
rule that reads q from the full vocabulary's softmax while the draft samples from the subset's (q too small on
every token it can say, so they are accepted too often), is caught by the same statistics at a tenth of the runs.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from helpers import deprecations_said, spec_tokens
from test_mutants import caught
from test_statistical import (  # noqa: F401 (pair: the same fixture, the same models)
    PROMPT, TEMPERATURE_1, V, always_accept, consistent, detected, end_to_end, exact_joint, pair, statistics, tables,
)

from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.engine.drafters import Draft, ModelDrafter
from specviz.models import PairSpec, load_spec
from specviz.models.draft import DraftQuant, with_cheaper_draft
from specviz.models.draft.lean import LeanDraft
from specviz.models.draft.vocab import SubsetHead, subset_linear, tokenizer_digest
from specviz.models.cut_head import draft_vocab_ids
from specviz.models.memory import model_bytes
from specviz.models.pair import ModelLoadError
from specviz.models.tiny import tiny_pair

KEPT = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9, 12, 15])  # <eos> (0) among them: the draft can stop
RUNS = 3_000
CONTROL_RUNS = 125  # always accept: P(not detected) 0 in 200,000 tries at 125 (5e-6 at 100), position 2 by far
MUTANT_RUNS = 300  # q from the full vocabulary: position 2 (TV 0.42) misses p < 1e-6 0 times in 200,000 tries at 200


def cut(pair):
    """The pair with its draft's head over KEPT only (the full head stays as the draft model's `full_head`)."""
    draft = copy.deepcopy(pair.draft)
    draft.full_head = draft.head
    draft.head = SubsetHead(subset_linear(draft.full_head, KEPT), KEPT, V)
    return replace(pair, draft=draft)


@pytest.fixture(scope="module")
def cut_pair(pair):
    return cut(pair)


def test_the_subset_head_is_the_full_head_on_its_tokens_and_minus_infinity_elsewhere(pair):
    head = pair.draft.head
    h = torch.randn(3, head.in_features)
    logits = SubsetHead(subset_linear(head, KEPT), KEPT, V)(h)
    left_out = torch.ones(V, dtype=torch.bool)
    left_out[KEPT] = False
    torch.testing.assert_close(logits[:, KEPT], head(h)[:, KEPT])
    assert torch.isneginf(logits[:, left_out]).all()
    q = torch.softmax(logits, -1)
    assert (q[:, left_out] == 0).all() and torch.allclose(q.sum(-1), torch.ones(3))


@torch.inference_mode()
def test_the_cut_leaves_a_real_share_of_the_drafts_mass_out(pair):
    """Not degenerate: the six left-out ids hold a real share of the draft's q (so a wrong q is visible): at the
    first position, and on average over the second position's 16 contexts."""
    def left_out(prefixes):
        ids = torch.tensor([PROMPT + list(p) for p in prefixes])
        q = torch.softmax(pair.draft(ids).logits[:, -1].float(), -1)
        return 1 - float(q[:, KEPT].sum(-1).mean())
    assert left_out([()]) > 0.1 and left_out([(x,) for x in range(V)]) > 0.3


def test_speculation_with_a_cut_draft_head_samples_the_target_distribution(cut_pair):
    samples, _ = end_to_end(cut_pair, TEMPERATURE_1, RUNS)
    stats = statistics(samples, exact_joint(tables(cut_pair.target, TEMPERATURE_1)))
    print("draft head over 10 of 16 ids", stats)
    assert consistent(stats, 1e-3, 0.05), stats


def test_negative_control_cut_draft_head(cut_pair, monkeypatch):
    always_accept(monkeypatch)
    samples, _ = end_to_end(cut_pair, TEMPERATURE_1, CONTROL_RUNS)
    stats = statistics(samples, exact_joint(tables(cut_pair.target, TEMPERATURE_1)))
    print("always accept, draft head over 10 of 16 ids", stats)
    assert detected(stats, 1e-3, 0.05), stats


def test_a_rule_reading_q_from_the_full_vocabulary_while_the_draft_samples_the_subset_is_caught(cut_pair, monkeypatch):
    real = ModelDrafter.propose
    full = copy.deepcopy(cut_pair.draft)
    full.head = full.full_head

    def propose(self, ids, history, k):  # the tokens the cut head sampled; the q of the head as loaded
        d = real(self, ids, history, k)
        if not len(d.tokens):
            return d
        seen = torch.cat([ids[0], d.tokens[:-1]])[None]
        return Draft(d.tokens, torch.softmax(full(seen).logits[0, -len(d.tokens):].float(), -1), d.logits)

    monkeypatch.setattr(ModelDrafter, "propose", propose)
    samples, _ = end_to_end(cut_pair, TEMPERATURE_1, MUTANT_RUNS)  # caught at a tenth of the test's runs
    stats = statistics(samples, exact_joint(tables(cut_pair.target, TEMPERATURE_1)))
    print("q from the full vocabulary, drafts from the subset", stats)
    assert caught(stats) and not consistent(stats, 1e-3, 0.05), stats


def tiny_ranking(tmp_path, tokenizer, ranked):
    path = tmp_path / "draft_vocab.json"
    path.write_text(json.dumps({"tokenizer_sha256": tokenizer_digest(tokenizer), "vocab": 96, "ranked": ranked}))
    return path


def test_a_lean_draft_with_a_cut_head_holds_only_those_rows_and_decodes_greedy_as_the_target_alone(tmp_path):
    """float32, greedy: the tokens are the target's alone, with the head cut to 32 of 96 ids (16-row blocks, as
    int4 packs them); the draft's head holds 32 rows' bytes, not 96."""
    loaded = tiny_pair()
    ids = draft_vocab_ids(loaded, 32, tiny_ranking(tmp_path, loaded.tokenizer, list(range(95, -1, -1))))
    assert ids.tolist() == list(range(64, 96))  # the 32 ranked first, in id order
    whole = with_cheaper_draft(loaded, DraftQuant())
    part = with_cheaper_draft(loaded, DraftQuant(), vocab_ids=ids)
    assert isinstance(part.draft, LeanDraft) and isinstance(part.draft.lm_head, SubsetHead)
    assert "head over 32 tokens" in part.draft_name
    head, cut_head = model_bytes(whole.draft.lm_head), model_bytes(part.draft.lm_head.head)
    assert cut_head == head // 3 and model_bytes(part.draft) == model_bytes(whole.draft) - head + cut_head + 32 * 8
    prompt, config = [3, 4, 5, 6, 7, 8], DecodeConfig(k=4, max_new_tokens=16, adaptive="fixed")
    rounds = list(speculative_generate(part, prompt, config))
    alone = [s.token.id for s in autoregressive_generate(loaded, prompt, config)]
    assert spec_tokens(rounds) == alone and len(alone) == 16
    drafted = {d.id for r in rounds for d in r.drafted}
    assert drafted and drafted <= set(range(64, 96))  # the draft says only what its head keeps


def test_a_decode_on_the_lean_draft_step_says_nothing_deprecated():
    """The lean int4 draft takes its cache by either name and is passed the current one, in a chain and a tree: no
    deprecation said (`helpers.deprecations_said`)."""
    lean = with_cheaper_draft(tiny_pair(), DraftQuant())
    assert isinstance(lean.draft, LeanDraft)
    with deprecations_said() as said:
        for drafter in ("model", "tree"):
            rounds = list(speculative_generate(lean, [3, 4, 5, 6], DecodeConfig(k=3, max_new_tokens=10,
                                                                                 drafter=drafter)))
            assert rounds
    assert said == []


def test_a_ranking_for_another_tokenizer_is_refused_in_one_sentence(tmp_path):
    loaded = tiny_pair()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"tokenizer_sha256": "0" * 64, "ranked": list(range(64))}))
    with pytest.raises(ModelLoadError, match="made for the embedded pair's tokenizer"):
        draft_vocab_ids(loaded, 32, other)
    assert draft_vocab_ids(loaded, 0, other) is None  # 0: the whole vocabulary, no ranking read


def test_a_cut_head_without_a_cheaper_draft_step_is_refused_in_one_sentence():
    with pytest.raises(ModelLoadError, match="needs --draft-quant int4 or int8"):
        load_spec(PairSpec("tiny", "tiny", draft_quant="none", draft_vocab=32, kernels="plain", step="eager"))
