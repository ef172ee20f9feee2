"""The GPU's row-invariant verify (specviz/kernels/triton_rows.py, specviz/models/invariant_gpu.py): every row of a
linear, an RMSNorm and attention sums in one order for 1-17 rows, so a target's verify is its one-token steps bit
for bit. Each test runs on CPU tensors in Triton's interpreter (conftest sets TRITON_INTERPRET=1 where no GPU is
seen: the kernels' logic, tiles and loops) and again on CUDA where a GPU is lent (the tensor cores' numbers):
`[cuda]` is skipped, visibly, on a machine without one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from specviz.kernels import triton_rows
from specviz.models.invariant_gpu import RowsLinear, invariant, missing
from specviz.models.tiny import tiny_model, tiny_pair
from specviz.runs.row_check import row_check

pytest.importorskip("triton", reason="Triton is not installed (make test installs it)")

DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not triton_rows.interpreting(),
                                                       reason="Triton's interpreter is off (TRITON_INTERPRET)")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]
DTYPES = [torch.float32, torch.bfloat16]
WIDEST = 17


def split_k_at_9(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A mutant: at 9 rows the inputs in two halves, each summed alone and then added (split-K); else the kernel."""
    if x.reshape(-1, x.shape[-1]).shape[0] != 9:
        return triton_rows.linear(x, weight, bias)
    half = x.shape[-1] // 2
    return triton_rows.linear(x[..., :half], weight[:, :half], bias) + triton_rows.linear(x[..., half:],
                                                                                           weight[:, half:])


