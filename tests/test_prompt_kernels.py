"""A prompt read on the fastest kernels while the verify stays invariant (`plans.prompt_plan`, `PromptReading`).

Why exactness holds: a prompt's rows are never compared with a one-token step, and both lanes read their prompt
through `engine.plumbing.prefill`, on the same prompt kernels, so both start from the same cache; every row after
it (the one-token steps, the verifies) runs on the invariant plan. The control shows the prompt kernels really are
another computation: a prompt read outside the switch leaves another cache."""

from __future__ import annotations

import pytest
import torch

from helpers import spec_tokens
from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.plumbing import prefill
from specviz.compat import forward
from specviz.kernels import rows
from specviz.models import encode_prompt
from specviz.models.kernels import INVARIANT, SUMS, TunedLinear
from specviz.models.plans import Choice, prompt_plan
from specviz.models.target import with_target
from specviz.models.tiny import tiny_pair
from test_invariant import split_k
from transformers import DynamicCache

pytestmark = pytest.mark.skipif(not rows.available(torch.bfloat16), reason="no row-invariant attention here")


def dense_reads_fastest(group, width, dtype, device, row_counts):
    """A timer whose table makes torch's own kernel ten times the fastest at every row count (not invariant)."""
    return {k: {n: 0.1 if k == "dense" else 1.0 for n in row_counts} for k in group[0]}


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def pair(request, tmp_path_factory):
    """The tiny pair's target planned invariant for its steps and on torch's own kernel for its prompts (the timer's
    choice); its prompt kernels then made another order of summing for sure (split-K: on shapes this small torch's
    kernel and the invariant ones happen to round alike)."""
    pair, tuning = with_target(tiny_pair(dtype=request.param), "none", "tuned", invariant=True,
                               folder=tmp_path_factory.mktemp("kernels"), timer=dense_reads_fastest)
    assert pair.not_invariant is None
    assert all(c.kernel in INVARIANT for plan in tuning.plans.values() for c in plan.values())
    assert all(c.kernel == "dense" for plan in tuning.prompt_plans.values() for c in plan.values())
    for module in pair.target.modules():
        if isinstance(module, TunedLinear):
            module.prompt_rows = [None, *[split_k(module.inner)] * (len(module.prompt_rows) - 1)]
    return pair


def test_greedy_speculation_is_the_target_alones_text_with_the_prompt_on_other_kernels(pair):
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed")
    for prompt in ("the man said that it was good and", "she had not been there for", "which one of them would"):
        ids = encode_prompt(pair.tokenizer, prompt)
        alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
        assert spec_tokens(speculative_generate(pair, ids, config)) == alone, prompt


def test_a_prompt_read_outside_the_switch_leaves_another_cache(pair):
    """The control: the prompt kernels are not the steps' (so reading a prompt alike in both lanes is what keeps
    them equal), and the switch is off again after the prompt."""
    ids = torch.tensor([encode_prompt(pair.tokenizer, "the man said that it was good and she had not been there")])
    read, plain = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        prefill(pair.target, read, ids)
        forward(pair.target, ids[:, :-1], plain, 1)
    cached = lambda cache: [t for layer in cache.layers for t in (layer.keys, layer.values)]  # noqa: E731
    assert not all(torch.equal(a, b) for a, b in zip(cached(read), cached(plain)))
    assert not any(m.reading for m in pair.target.modules() if isinstance(m, TunedLinear))


def test_a_prompt_plan_takes_another_copy_only_where_it_pays():
    """On the copies the plan keeps, the fastest of them; a kernel on a copy of its own only where it saves the race
    more than `LEAN_COST` of its time."""
    plan = {n: Choice("widened", n) for n in (1, 9, 64)}
    costs = {"dense": {1: 1.0, 9: 1.0, 64: 3.0}, "streamed": {1: 1.0, 9: 1.0, 64: 4.0},
             "widened": {1: 1.0, 9: 1.0, 64: 5.0}}
    assert {c.kernel for c in prompt_plan(costs, plan, 17).values()} >= {"dense"}  # saves 1 of 25: a copy pays
    costs["dense"][64] = 3.9
    assert prompt_plan(costs, plan, 17)[64] == Choice("streamed", 64)  # saves 0.1 of 25: the kept copy's fastest
    assert SUMS["streamed"] != SUMS["widened"]  # (another way of summing, on the same copy: a prompt may)
