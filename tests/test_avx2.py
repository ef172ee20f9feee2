"""specviz's kernels on a CPU without AVX-512 (most laptops), proven on any machine with AVX2: built with no AVX-512
flag and holding no AVX-512 instruction; this process kept below AVX-512 (`isa_cap`) uses them; a way sums a row as
at AVX-512, bit for bit; the tiny pair's verify equals its one-token steps for 1-17 rows; the controls are caught.

In this module our kernels are kept below AVX-512 by the cap's variables (they read them at every choice); torch's
own kernels read theirs once at import, so one test runs a whole process under the cap.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import spec_tokens
from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.kernels import build, rows, streamed
from specviz.models import encode_prompt
from specviz.models import kernels as K
from specviz.models.kernels import Choice, TunedLinear
from specviz.models.target import with_target
from specviz.models.tiny import tiny_pair
from specviz.runs.row_check import row_check
from test_invariant import PROMPT, WIDTHS, qkv, split_k
from test_streamed import rows_alike

CAP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
HAS_AVX512 = {"avx512f", "avx512_bf16"} <= build.cpu_flags(environ={})
pytestmark = pytest.mark.skipif(not build.AVX2 <= build.cpu_flags(environ={}) or shutil.which("g++") is None,
                                reason="no AVX2 or no compiler here")
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="no AVX-512 here to compare with")


@pytest.fixture(autouse=True)
def capped(monkeypatch):
    for name, value in CAP.items():
        monkeypatch.setenv(name, value)


def test_kept_below_avx512_every_kernel_chooses_the_avx2_level():
    assert build.vector_level() == "avx2"
    assert streamed.level_for(torch.bfloat16) == rows.level_for(torch.bfloat16) == "avx2"
    assert streamed.applies(torch.empty(64, 64, dtype=torch.bfloat16)) and rows.available(torch.bfloat16)


def instructions(lib: ctypes.CDLL) -> str:
    return subprocess.run(["objdump", "-d", lib._name], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump here")
@pytest.mark.parametrize("module", [streamed, rows])
def test_the_avx2_builds_have_no_avx512_flag_and_no_avx512_register(module, monkeypatch):
    assert not [f for f in module.LEVELS["avx2"] if "avx512" in f]
    assert "zmm" not in instructions(module.library("avx2"))
    if HAS_AVX512:  # the control: the AVX-512 build of the same source uses the 512-bit registers
        monkeypatch.delenv("ATEN_CPU_CAPABILITY")
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        assert "zmm" in instructions(module.library("avx512"))


def level_ways(weight: torch.Tensor, level: str) -> dict[str, streamed.Streamed]:
    return streamed.ways(weight, None, streamed.library(level))


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_way_sums_every_row_as_at_avx512_bit_for_bit(dtype, monkeypatch):
    torch.manual_seed(3)
    weight = torch.randn(176, 320, dtype=dtype)  # 11 blocks: an odd block per thread and unit counts that don't divide
    narrow = level_ways(weight, "avx2")
    assert set(narrow) == ({"widened", "widened_ahead"} if dtype == torch.bfloat16 else {"streamed", "streamed_ahead"})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    wide = level_ways(weight, "avx512")
    for n in [*range(1, 18), 24, 40]:
        x = torch.randn(n, 320, dtype=dtype)
        for way, kernel in narrow.items():
            assert torch.equal(kernel(x), wide[way](x)), (way, n)
    assert not torch.equal(narrow[next(iter(narrow))](x), level_ways(weight.roll(1, 1), "avx512")[way](x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_way_sums_a_row_alike_whatever_the_rows_beside_it(dtype):
    torch.manual_seed(4)
    weight = torch.randn(160, 96, dtype=dtype)
    for way, kernel in level_ways(weight, "avx2").items():
        assert rows_alike(kernel, torch.randn(40, 96, dtype=dtype)) == [], way


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_attention_row_is_the_same_whatever_the_rows_beside_it(dtype):
    q, k, v = qkv(dtype)
    scale = q.shape[-1] ** -0.5
    together = rows.attend(q, k, v, None, scale)
    for n in WIDTHS:
        assert torch.equal(rows.attend(q[:, :, -n:], k, v, None, scale), together[:, -n:]), n
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(6, 1), v.double().repeat_interleave(6, 1),
        attn_mask=torch.ones(17, k.shape[2], dtype=torch.bool).tril(k.shape[2] - 17))
    tolerance = 1e-5 if dtype == torch.float32 else 4e-3  # bf16: its output's rounding
    assert float((together.double() - exact.transpose(1, 2)).abs().max()) < tolerance * q.shape[-1] ** 0.5


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def invariant(request, tmp_path, capped):
    pair, tuning = with_target(tiny_pair(dtype=request.param), "none", "tuned", invariant=True, folder=tmp_path)
    assert pair.not_invariant is None and pair.target.config._attn_implementation == rows.ROWS
    address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    avx2 = streamed.library("avx2")
    for module in pair.target.modules():  # every linear's steps and verifies on the AVX2 build (a prompt: any)
        if isinstance(module, TunedLinear):
            for kernel in {module.kernels[c.kernel] for c in module.plan.values()}:
                assert address(kernel.fn) == address(getattr(avx2, kernel.fn.__name__)), module.key
    assert {K.SUMS[c.kernel] for plan in tuning.plans.values() for c in plan.values()} <= {"streamed", "widened"}
    return pair


def test_the_tiny_pairs_verify_equals_its_one_token_steps_and_a_split_k_verify_is_caught(invariant, monkeypatch):
    for width in WIDTHS:
        check = row_check(invariant.target, PROMPT, width)
        assert check.identical, (width, check.logits, check.kv)
    for module in invariant.target.modules():  # the mutant: a 9-row verify summed in two halves
        if isinstance(module, TunedLinear):
            mutant = TunedLinear(module.inner, {**module.plan, 9: Choice("split", 9)},
                                 {**module.kernels, "split": split_k(module.inner)})
            monkeypatch.setattr(module, "by_rows", mutant.by_rows)
    assert not row_check(invariant.target, PROMPT, 9).identical
    assert row_check(invariant.target, PROMPT, 8).identical


def test_greedy_speculation_is_the_target_alones_text(invariant):
    config = DecodeConfig(k=6, max_new_tokens=32, sampling=SamplingParams(0.0), adaptive="fixed")
    for prompt in ("the man said that it was good and", "which one of them would"):
        ids = encode_prompt(invariant.tokenizer, prompt)
        alone = [s.token.id for s in autoregressive_generate(invariant, ids, config)]
        assert spec_tokens(speculative_generate(invariant, ids, config)) == alone, prompt


WHOLE_PROCESS = """
from pathlib import Path
import torch
from specviz.models.target import with_target
from specviz.models.tiny import tiny_pair
from specviz.runs.row_check import row_check
from specviz.kernels import build
pair, _ = with_target(tiny_pair(dtype=torch.bfloat16), "none", "tuned", invariant=True, folder=Path({folder!r}))
print(build.vector_level(), torch.backends.cpu.get_cpu_capability(), pair.not_invariant,
      all(row_check(pair.target, [3, 5, 7, 11, 13], w).identical for w in (1, 9, 13, 17)))
"""


def test_a_process_kept_below_avx512_verifies_bit_for_bit(tmp_path):
    out = subprocess.run([sys.executable, "-c", WHOLE_PROCESS.format(folder=str(tmp_path))], capture_output=True,
                         text=True, env={**os.environ, **CAP}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["avx2", "AVX2", "None", "True"]