def rows_that_differ(linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> list[int]:
    """The row counts n in 1..len(x) where some row of `linear` over x[:n] is not that row's product alone."""
    alone = [linear(x[i:i + 1], weight, bias)[0] for i in range(len(x))]
    return [n for n in range(1, len(x) + 1)
            if not all(torch.equal(row, alone[i]) for i, row in enumerate(linear(x[:n], weight, bias)))]


def values(*shape, device, dtype, scale=1.0, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(device, dtype)


def operands(device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """17 rows of 200 inputs, a weight of 96 outputs and its bias: shapes that fill no tile evenly."""
    x = values(WIDEST, 200, device=device, dtype=dtype)
    return x, values(96, 200, device=device, dtype=dtype, scale=0.07, seed=1), values(96, device=device, dtype=dtype,
                                                                                     seed=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_linear_is_torchs_product_to_rounding_with_and_without_bias(device, dtype):
    x, w, b = operands(device, dtype)
    for bias in (None, b):
        ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        got = triton_rows.linear(x, w, bias)
        assert got.dtype == dtype and got.shape == (WIDEST, 96)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.float(), ref, atol=tol, rtol=tol)
    three_d = triton_rows.linear(x.view(1, WIDEST, 200), w)  # (a model's [batch, rows, features])
    assert torch.equal(three_d[0], triton_rows.linear(x, w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_of_the_linear_sums_alike_for_1_to_17_rows_and_a_split_k_mutant_is_caught(device, dtype):
    """Shapes that fill no tile evenly (inputs 200: steps of 64 or 32 and a part; 96 outputs: 1.5 tiles of 64)."""
    x, w, b = operands(device, dtype)
    assert rows_that_differ(triton_rows.linear, x, w, b) == []
    assert rows_that_differ(split_k_at_9, x, w, b) == [9]  # the control: another order of the same sums


@pytest.mark.parametrize("device", DEVICES)
def test_tiles_of_every_width_give_each_output_the_same_bits_and_fill_the_gpu(device, monkeypatch):
    """`block_n` picks a weight's tile width by its outputs and the GPU (so q/k/v fused and apart may differ): an
    output's sums do not depend on it; and the width chosen gives each multiprocessor two tiles where it can."""
    x, w = values(9, 200, device=device, dtype=torch.bfloat16), values(96, 200, device=device, dtype=torch.bfloat16,
                                                                       seed=1)
    by_width = {}
    for width in triton_rows.BLOCK_NS:
        monkeypatch.setattr(triton_rows, "block_n", lambda outputs, dev, width=width: width)
        by_width[width] = triton_rows.linear(x, w)
    assert all(torch.equal(got, by_width[64]) for got in by_width.values())
    monkeypatch.undo()
    monkeypatch.setattr(triton_rows, "multiprocessors", lambda dev: 132)  # an H100's or H200's
    widths = {n: triton_rows.block_n(n, torch.device(device)) for n in (152064, 37888, 18944, 4608, 3584, 512)}
    assert widths == {152064: 64, 37888: 64, 18944: 64, 4608: 16, 3584: 16, 512: 16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rms_norm_is_transformers_and_each_row_alone(device, dtype):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    x = values(WIDEST, 96, device=device, dtype=dtype, scale=3.0)
    norm = Qwen2RMSNorm(96, eps=1e-6).to(device, dtype)
    norm.weight.data = values(96, device=device, dtype=dtype, seed=3)
    got = triton_rows.rms_norm(x, norm.weight, norm.variance_epsilon)
    ulp = 1e-6 if dtype == torch.float32 else 2 ** -7
    assert torch.allclose(got.float(), norm(x).float(), rtol=2 * ulp, atol=ulp)
    assert all(torch.equal(triton_rows.rms_norm(x[:n], norm.weight, 1e-6)[i],
                           triton_rows.rms_norm(x[i:i + 1], norm.weight, 1e-6)[0])
               for n in (1, 5, 9, WIDEST) for i in range(n))


def causal_mask(n: int, slots: int) -> torch.Tensor:
    """transformers' boolean mask for n rows at the end of `slots` keys, as [1, 1, n, slots]."""
    return torch.ones(n, slots, dtype=torch.bool).tril(slots - n)[None, None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_is_sdpa_to_rounding_with_grouped_heads(device, dtype):
    q = values(1, 4, 5, 64, device=device, dtype=dtype)
    k, v = (values(1, 2, 150, 64, device=device, dtype=dtype, seed=s) for s in (1, 2))
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1),
                                         v.float().repeat_interleave(2, 1), attn_mask=causal_mask(5, 150).to(device),
                                         scale=0.125).transpose(1, 2)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for allowed in (None, triton_rows.allowed_keys(causal_mask(5, 150).to(device), 5, 150)):
        got = triton_rows.attend(q, k, v, allowed, 0.125)
        assert got.shape == (1, 5, 4, 64) and torch.allclose(got.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_verifys_attention_rows_are_the_one_token_steps_for_1_to_17_rows(device, dtype):
    """Row i of an n-row verify whose cache ends at slot p + n sees keys 0 .. p + i, as the one-token step at
    p + i does with a cache that ends there; also with the verify's keys past a block's end (p = 60, 64-slot
    blocks) and with transformers' boolean mask handed in at 1, 9 and 17 rows, over a static cache's buffer longer
    than what it holds (200 slots)."""
    p = 60
    q = values(1, 4, WIDEST, 64, device=device, dtype=dtype)
    k, v = (values(1, 2, p + WIDEST, 64, device=device, dtype=dtype, seed=s) for s in (1, 2))
    steps = [triton_rows.attend(q[:, :, i:i + 1], k[:, :, :p + i + 1], v[:, :, :p + i + 1], None, 0.125)[0, 0]
             for i in range(WIDEST)]
    for n in range(1, WIDEST + 1):
        slots = p + n
        rows = triton_rows.attend(q[:, :, :n], k[:, :, :slots], v[:, :, :slots], None, 0.125)[0]
        assert all(torch.equal(rows[i], steps[i]) for i in range(n)), n
        if n in (1, 9, 17):  # a static cache: its buffer's slots past p + n unwritten (NaN here), the mask says so
            buffer = 200
            kb, vb = (torch.cat([t[:, :, :slots], torch.full((1, 2, buffer - slots, 64), float("nan"), device=device,
                                                              dtype=dtype)], 2) for t in (k, v))
            mask = torch.zeros(1, 1, n, buffer, dtype=torch.bool)
            mask[..., :slots] = causal_mask(n, slots)
            allowed = triton_rows.allowed_keys(mask.to(device), n, buffer)
            rows = triton_rows.attend(q[:, :, :n], kb, vb, allowed, 0.125)[0]
            assert all(torch.equal(rows[i], steps[i]) for i in range(n)), (n, "masked")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tiny_targets_verify_is_its_one_token_steps_bit_for_bit_and_a_mutant_is_not(device, dtype, monkeypatch):
    """Every linear (the head too), RMSNorm and attention on the Triton kernels: a verify of 1, 9 and 17 rows
    against that many one-token steps, logits and K/V Δ 0 (`runs.row_check`, what `specviz rows` reports); the
    control, the same copy with a split-K linear at 9 rows, differs at 9 rows and not at 1."""
    model = tiny_model(0, 95).to(device, dtype)
    assert missing(model, torch.device(device), dtype) is None
    fast = invariant(model)
    assert model.config._attn_implementation != triton_rows.ROWS  # (the loaded model untouched)
    assert all(type(m) is not torch.nn.Linear for m in fast.modules())
    prompt = list(range(3, 15))
    for width in (1, 9, WIDEST):
        assert row_check(fast, prompt, width).identical, width
    monkeypatch.setattr(RowsLinear, "forward", lambda self, x: split_k_at_9(x, self.weight, self.bias))
    assert row_check(fast, prompt, 1).identical
    assert not row_check(fast, prompt, 9).identical


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_speculation_on_the_triton_target_is_the_target_alones_text_in_bf16(device):
    from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate

    pair = tiny_pair(device=device, dtype=torch.bfloat16)
    pair = replace(pair, target=invariant(pair.target))
    config = DecodeConfig(k=8, max_new_tokens=24, adaptive="fixed", sampling=SamplingParams(0.0))
    ids = list(range(3, 20))
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    rounds = list(speculative_generate(pair, ids, config))
    spec = [t for r in rounds for t in r.new_token_ids]
    assert spec[:len(alone)] == alone and len(alone) == 24
    assert any(len(r.new_token_ids) > 1 for r in rounds)  # (verifies of many rows happened)


def test_what_the_kernels_do_not_serve_is_said_in_one_sentence():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = tiny_model(0, 95)
    assert "CUDA" in missing(model, torch.device("mps"), torch.float32)
    assert "float64" in missing(model, torch.device("cpu"), torch.float64)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))  # LayerNorm, Conv1D
    assert "Conv1D" in missing(gpt2, torch.device("cpu"), torch.float32)
    odd = tiny_model(0, 95, hidden=48)  # heads of 12
    assert "12 wide" in missing(odd, torch.device("cpu"), torch.float32)
    model.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}  # (--device-map auto over two GPUs)
    assert "several devices" in missing(model, torch.device("cpu"), torch.float32)
    del model.hf_device_map
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers  # (Mistral's, Qwen2's option)
    assert "slides a window" in missing(model, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_that_fail_or_disagree_on_a_machine_are_said_and_not_used(device, monkeypatch):
    """`failed` runs the kernels once against torch's ops before a target is put on them (a GPU or Triton whose
    compile fails, numbers off): here they pass, then a linear that is off and one that raises are each said."""
    probe = triton_rows.failed.__wrapped__  # (uncached)
    assert probe(torch.device(device), torch.bfloat16) is None
    good = triton_rows.linear
    monkeypatch.setattr(triton_rows, "linear", lambda x, w, b=None: good(x, w, b) * 1.5)
    assert probe(torch.device(device), torch.bfloat16) == ("the Triton kernels' linear, linear with bias disagreed "
                                                           "with torch's here")

    def raising(*args, **kwargs):
        raise RuntimeError("PTX not supported\nmore")

    monkeypatch.setattr(triton_rows, "linear", raising)
    assert "failed to run here (RuntimeError: PTX not supported)" in probe(torch.device(device), torch.bfloat16)


def test_a_target_not_on_the_cpus_kernels_is_put_on_the_triton_ones_where_they_serve(monkeypatch):
    """`models.target.with_target`'s GPU branch (a device whose kernels are not tuned), taken here on CPU tensors
    with the interpreter: the pair's target is the invariant copy, named so, `not_invariant` None; where Triton is
    missing it is the loaded model, with the reason."""
    from specviz.models import target as target_module

    pair = tiny_pair(dtype=torch.bfloat16)
    monkeypatch.setattr(target_module, "tunable", lambda device: False)
    served, tuning = target_module.with_target(pair, invariant=True)
    assert tuning is None and served.not_invariant is None
    assert served.target_name.endswith("[row-invariant kernels]")
    assert isinstance(served.target.lm_head, RowsLinear) and served.target.lm_head.weight is pair.target.lm_head.weight
    plain, _ = target_module.with_target(pair, kernels="plain", invariant=True)  # (torch's own kernels, asked for)
    assert plain.target is pair.target and "--kernels plain" in plain.not_invariant
    monkeypatch.setattr(triton_rows, "missing", lambda device: "Triton is not installed (pip install 'specviz[gpu]')")
    plain, _ = target_module.with_target(pair, invariant=True)
    assert plain.target is pair.target and "Triton is not installed" in plain.not_invariant


def test_where_a_compiled_step_wins_on_a_gpu_the_triton_copy_is_what_compiles(tmp_path):
    """`steps.with_steps` (`--step auto`, the probe's verdict faked): the target's compiled step is made from the
    copy on the Triton kernels, so the pair stays row-invariant; a target on the loaded model's kernels (the
    control) is made from the loaded one and says it is not."""
    from specviz.models import PairSpec
    from specviz.models.compiled import is_compiled
    from specviz.models.invariant_gpu import on_triton
    from specviz.models.step_timing import StepTimes
    from specviz.models.steps import InUse, Probe, with_steps

    loaded = replace(tiny_pair(), not_invariant=None)
    probe = Probe(lambda *a: StepTimes(eager_s=0.010, compiled_s=0.004, compile_s=1.0),
                  lambda compiled, ids, wide: InUse(0.004, 0.006 if wide else None), tmp_path)
    spec = PairSpec("tiny", "tiny", device="cpu", step="auto")
    on_gpu_kernels = with_steps(loaded, replace(loaded, target=invariant(loaded.target)), spec, probe=probe)
    assert is_compiled(on_gpu_kernels.target) and on_triton(on_gpu_kernels.target)
    assert on_gpu_kernels.not_invariant is None
    control = with_steps(loaded, loaded, spec, probe=probe)
    assert is_compiled(control.target) and not on_triton(control.target)
    assert "runs compiled" in control.not_invariant


def test_the_triton_copys_projections_fuse_for_a_gpus_compiled_step_and_change_no_bit(monkeypatch):
    """`fused.fuse_projections` (what a GPU's compiled step does to its copy) on the Triton copy: q/k/v and gate/up
    as one product each on the same kernel, a 9-row forward's logits the unfused copy's bit for bit; the control,
    the fused products on torch's F.linear, are not."""
    import copy

    import specviz.models.fused as fused
    from specviz.compat import forward
    from specviz.models.fused import fuse_projections

    model = tiny_model(0, 95).to(dtype=torch.bfloat16)
    fast = invariant(model)
    ids = torch.tensor([list(range(3, 12))])

    def logits(m):
        return forward(m, ids, None, 9).logits

    unfused = logits(fast)
    fused_copy = copy.deepcopy(fast, memo={id(t): t for t in fast.parameters()})
    assert fuse_projections(fused_copy) == 2 * model.config.num_hidden_layers
    assert torch.equal(logits(fused_copy), unfused)
    control = copy.deepcopy(fast, memo={id(t): t for t in fast.parameters()})
    product_of = fused.product_of
    monkeypatch.setattr(fused, "product_of", lambda linears: F.linear if product_of(linears) else None)
    fuse_projections(control)
    assert not torch.equal(logits(control), unfused)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
REAL = ("synthetic:qwen2.5-0.5b", "synthetic:qwen2.5-7b")  # the shapes, random weights (~16 GB in bf16)


@CUDA
@pytest.mark.parametrize("step", ["eager", "compiled"])
def test_on_cuda_the_7b_shapes_verify_is_its_steps_for_1_to_17_rows_and_greedy_speculation_is_the_target_alone(step):
    """The real shapes as a run loads them (`load_spec`, bf16, the invariant verify on by default): every verify
    width 1-17 against that many one-token steps, logits and K/V Δ 0 (eager), and greedy speculation at K = 8 the
    target alone's text over 64 tokens (random weights: near-ties are many), with the step eager and compiled."""
    from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
    from specviz.models import PairSpec, load_spec
    from specviz.models.synthetic import prompt_ids

    pair = load_spec(PairSpec(*REAL, device="cuda", dtype="bfloat16", step=step))
    assert pair.not_invariant is None
    ids = prompt_ids(40, 151_000)
    if step == "eager":
        for width in range(1, WIDEST + 1):
            check = row_check(pair.target, ids, width)
            assert check.identical, (width, check.logits, check.kv)
    config = DecodeConfig(k=8, max_new_tokens=64, adaptive="fixed", sampling=SamplingParams(0.0))
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    spec = [t for r in speculative_generate(pair, ids, config) for t in r.new_token_ids]
    assert spec[:len(alone)] == alone


def compile_for(*args: str):
    """scripts/triton_compile.py in a process of its own, the interpreter off (kernels compiled, not interpreted)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parents[1] / "scripts" / "triton_compile.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("arch", ["90", "80"])
def test_every_kernel_configuration_compiles_for_hopper_and_ampere_without_spills_and_no_gpu(arch):
    """Triton's compiler and its ptxas, no GPU needed: each launch the product makes (2 dtypes x (6 linears,
    3 norms, 4 attentions)) compiles for sm_90 (H100/H200) and sm_80 (A100) with no register spilled; the control, a
    tile of 12 rows (Triton's ranges are powers of two), fails and is said."""
    done = compile_for("--arch", arch)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 26 and all(f"sm_{arch}" in line and " ok " in line for line in lines)
    broken = compile_for("--arch", arch, "--tile-rows", "12")
    assert broken.returncode == 1 and "FAILED  CompilationError: arange's range must be a power of 2" in broken.stdout
