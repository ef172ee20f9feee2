"""Kernels chosen by measurement: the choice from a timing table, the dispatch, the cache, the target's precision.
(Greedy identity of the tuned target on the real pair is in test_embedded_e2e; their speed in `specviz bench`.)"""

from __future__ import annotations

import pytest
import torch
from helpers import spec_tokens
from torch import nn

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.models import PairSpec, load_spec
from specviz.models import auto_dtype
from specviz.models import kernels as K
from specviz.models import resident as R
from specviz.kernels import streamed
from specviz.models.draft.quantized import DraftQuant, Int4Linear, Int8Linear
from specviz.models.kernels import TunedLinear, tune
from specviz.models.plans import BUCKETS, Choice, LeanChoice, choose, lean_plans, lookup
from specviz.models.memory import model_bytes, weights_bytes
from specviz.models.target import quantize_target, with_target
from specviz.models.tiny import tiny_model, tiny_pair


def fake_timer(table):
    """A timer that reads a table {kernel: {rows: seconds}} (any row count missing: 1 s) and counts its calls."""
    calls = []

    def timer(group, width, dtype, device, row_counts):
        calls.append(len(group))
        return {k: {n: table.get(k, {}).get(n, 1.0) for n in row_counts} for k in group[0]}
    timer.calls = calls
    return timer


def test_the_fastest_kernel_is_chosen_for_each_row_count():
    costs = {"dense": {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0},
             "onednn": {1: 1.5, 2: 1.6, 3: 1.7, 4: 1.8}}
    plan = choose(costs, max_pad_rows=4)
    assert plan == {1: Choice("dense", 1), 2: Choice("onednn", 2), 3: Choice("onednn", 3), 4: Choice("onednn", 4)}


def test_a_row_count_runs_padded_where_more_rows_are_cheaper():
    """The Zen 4 pathology: one bf16 row costs more than two. One row then runs as two, and no row count costs
    more than a larger one."""
    costs = {"dense": {1: 1.6, 2: 1.0, 3: 1.1, 4: 1.2, 5: 3.0, 6: 1.3}}
    plan = choose(costs, max_pad_rows=6)
    assert plan[1] == Choice("dense", 2) and plan[2] == Choice("dense", 2)
    assert plan[5] == Choice("dense", 6)
    chosen = [costs[c.kernel][c.rows] for c in plan.values()]
    assert chosen == sorted(chosen)  # monotone in the rows asked for


def test_a_near_tie_keeps_the_modules_own_kernel_and_the_rows_asked_for():
    costs = {"dense": {1: 1.00, 2: 1.5}, "onednn": {1: 0.99, 2: 1.0}}
    assert choose(costs, 2)[1] == Choice("dense", 1)  # 1 % faster is within the noise: not worth a switch
    costs = {"dense": {1: 1.00, 2: 1.5}, "onednn": {1: 0.90, 2: 1.0}}
    assert choose(costs, 2)[1] == Choice("onednn", 1)


def test_above_the_padded_range_only_the_kernel_is_chosen():
    costs = {"dense": {1: 1.0, 2: 2.0, 24: 5.0, 32: 9.0}, "onednn": {1: 2.0, 2: 1.0, 24: 6.0, 32: 4.0}}
    plan = choose(costs, max_pad_rows=2)
    assert plan[24] == Choice("dense", 24) and plan[32] == Choice("onednn", 32)  # no padding to 32
    assert lookup(plan, 28) == Choice("dense", 28)  # between buckets: the kernel of the one below
    assert lookup(plan, 400) == Choice("onednn", 400)


@pytest.mark.parametrize("verify_widened", [0.19, 2.0])
def test_an_invariant_plan_sums_one_way_at_every_row_count_the_one_a_race_pays_least_for(verify_widened):
    """One row fastest on the dot product, nine rows on the widened FMAs (the 2-core Xeon's kind of table): the
    fastest kernel per row count would sum a verify's rows otherwise than the one-token steps."""
    costs = {"dense": {1: 1.0, 9: 1.0, 64: 9.0},
             "streamed": {1: 0.10, 9: 0.50, 64: 5.0}, "streamed_ahead": {1: 0.09, 9: 0.55, 64: 5.1},
             "widened": {1: 0.12, 9: 0.20, 64: 2.0}, "widened_ahead": {1: 0.11, 9: verify_widened, 64: 2.1}}
    ways = lambda plan: {streamed.SUMS[c.kernel] for c in plan.values()}  # noqa: E731
    assert ways(choose(costs, 9)) == {"streamed", "widened"}  # the control: per row count, two ways
    planned = choose(K.invariant_costs(costs, 9), 9)
    # at the race's mix (16 steps, 4 verifies, a prompt chunk): 4.5 s widened against 8.44 s on the dot product;
    # without its plain kernel, widened's verify at 2.0 costs it 11.86 s: the dot product's way then
    assert ways(planned) == {"widened"}
    assert planned[1] == Choice("widened_ahead", 1) and planned[64] == Choice("widened", 64)
    del costs["widened"]
    assert ways(choose(K.invariant_costs(costs, 9), 9)) == ({"widened"} if verify_widened < 0.5 else {"streamed"})


