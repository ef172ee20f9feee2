"""The compiled one-token step on a static KV cache: the same tokens as the eager model, the cache read and cut
as a dynamic one, and the choice between them made by measurement (`PairSpec.step`)."""

from __future__ import annotations

import copy
import gc
import json
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch

from helpers import EXACT, TEST_DEVICE, TEST_DTYPE, deprecations_said, same_greedy

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.compat import forward
from specviz.engine.plumbing import new_cache, prefilled, rollback
from specviz.models import ModelLoadError, PairSpec
from specviz.models.compiled import MAX_LEN, SIZES, CompileCounts, StaticKV, is_compiled, with_compiled_step
from specviz.models.static_cache import static_mask
from specviz.models.step_timing import StepTimes
from specviz.models.loading import load_spec
from specviz.models.steps import InUse, Probe, checked_in_use, inductor_cache, with_steps
from specviz.serving.session import Session
from specviz.models.synthetic import prompt_ids, synthetic_pair
from specviz.models.tiny import tiny_pair

MINI = ("synthetic:mini-draft", "synthetic:mini-target")
CLOSE = dict(rtol=1e-4, atol=1e-4) if EXACT else dict(rtol=0.05, atol=0.05)  # logits of one model, two kernels


@pytest.fixture(scope="module")
def pairs():
    """The mini synthetic pair (vocabularies differing by padding, as Qwen2.5 0.5B and 7B), eager and compiled: the
    target's verify too, padded to 6 tokens (K = 4's 5, and fewer after a cut) or 12."""
    eager = synthetic_pair(*MINI, device=str(TEST_DEVICE), dtype=TEST_DTYPE, seed=5)
    compiled = replace(eager, draft=with_compiled_step(eager.draft, sizes=(24, 256)),
                       target=with_compiled_step(eager.target, sizes=(24, 256), widths=(6, 12)))  # runs grow
    return eager, compiled


def test_the_compiled_copy_shares_the_weights_and_hands_out_static_caches(pairs):
    eager, compiled = pairs
    assert is_compiled(compiled.target) and not is_compiled(eager.target)
    assert compiled.target.lm_head.weight is eager.target.lm_head.weight
    assert isinstance(new_cache(compiled.target), StaticKV)
    assert not isinstance(new_cache(compiled.target, static=False), StaticKV)  # trees ask for a dynamic one
    assert not isinstance(new_cache(eager.target), StaticKV)


@torch.inference_mode()
def test_the_static_cache_reads_and_cuts_like_a_dynamic_one(pairs):
    """Logits after every kind of move (prompt, one token, a verify, a cut, a copy) equal the eager model's on a
    DynamicCache doing the same, to rounding (float32's; bf16's where the suite runs in bf16)."""
    eager, compiled = pairs
    ids = torch.tensor([prompt_ids(30, 1000, seed=2)], device=TEST_DEVICE)
    static, dynamic = prefilled(compiled.target, ids[:, :20]), prefilled(eager.target, ids[:, :20])
    assert isinstance(static, StaticKV) and static.get_seq_length() == dynamic.get_seq_length() == 19

    def both(feed, keep=1):
        a, b = forward(compiled.target, feed, static, keep).logits, forward(eager.target, feed, dynamic, keep).logits
        torch.testing.assert_close(a, b, **CLOSE)
        assert static.get_seq_length() == dynamic.get_seq_length()

    both(ids[:, 19:20])  # the compiled step
    both(ids[:, 20:23], keep=3)  # a verify, compiled padded to 6 tokens: the padding's rows and entries dropped
    both(ids[:, 23:26], keep=2)  # (the padding was overwritten; a verify keeping fewer rows than it feeds)
    rollback(static, 22), rollback(dynamic, 22)  # the round's cut
    assert static.get_seq_length() == 22
    both(ids[:, 22:23])  # overwrites the stale entry at 22
    twin = copy.deepcopy(static)
    both(ids[:, 23:24])
    assert twin.get_seq_length() == 23  # the copy did not move with the original
    both(ids[:, 24:26], keep=1)  # a draft's catch-up: two compiled steps, the last one's row
    both(ids[:, 26:29], keep=3)
    with pytest.raises(ValueError, match="negative count"):
        static.crop(1)


