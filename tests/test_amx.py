"""The AMX tile kernel (`kernels/amx.py`): torch's product to bf16's rounding, every row summed alike at every row
count (a split-K mutant caught), one packed copy shared with the vector kernels, the tiny pair's verify bit-identical
to its one-token steps on it, and the fallback where the tiles are absent, capped or refused."""

from __future__ import annotations

import errno
import logging

import pytest
import torch
from torch import nn

from specviz.kernels import amx, build, streamed, w4a8
from specviz.models import kernels as K
from specviz.models.kernels import TunedLinear
from specviz.models.draft.quantized import int4_codes
from specviz.models.plans import Choice
from specviz.models.target import with_target
from specviz.models.tiny import tiny_pair
from specviz.runs.row_check import row_check
from test_streamed import rows_alike

needs_amx = pytest.mark.skipif(amx.library() is None, reason="no AMX tiles here (lscpu | grep amx_tile)")
VECTOR_WAYS = frozenset(streamed.SUMS)  # what a plan on the tiles alone leaves out


def tiles(weight: torch.Tensor, bias: torch.Tensor | None = None) -> dict[str, streamed.Streamed]:
    return amx.ways(weight, bias, amx.library(), streamed.Packing(weight))


@needs_amx
@pytest.mark.parametrize("way", list(amx.WAYS))
@pytest.mark.parametrize("rows", [1, 4, 9, 16, 17, 33])
@pytest.mark.parametrize("bias", [True, False])
def test_it_multiplies_as_torch_to_bf16s_rounding(rows, way, bias):
    """bf16 products are exact in float32: the tiles' sums differ from an exact reference by float32's summation
    only, and the outputs are that sum (plus the bias) rounded to bf16 once."""
    torch.manual_seed(rows)
    weight = torch.randn(80, 256, dtype=torch.bfloat16)
    b = torch.randn(80, dtype=torch.bfloat16) if bias else None
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    got = tiles(weight, b)[way](x)
    exact = x.double() @ weight.double().T + (b.double() if bias else 0)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 80)
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-6)


@needs_amx
@pytest.mark.parametrize("way", list(amx.WAYS))
def test_every_row_count_sums_a_row_alike(way):
    """1-17 rows (a verify at K up to 16, a tree of 16), 24, and a 40-row prompt of two full tiles and a part."""
    torch.manual_seed(1)
    weight, bias = torch.randn(160, 96, dtype=torch.bfloat16), torch.randn(160, dtype=torch.bfloat16)
    assert rows_alike(tiles(weight, bias)[way], torch.randn(40, 96, dtype=torch.bfloat16)) == []


@needs_amx
def test_a_tile_kernel_that_splits_the_inputs_past_eight_rows_is_caught():
    """The mutant: past 8 rows each row's sum runs as two halves of its inputs added (split-K, as GEMMs do for some
    shapes); the one-token step and a verify's first 8 rows then differ from the rows of a wider call."""
    torch.manual_seed(2)
    weight = torch.randn(160, 128, dtype=torch.bfloat16)
    whole = tiles(weight)["amx"]
    first, second = tiles(weight[:, :64].contiguous())["amx"], tiles(weight[:, 64:].contiguous())["amx"]
    mutant = lambda x: whole(x) if x.shape[0] <= 8 else first(x[:, :64]) + second(x[:, 64:])  # noqa: E731
    assert rows_alike(mutant, torch.randn(40, 128, dtype=torch.bfloat16)) == list(range(1, 9))


@needs_amx
def test_asking_for_the_weight_ahead_changes_no_bit():
    torch.manual_seed(3)
    weight = torch.randn(4096, 256, dtype=torch.bfloat16)  # blocks longer than the distance asked ahead
    ways = tiles(weight)
    for rows in (1, 13, 40):
        x = torch.randn(rows, 256, dtype=torch.bfloat16)
        assert torch.equal(ways["amx_ahead"](x), ways["amx"](x)), rows


@needs_amx
def test_the_tiles_read_the_vector_kernels_packed_copy():
    linear = nn.Linear(64, 64).to(torch.bfloat16)
    kernels = K.kernels_of(linear)
    assert set(amx.WAYS) <= set(kernels)
    TunedLinear(linear, {1: Choice("widened_ahead", 1), 13: Choice("amx", 13)}, kernels)
    assert kernels["amx"].packed is kernels["widened_ahead"].packed is not None
    assert K.SUMS["amx"] == K.SUMS["amx_ahead"] != K.SUMS["widened"]  # their own way: a plan does not mix them


