"""A draft of another family: the vocabulary mapping, the mapped drafter's contract, and exactness.

The mapping on hand-made vocabularies (shared, draft-only and target-only tokens, ambiguous strings), then a
tiny pair "of two families": the tiny target (95 words) and a draft whose vocabulary holds 90 of its words in
reverse order plus 10 words of its own, made from the target's weights re-indexed (`helpers.other_family`),
so it agrees often, in other ids. Its context is the target's tokens translated (a word the draft lacks
becomes two of the draft's own tokens, so the two caches differ in length). Statistical exactness under
sampling, with its negative control, is in test_statistical.py; the real SmolLM2 -> Qwen pair in
test_embedded_e2e.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import EXACT, TEST_DEVICE, check_rounds, on_test_device, other_family, same_greedy, spec_tokens
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.drafters import MappedDrafter
from specviz.engine.rules import acceptance_probs, residual
from specviz.engine.sampling import logits_to_probs, make_generator
from specviz.models.families import VocabMap, same_tokenizer, shared_tokens, vocab_map
from specviz.models.pair import ModelLoadError, ModelPair
from specviz.models.tiny import EOS_ID, WORDS, tiny_model, tiny_tokenizer

CPU = torch.device("cpu")
SHARED = 90
DRAFT_WORDS = WORDS[:SHARED][::-1] + [f"zz{i}" for i in range(10)]  # draft id d: the target's word rows[d]
ROWS = [WORDS.index(w) if w in WORDS else None for w in DRAFT_WORDS]
SAMPLINGS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=10, top_p=0.9)]
PROMPTS = ["the a of", "she said that", "one", "it was the", "we"]


def translate(ids: list[int], before: list[int] = ()) -> list[int]:
    """Target ids -> draft ids: a shared word is its draft id, a word the draft lacks two tokens of its own."""
    out = []
    for t in ids:
        w = WORDS[t]
        out += [DRAFT_WORDS.index(w)] if w in DRAFT_WORDS else [SHARED + t % 10, SHARED + (t + 1) % 10]
    return out


def word_tokenizer(words: list[str]):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0])


@pytest.fixture(scope="module")
def cross() -> ModelPair:
    target = tiny_model(0, len(WORDS))
    mapping = VocabMap.build(DRAFT_WORDS, WORDS, translate, device=TEST_DEVICE)
    return on_test_device(ModelPair(
        draft=other_family(target, ROWS, 0.02, seed=1), target=target, tokenizer=tiny_tokenizer(), device=CPU,
        dtype=torch.float32, draft_name="tiny-other", target_name="tiny-target", eos_token_ids=frozenset({EOS_ID}),
        vocab_map=mapping))


CLOSE = dict(atol=1e-5, rtol=1e-4) if EXACT else dict(atol=2e-2, rtol=2e-2)  # one token computed two ways


def batch(ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], device=TEST_DEVICE)


def encode(pair, prompt: str) -> list[int]:
    return pair.tokenizer(prompt)["input_ids"]


# --- the mapping ---------------------------------------------------------------------------------


def test_shared_tokens_are_the_strings_each_vocabulary_has_exactly_once():
    draft = ["a", "b", "c", "x", "dup", "dup", None, "d-only"]
    target = ["c", "a", "y", "dup", "b", "z", "x", "x", None]
    # a, b, c shared; "dup" twice in the draft and "x" twice in the target: ambiguous, left out; y, z, d-only
    # are one side's alone; None (padding rows) never matches
    assert sorted(shared_tokens(draft, target)) == [(0, 1), (1, 4), (2, 0)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "T=1", "warped"])
def test_the_mapped_q_sums_to_one_over_the_shared_tokens(sampling):
    draft = ["a", "b", "c", "x", "dup", "dup", "d-only"]
    target = ["c", "a", "y", "dup", "b", "z", "x", "x"]
    mapping = VocabMap.build(draft, target, translate=lambda ids, before: ids)
    assert mapping.draft_of.tolist() == [2, 0, -1, -1, 1, -1, -1, -1] and mapping.shared == {0, 1, 4}
    logits = torch.randn(3, len(draft), generator=torch.Generator().manual_seed(0))
    q = logits_to_probs(mapping.target_logits(logits), sampling)
    assert q.shape == (3, len(target))
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    assert (q[:, [2, 3, 5, 6, 7]] == 0).all()  # target-only and ambiguous tokens: never proposed
    # the draft's own (warped) distribution over the shared tokens, renormalised, at the target's ids
    restricted = torch.full_like(logits, float("-inf"))
    restricted[:, [0, 1, 2]] = logits[:, [0, 1, 2]]
    torch.testing.assert_close(q[:, [1, 4, 0]], logits_to_probs(restricted, sampling)[:, [0, 1, 2]])


def test_one_tokenizer_or_two():
    tiny = tiny_tokenizer()
    assert same_tokenizer(tiny, tiny_tokenizer())
    swapped = word_tokenizer(WORDS[::-1])  # the same words, other ids
    assert not same_tokenizer(swapped, tiny) and not same_tokenizer(word_tokenizer(DRAFT_WORDS), tiny)


def test_the_mapping_from_two_real_tokenizers():
    draft_tok, target_tok = word_tokenizer(DRAFT_WORDS), tiny_tokenizer()
    mapping = vocab_map(draft_tok, target_tok, len(DRAFT_WORDS), len(WORDS) + 5, "D", "T")  # + padding rows
    assert mapping.size == SHARED and mapping.draft_of.shape == (len(WORDS) + 5,)
    assert all(DRAFT_WORDS[int(mapping.draft_of[t])] == WORDS[t] for t in mapping.shared)
    ids = target_tok("she said that the")["input_ids"]
    assert draft_tok.decode(mapping.translate(ids, [])) == "she said that the"  # the draft reads the same text
    # a piece read after the tokens before it starts as it does in context (here: with its space)
    assert mapping.translate(ids[2:], ids[:2]) == draft_tok(" that the", add_special_tokens=False)["input_ids"]


def test_too_few_shared_tokens_are_refused_naming_both_models():
    with pytest.raises(ModelLoadError, match="draft D-model and target T-model .* share only 2 of"):
        vocab_map(word_tokenizer(["the", "a", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"]), tiny_tokenizer(),
                  10, len(WORDS), "D-model", "T-model")


@torch.inference_mode()
def test_the_rule_with_a_mapped_q_emits_exactly_p_at_every_position(cross):
    """The analytic identity, per position of a real context: P(emit x) = q(x) min(1, p/q)(x) + P(reject)
    residual(x) = p(x), for the shared tokens and for the target-only ones (where q = 0) alike."""
    sampling = SamplingParams(1.0)
    ids = encode(cross, "she said that the")
    for n in range(1, len(ids) + 1):
        p = logits_to_probs(cross.target(batch(ids[:n])).logits[0, -1].float(), sampling)
        draft_logits = cross.draft(batch(translate(ids[:n]))).logits[0, -1].float()
        q = logits_to_probs(cross.vocab_map.target_logits(draft_logits), sampling)
        tokens = torch.arange(len(WORDS), device=TEST_DEVICE)
        accept = q * acceptance_probs(p.expand(len(WORDS), -1), q.expand(len(WORDS), -1), tokens)
        emitted = accept + (1 - accept.sum()) * residual(p, q)
        torch.testing.assert_close(emitted, p, atol=1e-6, rtol=0)
        assert (q[SHARED:] == 0).all() and (p[SHARED:] > 0).all()  # target-only: said only through the residual


# --- the drafter ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "T=1", "warped"])
@torch.inference_mode()
def test_the_mapped_drafter_reports_the_q_it_sampled_from(cross, sampling):
    ids = encode(cross, "she said that")
    drafter = MappedDrafter(cross.draft, cross.vocab_map, sampling, make_generator(TEST_DEVICE, 0), len(WORDS))
    drafter.prefill(batch(ids))
    draft = drafter.propose(batch(ids), ids, 5)
    assert draft.k == 5 and all(int(t) in cross.vocab_map.shared for t in draft.tokens)
    for j in range(5):
        context = translate(ids + draft.tokens[:j].tolist())
        expected = logits_to_probs(cross.vocab_map.target_logits(cross.draft(batch(context)).logits[0, -1].float()),
                                   sampling)
        torch.testing.assert_close(draft.q[j], expected, **CLOSE)
        assert draft.q[j, draft.tokens[j]] > 0


def greedy_mapped(cross, ids: list[int]) -> MappedDrafter:
    """A greedy drafter of the cross pair that has read `ids`."""
    drafter = MappedDrafter(cross.draft, cross.vocab_map, SamplingParams(0.0), make_generator(TEST_DEVICE, 0),
                            len(WORDS))
    drafter.prefill(batch(ids))
    return drafter


def reads_on_as_fresh(cross, drafter: MappedDrafter, context: list[int]) -> None:
    """`drafter` drafts after `context` exactly as a fresh drafter that read all of it: same tokens, same q."""
    resumed = drafter.propose(batch(context), context, 3)
    again = greedy_mapped(cross, context).propose(batch(context), context, 3)
    assert resumed.tokens.tolist() == again.tokens.tolist()
    torch.testing.assert_close(resumed.logits, again.logits, **CLOSE)


@torch.inference_mode()
def test_after_a_rollback_the_drafter_reads_on_as_if_fresh(cross):
    """Keep one drafted token, then a word the draft lacks (two draft tokens): the next draft is what a
    drafter that read the whole context afresh proposes, with the same q."""
    ids = encode(cross, "the a of")
    drafter = greedy_mapped(cross, ids)
    first = drafter.propose(batch(ids), ids, 4).tokens.tolist()
    drafter.rollback(len(ids) + 1)
    context = ids + first[:1] + [WORDS.index("years")]  # a word only the target has
    assert WORDS.index("years") not in cross.vocab_map.shared
    reads_on_as_fresh(cross, drafter, context)
    assert drafter.cache.get_seq_length() == len(translate(context)) + 2  # the context, two drafts read back


@torch.inference_mode()
def test_accepted_drafts_survive_a_lookup_round_in_between(cross):
    """Round 1: the model drafts and two drafts are kept; round 2: prompt lookup drafts (the model only rolls
    back) and one of its tokens is kept; round 3: the model reads on exactly as a fresh drafter would."""
    ids = encode(cross, "the a of")
    drafter = greedy_mapped(cross, ids)
    first = drafter.propose(batch(ids), ids, 4).tokens.tolist()
    drafter.rollback(len(ids) + 2)
    context = ids + first[:2] + [WORDS.index("years")]  # + the correction
    drafter.rollback(len(context) + 1)  # a lookup round: its accepted token is not the model's
    context += [WORDS.index("the"), 7]
    reads_on_as_fresh(cross, drafter, context)


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_greedy_output_of_the_cross_family_pair_is_the_target_alone(cross, drafter):
    drafted = accepted = 0
    marked = []
    for k in (1, 2, 4):
        config = DecodeConfig(k=k, max_new_tokens=24, sampling=SamplingParams(0.0), adaptive="fixed",
                              drafter=drafter)
        for prompt in PROMPTS:
            ids = encode(cross, prompt)
            rounds = list(speculative_generate(cross, ids, config))
            assert same_greedy(spec_tokens(rounds), list(autoregressive_generate(cross, ids, config))), prompt
            check_rounds(cross, rounds, config)
            drafted += sum(r.k for r in rounds)
            accepted += sum(r.n_accepted for r in rounds)
            marked += [(r.emitted.id, r.emitted.draftable) for r in rounds if r.emitted]
    assert accepted / drafted > 0.3  # the re-indexed draft agrees often: a wrong mapping would not
    assert all(draftable == (t in cross.vocab_map.shared) for t, draftable in marked)
    assert any(not draftable for _, draftable in marked)  # the target said words the draft could not propose


# --- the commands around it ----------------------------------------------------------------------


def test_the_bench_times_the_draft_on_its_own_tokens_and_the_proof_skips_the_draft_alone(cross, tmp_path):
    """`specviz bench --draft smollm2` times the draft's step on the prompt in its own ids; the proof's
    "draft alone" control is left out (a draft of another family speaks other ids), the others stay."""
    pytest.importorskip("gradio_client", reason="the whole CLI (a lent GPU machine runs the engine without it)")
    from unittest import mock

    from specviz import cli
    from specviz.runs.proof import ProofSettings, samplers

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "the a of", "kind": "code"}\n')
    out = tmp_path / "r.json"
    from specviz.bench import costs

    timed_on = []  # (which forward, the ids it read the prompt in): the target's curve first, then the draft's step
    forward_times = costs._forward_times

    def spy(model, prompt_ids, sizes, reps, device):
        timed_on.append(list(prompt_ids))
        return forward_times(model, prompt_ids, sizes, reps, device)
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: cross), \
            mock.patch("specviz.bench.costs._forward_times", spy):
        assert cli.main(["bench", "--prompts", str(prompts), "--k", "3", "--max-new-tokens", "8", "--json", str(out),
                         "--no-progress"]) == 0
    assert out.read_text().count('"identical_fraction": 1.0') >= 2  # greedy: every method equals the target alone
    target_ids, draft_ids = timed_on[-2:]
    assert draft_ids == cross.vocab_map.translate(target_ids, []) and draft_ids != target_ids  # its own ids
    names = [s.name for s in samplers(cross, ProofSettings())]
    assert names == ["speculative", "target alone", "always accept (control)"]
