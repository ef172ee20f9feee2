"""What only a GPU can show: a synthetic pair of real shapes on CUDA, raced, its memory estimate against what CUDA
allocated, and CUDA graphs replaying its compiled steps. Skipped without a GPU; scripts/gpu_check.sh runs it on a lent
one, beside the engine's tests on CUDA (SPECVIZ_TEST_DEVICE=cuda)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import TEST_DTYPE

from specviz.engine import DecodeConfig
from specviz.models import PairSpec, load_pair
from specviz.models.memory import weights_bytes
from specviz.runs.race import race_decoders
from specviz.runs.trace import RunMeta

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")

PAIR = ("synthetic:qwen2.5-0.5b", "synthetic:qwen2.5-1.5b")  # real shapes, ~4 GB in bf16: any GPU holds them
DTYPE = str(TEST_DTYPE).removeprefix("torch.")


@pytest.fixture(scope="module")
def pair():
    torch.cuda.reset_peak_memory_stats()
    return load_pair(*PAIR, device="cuda", dtype=DTYPE)


def test_the_weights_estimate_is_what_cuda_allocated_for_them(pair):
    """The estimate (parameters on the meta device x bytes each) against what building the pair allocated, apart
    from whatever the tests before it hold (the module's pair, caches kept for reuse): weights plus what
    initialisation and the pair's load held briefly."""
    need, dtype = weights_bytes(PairSpec(*PAIR, device="cuda", dtype=DTYPE, kernels="plain"))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    built = load_pair(*PAIR, device="cuda", dtype=DTYPE)
    held, peak = torch.cuda.memory_allocated() - before, torch.cuda.max_memory_allocated() - before
    print(f"estimate {need / 2**20:.0f} MiB, allocated {held / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")
    assert dtype == TEST_DTYPE and built.dtype == TEST_DTYPE
    assert need <= held < need * 1.02  # the weights, and tensors of next to nothing beside them
    assert peak < need * 1.25


def test_a_race_on_cuda_runs_both_lanes_to_the_end_and_greedy_agrees(pair):
    config = DecodeConfig(k=4, max_new_tokens=32, adaptive="fixed")
    ids = pair.tokenizer("t5 t17 t300 t4000 t151000")["input_ids"]
    *_, state = race_decoders(pair, ids, config, RunMeta.of(pair, "t5 t17 t300 t4000 t151000", ids, config))
    assert state.done and state.ar.tokens == state.spec.tokens == 32
    assert state.ar.clock > 0 and state.spec.clock > 0
    if TEST_DTYPE == torch.float32:
        assert state.identical


def test_the_memory_of_a_run_stays_near_the_weights(pair):
    """A race adds KV caches and activations: small beside the weights at these lengths. Counted from what the
    process held before the run (the pair, and whatever earlier tests in this worker keep), not from zero."""
    from specviz.engine import speculative_generate

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    list(speculative_generate(pair, list(range(1, 200)), DecodeConfig(k=8, max_new_tokens=64, adaptive="fixed")))
    need, _ = weights_bytes(PairSpec(*PAIR, device="cuda", dtype=DTYPE, kernels="plain"))
    added = torch.cuda.max_memory_allocated() - before
    print(f"weights {need / 2**20:.0f} MiB, held before {before / 2**20:.0f} MiB, the run's peak added {added / 2**20:.0f} MiB")
    assert added < need * 0.1


def test_compiled_steps_on_cuda_replay_graphs_and_agree(pair):
    """CUDA graphs (reduce-overhead) on both models' one-token steps: the same greedy text as eager in float32."""
    from specviz.engine import autoregressive_generate, speculative_generate
    from specviz.models.compiled import with_compiled_step

    compiled = replace(pair, draft=with_compiled_step(pair.draft, sizes=(512,)),
                       target=with_compiled_step(pair.target, sizes=(512,)))
    config = DecodeConfig(k=4, max_new_tokens=32, adaptive="fixed")
    ids = list(range(1, 40))
    alone = [s.token.id for s in autoregressive_generate(compiled, ids, config)]
    spec = [t for r in speculative_generate(compiled, ids, config) for t in r.new_token_ids]
    assert len(alone) == len(spec) == 32
    if TEST_DTYPE == torch.float32:
        assert spec == alone == [s.token.id for s in autoregressive_generate(pair, ids, config)]