def test_one_copy_of_each_weight_unless_the_race_pays_more_than_three_percent_for_it():
    """The Zen 4 case: torch's own kernel (oneDNN off) fastest at one row, oneDNN packed at nine. A plan on one copy
    of the weight is taken where the whole model's race pays at most 3 % more for it; past that, the shapes whose
    second copy buys the most time per byte keep both. The price is reported per shape either way."""
    mix = {1: 1, 9: 1}
    a = {"dense": {1: 2.0, 9: 1.10}, "native": {1: 1.0, 9: 3.0}, "onednn": {1: 1.9, 9: 1.06}}  # one copy: +1.9 %
    b = {"dense": {1: 2.0, 9: 1.2}, "native": {1: 0.5, 9: 3.0}, "onednn": {1: 1.9, 9: 1.05}}  # one copy: +9.7 %
    assert choose(a, 9)[9] == Choice("onednn", 9) and choose(b, 9)[1] == Choice("native", 1)  # fastest: both forms
    alone = lean_plans({"a": a}, {"a": (1, 100)}, 9, mix=mix)["a"]
    assert alone.plan[1] == Choice("native", 1) and alone.plan[9] == Choice("dense", 9)
    assert alone.forms == ("as loaded",) and alone.extra == pytest.approx((1.0 + 1.10) / (1.0 + 1.06) - 1)
    both = lean_plans({"b": b}, {"b": (1, 100)}, 9, mix=mix)["b"]
    assert both.plan == choose(b, 9) and both.forms == ("as loaded", "packed")
    assert both.extra == pytest.approx(1.7 / 1.55 - 1)
    # in a model of 10 linears of b and 1 of a big `c` that one copy costs nothing: b's 9.7 % is 0.6 % of the race
    c = {"dense": {1: 20.0, 9: 22.0}}
    model = lean_plans({"b": b, "c": c}, {"b": (10, 100), "c": (10, 1000)}, 9, mix=mix)
    assert model["b"].forms == ("as loaded",) and model["c"].forms == ("as loaded",)
    # together a (+0.04 for 100 bytes) and d (+0.10 for 1000) cost 3.4 % of the race: d saves more bytes a second
    d = {"dense": {1: 2.0, 9: 1.10}, "native": {1: 0.8, 9: 3.0}, "onednn": {1: 1.9, 9: 1.0}}  # one copy: +5.6 %
    pair = lean_plans({"a": a, "d": d}, {"a": (1, 100), "d": (1, 1000)}, 9, mix=mix)
    assert pair["d"].forms == ("as loaded",) and pair["a"].forms == ("as loaded", "packed")
    one_form = {"dense": {1: 1.0, 9: 1.2}, "onednn": {1: 1.5, 9: 1.5}}  # nothing to trade: no price
    assert lean_plans({"e": one_form}, {"e": (1, 1)}, 9, mix=mix)["e"] == LeanChoice(choose(one_form, 9),
                                                                                        ("as loaded",), 0.0)


def test_the_kernel_without_onednn_puts_the_switch_back_even_when_the_product_fails():
    linear = nn.Linear(8, 4)
    native = K.WithoutOneDNN(linear.weight, linear.bias)
    assert torch.backends.mkldnn.enabled
    torch.testing.assert_close(native(torch.ones(2, 8)), linear(torch.ones(2, 8)))
    with pytest.raises(RuntimeError):
        native(torch.ones(2, 5))  # wrong width
    assert torch.backends.mkldnn.enabled
    with torch.backends.mkldnn.flags(enabled=False):  # it restores what it found, not "on"
        native(torch.ones(1, 8))
        assert not torch.backends.mkldnn.enabled


