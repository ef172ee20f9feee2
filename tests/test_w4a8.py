"""The draft's 4-bit x 8-bit kernel (`kernels/w4a8`): against a float reference of the same codes (within the 8-bit
activations' rounding), every shape of the embedded draft and odd ones, both threads' halves of the blocks, one copy
of the codes once the dispatcher has chosen, and torch's int4 kernel where the CPU lacks VNNI.

Its AVX2 level (a CPU without AVX-512) is built here explicitly on any machine with AVX2, with AVX-VNNI and without:
the same checks, the AVX-512 level's products bit for bit, its fused step to float32's rounding, and a whole process
kept below AVX-512 (`build.isa_cap`) using it."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from specviz.kernels import amx, build, w4a8
from specviz.models import kernels as K
from specviz.models import resident as R
from specviz.models.draft.quantized import Int4Linear

needs_kernel = pytest.mark.skipif(not w4a8.applies(w4a8.OUTS, w4a8.GROUP, w4a8.GROUP, torch.float32),
                                  reason="neither AVX512-VNNI nor AVX2 here, or no compiler")
HAS = build.cpu_flags(environ={})  # the machine's flags, whatever caps this process
needs_avx2 = pytest.mark.skipif(not build.AVX2 <= HAS or shutil.which(os.environ.get("CXX", "g++")) is None,
                                reason="no AVX2 or no compiler here")
needs_vnni = pytest.mark.skipif(w4a8.AVX_VNNI not in HAS, reason="no AVX-VNNI here")
needs_avx512 = pytest.mark.skipif(not w4a8.NEEDS["avx512"][torch.bfloat16] <= HAS,
                                  reason="no AVX512-VNNI and -BF16 here to compare with")
# the AVX2 level's two builds: the dot products on vpmaddubsw and vpmaddwd, or on AVX-VNNI's vpdpbusd
AVX2_BUILDS = [pytest.param(False, id="avx2"), pytest.param(True, id="avx2-vnni", marks=needs_vnni)]
# a product as this process runs it (None), and at the AVX2 level both ways
KERNELS = [pytest.param(None, id="this-process", marks=needs_kernel),
           *(pytest.param(p.values[0], id=p.id, marks=[needs_avx2, *p.marks]) for p in AVX2_BUILDS)]
# the embedded 0.5B draft's linears (q/k/v fused, gate/up fused, o, down) and a cut head; then odd sizes
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (32000, 896), (16, 32), (48, 96), (80, 160)]
# the 8-bit activations' rounding: |x - a * xs| <= xs / 2 per input, so a product's relative error stays near 0.5 %
TOLERANCE = 0.015


def linear(out: int, width: int, seed: int = 0) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(width, out, bias=False)
    with torch.no_grad():
        lin.weight.copy_(0.05 * torch.randn(out, width, generator=gen))
    return lin


def w4a8_fastest(group, width, dtype, device, rows) -> dict:
    """A kernel table (the dispatcher's `timer`) in which the 4-bit x 8-bit kernel is the fastest everywhere."""
    return {k: {n: 1e-6 if k == "w4a8" else 1.0 for n in rows} for k in group[0]}


def kernel_of(q: Int4Linear, vnni: bool | None) -> w4a8.W4A8:
    """`q`'s 4-bit x 8-bit product as this process runs it (`vnni` None), or at the AVX2 level with AVX-VNNI or
    without."""
    if vnni is None:
        return K.kernels_of(q)["w4a8"]
    return w4a8.W4A8(q.w4a8_packed, q.out_features, q.in_features, w4a8.library("avx2", vnni=vnni))


def dequantized(q: Int4Linear) -> torch.Tensor:
    """The float weights the codes stand for, transposed, read back through torch's int4 kernel (an identity's rows)."""
    eye = torch.eye(q.in_features, dtype=torch.bfloat16)
    return q.matmul(eye).float()  # [in, out]: W transposed


@pytest.mark.parametrize("vnni", KERNELS)
@pytest.mark.parametrize("out,width", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_computes_the_codes_product_within_the_activations_rounding(out, width, dtype, vnni):
    q = Int4Linear(linear(out, width).to(dtype), 32, keep_dense=False)
    kernel = kernel_of(q, vnni)
    x = torch.randn(5, width, generator=torch.Generator().manual_seed(1)).to(dtype)
    reference = x.float() @ dequantized(q)
    for n in (1, 2, 3, 4, 5):  # one to four rows at a time, and a fifth after them
        got = kernel(x[:n]).float()
        assert got.dtype == torch.float32 and got.shape == (n, out)
        assert float((got - reference[:n]).norm() / reference[:n].norm()) < TOLERANCE, n


@pytest.mark.parametrize("vnni", KERNELS)
@pytest.mark.parametrize("out,width", [(1152, 896), (896, 4864), (48, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompts_rows_two_to_a_register_are_the_one_row_products_bit_for_bit(out, width, dtype, vnni):
    """At AVX-512, from 8 rows two go to a 512-bit register, each lane doing the one-row path's operations in its
    order; at AVX2 a pass takes four rows at a time, each alike."""
    q = Int4Linear(linear(out, width).to(dtype), 32, keep_dense=False)
    kernel = kernel_of(q, vnni)
    x = torch.randn(41, width, generator=torch.Generator().manual_seed(2)).to(dtype)
    alone = torch.cat([kernel(x[i:i + 1]) for i in range(41)])
    for n in (8, 9, 17, 33, 41):  # whole pairs, an odd count's last row alone, more than one pass's 32 rows
        assert torch.equal(kernel(x[:n]), alone[:n]), n
    assert not torch.equal(kernel(x[1:9]), alone[:8])  # the control: other rows give other bits


@needs_kernel
def test_both_threads_halves_of_the_blocks_agree_with_one_thread():
    q = Int4Linear(linear(9728, 896), 32, keep_dense=False)
    kernel = K.kernels_of(q)["w4a8"]
    x = torch.randn(2, 896, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x)
        torch.set_num_threads(2)
        two = kernel(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # each output block computed whole by one thread, whichever


@pytest.mark.parametrize("vnni", KERNELS)
@pytest.mark.parametrize("out,width", [(9728, 896), (896, 4864), (48, 96)])
def test_asking_for_the_codes_ahead_changes_no_bit(out, width, vnni):
    """Prefetching is a hint (even past the codes' end): the same products, bit for bit, as the negative control's
    changed codes are not."""
    q = Int4Linear(linear(out, width).to(torch.bfloat16), 32, keep_dense=False)
    kernel = kernel_of(q, vnni)
    x = torch.randn(3, width, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2))
    plain = kernel(x)
    kernel.prefetch = max(w4a8.PREFETCH)
    assert torch.equal(kernel(x), plain)
    q.w4a8_packed[:128] ^= 0x11  # the first block's codes of its first group: its outputs change
    assert not torch.equal(kernel(x), plain)


@needs_kernel
def test_the_dispatcher_keeps_one_copy_of_the_codes():
    q, r = (Int4Linear(linear(896, 896).to(torch.bfloat16), 32, keep_dense=False) for _ in range(2))
    held = lambda m: sum(t.numel() * t.element_size() for t in m.buffers())  # noqa: E731
    both = held(q)
    R.release_unused_codes(nn.Sequential(K.TunedLinear(q, {1: K.Choice("w4a8", 1)}),
                                         K.TunedLinear(r, {1: K.Choice("int4", 1)})))
    assert q.qweight.numel() == 0 and q.w4a8_packed is not None and held(q) < 0.6 * both
    assert K.module_bytes(q) == held(q)  # what a step reads: the one copy kept
    assert r.w4a8_packed is None and r.qweight.numel() > 0


@needs_kernel
@pytest.mark.parametrize("faster", [True, False])
def test_the_step_decides_a_kernel_faster_per_shape(tmp_path, faster):
    """Where the plan uses the kernel, the whole draft step is timed with it and without it: the slower step's plan
    is dropped (a fake timer says which is faster), and one copy of the codes stays."""
    from dataclasses import replace

    from specviz.models.draft.quantized import DraftQuant, quantize_draft
    from specviz.models.target import with_tuned_draft
    from specviz.models.tiny import tiny_pair

    pair = tiny_pair()
    pair = replace(pair, draft=quantize_draft(pair.draft, DraftQuant(4)))
    cheap = {"w4a8": 0.001, "int4": 1.0}  # the table: the new kernel fastest for every shape and row count
    costs = lambda group, width, dtype, device, rows: {k: {n: cheap[k] for n in rows} for k in group[0]}  # noqa: E731
    said = []
    tuned = with_tuned_draft(pair, said.append, step_timer=lambda a, b: (1.0, 2.0) if faster else (2.0, 1.0),
                             timer=costs, folder=tmp_path).draft
    assert R.uses(tuned, "w4a8") == faster and R.uses(tuned, "int4") != faster
    assert [x for x in said if "4-bit x 8-bit kernel:" in x][0].endswith("kept." if faster else "dropped.")
    linears = [m.inner for m in tuned.modules() if isinstance(m, K.TunedLinear)]
    assert all((m.w4a8_packed is None) != (m.qweight.numel() == 0) for m in linears)


@needs_kernel
@pytest.mark.parametrize("fastest", [0, 1, 2])
def test_the_step_decides_how_far_ahead_the_codes_are_asked_for(tmp_path, fastest):
    """Once the kernel is kept, the step is timed again with its reads prefetched, at each reach against the fastest
    so far: the fastest is kept (`fastest`: not asking, the first reach, the second), products and fused step alike,
    each said in one sentence."""
    from specviz.models.draft import DraftQuant, with_cheaper_draft
    from specviz.models.target import with_tuned_draft
    from specviz.models.tiny import tiny_pair

    reaches = (0, *w4a8.PREFETCH)
    step = {0: 3.0, reaches[1]: 2.0 if fastest == 1 else 4.0, reaches[2]: 1.0 if fastest == 2 else 5.0}
    if fastest == 2:
        step[reaches[1]] = 2.0  # the first reach beats not asking, the second beats both
    timed = lambda a, b: (step[K.w4a8_products(a)[0].prefetch], step[K.w4a8_products(b)[0].prefetch])  # noqa: E731
    timings = iter([(1.0, 2.0)])  # the kernel kept; then the reaches, by the fake step times above
    said = []
    draft = with_tuned_draft(with_cheaper_draft(tiny_pair(), DraftQuant(4)), said.append,
                             step_timer=lambda a, b: next(timings, None) or timed(a, b), timer=w4a8_fastest,
                             folder=tmp_path).draft
    reach = reaches[fastest]
    assert {p.prefetch for p in K.w4a8_products(draft)} == {reach} and draft.fused().prefetch == reach
    assert [x.endswith("asked.") for x in said if "ahead:" in x] == [fastest > 0, fastest == 2]


def test_without_vnni_torch_int4_kernel_serves(monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx512f", "avx512vl"})
    q = Int4Linear(linear(896, 896), 32, keep_dense=False)
    assert q.w4a8_packed is None and set(K.kernels_of(q)) == {"int4"}


@needs_avx2
def test_a_cpu_with_avx2_alone_gets_the_avx2_build_without_vnni(monkeypatch):
    """An AVX2 CPU without AVX-512 or AVX-VNNI (AMD before Zen 4): the vpmaddubsw build serves the draft."""
    monkeypatch.setattr(build, "cpu_flags", lambda: set(build.AVX2))
    q = Int4Linear(linear(896, 896), 32, keep_dense=False)
    assert q.w4a8_packed is not None and set(K.kernels_of(q)) == {"int4", "w4a8"}
    assert w4a8.library() is w4a8.library("avx2", vnni=False) is not None


@pytest.fixture(scope="module")
def lean_tiny(tmp_path_factory):
    """The tiny pair with the lean int4 draft, its products on the 4-bit x 8-bit kernel (a table that says it is the
    fastest everywhere, a step timer that says its step is), so that its one-token step is one call."""
    from specviz.models.draft import DraftQuant, with_cheaper_draft
    from specviz.models.target import with_tuned_draft
    from specviz.models.tiny import tiny_pair

    pair = with_cheaper_draft(tiny_pair(), DraftQuant(4))
    return with_tuned_draft(pair, lambda _: None, step_timer=lambda a, b: (1.0, 2.0), timer=w4a8_fastest,
                            folder=tmp_path_factory.mktemp("kernels"))


@needs_kernel
def test_the_fused_step_computes_what_the_layers_compute(lean_tiny):
    from transformers import DynamicCache

    from specviz.compat import forward

    draft = lean_tiny.draft
    assert draft.fused() is not None
    ids = torch.tensor([[(7 + 31 * i) % 90 for i in range(20)]])
    with torch.inference_mode():
        fused, layers = draft.new_cache(8), DynamicCache()  # (8 slots: it grows past them)
        forward(draft, ids, fused, 1), forward(draft, ids, layers, 1)
        token = torch.tensor([[5]])
        for _ in range(6):
            a, b = (forward(draft, token, c, 1).logits[0, -1].float() for c in (fused, layers))
            assert float((a - b).norm() / b.norm()) < 0.01 and a.argmax() == b.argmax()  # 8-bit activations: ~1e-3
            token = b.argmax().view(1, 1)
        assert fused.get_seq_length() == layers.get_seq_length() == 26 and fused.capacity >= 26
        fused.crop(-4), layers.crop(-4)
        a, b = (forward(draft, token, c, 1).logits[0, -1].float() for c in (fused, layers))
        assert fused.get_seq_length() == 23 and a.argmax() == b.argmax()  # the cut cache is read as cut


@needs_kernel
@pytest.mark.parametrize("feed", [2, 3, 8])
def test_the_fused_step_over_a_few_tokens_computes_what_the_layers_compute(lean_tiny, feed):
    """A round's last draft and its bonus (or a few more) in one fused call: every row's logits as the layers' (each
    row attends causally: up to its own position), and the cache written at each of their positions (the next step
    reads it)."""
    from transformers import DynamicCache

    from specviz.compat import forward

    draft = lean_tiny.draft
    ids = torch.tensor([[(7 + 31 * i) % 90 for i in range(20)]])
    new = torch.tensor([[(3 + 17 * i) % 90 for i in range(feed)]])
    with torch.inference_mode():
        fused, layers = draft.new_cache(8), DynamicCache()
        forward(draft, ids, fused, 1), forward(draft, ids, layers, 1)
        a, b = (forward(draft, new, c, feed).logits[0].float() for c in (fused, layers))
        assert a.shape == b.shape == (feed, a.shape[-1])
        assert all(float((a[r] - b[r]).norm() / b[r].norm()) < TOLERANCE for r in range(feed))
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        token = torch.tensor([[11]])
        a, b = (forward(draft, token, c, 1).logits[0, -1].float() for c in (fused, layers))
        # within the 8-bit activations' rounding (TOLERANCE): on an AMD EPYC (Zen 3, AVX2 without VNNI) the fed rows
        # came out equal and the step after 3 of them 1.01% apart, the control 74% away
        assert float((a - b).norm() / b.norm()) < TOLERANCE and fused.get_seq_length() == 20 + feed + 1
        first = forward(draft, new, draft_after(draft, ids), feed).logits[0].float()
        shifted = forward(draft, new, draft_after(draft, ids[:, 1:]), feed).logits[0].float()
        assert float((first - shifted).norm() / shifted.norm()) > TOLERANCE  # control: it tells contexts apart


@needs_kernel
def test_a_prompt_read_on_the_tiles_computes_what_the_layers_compute(lean_tiny):
    """A prompt of `TILE_ROWS` tokens or more: where AMX serves, its products go to the tiles (the codes widened to
    bf16, the rows in bf16, where the layers multiply 8-bit rows: each product differs by the two roundings, 0.6% on
    the tiny draft); its last row's logits and the cache it leaves (the next step reads it) as the layers' to within
    TOLERANCE, which the same prompt with another first token is not (the control: 19% away)."""
    from transformers import DynamicCache

    from specviz.compat import forward

    tolerance = 0.06  # the roundings' 0.6% a product, through the tiny draft's layers: 3% at the logits
    draft = lean_tiny.draft
    n = draft.fused().TILE_ROWS + 9
    ids = torch.tensor([[(7 + 31 * i) % 90 for i in range(n)]])
    other = torch.cat([ids[:, :1] + 1, ids[:, 1:]], 1)
    with torch.inference_mode():
        fused, layers = draft.new_cache(8), DynamicCache()
        a, read = (forward(draft, ids, c, 1).logits[0, -1].float() for c in (fused, layers))
        assert float((a - read).norm() / read.norm()) < tolerance and a.argmax() == read.argmax()
        token = torch.tensor([[11]])
        a, b = (forward(draft, token, c, 1).logits[0, -1].float() for c in (fused, layers))
        assert float((a - b).norm() / b.norm()) < tolerance and fused.get_seq_length() == n + 1
        c = forward(draft, other, draft.new_cache(8), 1).logits[0, -1].float()
        assert float((c - read).norm() / read.norm()) > tolerance


def draft_after(draft, ids):
    """A fresh cache of `draft` that has read `ids`."""
    from specviz.compat import forward

    cache = draft.new_cache(8)
    forward(draft, ids, cache, 1)
    return cache


@needs_kernel
def test_the_tuned_drafts_codes_are_one_buffer_on_huge_pages_read_by_all(lean_tiny):
    """Every product, its linear and the fused step read the codes from one buffer that starts on a huge page and
    holds only what they read (the codes the plan dropped are not in it)."""
    from specviz.kernels import pages

    draft = lean_tiny.draft
    products = K.w4a8_products(draft)
    codes = {id(p.packed): p.packed for p in products}
    linears = [m.inner for m in draft.modules() if isinstance(m, K.TunedLinear)]
    assert products and {id(m.w4a8_packed) for m in linears} == set(codes)
    buffers = {t.untyped_storage().data_ptr() for t in codes.values()}
    assert len(buffers) == 1
    first = min(t.data_ptr() for t in codes.values())
    assert first % pages.HUGE == 0
    held = sum(-(-t.numel() // pages.ALIGN) * pages.ALIGN for t in codes.values())
    assert next(iter(codes.values())).untyped_storage().nbytes() == held
    read = {t.data_ptr() for t in draft.fused().kept if t.dtype == torch.uint8}  # the fused step's codes
    assert read and read <= {t.data_ptr() for t in codes.values()}  # these, not a copy left behind


@needs_kernel
def test_speculation_on_the_fused_draft_is_the_target_alones_text(lean_tiny):
    from helpers import spec_tokens
    from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
    from specviz.models import encode_prompt

    config = DecodeConfig(k=5, max_new_tokens=30, sampling=SamplingParams(0.0), adaptive="fixed")
    ids = encode_prompt(lean_tiny.tokenizer, "the man said that it was good and")
    rounds = list(speculative_generate(lean_tiny, ids, config))
    assert spec_tokens(rounds) == [s.token.id for s in autoregressive_generate(lean_tiny, ids, config)]
    assert sum(r.n_accepted for r in rounds) > 0  # the fused draft's guesses are accepted: it drafts as the target


def test_the_draft_steps_split_accounts_for_the_whole_step(lean_tiny, monkeypatch):
    """`specviz costs`' split of the draft's one-token step: products, attention (the lean draft's own function)
    and the rest, which together make the step; a fused step's attention is inside its one call (no part of its
    own), and a draft whose attention is not a function of its own has none either."""
    from specviz.bench.draft_split import draft_split
    from specviz.models.tiny import tiny_pair

    draft = lean_tiny.draft
    fused = draft_split(draft, context=16, reps=3)
    assert fused["fused"] is (draft.fused() is not None) and fused["products_ms"] > 0
    monkeypatch.setattr(type(draft), "fused", lambda self: None)  # the layers' ops: attention a function of its own
    layered = draft_split(draft, context=16, reps=3)
    assert not layered["fused"] and layered["products_ms"] > 0 and layered["attention_ms"] > 0
    parts = layered["products_ms"] + layered["attention_ms"] + layered["rest_ms"]
    assert parts >= layered["step_ms"] - 3e-3  # (the rest is never below 0)
    plain = draft_split(tiny_pair().draft, context=16, reps=3)
    assert plain["attention_ms"] is None and not plain["fused"] and plain["products_ms"] > 0


# ---- the AVX2 level beside the AVX-512 one

def instructions(lib) -> str:
    return subprocess.run(["objdump", "-d", lib._name], capture_output=True, text=True, check=True).stdout


@needs_avx2
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump here")
@pytest.mark.parametrize("vnni", AVX2_BUILDS)
def test_the_avx2_builds_hold_no_avx512_register_and_their_own_dot_product(vnni):
    assert not [f for f in w4a8.LEVELS["avx2"] if "avx512" in f]
    code = instructions(w4a8.library("avx2", vnni=vnni))
    assert "zmm" not in code
    assert ("{vex} vpdpbusd" in code) == vnni and ("vpmaddubsw" in code) != vnni
    if w4a8.NEEDS["avx512"][torch.float32] <= HAS:  # the control: the AVX-512 build uses the 512-bit registers
        assert "zmm" in instructions(w4a8.library("avx512"))


@needs_avx512
@needs_avx2
@pytest.mark.parametrize("vnni", AVX2_BUILDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_avx2_products_are_the_avx512_products_bit_for_bit(dtype, vnni):
    """Each output's integer sums are exact and its float operations the same in the same order at both levels (the
    AVX-512 level's pairs of blocks in one 512-bit register, the AVX2 level's in two 256-bit ones): the same bits, at
    one row and at many, an odd last block (80 outputs) among them; the control: changed codes change them."""
    wide_lib = w4a8.library("avx512")
    x = (3 * torch.randn(17, 4864, generator=torch.Generator().manual_seed(4))).to(dtype)
    x[0, :32] = 0  # a block of zeros (its scale 0)
    for out, width in [(1152, 896), (896, 4864), (48, 96), (80, 160)]:
        q = Int4Linear(linear(out, width).to(dtype), 32, keep_dense=False)
        wide, narrow = w4a8.W4A8(q.w4a8_packed, out, width, wide_lib), kernel_of(q, vnni)
        for n in (1, 2, 3, 5, 8, 9, 17):
            assert torch.equal(narrow(x[:n, :width]), wide(x[:n, :width])), (out, width, n)
    expected = wide(x[:2, :width])
    q.w4a8_packed[:128] ^= 0x11
    assert not torch.equal(narrow(x[:2, :width]), expected)


@needs_avx2
@pytest.mark.parametrize("vnni", AVX2_BUILDS)
def test_the_largest_codes_and_activations_sum_exactly(vnni):
    """Codes 15 against activations of +-127 (every input at its block's maximum): vpmaddubsw's pairs reach
    2 * 15 * 127 = 3810, far from 16 bits' saturation, and every group's sum is exact: y = 15 * the inputs' sum, to
    float32's rounding of the scales."""
    out, width = 16, 256
    codes = torch.full((out, width), 15)
    packed = w4a8.pack(codes, torch.ones(out, width // 32), torch.zeros(out, width // 32))
    x = torch.tensor([[0.5] * width, [-0.5] * width, [0.5, -0.5] * (width // 2)])
    y = w4a8.W4A8(packed, out, width, w4a8.library("avx2", vnni=vnni))(x)
    assert torch.allclose(y, (15 * x.sum(1, keepdim=True)).expand(-1, out), rtol=1e-6, atol=1e-4)


def on_lib(draft, lib, tiles=None):
    """`draft`'s fused step with everything on `lib` (the tiles not given, unless `tiles`)."""
    step = copy.copy(draft.fused())
    step.lib, step.tiles = lib, tiles
    return step


def fused_run(draft, step, ids: torch.Tensor, tokens=(5, 11, 17)):
    """The last row's logits after `ids` and then after each of `tokens`, one step each, and the cache they leave."""
    cache = draft.new_cache(8)
    with torch.inference_mode():
        logits = [draft.fused_forward(step, ids, cache, 1, True).logits[0]]
        logits += [draft.fused_forward(step, torch.tensor([[t]]), cache, 1, True).logits[0] for t in tokens]
    return torch.cat(logits).float(), cache


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@needs_avx512
@needs_avx2
def test_the_fused_step_at_avx2_computes_what_it_computes_at_avx512(lean_tiny):
    """Its products are the same bits; only the sums across a register's lanes (a norm's, an attention score's) sum
    8 lanes, not 16: the logits and the cache to float32's rounding (2e-7 on the tiny draft), the same greedy tokens,
    where another context is 1e-3 away or more (the control). With AVX-VNNI and without, bit for bit."""
    draft = lean_tiny.draft
    ids = torch.tensor([[(7 + 31 * i) % 90 for i in range(20)]])
    wide, wide_cache = fused_run(draft, on_lib(draft, w4a8.library("avx512")), ids)
    narrow, narrow_cache = fused_run(draft, on_lib(draft, w4a8.library("avx2", vnni=False)), ids)
    assert relative(narrow, wide) < 1e-5 and torch.equal(narrow.argmax(-1), wide.argmax(-1))
    for a, b in zip(narrow_cache.keys + narrow_cache.values, wide_cache.keys + wide_cache.values):
        assert relative(a, b) < 1e-5
    if w4a8.AVX_VNNI in HAS:
        assert torch.equal(fused_run(draft, on_lib(draft, w4a8.library("avx2", vnni=True)), ids)[0], narrow)
    other, _ = fused_run(draft, on_lib(draft, w4a8.library("avx2", vnni=False)), ids[:, 1:])
    assert relative(other, wide) > 1e-3


@needs_avx2
@pytest.mark.skipif(amx.w4_rows() is None, reason="no AMX tiles here")
def test_below_avx512_the_fused_step_never_calls_the_tiles(lean_tiny):
    """The tiles' kernel is AVX-512 code: a prompt of TILE_ROWS tokens or more, given the tiles, computes at AVX2 what
    it computes without them; at AVX-512 the tiles change it (the control: their bf16 rows)."""
    tiles = amx.w4_rows()
    draft = lean_tiny.draft
    ids = torch.tensor([[(7 + 31 * i) % 90 for i in range(draft.fused().TILE_ROWS + 9)]])
    narrow = w4a8.library("avx2", vnni=False)
    assert torch.equal(fused_run(draft, on_lib(draft, narrow, tiles), ids)[0],
                       fused_run(draft, on_lib(draft, narrow), ids)[0])
    wide = w4a8.library("avx512")
    assert not torch.equal(fused_run(draft, on_lib(draft, wide, tiles), ids)[0],
                           fused_run(draft, on_lib(draft, wide), ids)[0])


CAPPED = """
import json, torch
from torch import nn
from specviz.kernels import build, w4a8
from specviz.models import kernels as K
from specviz.models.draft.quantized import Int4Linear
q = Int4Linear(nn.Linear(896, 896, bias=False).to(torch.bfloat16), 32, keep_dense=False)
print(json.dumps({"level": build.vector_level(), "avx2 build": w4a8.library() is w4a8.library("avx2"),
                  "avx512 refused": w4a8.library("avx512") is None, "kernels": sorted(K.kernels_of(q)),
                  "applies": [w4a8.applies(896, 896, 32, d) for d in (torch.float32, torch.bfloat16)]}))
"""


@needs_avx2
def test_a_process_kept_below_avx512_multiplies_on_the_avx2_build():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run([sys.executable, "-c", CAPPED], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said == {"level": "avx2", "avx2 build": True, "avx512 refused": True, "kernels": ["int4", "w4a8"],
                    "applies": [True, True]}
