"""The packed verify: the target's linears on oneDNN-packed weights for 4+ rows, the loaded model untouched.
(Its greedy identity on the real pair is in test_embedded_e2e; its speed in `specviz bench`.)"""

from __future__ import annotations

import pytest
import torch
from helpers import spec_tokens
from torch import nn

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.models import PairSpec, load_spec
from specviz.models.memory import model_bytes, weights_bytes
from specviz.models.packed_target import PACKED_FROM, PackedLinear, packed_target, supports, with_packed_target
from specviz.models.tiny import tiny_model, tiny_pair


@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_linear_multiplies_as_the_dense_one_for_any_number_of_rows(bias):
    torch.manual_seed(0)
    dense = nn.Linear(96, 160, bias=bias)
    packed = PackedLinear(dense)
    for rows in range(1, 21):
        x = torch.randn(1, rows, 96)
        got, want = packed(x), dense(x)
        assert got.shape == want.shape == (1, rows, 160)
        if rows < PACKED_FROM:  # a decode step stays on the dense kernel: bit for bit
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_the_number_of_rows_decides_the_kernel():
    torch.manual_seed(1)
    dense = nn.Linear(32, 48)
    packed = PackedLinear(dense)
    x = torch.randn(6, 32)
    want = dense(x)
    dense.weight.zero_()  # the dense kernel now sees zeros; the packed copy keeps the weights it was made from
    for rows in range(1, 7):
        got = packed(x[:rows])
        expected = dense.bias.expand(rows, -1) if rows < PACKED_FROM else want[:rows]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_packed_copy_shares_the_weights_and_leaves_the_loaded_model_as_it_was():
    model = tiny_model(0, 64)
    fast = packed_target(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    packed = [m for m in fast.modules() if isinstance(m, PackedLinear)]
    assert linears and len(packed) == len(linears)  # every linear, the head included
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert {m.dense.weight.data_ptr() for m in packed} == {m.weight.data_ptr() for m in linears}
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    torch.testing.assert_close(fast(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_the_packed_copy_counts_in_the_memory_the_app_shows():
    model = tiny_model(0, 64)
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    assert model_bytes(packed_target(model)) == model_bytes(model) + linears


def test_it_applies_only_to_float32_on_a_cpu():
    model = tiny_model(0, 64)
    assert supports(model)
    bf16 = tiny_model(0, 64).to(torch.bfloat16)
    assert not supports(bf16) and packed_target(bf16) is bf16  # bf16 matmuls already run on oneDNN


@pytest.mark.parametrize("drafter", ["model", "tree"])
def test_greedy_speculation_on_the_packed_target_equals_it_alone(drafter):
    pair = with_packed_target(tiny_pair(3))
    assert pair.target_name == "tiny-target [packed verify]"
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed", drafter=drafter,
                          tree_budget=12)
    ids = [1, 2, 3, 4, 5]
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    rounds = list(speculative_generate(pair, ids, config))
    assert spec_tokens(rounds) == alone
    # verifies wide enough to run on the packed weights (the pending token and the drafts: a chain or a tree)
    assert max(len(r.tree) or r.k for r in rounds) + 1 >= PACKED_FROM


def test_the_settings_ask_for_it_by_default_and_plain_turns_it_off():
    loader = lambda *a, **k: tiny_pair()  # noqa: E731
    served = load_spec(PairSpec("tiny", "tiny", draft_quant="none"), loader=loader)
    plain = load_spec(PairSpec("tiny", "tiny", draft_quant="none", target_kernel="plain"), loader=loader)
    assert any(isinstance(m, PackedLinear) for m in served.target.modules())
    assert not any(isinstance(m, PackedLinear) for m in plain.target.modules())
    assert plain.target_name == "tiny-target"


def test_the_memory_estimate_counts_the_packed_copy(tmp_path):
    tiny_model(0, 64).save_pretrained(tmp_path / "m")
    packed, _ = weights_bytes(PairSpec(None, str(tmp_path / "m"), device="cpu", dtype="float32"))
    plain, _ = weights_bytes(PairSpec(None, str(tmp_path / "m"), device="cpu", dtype="float32",
                                      target_kernel="plain"))
    bf16, _ = weights_bytes(PairSpec(None, str(tmp_path / "m"), device="cpu", dtype="bfloat16"))
    assert packed == 2 * plain and bf16 == plain // 2  # no packed copy in bf16: it does not apply there