@pytest.mark.parametrize("bias", [True, False])
def test_every_kernel_and_padding_multiplies_as_the_dense_linear(bias):
    torch.manual_seed(0)
    dense = nn.Linear(96, 160, bias=bias)
    kernels = K.kernels_of(dense)
    assert set(kernels) == {"dense", "native", "onednn"} | (set(streamed.WAYS[torch.float32]) if streamed.library()
                                                            else set())
    for name in kernels:
        for rows, padded in ((1, 1), (1, 2), (3, 8), (20, 20)):
            tuned = TunedLinear(dense, {rows: Choice(name, padded)})
            x = torch.randn(1, rows, 96)
            got, want = tuned(x), dense(x)
            assert got.shape == want.shape == (1, rows, 160)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_the_plan_decides_the_kernel_and_the_rows_it_runs():
    seen = []
    kernels = {"a": lambda x: seen.append(("a", x.shape[0])) or torch.zeros(x.shape[0], 4),
               "b": lambda x: seen.append(("b", x.shape[0])) or torch.ones(x.shape[0], 4)}
    tuned = TunedLinear(nn.Linear(3, 4), {1: Choice("b", 2), 2: Choice("b", 2), 3: Choice("a", 3)}, kernels)
    out = [tuned(torch.randn(n, 3)) for n in (1, 2, 3)]
    assert seen == [("b", 2), ("b", 2), ("a", 3)]
    assert [o.shape[0] for o in out] == [1, 2, 3] and out[0].sum() == 4 and out[2].sum() == 0