@torch.inference_mode()
def test_the_step_is_compiled_once_for_every_position_and_cache():
    """Each token at a new position, fed as a slice of the run's ids (its stride differs every time), and a second
    run on the buffers the first gave back: one graph. A recompilation per step would, after torch's limit of 8,
    silently run eager. (A new buffer set is a graph of its own on CUDA: `warm_sizes` makes those at load.)"""
    from torch._dynamo.utils import counters

    model = with_compiled_step(synthetic_pair(None, MINI[1], device=str(TEST_DEVICE), seed=9).target, sizes=(128,))
    prompt = prompt_ids(60, 1000, seed=3)
    before = counters["stats"]["unique_graphs"]
    for start in (10, 12):
        cache = prefilled(model, torch.tensor([prompt[:start]], device=TEST_DEVICE))
        for i in range(start, 40):  # the last token of the ids so far, as the round loop feeds it
            last = torch.tensor([prompt[:i]], device=TEST_DEVICE)[:, -1:]
            forward(model, last, cache, 1)
        del cache  # its buffers back to the pool: the next run borrows them, as runs do
    assert counters["stats"]["unique_graphs"] - before == 1


@torch.inference_mode()
def test_a_verify_is_one_graph_per_width_whatever_it_drafted():
    """Verifies of 2 to 6 tokens (a confidence cut drafts fewer than K), at any position: one graph, the width 6."""
    from torch._dynamo.utils import counters

    model = with_compiled_step(synthetic_pair(None, MINI[1], device=str(TEST_DEVICE), seed=9).target, sizes=(128,),
                               widths=(6,))
    prompt = prompt_ids(60, 1000, seed=3)
    cache = prefilled(model, torch.tensor([prompt[:10]], device=TEST_DEVICE))
    forward(model, torch.tensor([prompt[9:10]], device=TEST_DEVICE), cache, 1)
    before = counters["stats"]["unique_graphs"]
    position = 10
    for n in (2, 3, 4, 5, 6, 3, 2):
        out = forward(model, torch.tensor([prompt[position:position + n]], device=TEST_DEVICE), cache, n)
        assert out.logits.shape[1] == n and cache.get_seq_length() == position + n
        rollback(cache, position + 1)  # a round that kept one
        position += 1
    assert counters["stats"]["unique_graphs"] - before == 1


@torch.inference_mode()
def test_a_forward_no_compiled_width_takes_sees_only_the_static_cache_s_tokens():
    """Where the compiled verify lost its probe (no widths: the pair's faster kernels can make it so) or a prompt is
    wider than every width, the forward runs eager on the static cache: given that cache's mask and positions, as
    the compiled verify is, each row sees the tokens held and none of the unwritten slots (the row-invariant
    attention reads a missing mask as causal over every slot). The tiny pair as loaded: tuned kernels, that
    attention, a compiled step."""
    pair = load_spec(PairSpec("tiny", "tiny", draft_quant="none", step="compiled"))
    target = pair.target
    target.verify_widths = ()
    ids = torch.tensor([prompt_ids(20, 60, seed=2)])
    for n in (6, 12):  # prompts past CATCH_UP (read in one forward), then a verify of 5
        static, dynamic = prefilled(target, ids[:, :n]), prefilled(target, ids[:, :n], static=False)
        assert isinstance(static, StaticKV) and not isinstance(dynamic, StaticKV)
        a, b = forward(target, ids[:, n:n + 5], static, 5).logits, forward(target, ids[:, n:n + 5], dynamic, 5).logits
        torch.testing.assert_close(a, b, **CLOSE)


def test_a_dropped_run_gives_its_buffers_back():
    """At most a few sets of static buffers exist per model: a graph is specialised to their addresses."""
    model = with_compiled_step(synthetic_pair(None, MINI[1], device=str(TEST_DEVICE)).target, sizes=(16, 64))
    first = new_cache(model)
    small = first.hf
    with torch.inference_mode():
        first.reserve(20)  # past the first size: the run moves to the next, and the small buffers go back at once
    assert first.size == 64 and new_cache(model).hf is small
    large = first.hf
    del first
    gc.collect()
    again = new_cache(model)
    again.reserve(40)
    assert again.hf is large and again.get_seq_length() == 0


