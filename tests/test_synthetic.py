"""Synthetic pairs: random weights in the published shapes of real models, for measuring costs anywhere."""

from __future__ import annotations

import pytest
import torch
from helpers import TEST_DEVICE, TEST_DTYPE, same_greedy

from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.models import ModelLoadError, PairSpec, load_pair
from specviz.models.memory import model_bytes, parameter_count, weights_bytes
from specviz.models.synthetic import SHAPES, prompt_ids, synthetic_pair

# config.json of Qwen/Qwen2.5-{0.5B,1.5B,7B}-Instruct, as their model cards count them
PUBLISHED = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512}
MINI = ("synthetic:mini-draft", "synthetic:mini-target")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_shapes_are_the_published_models(name):
    """Counted on the meta device from the shape's config: a wrong width, head count or tie changes the count."""
    assert parameter_count(f"synthetic:{name}", "target") == PUBLISHED[name]


def test_a_real_pair_s_vocabularies_differ_by_padding_and_so_do_the_synthetic_ones():
    assert SHAPES["qwen2.5-7b"].vocab - SHAPES["qwen2.5-0.5b"].vocab == 128
    assert SHAPES["mini-target"].vocab > SHAPES["mini-draft"].vocab


def test_the_pair_loads_by_name_with_one_tokenizer_over_the_smaller_vocabulary():
    pair = load_pair(*MINI, device="cpu", dtype="float32")
    assert pair.vocab_size == SHAPES["mini-target"].vocab  # we work in the larger, as with a real pair
    assert len(pair.tokenizer) == SHAPES["mini-draft"].vocab
    ids = prompt_ids(20, len(pair.tokenizer))
    assert pair.tokenizer(pair.tokenizer.decode(ids))["input_ids"] == ids  # every id the tokenizer has round-trips
    assert pair.tokenizer.decode([SHAPES["mini-target"].vocab - 1]) == ""  # a padding id decodes to nothing
    assert pair.draft_name == MINI[0] and pair.target_name == MINI[1] and not pair.eos_token_ids


def test_the_weights_are_drawn_on_the_device_in_the_dtype_and_the_estimate_matches_them():
    pair = synthetic_pair(*MINI, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for m in (pair.draft, pair.target) for p in m.parameters()} == {torch.bfloat16}
    need, dtype = weights_bytes(PairSpec(*MINI, device="cpu", dtype="bfloat16", kernels="plain"))
    assert dtype == torch.bfloat16
    weights = sum(p.numel() * p.element_size() for m in (pair.draft, pair.target) for p in m.parameters())
    assert need == weights  # tied embeddings counted once in both (`parameters()` yields a shared tensor once)
    assert model_bytes(pair.draft) + model_bytes(pair.target) - weights < 1024  # beside them, only rotary tables


@pytest.mark.parametrize("draft,target", [("embedded", "synthetic:mini-target"), ("synthetic:mini-draft", "embedded")])
def test_a_synthetic_model_pairs_only_with_another(draft, target):
    with pytest.raises(ModelLoadError, match="synthetic model pairs only with another synthetic"):
        load_pair(draft, target, device="cpu", dtype="float32")


def test_an_unknown_shape_is_one_sentence_naming_the_known_ones():
    with pytest.raises(ModelLoadError, match="unknown synthetic shape 'qwen9'.*qwen2.5-7b"):
        load_pair("synthetic:qwen9", "synthetic:mini-target", device="cpu", dtype="float32")


def test_ids_in_the_target_s_padding_run_as_on_a_real_pair():
    """Random weights may emit the target's padding ids, which the draft cannot read (as a real pair never does):
    with those rows made likely, the decoder still runs, greedy speculation equals the target alone, and the
    padding ids are fed to the draft as id 0 (`fit_ids`) and decode to nothing."""
    pair = synthetic_pair(*MINI, device=str(TEST_DEVICE), dtype=TEST_DTYPE, seed=3)
    rows = SHAPES["mini-draft"].vocab
    with torch.no_grad():
        pair.target.lm_head.weight[rows:] *= 40  # padding rows the target now often picks
    config = DecodeConfig(k=4, max_new_tokens=48, adaptive="fixed")
    prompt = prompt_ids(12, rows, seed=1)
    steps = list(autoregressive_generate(pair, prompt, config))
    alone = [s.token.id for s in steps]
    rounds = list(speculative_generate(pair, prompt, config))
    assert same_greedy([t for r in rounds for t in r.new_token_ids], steps)
    assert any(t >= rows for t in alone)  # the padding path was taken
    assert all(d.id < rows for r in rounds for d in r.drafted)  # the draft proposes only ids of its own
    assert pair.tokenizer.decode([t for t in alone if t >= rows]) == ""


@pytest.fixture(scope="module")
def mini():
    return synthetic_pair(*MINI, device=str(TEST_DEVICE), dtype=TEST_DTYPE, seed=1)


def test_the_runs_layer_races_a_synthetic_pair_to_the_end(mini):
    """The runs layer's race, as the app and the API run it, on the suite's device (no Gradio involved)."""
    from specviz.runs.race import race_decoders
    from specviz.runs.trace import RunMeta

    config = DecodeConfig(k=4, max_new_tokens=32, adaptive="fixed")
    prompt = " ".join(f"t{i}" for i in prompt_ids(12, 1000, seed=2))
    ids = mini.tokenizer(prompt)["input_ids"]
    *_, state = race_decoders(mini, ids, config, RunMeta.of(mini, prompt, ids, config))
    assert state.done and state.ar.tokens == state.spec.tokens == 32 and state.ar.clock > 0 < state.spec.clock
    assert same_greedy(state.spec.token_ids, state.ar.events)
    assert state.meta.device == str(TEST_DEVICE) and state.meta.target == MINI[1]


def test_a_trace_of_a_synthetic_pair_saves_and_loads(mini, tmp_path):
    from specviz.runs import trace

    config = DecodeConfig(k=3, max_new_tokens=20, adaptive="fixed")
    t = trace.record(mini, "t5 t17 t300", config, with_ar=True)
    assert sum(len(r.new_token_ids) for r in t.rounds) == 20 and len(t.ar_steps) == 20
    assert all(r.verify_time > 0 and r.draft_time > 0 for r in t.rounds)
    again = trace.load(trace.save(t, tmp_path / "t.json"))
    assert again.rounds == t.rounds and again.meta == t.meta
