"""The few-row kernel (`models/streamed.py`): the same product as torch's, its layout, its build, its absence."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from specviz.models import kernels as K
from specviz.models import resident as R
from specviz.kernels import build, streamed
from specviz.models.kernels import TunedLinear, tune
from specviz.models.plans import Choice
from specviz.models.memory import model_bytes
from specviz.models.tiny import tiny_model

needs_kernel = pytest.mark.skipif(streamed.library() is None, reason="the few-row kernel cannot be built here")
BF16_LIB = streamed.library_for(torch.empty(16, 2, dtype=torch.bfloat16))
needs_bf16 = pytest.mark.skipif(BF16_LIB is None, reason="no few-row kernel for bf16 here")
# the ways this machine's level has (AVX-512: the dot product too)
BF16_WAYS = list(streamed.ways(torch.empty(16, 2, dtype=torch.bfloat16), None, BF16_LIB)) if BF16_LIB else []


def test_the_layout_puts_16_outputs_side_by_side_and_bf16_inputs_in_pairs():
    weight = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4)  # w[j][c] = 4 j + c
    packed = streamed.pack(weight)
    assert packed.shape == (2, 4, 16, 1)  # [blocks, inputs, outputs in the block, 1]
    assert packed[1, 3, :, 0].tolist() == [4 * (16 + j) + 3 for j in range(16)]
    packed = streamed.pack(weight.to(torch.bfloat16))
    assert packed.shape == (2, 2, 16, 2)  # bf16: the inputs in pairs
    assert packed[0, 1, 5].tolist() == [4 * 5 + 2, 4 * 5 + 3]


@needs_kernel
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 13, 16, 17, 18, 40])
def test_it_multiplies_as_torch_in_float32(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 160, bias=bias)
    kernel = K.kernels_of(linear)["streamed"]
    x = torch.randn(rows, 96)
    torch.testing.assert_close(kernel(x), linear(x), rtol=1e-5, atol=1e-5)


@needs_bf16
@pytest.mark.parametrize("way", BF16_WAYS)
@pytest.mark.parametrize("rows", [1, 4, 9, 17, 33])
def test_it_multiplies_as_torch_in_bf16_to_the_last_bit_of_float32_sums(rows, way):
    """bf16 products are exact in float32: the sums differ from a float32 reference by summation order only, and
    the outputs are that sum (plus the bias) rounded to bf16 once; every way."""
    torch.manual_seed(rows)
    weight, bias = torch.randn(64, 256, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    got = streamed.Streamed(weight, bias, BF16_LIB, way)(x)
    exact = x.double() @ weight.double().T + bias.double()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-6)  # within bf16's half-ulp rounding
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=2 ** -7, atol=1e-2)


@needs_kernel
def test_a_plan_on_the_streamed_copy_alone_lets_the_weights_as_loaded_go(tmp_path):
    """One copy of each weight: where the few-row kernel serves every row count, the linears' weights as loaded are
    released and the model holds its streamed copies and the rest once; the logits stay the model's."""
    model = tiny_model(0, 64)
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    timer = lambda group, *a: {k: {n: 0.1 if k == "streamed" else 1.0 for n in a[-1]} for k in group[0]}  # noqa: E731
    fast, tuning = tune(model, folder=tmp_path, timer=timer, max_rows=3)
    assert {c.kernel for plan in tuning.plans.values() for c in plan.values()} == {"streamed"}
    assert model_bytes(fast) == model_bytes(model) + linears  # the streamed copies, made at tuning, beside the loaded
    assert R.release_unused_dense(fast) == linears
    assert model_bytes(fast) == model_bytes(model)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    torch.testing.assert_close(fast(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def rows_alike(kernel, x: torch.Tensor) -> list[int]:
    """The row counts at which the last rows of `x`, multiplied alone, are not bit for bit those rows multiplied
    with all of `x` (a verify's rows against the one-token steps)."""
    together = kernel(x)
    return [n for n in [*range(1, 18), 24, x.shape[0]] if not torch.equal(kernel(x[-n:]), together[-n:])]


@needs_bf16
@pytest.mark.parametrize("way", BF16_WAYS)
def test_each_way_sums_a_row_alike_whatever_the_rows_beside_it(way):
    torch.manual_seed(1)
    weight, bias = torch.randn(160, 96, dtype=torch.bfloat16), torch.randn(160, dtype=torch.bfloat16)
    kernel = streamed.ways(weight, bias, BF16_LIB)[way]
    assert rows_alike(kernel, torch.randn(40, 96, dtype=torch.bfloat16)) == []


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=needs_kernel),
                                   pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_rows_alike_across_slices_of_the_inputs(dtype):
    """Wider than `sliced`'s slice of 128 input pairs (streamed.cpp: AVX2 from 7 rows), with a part slice at the end:
    a chunk's sums stored between slices and loaded back keep every row's bits at every row count."""
    torch.manual_seed(2)
    weight, bias = torch.randn(48, 600, dtype=dtype), torch.randn(48, dtype=dtype)
    kernel = streamed.ways(weight, bias, streamed.library_for(weight))["widened" if dtype == torch.bfloat16 else "streamed"]
    assert rows_alike(kernel, torch.randn(40, 600, dtype=dtype)) == []


@needs_bf16
def test_a_way_that_sums_otherwise_beyond_one_row_is_caught():
    """The negative control: a kernel that splits each row's sum in two halves when more rows come (as GEMMs do
    for some shapes) is found out where it matters, the one-token step against the verify's rows."""
    torch.manual_seed(1)
    weight = torch.randn(160, 96, dtype=torch.bfloat16)
    kernel = streamed.ways(weight, None, BF16_LIB)["widened"]
    split = lambda x: kernel(x) if x.shape[0] == 1 else F.linear(x[:, :48], weight[:, :48]) + F.linear(  # noqa: E731
        x[:, 48:], weight[:, 48:])
    assert rows_alike(split, torch.randn(40, 96, dtype=torch.bfloat16)) == [1]


@needs_bf16
@pytest.mark.parametrize("way", [w for w in BF16_WAYS if not w.endswith("_ahead")])
def test_asking_for_the_weight_ahead_changes_no_bit(way):
    torch.manual_seed(2)
    weight = torch.randn(4096, 256, dtype=torch.bfloat16)  # blocks longer than the distance asked ahead
    kernels = streamed.ways(weight, None, BF16_LIB)
    for rows in (1, 9, 40):
        x = torch.randn(rows, 256, dtype=torch.bfloat16)
        assert torch.equal(kernels[f"{way}_ahead"](x), kernels[way](x)), rows
    other = streamed.ways(weight.roll(1, 0), None, BF16_LIB)[f"{way}_ahead"]  # the control: it can differ
    assert not torch.equal(other(x), kernels[way](x))


@needs_kernel
def test_the_ways_of_one_weight_share_one_packed_copy():
    linear = nn.Linear(64, 64)
    kernels = K.kernels_of(linear)
    plan = {1: Choice("streamed_ahead", 1), 2: Choice("streamed", 2)}
    tuned = TunedLinear(linear, plan, kernels)
    assert kernels["streamed"].packed is kernels["streamed_ahead"].packed is not None
    assert model_bytes(tuned) == model_bytes(linear) + 64 * 64 * 4  # one packed copy beside the weight as loaded


@needs_kernel
def test_a_candidate_the_plan_does_not_use_makes_no_copy():
    linear = nn.Linear(64, 64)
    kernels = K.kernels_of(linear)
    tuned = TunedLinear(linear, {1: Choice("dense", 1)}, kernels)
    assert kernels["streamed"].packed is None and kernels["onednn"].packed is None
    assert model_bytes(tuned) == model_bytes(linear)


def test_without_a_compiler_it_is_said_once_and_the_others_serve(monkeypatch, caplog):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    streamed.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert set(K.kernels_of(nn.Linear(64, 64))) == {"dense", "native", "onednn"}
            assert set(K.kernels_of(nn.Linear(64, 64))) == {"dense", "native", "onednn"}
        said = [r.getMessage() for r in caplog.records if "few-row kernel" in r.getMessage()]
        assert len(said) == 1 and "no C++ compiler" in said[0]
    finally:
        streamed.library.cache_clear()


@needs_kernel
def test_it_is_built_once_per_machine_and_reused(tmp_path):
    import shutil

    compiler = shutil.which("g++")
    flags = streamed.FLAGS + streamed.LEVELS["avx2"]
    first = build.compiled(streamed.SOURCE, flags, compiler, tmp_path)
    made = first.stat().st_mtime_ns
    assert build.compiled(streamed.SOURCE, flags, compiler, tmp_path) == first
    assert first.stat().st_mtime_ns == made
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []  # nothing half-written left behind