@pytest.mark.parametrize("drafter", ["model", "tree", "hybrid"])
def test_greedy_output_on_the_compiled_steps_is_the_target_alone(pairs, drafter):
    """Float32, where exactness is proven: the target alone eager and compiled, and speculation on compiled steps
    (a tree's verify too, on the target's static cache; its draft's cache stays dynamic), give one text, through the padded vocabulary of the pair (in bf16: up to a
    near-tie, `helpers.same_greedy`)."""
    eager, compiled = pairs
    config = DecodeConfig(k=4, max_new_tokens=40, adaptive="fixed", drafter=drafter, tree_budget=8)
    prompt = prompt_ids(16, 1000, seed=4)
    alone = list(autoregressive_generate(eager, prompt, config))
    alone_compiled = list(autoregressive_generate(compiled, prompt, config))
    assert same_greedy([s.token.id for s in alone_compiled], alone)
    rounds = list(speculative_generate(compiled, prompt, config))
    assert same_greedy([t for r in rounds for t in r.new_token_ids], alone_compiled)


def test_a_decode_on_the_compiled_steps_says_nothing_deprecated(pairs):
    """The compiled step's graph, its eager forward on the static cache and on a dynamic one are called with the
    cache's name the installed transformers takes (5.24: `cache`; 5.17: `past_key_values`): no deprecation said
    (torch's own from compiling aside, `helpers.deprecations_said`)."""
    _, compiled = pairs
    dynamic = new_cache(compiled.target, static=False)
    with deprecations_said() as said:
        for drafter in ("model", "tree"):
            list(speculative_generate(compiled, prompt_ids(16, 1000, seed=6),
                                      DecodeConfig(k=4, max_new_tokens=12, drafter=drafter, tree_budget=8)))
        forward(compiled.target, torch.tensor([prompt_ids(4, 1000)], device=TEST_DEVICE), dynamic, 1)
    assert said == []


def test_a_trees_verify_is_the_compiled_graph_of_its_width(pairs, monkeypatch):
    """Every tree verify of a run (9 rows at most: the pending token and 8 nodes) runs padded to a compiled width
    (6 or 12) on the static cache, whatever shape each tree had; and a second run compiles nothing: a chain's verify of that
    width and a tree's are one graph."""
    from specviz.models import compiled as module

    eager, compiled = pairs
    config = DecodeConfig(k=4, max_new_tokens=24, adaptive="fixed", drafter="tree", tree_budget=8)
    list(speculative_generate(compiled, prompt_ids(16, 1000, seed=5), config))
    rows = []
    monkeypatch.setattr(module, "static_mask", lambda mask, past, n, size: rows.append(n) or
                        static_mask(mask, past, n, size))
    before = CompileCounts.now()
    rounds = list(speculative_generate(compiled, prompt_ids(16, 1000, seed=8), config))
    assert CompileCounts.now().since(before) == CompileCounts()
    assert len(rows) == len(rounds) and set(rows) <= set(compiled.target.verify_widths) and 12 in rows
    assert len({len(r.tree) for r in rounds}) > 1  # trees of several shapes


def test_a_padding_row_of_a_static_mask_sees_the_prompt_and_itself():
    """Never a row that sees nothing (its NaN keys would reach later rows through masked slots)."""
    tree = torch.zeros(1, 1, 3, 5 + 3)  # 3 rows after 5 cached tokens, every key visible
    mask = static_mask(tree, 5, 6, 16)
    assert mask.shape == (1, 1, 6, 16) and (mask[0, 0, :3, :8] == 0).all() and (mask[0, 0, :3, 8:] < -1e30).all()
    for row in range(3, 6):
        assert (mask[0, 0, row, :5] == 0).all() and mask[0, 0, row, 5 + row] == 0
        assert (mask[0, 0, row] == 0).sum() == 6


@pytest.mark.skipif(not EXACT, reason="in bf16 the two kernels' logits differ by more than a draw can hide")
def test_sampled_output_on_the_compiled_steps_is_seeded_like_the_eager_one(pairs):
    """Sampling draws from the same generator in the same order: a seeded run on compiled steps repeats the eager
    run's tokens whenever the logits agree to rounding (here, always)."""
    eager, compiled = pairs
    config = DecodeConfig(k=3, max_new_tokens=30, adaptive="fixed", sampling=SamplingParams(1.0), seed=11)
    prompt = prompt_ids(10, 1000, seed=6)
    runs = [[t for r in speculative_generate(p, prompt, config) for t in r.new_token_ids] for p in (eager, compiled)]
    assert runs[0] == runs[1]


