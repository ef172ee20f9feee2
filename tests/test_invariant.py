"""The invariant verify: every row a verify scores, and the K/V it writes, bit-identical to the one-token step at its
position (`kernels.rows`, the invariant linears of `models.kernels`), for every row count a verify presents; so
greedy speculation gives the target alone's text in bfloat16 too. A mutant dispatcher that sends one row count to
another kernel, or attention back to SDPA, is caught. An int4 target's verify on the int4 x 8-bit kernel, too."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from helpers import spec_tokens
from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.kernels import build, rows, w4a8
from specviz.models import encode_prompt
from specviz.models.kernels import Choice, TunedLinear
from specviz.models.target import with_target
from specviz.models.tiny import tiny_pair
from specviz.runs.row_check import row_check

pytestmark = pytest.mark.skipif(not rows.available(torch.float32), reason="no row-invariant attention here")
DTYPES = [torch.float32, torch.bfloat16]
PROMPT = [3, 5, 7, 11, 13, 2, 8, 9, 4]
WIDTHS = range(1, 18)  # a chain's K + 1 (K up to 16) and a tree of 16 nodes


def qkv(dtype, n=17, heads=12, kv_heads=2, slots=300, d=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype)
            for shape in ((1, heads, n, d), (1, kv_heads, slots, d), (1, kv_heads, slots, d))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_attends_alike_whatever_the_rows_beside_it(dtype):
    q, k, v = qkv(dtype)
    scale = q.shape[-1] ** -0.5
    together = rows.attend(q, k, v, None, scale)
    for n in WIDTHS:  # the last n rows of the 17, at the same positions
        alone = rows.attend(q[:, :, -n:], k, v, None, scale)
        assert torch.equal(alone, together[:, -n:]), n
    d = q.shape[-1]
    seen = torch.ones(17, k.shape[2], dtype=torch.bool).tril(k.shape[2] - 17)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(6, 1), v.double().repeat_interleave(6, 1), attn_mask=seen)
    tolerance = 1e-5 if dtype == torch.float32 else 4e-3  # bf16: its output's rounding
    assert float((together.double() - exact.transpose(1, 2)).abs().max()) < tolerance * d ** 0.5


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tree_node_attends_as_the_step_at_its_position_though_its_keys_are_scattered(dtype):
    """A node sees the prompt and its ancestors among siblings' slots; the same keys side by side give the same
    row: the sums run over the keys it sees in order, 16 at a time by rank, not by slot."""
    q, k, v = qkv(dtype, n=1, slots=40)
    keep = [*range(30), 32, 35, 39]  # its ancestors at slots 32, 35, 39 (the siblings at the others)
    mask = torch.zeros(1, 1, 1, 40, dtype=torch.bool)
    mask[..., keep] = True
    scattered = rows.attend(q, k, v, rows.allowed_keys(mask, 1, 40), 0.1)
    packed = rows.attend(q, k[:, :, keep], v[:, :, keep], None, 0.1)
    assert torch.equal(scattered, packed)
    additive = torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)  # the tree's own mask, as transformers hands it
    assert torch.equal(rows.attend(q, k, v, rows.allowed_keys(additive, 1, 40), 0.1), packed)


def test_a_prompt_into_an_empty_cache_goes_to_sdpa_and_a_step_to_the_rows():
    q, k, v = qkv(torch.float32, n=8, slots=8)
    assert not rows.takes(q, k, {})  # a prompt: both lanes read it alike
    assert rows.takes(q[:, :, -1:], k, {}) and rows.takes(q, *qkv(torch.float32, n=8, slots=20)[1:2], {})
    assert not rows.takes(q[:, :, -1:], k, {"softcap": 30.0})


@pytest.fixture(scope="module", params=DTYPES, ids=["float32", "bfloat16"])
def invariant(request, tmp_path_factory):
    pair, _ = with_target(tiny_pair(dtype=request.param), "none", "tuned", invariant=True,
                          folder=tmp_path_factory.mktemp("kernels"))
    assert pair.not_invariant is None and pair.target.config._attn_implementation == rows.ROWS
    return pair


def test_every_verify_width_equals_the_one_token_steps_bit_for_bit(invariant):
    for width in WIDTHS:
        check = row_check(invariant.target, PROMPT, width)
        assert check.identical, (width, check.logits, check.kv)


def split_k(linear: torch.nn.Linear):
    """A kernel that sums each row's products in two halves and adds them (split-K, as GEMMs do for some shapes):
    the same product, another order."""
    half = linear.in_features // 2
    w = linear.weight
    return lambda x: F.linear(x[:, :half], w[:, :half]) + F.linear(x[:, half:], w[:, half:], linear.bias)


def test_a_dispatcher_that_sends_one_row_count_elsewhere_is_caught(invariant, monkeypatch):
    """The mutant: nine rows (a verify at K = 8) go to a split-K kernel instead of the invariant one."""
    for module in invariant.target.modules():
        if isinstance(module, TunedLinear):
            kernels = {**module.kernels, "split": split_k(module.inner)}
            mutant = TunedLinear(module.inner, {**module.plan, 9: Choice("split", 9)}, kernels)
            monkeypatch.setattr(module, "by_rows", mutant.by_rows)
    assert not row_check(invariant.target, PROMPT, 9).identical
    assert row_check(invariant.target, PROMPT, 8).identical  # the other widths still are


def test_attention_back_on_sdpa_is_caught(invariant, monkeypatch):
    monkeypatch.setattr(invariant.target.config, "_attn_implementation", "sdpa")
    assert not all(row_check(invariant.target, PROMPT, width).identical for width in (2, 9, 17))


@pytest.mark.parametrize("drafter", ["model", "tree"])
def test_greedy_speculation_is_the_target_alones_text(invariant, drafter):
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed", drafter=drafter)
    for prompt in ("the man said that it was good and", "she had not been there for", "which one of them would"):
        ids = encode_prompt(invariant.tokenizer, prompt)
        alone = [s.token.id for s in autoregressive_generate(invariant, ids, config)]
        assert spec_tokens(speculative_generate(invariant, ids, config)) == alone, prompt


def test_where_the_verify_cannot_be_invariant_it_says_why():
    pair = tiny_pair()
    why = with_target(pair, "int8", "tuned", invariant=True)[0].not_invariant
    assert "quantized kernels do not keep a row's sums in one order" in why and "not built" not in why
    assert "--kernels plain" in with_target(pair, "none", "plain", invariant=True)[0].not_invariant
    assert "--no-invariant" in with_target(pair, "none", "plain", invariant=False)[0].not_invariant
    # the bench's way: the target quantized on the kernels as loaded, then tuned as it is (its linears int8 already)
    quantized = with_target(pair, "int8", "plain")[0]
    assert "quantized kernels" in with_target(quantized, "none", "tuned", invariant=True)[0].not_invariant


# the int4 x 8-bit kernel needs AVX512-VNNI and a compiler; without it the int4 target says why (the test after these)
needs_w4a8 = pytest.mark.skipif(not w4a8.applies(64, 64, 32, torch.float32),
                                reason="no int4 x 8-bit kernel here (AVX512-VNNI and a compiler)")


@pytest.fixture(scope="module", params=["int4", "bench"])
def int4_invariant(request, tmp_path_factory):
    """The tiny target in int4 on the int4 x 8-bit kernel, asked to be invariant: quantized and tuned in one go, or
    the bench's way (quantized on the kernels as loaded, then tuned as it is)."""
    folder = tmp_path_factory.mktemp("kernels")
    pair = tiny_pair()
    if request.param == "bench":
        pair = with_target(pair, "int4", "plain")[0]
    pair = with_target(pair, "int4" if request.param == "int4" else "none", "tuned", invariant=True, folder=folder)[0]
    assert pair.not_invariant is None and pair.target.config._attn_implementation == rows.ROWS
    return pair