def w4_rows(x: torch.Tensor, packed: torch.Tensor, out: int) -> torch.Tensor:
    """amx.cpp's product of a 4-bit weight (w4a8.cpp's layout) over x's rows, float32 in and out."""
    n, width = x.shape
    y = torch.empty(n, out)
    room = torch.zeros((n + 15) // 16 * 16, width, dtype=torch.bfloat16)
    amx.library().linear_w4(x.data_ptr(), room.data_ptr(), packed.data_ptr(), y.data_ptr(), n, width, out)
    return y


@needs_amx
@pytest.mark.parametrize("out,width", [(1152, 896), (896, 4864), (48, 64)])
def test_a_4bit_weight_over_a_prompts_rows_is_its_widened_bf16_product(out, width):
    """The draft's codes widened to bf16 (code * scale + low) on the tiles: every row of 1 to 40 (a tile, past it) is
    the rows in bf16 times those weights, to float32's rounding of the sums; the control: the same codes read with
    each group's nibbles in the other order (inputs 8t + j and 8t + 4 + j exchanged) are far from it."""
    g = torch.Generator().manual_seed(out + width)
    codes, scale, low = int4_codes(torch.randn(out, width, generator=g) * 0.05, 32)
    packed = w4a8.pack(codes, scale.squeeze(-1), low.squeeze(-1))

    def weights(c: torch.Tensor) -> torch.Tensor:
        w = c.float().view(out, -1, 32) * scale.half().float() + low.half().float()
        return w.view(out, width).bfloat16().double()
    swapped = codes.view(out, -1, 2, 4).flip(2).reshape(out, width)
    for n in (1, 5, 16, 17, 40):
        x = torch.randn(n, width, generator=g)
        got, rows = w4_rows(x, packed, out).double(), x.bfloat16().double()
        assert float((got - rows @ weights(codes).T).norm() / got.norm()) < 1e-5, n
        assert float((got - rows @ weights(swapped).T).norm() / got.norm()) > 0.1, n


@pytest.fixture(scope="module")
def on_tiles(tmp_path_factory):
    """The tiny pair in bf16, its target planned on the tiles alone (the vector kernels left out)."""
    pair, tuning = with_target(tiny_pair(dtype=torch.bfloat16), "none", "tuned", invariant=True,
                               folder=tmp_path_factory.mktemp("kernels"), exclude=VECTOR_WAYS)
    assert pair.not_invariant is None
    assert {K.SUMS[c.kernel] for plan in tuning.plans.values() for c in plan.values()} == {"amx"}
    return pair


@needs_amx
def test_the_tiny_pairs_verify_on_the_tiles_equals_its_one_token_steps(on_tiles):
    for width in range(1, 18):
        check = row_check(on_tiles.target, [3, 5, 7, 11, 13, 2, 8, 9, 4], width)
        assert check.identical, (width, check.logits, check.kv)


def test_a_cpu_without_amx_or_kept_below_it_plans_without_the_tiles(monkeypatch):
    weight = torch.zeros(64, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert not amx.applies(weight)
    monkeypatch.undo()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # isa_cap: this process below AVX-512, so below AMX too
    assert not amx.applies(weight)
    assert not set(amx.WAYS) & set(K.kernels_of(nn.Linear(64, 64).to(torch.bfloat16)))
    assert not amx.applies(torch.zeros(64, 48, dtype=torch.bfloat16))  # and inputs not a multiple of a tile step


def test_where_linux_refuses_the_tile_state_it_is_said_once_and_the_vector_kernels_serve(monkeypatch, caplog):
    class Refusing:
        class amx_permit:  # noqa: N801 - a C function's stand-in
            restype = None

            def __new__(cls):
                return errno.EPERM

    monkeypatch.setattr(build, "library", lambda *a: Refusing)
    amx.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert amx.library() is None and amx.library() is None
        said = [r.getMessage() for r in caplog.records if "tile" in r.getMessage()]
        assert len(said) == 1 and "EPERM" in said[0], said
    finally:
        amx.library.cache_clear()