def test_a_run_longer_than_the_static_cache_is_one_sentence():
    model = with_compiled_step(synthetic_pair(None, MINI[1], device=str(TEST_DEVICE)).target, sizes=(8, 16))
    with pytest.raises(ValueError, match="more than the 16 tokens the compiled step's static cache holds"):
        prefilled(model, torch.tensor([prompt_ids(20, 1000)], device=TEST_DEVICE))
    assert MAX_LEN == max(SIZES) >= 2048 + 512 + 17  # the server's longest prompt and reply, and a round past them


class FakeMeasure:
    """Step times by role, as if measured: the draft's compiled step faster, the target's slower."""

    def __init__(self):
        self.calls = 0

    def __call__(self, eager, compiled, prompt):
        self.calls += 1
        big = eager.config.hidden_size > 64
        return StepTimes(eager_s=0.010, compiled_s=0.020 if big else 0.004, compile_s=1.0)


def as_probed(compiled, ids, wide):
    """A compiled step timed in use as fast as FakeMeasure's probe said (no real timing)."""
    return InUse(step_s=0.004, wide_s=0.006 if wide else None)


def test_auto_compiles_each_model_whose_compiled_step_measured_faster_and_remembers(tmp_path):
    loaded = synthetic_pair(*MINI, device="cpu")
    spec = PairSpec(*MINI, device="cpu", step="auto")
    measure = FakeMeasure()
    pair = with_steps(loaded, loaded, spec, probe=Probe(measure, as_probed, tmp_path))
    assert is_compiled(pair.draft) and not is_compiled(pair.target)
    assert pair.draft_name.endswith("[compiled step]") and pair.target_name == MINI[1]
    assert pair.eager_steps is loaded  # what a check in use falls back to
    assert measure.calls == 2
    again = with_steps(loaded, loaded, spec, probe=Probe(measure, as_probed, tmp_path))
    assert measure.calls == 2 and is_compiled(again.draft) and not is_compiled(again.target)  # from the cache


def steps_with(tmp_path, times: StepTimes, used: InUse, lines: list):
    """The mini pair's steps under `auto`, both models probed at `times` and timed in use at `used` (fakes)."""
    loaded = synthetic_pair(*MINI, device="cpu")
    return with_steps(loaded, loaded, PairSpec(*MINI, device="cpu", step="auto"), status=lines.append,
                      probe=Probe(lambda *a: times, lambda *a: used, tmp_path))


def test_a_compiled_step_must_win_its_probe_by_the_margin(tmp_path):
    """A 0.4 % win (the noise the Zen 4 probe chose by) keeps eager, and says so; 6 % compiles."""
    lines = []
    pair = steps_with(tmp_path / "a", StepTimes(eager_s=0.2308, compiled_s=0.2299, compile_s=30.0),
                      InUse(0.2299, 0.2), lines)
    assert not is_compiled(pair.target) and not is_compiled(pair.draft) and pair.eager_steps is None
    assert any("The target's one-token step: eager 230.8 ms, compiled 229.9 ms: it stays eager (compiling must "
               "win by more than 5%)" in line for line in lines)
    pair = steps_with(tmp_path / "b", StepTimes(eager_s=0.2308, compiled_s=0.2168, compile_s=30.0),
                      InUse(0.2168, 0.2168), lines)
    assert is_compiled(pair.target) and pair.target.step_probe.compiled_s == 0.2168


def test_the_verify_is_compiled_at_the_narrowest_widths_that_each_win(tmp_path):
    """Per width, by the same margin; a narrow width that loses stops the list (short verifies would otherwise be
    padded to a wide one); kept measurements come back the same."""
    def times(*verify):
        return StepTimes(eager_s=0.010, compiled_s=0.005, compile_s=1.0, verify=verify)

    assert times((9, 0.020, 0.012), (17, 0.030, 0.020)).verify_widths == (9, 17)
    assert times((9, 0.020, 0.012), (17, 0.030, 0.029)).verify_widths == (9,)
    assert times((9, 0.020, 0.0195), (17, 0.030, 0.010)).verify_widths == ()  # 9 lost by noise: none
    kept = times((9, 0.020, 0.012), (17, 0.030, 0.029))
    assert StepTimes.of(json.loads(json.dumps(asdict(kept)))) == kept
    lines = []
    pair = steps_with(tmp_path, kept, InUse(0.005, 0.006), lines)
    assert pair.target.verify_widths == (9,) and pair.draft.verify_widths == ()
    assert any(line.startswith("The target's verify runs compiled at 9 tokens (9 tokens: eager 20.0 ms, compiled "
                               "12.0 ms; 17 tokens: eager 30.0 ms, compiled 29.0 ms)") for line in lines)