def test_a_tuned_copy_shares_the_weights_and_leaves_the_loaded_model_as_it_was(tmp_path):
    model = tiny_model(0, 64)
    fast, tuning = tune(model, folder=tmp_path, timer=fake_timer({}), max_rows=3)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    tuned = [m for m in fast.modules() if isinstance(m, TunedLinear)]
    assert linears and len(tuned) == len(linears)  # every linear, the head included
    assert not any(isinstance(m, TunedLinear) for m in model.modules())
    assert {m.inner.weight.data_ptr() for m in tuned} == {m.weight.data_ptr() for m in linears}
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    torch.testing.assert_close(fast(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    assert not tuning.cached and tuning.path.exists()


def test_the_table_is_reused_and_measured_again_when_the_machine_torch_or_model_changes(tmp_path, monkeypatch):
    model = tiny_model(0, 64)
    timer = fake_timer({"onednn": {1: 0.5}})
    _, first = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
    measured = len(timer.calls)
    assert measured == len(first.costs) > 0 and first.plans["linear:64x64:float32"][1] == Choice("onednn", 1)
    _, again = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
    assert again.cached and len(timer.calls) == measured and again.plans == first.plans  # from the cache
    tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu B")  # another CPU
    assert len(timer.calls) == 2 * measured
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch
    tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
    assert len(timer.calls) == 3 * measured
    monkeypatch.undo()
    tune(tiny_model(0, 64).to(torch.bfloat16), folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")  # another model
    assert len(timer.calls) > 3 * measured
    _, back = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
    assert back.cached
    from specviz.models import kernel_table

    monkeypatch.setattr(kernel_table, "sources_digest", lambda: "another kernel")  # specviz's kernels changed
    _, changed = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
    assert not changed.cached


def test_a_table_of_another_thread_count_is_measured_again_unless_a_test_reads_make_apps(tmp_path):
    """The app times each thread count's own table; the suite's real pair (`helpers.tables_kept_at`) reads the one
    `make app` kept at all threads instead of timing a pytest-xdist worker's one thread."""
    from helpers import tables_kept_at

    model, timer, threads = tiny_model(0, 64), fake_timer({"onednn": {1: 0.5}}), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _, app = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
        measured = len(timer.calls)
        torch.set_num_threads(1)
        with tables_kept_at(2):
            _, read = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")
        assert read.cached and read.plans == app.plans and len(timer.calls) == measured
        _, own = tune(model, folder=tmp_path, timer=timer, max_rows=3, cpu="cpu A")  # the app's rule: timed again
        assert not own.cached and len(timer.calls) == 2 * measured
    finally:
        torch.set_num_threads(threads)


def test_a_shape_is_timed_over_enough_of_its_linears_to_leave_the_caches(tmp_path, monkeypatch):
    model = tiny_model(0, 64)
    monkeypatch.setattr(K, "GROUP_BYTES", 10**12)  # more than the model: every linear of each shape
    timer = fake_timer({})
    tune(model, folder=tmp_path / "all", timer=timer, max_rows=2)
    assert sum(timer.calls) == sum(isinstance(m, nn.Linear) for m in model.modules()) > len(timer.calls)
    monkeypatch.setattr(K, "GROUP_BYTES", 1)  # any one weight leaves the caches: one linear per shape
    timer = fake_timer({})
    tune(model, folder=tmp_path / "one", timer=timer, max_rows=2)
    assert set(timer.calls) == {1}


@pytest.mark.parametrize("drafter", ["model", "tree"])
def test_greedy_speculation_on_a_tuned_target_equals_the_untuned_target_alone(drafter):
    """Real timings (this machine's table), a plan that pads and switches kernels; the tokens do not change."""
    pair = tiny_pair(3)
    tuned, tuning = with_target(pair, "none", "tuned")
    assert tuned.target_name == "tiny-target [tuned kernels]" and tuning is not None
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed", drafter=drafter,
                          tree_budget=12)
    ids = [1, 2, 3, 4, 5]
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    assert [s.token.id for s in autoregressive_generate(tuned, ids, config)] == alone
    assert spec_tokens(speculative_generate(tuned, ids, config)) == alone


@pytest.mark.parametrize("quant,kind", [("int4", Int4Linear), ("int8", Int8Linear)])
def test_a_quantized_target_runs_its_quantized_weights_for_every_row_count(quant, kind):
    pair = tiny_pair(3)
    q, _ = with_target(pair, quant, "plain")
    assert q.target_name == f"tiny-target [{quant} weights]"
    linears = [m for m in q.target.modules() if isinstance(m, kind)]
    assert len(linears) == sum(isinstance(m, nn.Linear) for m in pair.target.modules())
    assert all(m.dense is None for m in linears)  # no dense fallback: the prompt reads the same weights
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        whole = q.target(ids).logits
        one_by_one = torch.cat([q.target(ids[:, :n]).logits[:, -1:] for n in range(1, 9)], 1)
        assert not torch.allclose(whole, pair.target(ids).logits, atol=1e-3)  # other weights than the loaded ones
    torch.testing.assert_close(whole, one_by_one, rtol=1e-3, atol=1e-3)  # the same weights at 1 and 8 rows


@pytest.mark.parametrize("quant", ["int4", "int8"])
@pytest.mark.parametrize("drafter", ["model", "tree"])
def test_greedy_speculation_on_a_quantized_tuned_target_equals_it_alone(quant, drafter):
    pair, _ = with_target(tiny_pair(3), quant, "tuned")
    config = DecodeConfig(k=6, max_new_tokens=40, sampling=SamplingParams(0.0), adaptive="fixed", drafter=drafter,
                          tree_budget=12)
    ids = [1, 2, 3, 4, 5]
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    rounds = list(speculative_generate(pair, ids, config))
    assert spec_tokens(rounds) == alone
    if drafter == "model":  # drafts accepted and rejected: the rule decided both ways
        assert any(r.n_accepted < r.k for r in rounds) and any(r.n_accepted > 0 for r in rounds)


def test_the_settings_tune_by_default_and_plain_keeps_the_kernels_as_loaded():
    loader = lambda *a, **k: tiny_pair()  # noqa: E731
    served = load_spec(PairSpec("tiny", "tiny", draft_quant="none", step="eager"), loader=loader)
    plain = load_spec(PairSpec("tiny", "tiny", draft_quant="none", kernels="plain", step="eager"), loader=loader)
    assert any(isinstance(m, TunedLinear) for m in served.target.modules())
    assert any(isinstance(m, TunedLinear) for m in served.draft.modules())  # one dispatcher: the draft's too
    assert not any(isinstance(m, TunedLinear) for m in [*plain.target.modules(), *plain.draft.modules()])
    assert plain.target_name == "tiny-target"


def test_a_packed_copy_never_chosen_is_let_go_and_one_chosen_counts_in_memory(tmp_path):
    model = tiny_model(0, 64)
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    dense_only, _ = tune(model, folder=tmp_path / "a", timer=fake_timer({"onednn": {}}), max_rows=2)
    assert model_bytes(dense_only) == model_bytes(model)
    packed, _ = tune(model, folder=tmp_path / "b", timer=fake_timer({"dense": {}, "onednn": {1: 0.1, 2: 0.1}}),
                     max_rows=2)
    assert model_bytes(packed) == model_bytes(model) + linears


def test_a_target_packed_for_every_row_count_keeps_one_copy_of_each_weight(tmp_path):
    """The resident bytes after release are the expected total: every linear once (its packed copy) and the rest of
    the model (embeddings, norms) once; a step reads the same bytes and computes the same logits."""
    model = tiny_model(0, 64)
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    packed, _ = tune(model, folder=tmp_path, timer=fake_timer({"dense": {}, "onednn": {n: 0.1 for n in range(1, 129)}}),
                     max_rows=2)
    reads, ids = R.step_bytes(packed), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert model_bytes(packed) == model_bytes(model) + linears  # two copies, before
    assert R.release_unused_dense(packed) == linears
    assert model_bytes(packed) == model_bytes(model)  # one copy: the packed linears and the rest, once
    assert R.step_bytes(packed) == reads
    torch.testing.assert_close(packed(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    assert R.release_unused_dense(packed) == 0  # nothing left to release


def test_a_lean_draft_holds_its_packed_weights_and_the_embedding_once_and_the_load_frees_the_dense_ones():
    """The draft's resident bytes are the expected total: the embedding, each linear's packed form, norms and
    biases; no dense copy of a layer or the head. `load_spec` (which drops the pair as loaded) frees the loaded
    draft's linears; `with_speedups` alone leaves a loaded pair as it was."""
    from specviz.models.draft.lean import LeanDraft
    from specviz.models.draft.quantized import QuantLinear
    from specviz.models.loading import with_speedups

    loaded = tiny_pair()
    spec = PairSpec("tiny", "tiny", kernels="plain", step="eager")
    kept = with_speedups(loaded, spec)
    assert all(m.weight.device.type == "cpu" for m in loaded.draft.modules() if isinstance(m, nn.Linear))
    pair = load_spec(spec, loader=lambda *a, **k: loaded)
    assert isinstance(pair.draft, LeanDraft) and isinstance(kept.draft, LeanDraft)
    assert all(m.weight.device.type == "meta" for m in loaded.draft.modules() if isinstance(m, nn.Linear))
    embedding = pair.draft.embed.weight
    packed = [m for m in pair.draft.modules() if isinstance(m, QuantLinear)]
    assert len(packed) == 4 * len(pair.draft.layers) + 1  # qkv, o, gate_up, down; the head
    expected = (embedding.numel() * embedding.element_size() + sum(K.module_bytes(m) for m in packed)
                + sum(t.numel() * t.element_size() for n, t in pair.draft.named_parameters() if "norm" in n)
                + sum(b.numel() * b.element_size() for b in pair.draft.buffers() if b.is_floating_point()
                      and b.dim() == 1 and not any(b is q for m in packed for q in m.buffers())))
    assert model_bytes(pair.draft) == expected
    assert model_bytes(pair.draft) < model_bytes(tiny_pair().draft) / 2
    config = DecodeConfig(k=3, max_new_tokens=12, adaptive="fixed")  # the freed weights are not used: same tokens
    runs = [[t for r in speculative_generate(p, [3, 4, 5, 6, 7, 8, 9, 10], config) for t in r.new_token_ids]
            for p in (pair, kept)]
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_a_weight_a_plan_multiplies_by_or_another_module_holds_is_kept(tmp_path):
    model = tiny_model(0, 64)
    some, _ = tune(model, folder=tmp_path / "a", max_rows=2,
                   timer=fake_timer({"dense": {n: 0.5 for n in BUCKETS}, "onednn": {1: 0.1, 2: 0.1}}))
    assert R.release_unused_dense(some) == 0  # dense still serves the prompt's row counts
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in Qwen2.5-0.5B
    tied, _ = tune(model, folder=tmp_path / "b", timer=fake_timer({"onednn": {n: 0.1 for n in range(1, 129)}}),
                   max_rows=2)
    head = model.lm_head.weight.numel() * 4
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    assert R.release_unused_dense(tied) == linears - head  # the embedding still reads the head's weight


def test_the_memory_estimate_counts_the_packed_copy_and_not_for_a_quantized_target(tmp_path):
    tiny_model(0, 64).save_pretrained(tmp_path / "m")
    folder = str(tmp_path / "m")
    tuned, _ = weights_bytes(PairSpec(None, folder, device="cpu", dtype="float32"))
    plain, _ = weights_bytes(PairSpec(None, folder, device="cpu", dtype="float32", kernels="plain"))
    quant, _ = weights_bytes(PairSpec(None, folder, device="cpu", dtype="float32", target_quant="int4"))
    assert tuned == 2 * plain and quant == plain  # a quantized target loads as it is, then shrinks


def test_a_quantized_target_on_a_gpu_is_refused_in_one_sentence():
    from specviz.models.pair import ModelLoadError

    pair = tiny_pair()
    pair.device = torch.device("meta")
    with pytest.raises(ModelLoadError, match="runs on a CPU only"):
        with_target(pair, "int4", "plain")


def test_auto_picks_the_dtype_whose_verify_is_fastest_here_and_caches_it(tmp_path):
    from specviz.engine.config import DecodeConfig

    measured = []

    def measure(dtype):
        measured.append(dtype)
        return {torch.float32: {"step": 0.4, "verify": 0.5}, torch.bfloat16: {"step": 0.2, "verify": 0.3}}[dtype]
    assert auto_dtype.fastest_cpu_dtype(folder=tmp_path, cpu="x", measure=measure) == torch.bfloat16
    assert auto_dtype.fastest_cpu_dtype(folder=tmp_path, cpu="x", measure=lambda d: 1 / 0) == torch.bfloat16  # cached
    assert len(measured) == 2
    # a faster one-token step does not decide it: the speculative lane's target cost is its verify
    slow_verify = {torch.float32: {"step": 0.3, "verify": 0.35}, torch.bfloat16: {"step": 0.2, "verify": 0.4}}
    dtype, why = auto_dtype.race_dtype(folder=tmp_path, cpu="y", measure=slow_verify.get)
    assert dtype == torch.float32
    assert why.startswith("dtype auto: float32, whose verify of 13 rows") and "bfloat16 400.00 ms (a step 200.00)" in why
    assert auto_dtype.VERIFY_ROWS == DecodeConfig().k + 1  # the default K's verify


def test_the_verify_is_timed_on_the_invariant_kernels_where_the_dtype_has_them():
    def timer(group, width, dtype, device, rows):  # a split-K kernel fastest at every width: not the race's verify
        return {k: {n: 0.001 if k == "onednn" else 0.002 if k.startswith("widened") else 0.004 for n in rows}
                for k in group[0]}
    seconds = auto_dtype.layer_seconds(torch.bfloat16, timer)
    layer = sum(count for *_, count in auto_dtype.REFERENCE_LAYER)
    here = set(K.kernels_of(nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)))  # oneDNN's bf16 needs AVX-512
    fastest = 0.001 if "onednn" in here else 0.002 if any(k.startswith("widened") for k in here) else 0.004
    assert seconds["step"] == pytest.approx(fastest * layer)
    if K.INVARIANT & here:
        assert seconds["verify"] == pytest.approx(0.002 * layer)


def test_step_bytes_count_each_linear_once_whatever_its_kernels_keep(tmp_path):
    model = tiny_model(0, 64)
    linears = sum(m.weight.numel() * 4 + (m.bias.numel() * 4 if m.bias is not None else 0)
                  for m in model.modules() if isinstance(m, nn.Linear))
    assert R.step_bytes(model) == linears
    packed, _ = tune(model, folder=tmp_path, timer=fake_timer({"dense": {}, "onednn": {1: 0.1}}), max_rows=2)
    assert R.step_bytes(packed) == linears
    assert R.step_bytes(quantize_target(model, DraftQuant.named("int4"))) < linears / 4


def test_a_cpu_kept_below_avx512_gets_no_packed_bf16_candidate_and_every_candidate_runs():
    """Under ONEDNN_MAX_CPU_ISA=AVX2 (as on a CPU without AVX-512) oneDNN's packed bf16 linear raises at packing: it
    is no candidate there, and timing the candidates (the dtype choice of `--dtype auto`) runs to the end."""
    import os
    import subprocess
    import sys

    code = ("import torch; from torch import nn; from specviz.models.kernels import kernels_of; "
            "m = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16); ks = kernels_of(m); "
            "x = torch.randn(2, 64, dtype=torch.bfloat16); [k(x) for k in ks.values()]; print(sorted(ks))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'dense'" in done.stdout and "onednn" not in done.stdout and "streamed" not in done.stdout
