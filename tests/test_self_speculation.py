"""Self-speculation: the target's first L layers draft for it (early exit), with no second model.

The early-exit logits are checked against an independent reference, the model's own hidden states
(transformers' `output_hidden_states`: the output of layer L, read out with the final norm and head),
for Qwen2, Qwen2 with sliding-window layers and Llama; with all layers they are the model's logits.
Then the drafter's contract (q is what it sampled from, its cache crops), greedy identity with the
target alone on a target-only pair, the one-sentence refusals, and each loaded model's memory.
Statistical exactness under sampling is in test_statistical.py.
"""

from __future__ import annotations


import pytest
import torch
from causal_lm import CausalLM
from helpers import check_rounds, spec_tokens
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.drafters import SelfDrafter, drafter_problem, make_drafter
from specviz.engine.early_exit import EarlyExit
from specviz.engine.events import ACCEPTED
from specviz.engine.plumbing import PromptCache
from specviz.engine.sampling import logits_to_probs, make_generator
from specviz.models.memory import model_bytes, pair_bytes
from specviz.models.pair import ModelPair
from specviz.models.tiny import EOS_ID, WORDS, tiny_model, tiny_tokenizer
from specviz.ui.render import header_html, size_text

CPU = torch.device("cpu")
V = len(WORDS)
LAYERS = 4
GREEDY, SAMPLED = SamplingParams(0.0), SamplingParams(1.0)
PROMPTS = ["the a of", "she said that", "one", "it was the", "we"]
IDS = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21]  # longer than the sliding window below


def small(kind: str) -> torch.nn.Module:
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    sliding = dict(use_sliding_window=True, sliding_window=4, max_window_layers=2) if kind == "qwen2 sliding" else {}
    return Qwen2ForCausalLM(Qwen2Config(**common, **sliding)).eval()


@pytest.fixture(scope="module")
def target_only() -> ModelPair:
    """A 4-layer tiny target and no draft model: exit layers 1..3 are all worth a look."""
    return ModelPair(draft=None, target=tiny_model(0, V, layers=LAYERS), tokenizer=tiny_tokenizer(), device=CPU,
                     dtype=torch.float32, draft_name="none", target_name="tiny-4", eos_token_ids=frozenset({EOS_ID}))


def encode(pair, prompt: str) -> list[int]:
    return pair.tokenizer(prompt)["input_ids"]