def test_the_probe_times_the_verify_only_beside_a_step_that_won(monkeypatch):
    """A first start on a CPU, where the compiled step loses, compiles no verify graph at all."""
    from specviz.models import step_timing

    eager, compiled = SimpleNamespace(name="eager"), SimpleNamespace(name="compiled", verify_widths=(9, 17))
    widths = []
    monkeypatch.setattr(step_timing, "wide_forward", lambda model, ids, n: widths.append((model.name, n)) or
                        (0.02 if model.name == "eager" else 0.01))
    for compiled_s, measured in ((0.0099, []), (0.005, [("eager", 9), ("compiled", 9), ("eager", 17),
                                                       ("compiled", 17)])):
        widths.clear()
        times = step_timing.measure_step(eager, compiled, [[1, 2]],
                                         timer=lambda m, ids, **kw: 0.010 if m.name == "eager" else compiled_s)
        assert widths == measured and times.verify_widths == ((9, 17) if measured else ())


def test_a_compiled_step_that_does_not_hold_in_use_is_dropped_at_load_in_one_sentence(tmp_path):
    """Won its probe by 6 %, but as a run uses it: slower than eager (the 318.7 ms the bench met), or slower than a
    2-token forward (T(2)/T1 0.86): either way the pair keeps its eager steps and says why."""
    probe = StepTimes(eager_s=0.2308, compiled_s=0.2168, compile_s=30.0)
    for used, why in ((InUse(0.3187, 0.28), "in use it took 318.7 ms a token against 230.8 ms eager (its probe: "
                                            "216.8 ms)"),
                      (InUse(0.2168, 0.1865), "a 2-token forward (186.5 ms) cost less than its one-token step "
                                              "(216.8 ms)")):
        lines = []
        pair = steps_with(tmp_path / str(used.step_s), probe, used, lines)
        assert not is_compiled(pair.target) and not is_compiled(pair.draft)
        dropped = [line for line in lines if "won its probe" in line]
        assert len(dropped) == 2 and why in dropped[1] and dropped[1].endswith("it runs eager.")


def test_a_compiled_target_slower_in_a_run_than_its_probe_falls_back_to_eager(tmp_path):
    """The check in use after a run: the target alone's median step against the probe's eager step."""
    lines = []
    pair = steps_with(tmp_path, StepTimes(eager_s=0.2308, compiled_s=0.2168, compile_s=30.0), InUse(0.2168, 0.22),
                      lines)
    same, note = checked_in_use(pair, 0.2300)  # (a run's step pays for sampling too: no margin in use)
    assert same is pair and note is None
    back, note = checked_in_use(pair, 0.245)
    assert not is_compiled(back.target) and back.target is pair.eager_steps.target
    assert is_compiled(back.draft) is is_compiled(pair.draft)  # only the target's step was measured in use
    assert note.count(". ") == 0 and "did not hold in this run (in use it took 245.0 ms a token against 230.8 ms " \
        "eager" in note and note.endswith("the target runs eager from now on.")
    session = Session(pair)
    slow = [SimpleNamespace(time=t) for t in (0.25, 0.24, 0.26) * 3]
    assert session.check_steps(pair, slow[:7]) is None and session.check_steps(pair, slow, shared_cpu=True) is None
    assert is_compiled(session.pair.target)  # too short, or shared: not judged
    assert session.check_steps(pair, slow) == checked_in_use(pair, 0.25)[1]
    assert not is_compiled(session.pair.target)
    assert session.check_steps(session.pair, slow) is None  # eager now: nothing to drop