@needs_w4a8
def test_an_int4_targets_verify_rows_are_its_one_token_steps_bit_for_bit(int4_invariant):
    """Each row's 8-bit activations are its own and the kernel sums a row in one order at every row count, so a
    quantized target verifies as its steps compute too: every width, and greedy speculation gives its text."""
    for width in WIDTHS:
        check = row_check(int4_invariant.target, PROMPT, width)
        assert check.identical, (width, check.logits, check.kv)
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed")
    ids = encode_prompt(int4_invariant.tokenizer, "the man said that it was good and")
    alone = [s.token.id for s in autoregressive_generate(int4_invariant, ids, config)]
    assert spec_tokens(speculative_generate(int4_invariant, ids, config)) == alone


@needs_w4a8
def test_an_int4_verify_quantized_across_its_rows_is_caught(int4_invariant, monkeypatch):
    """The control: nine rows whose 8-bit activations come out otherwise (scaled up for the kernel, down after, as a
    scale shared across the rows would) are no longer the steps' rows."""
    for module in int4_invariant.target.modules():
        if isinstance(module, TunedLinear):
            kernel = module.kernels["w4a8"]
            kernels = {**module.kernels, "rescaled": lambda x, kernel=kernel: kernel(x * 3.0) / 3.0}
            mutant = TunedLinear(module.inner, {**module.plan, 9: Choice("rescaled", 9)}, kernels)
            monkeypatch.setattr(module, "by_rows", mutant.by_rows)
    assert not row_check(int4_invariant.target, PROMPT, 9).identical
    assert row_check(int4_invariant.target, PROMPT, 8).identical  # the other widths still are


def test_without_the_int4_x_8_bit_kernel_an_int4_target_says_why(monkeypatch, tmp_path):
    """Where the CPU lacks VNNI (forced here, so it runs on every machine) only torch's int4 kernel serves: the verify
    cannot be invariant, and the pair says so in one sentence."""
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx512f", "avx512vl", "avx512bw", "avx512_bf16"})
    pair = with_target(tiny_pair(), "int4", "tuned", invariant=True, folder=tmp_path)[0]
    assert "quantized kernels do not keep a row's sums in one order" in pair.not_invariant
    assert pair.target.config._attn_implementation != rows.ROWS


def test_specviz_rows_shows_the_verify_row_by_row_both_ways(tmp_path, capsys):
    """The lesson as a command: on the tiny pair, the invariant verify is bit-identical (exit 0) and SDPA is not."""
    import json

    from specviz import cli

    out = tmp_path / "rows.json"
    assert cli.main(["rows", "--draft", "tiny", "--target", "tiny", "--step", "eager", "--prompt",
                     "the man said that it was good and", "--width", "5", "--tokens", "12", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    invariant, sdpa = report["ways"]
    assert invariant["attention"] == rows.ROWS and not any(invariant["rows"]["logits"]) and invariant["identical_text"]
    assert sdpa["attention"] == "sdpa" and any(sdpa["rows"]["logits"]) and len(sdpa["texts"]) == 5
    assert "verify of 5 rows" in capsys.readouterr().out
    assert cli.main(["rows", "--draft", "tiny", "--target", "tiny", "--width", "0"]) == 2  # one sentence, exit 2