@torch.no_grad()
def reference_logits(model, ids: list[int], layer: int) -> torch.Tensor:
    """Layer `layer`'s output read out by the final norm and head, from one plain forward [T, V]."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    if layer == len(model.model.layers):
        return out.logits[0]
    return model.lm_head(model.model.norm(out.hidden_states[layer]))[0]


# --- the early exit ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen2", "qwen2 sliding", "llama"])
@torch.inference_mode()
def test_early_exit_reads_out_the_models_own_hidden_state_at_every_depth(kind):
    model = small(kind)
    if kind == "qwen2 sliding":
        assert set(model.config.layer_types) == {"full_attention", "sliding_attention"}
    for layer in range(1, LAYERS + 1):
        expected = reference_logits(model, IDS, layer)
        got = EarlyExit(model, layer)(torch.tensor([IDS]), DynamicCache(), logits_to_keep=len(IDS)).logits[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # the same logits a few tokens at a time, through its own cache: positions and masks follow the cache
        view, cache = EarlyExit(model, layer), DynamicCache()
        parts = [view(torch.tensor([IDS[a:b]]), cache, logits_to_keep=b - a).logits[0]
                 for a, b in ((0, 4), (4, 5), (5, 9), (9, 10))]
        torch.testing.assert_close(torch.cat(parts), expected, rtol=1e-4, atol=1e-5)
        assert len(cache.layers) == layer and cache.get_seq_length() == len(IDS)  # a cache for its L layers only


@torch.inference_mode()
def test_with_all_layers_the_early_exit_is_the_target():
    model = small("qwen2")
    ids = torch.tensor([IDS])
    assert torch.equal(EarlyExit(model, LAYERS)(ids, DynamicCache(), logits_to_keep=len(IDS)).logits,
                       model(ids).logits)
    assert model.config.num_hidden_layers == LAYERS  # the shared model was never changed


# --- the drafter's contract ----------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED, SamplingParams(0.7, 10, 0.9)])
def test_self_drafter_q_is_the_distribution_it_sampled_from(target_only, sampling):
    ids = encode(target_only, "she said that")
    drafter = SelfDrafter(target_only.target, 2, sampling, make_generator(CPU, 0), V)
    draft = drafter.propose(torch.tensor([ids]), ids, 5)
    assert draft.k == 5
    for j in range(5):
        context = ids + draft.tokens[:j].tolist()
        expected = logits_to_probs(reference_logits(target_only.target, context, 2)[-1], sampling)
        torch.testing.assert_close(draft.q[j], expected, atol=1e-5, rtol=1e-4)
        assert draft.q[j, draft.tokens[j]] > 0


def test_self_drafter_continues_from_its_cache_after_rollback(target_only):
    ids = encode(target_only, "the a of")
    drafter = SelfDrafter(target_only.target, 2, GREEDY, make_generator(CPU, 0), V)
    first = drafter.propose(torch.tensor([ids]), ids, 4).tokens.tolist()
    drafter.rollback(len(ids) + 1)  # keep one drafted token, then the "target" says 7
    context = ids + first[:1] + [7]
    again = drafter.propose(torch.tensor([context]), context, 3).tokens.tolist()
    fresh = SelfDrafter(target_only.target, 2, GREEDY, make_generator(CPU, 0), V)
    assert again == fresh.propose(torch.tensor([context]), context, 3).tokens.tolist()


# --- the round loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_self_speculation_equals_the_target_alone(target_only, exit_layer, k):
    config = DecodeConfig(k=k, max_new_tokens=24, sampling=GREEDY, drafter="self", exit_layer=exit_layer)
    for prompt in PROMPTS:
        ids = encode(target_only, prompt)
        rounds = list(speculative_generate(target_only, ids, config))
        assert spec_tokens(rounds) == [s.token.id for s in autoregressive_generate(target_only, ids, config)]
        assert {r.drafter for r in rounds} == {"self"}
        check_rounds(target_only, rounds, config)


def test_sampled_self_speculation_rounds_are_consistent(target_only):
    for seed in range(3):
        config = DecodeConfig(k=4, max_new_tokens=24, sampling=SAMPLED, seed=seed, drafter="self", exit_layer=2)
        check_rounds(target_only, list(speculative_generate(target_only, encode(target_only, "we"), config)), config)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
def test_drafting_with_every_layer_the_target_accepts_every_draft(target_only, sampling):
    """The depth the settings refuse (it saves nothing), built directly: q = p, so min(1, p/q) = 1 up to the
    rounding of a one-token step against a batched verify."""
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=sampling, seed=0, adaptive="fixed")
    drafter = SelfDrafter(target_only.target, LAYERS, sampling, make_generator(CPU, 0), V)
    drafted = [d for r in speculative_generate(target_only, encode(target_only, "it was the"), config, drafter=drafter)
               for d in r.drafted]
    assert len(drafted) > 10 and all(d.status == ACCEPTED for d in drafted)
    assert min(d.accept_prob for d in drafted) > 1 - 1e-4


def test_early_exits_share_a_prompt_cache_entry_per_depth(target_only):
    ids = encode(target_only, "the a of")
    cache = PromptCache()
    for seed in (1, 2):
        for layer in (1, 2):
            config = DecodeConfig(k=4, max_new_tokens=12, sampling=SAMPLED, seed=seed, drafter="self",
                                  exit_layer=layer)
            fresh, shared = [spec_tokens(speculative_generate(target_only, ids, config, prompt_cache=c))
                             for c in (None, cache)]
            assert fresh == shared
    # the target's prompt, and one early exit per depth, each holding its own layers only
    assert sorted(len(c.layers) for c in cache.saved.values()) == [1, 2, LAYERS]


# --- refusals, in one sentence -------------------------------------------------------------------


def test_drafter_problems_say_what_to_do(target_only):
    target = target_only.target
    assert drafter_problem("self", None, target, 3) is None  # no draft model needed
    assert "between 1 and 3" in drafter_problem("self", None, target, 4)
    assert "between 1 and 3" in drafter_problem("self", None, target, 14)
    assert "Llama/Qwen2-style" in drafter_problem("self", None, CausalLM(16), 1)
    assert "'lookup' or 'self'" in drafter_problem("model", None, target, 14)
    assert drafter_problem("model", target, target, 99) is None  # the exit layer concerns 'self' alone
    gen = make_generator(CPU, 0)
    assert make_drafter(DecodeConfig(drafter="self", exit_layer=2, sampling=GREEDY), target_only, gen).name == "self"
    with pytest.raises(ValueError, match="exit layer must be between 1 and 3"):
        make_drafter(DecodeConfig(drafter="self", exit_layer=4, sampling=GREEDY), target_only, gen)
    with pytest.raises(ValueError, match="between 1 and 3 for this target's 4 layers"):
        next(speculative_generate(target_only, [3, 4], DecodeConfig(drafter="self", exit_layer=7)))


def test_the_exit_layer_setting_is_validated_like_any_other():
    from specviz.settings.errors import InputError
    from specviz.settings.spec import validate

    assert validate(DecodeConfig, {"drafter": "self", "exit_layer": "3"}).exit_layer == 3
    with pytest.raises(InputError, match="exit layer must be a whole number of at least 1, below the target.s layer "
                                         "count, got 0"):
        validate(DecodeConfig, {"exit_layer": 0})


# --- memory: what self-speculation saves ---------------------------------------------------------


def test_model_bytes_counts_each_stored_tensor_once():
    untied = small("qwen2")
    tied = Qwen2ForCausalLM(Qwen2Config(**{**untied.config.to_dict(), "tie_word_embeddings": True})).eval()
    embedding = V * 64 * 4  # float32
    buffers = sum(b.numel() * b.element_size() for b in untied.buffers())
    assert model_bytes(untied) == sum(p.numel() for p in untied.parameters()) * 4 + buffers
    assert model_bytes(untied) - model_bytes(tied) == embedding  # the tied head is the embedding's storage
    assert model_bytes(untied.to(torch.bfloat16)) * 2 == model_bytes(small("qwen2"))


def test_pair_bytes_by_role(tiny, target_only):
    both = pair_bytes(tiny)
    assert list(both) == ["draft", "target"] and both["draft"] == both["target"] > 0  # the tiny draft: a noisy copy
    assert list(pair_bytes(target_only)) == ["target"]
    assert pair_bytes(None) == {}


def test_the_header_shows_each_models_memory():
    html = header_html("a → b (cpu, float32)", {"draft": 1_976_000_000, "target": 6_170_000_000})
    assert "weights in memory: draft 1.98 GB, target 6.17 GB" in html and "serving a → b" in html
    assert "sv-memory" not in header_html("a → b")
    assert [size_text(n) for n in (999, 346_432, 12_345_678)] == ["999 B", "346 kB", "12.3 MB"]


def test_a_shared_page_names_the_exit_layer_of_a_self_run(target_only):
    from specviz.runs.trace import RunMeta
    from specviz.ui.share import settings

    ids = encode(target_only, "we")
    rows = dict(settings(RunMeta.of(target_only, "we", ids, DecodeConfig(drafter="self", exit_layer=2))))
    assert rows["drafter"] == "self" and rows["exit layer"] == 2
    assert "exit layer" not in dict(settings(RunMeta.of(target_only, "we", ids, DecodeConfig(drafter="lookup"))))