def test_eager_and_compiled_are_taken_as_asked(tmp_path):
    loaded = synthetic_pair(*MINI, device="cpu")
    measure = FakeMeasure()
    eager = with_steps(loaded, loaded, PairSpec(*MINI, step="eager"), probe=Probe(measure, folder=tmp_path))
    assert eager is loaded
    both = with_steps(loaded, loaded, PairSpec(*MINI, step="compiled"), probe=Probe(measure, folder=tmp_path))
    assert is_compiled(both.draft) and is_compiled(both.target) and measure.calls == 0


def test_a_quantized_target_is_not_compiled():
    spec = PairSpec("tiny", "tiny", draft_quant="none", target_quant="int8", step="compiled")
    with pytest.raises(ModelLoadError, match="--step eager or --target-quant none"):
        load_spec(spec, loader=lambda *a, **k: tiny_pair())


class ForeignCache:
    """A compile that fails while torch's compile caches are read (code another process cached, for vector
    instructions this one's check did not find) and works with them off: FakeMeasure's times, once they are off."""

    def __init__(self):
        self.tries = []

    def __call__(self, *args):
        self.tries.append(torch.compiler.config.force_disable_caches)
        if not self.tries[-1]:
            raise RuntimeError("backend='inductor' raised:\nCppCompileError: C++ compile error\n(pages)")
        return FakeMeasure()(*args)


@torch.compiler.config.patch(force_disable_caches=False)  # (and put back after: the retry turns them off)
def test_a_compile_failed_by_torchs_cache_is_compiled_again_without_it(tmp_path, monkeypatch):
    """The probe's compile fails with torch's caches and is tried once more without them: the draft's step is
    measured and compiled as it would have been, the sentence names the cache's folder, and the caches stay off for
    the process (a width compiled later meets the same entry). --step compiled is tried again the same way."""
    loaded = synthetic_pair(*MINI, device="cpu")
    measure, lines = ForeignCache(), []
    pair = with_steps(loaded, loaded, PairSpec(*MINI, step="auto"), status=lines.append,
                      probe=Probe(measure, as_probed, tmp_path))
    assert is_compiled(pair.draft) and not is_compiled(pair.target)  # FakeMeasure's verdicts: the draft's won
    assert measure.tries == [False, True, True]  # once more for the draft, then the caches stayed off
    assert torch.compiler.config.force_disable_caches
    said = [line for line in lines if "succeeded without them" in line]
    assert len(said) == 1 and "(BackendCompilerFailed" not in said[0] and "raised: CppCompileError" in said[0]
    assert str(inductor_cache()) in said[0]

    torch.compiler.config.force_disable_caches = False
    timed = []

    def step_timed(*args, **kwargs):
        timed.append(torch.compiler.config.force_disable_caches)
        if not timed[-1]:
            raise RuntimeError("a bad cache entry")

    monkeypatch.setattr("specviz.models.steps.time_step", step_timed)
    lines.clear()
    both = with_steps(loaded, loaded, PairSpec(*MINI, step="compiled"), status=lines.append,
                      probe=Probe(folder=tmp_path))
    assert is_compiled(both.draft) and is_compiled(both.target) and timed == [False, True, True]
    assert [line for line in lines if "succeeded without them" in line][0].startswith("The draft: compiling failed")


def test_a_step_that_cannot_compile_here_runs_eager_under_auto_and_is_one_sentence_when_asked_for(tmp_path,
                                                                                                   monkeypatch):
    """Compiling needs a working compiler toolchain (Triton needs a C compiler); without one, auto keeps the eager
    step and says why, and --step compiled refuses at load, in one sentence, rather than failing mid-run."""
    loaded = synthetic_pair(*MINI, device="cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.\n(pages)")

    lines = []
    pair = with_steps(loaded, loaded, PairSpec(*MINI, step="auto"), status=lines.append,
                      probe=Probe(broken, folder=tmp_path))
    assert not is_compiled(pair.draft) and not is_compiled(pair.target)
    assert any("cannot be compiled here (RuntimeError: Failed to find C compiler" in line for line in lines), lines
    assert not list(tmp_path.glob("**/step-*.json"))  # nothing kept: the next start tries again
    monkeypatch.setattr("specviz.models.steps.time_step", broken)
    with pytest.raises(ModelLoadError, match="could not be compiled here .*use --step eager or auto"):
        with_steps(loaded, loaded, PairSpec(*MINI, step="compiled"), probe=Probe(folder=tmp_path))
