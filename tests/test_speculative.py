"""The round loop: greedy output identical to plain decoding, consistent events, seeds, and the edges
(end-of-sequence from the draft or as a correction, max_new_tokens, one-token prompts, stop requests).

Edges that need an end-of-sequence at a chosen place use `BigramLM`: a stand-in with the call
signature the engine uses for Hugging Face causal LMs, whose next-token logits depend only on the
last token, so the test decides exactly what each model wants to say.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import PretrainedConfig

from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.analysis.divergence import first_divergence, spec_gap_at
from specviz.compat import cache_keyword
from specviz.engine.speculative import cut_once
from specviz.engine.events import ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED
from specviz.models.pair import ModelPair
from specviz.models.tiny import EOS_ID, tiny_pair, tiny_tokenizer

from helpers import TEST_DEVICE, check_rounds, deprecations_said, same_greedy, spec_tokens

PROMPTS = ["the a of", "she said that", "one", "it was the", "we"]  # "one" ends with an EOS from the target
KS = [1, 2, 4, 8]
GREEDY = SamplingParams(0.0)
SAMPLED = SamplingParams(1.0)


def encode(pair, prompt: str) -> list[int]:
    return pair.tokenizer(prompt)["input_ids"]


def ar_tokens(pair, ids, config: DecodeConfig) -> list[int]:
    return [s.token.id for s in autoregressive_generate(pair, ids, config)]


def without_times(rounds) -> list[dict]:
    return [{k: v for k, v in r.to_dict().items() if not k.endswith("_time")} for r in rounds]


@pytest.fixture(scope="module")
def ar_greedy(tiny):
    """The target alone's greedy steps for each prompt."""
    config = DecodeConfig(max_new_tokens=24, sampling=GREEDY)
    return {p: list(autoregressive_generate(tiny, encode(tiny, p), config)) for p in PROMPTS}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_autoregressive(tiny, ar_greedy, prompt, k):
    config = DecodeConfig(k=k, max_new_tokens=24, sampling=GREEDY)
    rounds = list(speculative_generate(tiny, encode(tiny, prompt), config))
    assert same_greedy(spec_tokens(rounds), ar_greedy[prompt])
    check_rounds(tiny, rounds, config)


def test_the_tiny_pair_exercises_both_acceptance_and_rejection(tiny):
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=GREEDY, adaptive="fixed")
    rounds = [r for p in PROMPTS for r in speculative_generate(tiny, encode(tiny, p), config)]
    statuses = {d.status for r in rounds for d in r.drafted}
    kinds = {r.emitted.kind for r in rounds if r.emitted}
    assert statuses == {ACCEPTED, REJECTED, NOT_VERIFIED} and kinds == {CORRECTION, BONUS}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("drafter", ["lookup", "hybrid"])
def test_greedy_exact_with_model_free_drafters(tiny, ar_greedy, drafter, k):
    config = DecodeConfig(k=k, max_new_tokens=24, sampling=GREEDY, drafter=drafter)
    for prompt in PROMPTS:
        rounds = list(speculative_generate(tiny, encode(tiny, prompt), config))
        assert same_greedy(spec_tokens(rounds), ar_greedy[prompt]), prompt
        assert {r.drafter for r in rounds} == {drafter}
        check_rounds(tiny, rounds, config)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("adaptive", ["confidence", "acceptance"])
def test_greedy_exact_with_adaptive_k(tiny, ar_greedy, adaptive, k):
    config = DecodeConfig(k=k, max_new_tokens=24, sampling=GREEDY, adaptive=adaptive, confidence=0.1)
    ks = []
    for prompt in PROMPTS:
        rounds = list(speculative_generate(tiny, encode(tiny, prompt), config))
        assert same_greedy(spec_tokens(rounds), ar_greedy[prompt]), prompt
        check_rounds(tiny, rounds, config)
        ks += [r.k for r in rounds[:-1]]  # the last round may be cut by max_new_tokens
    if k > 1:
        assert len(set(ks)) > 1  # K really adapts


@pytest.mark.parametrize("draft_vocab", [80, 128])
def test_draft_with_a_different_vocabulary_size(draft_vocab):
    """A draft padded larger (it may propose ids the target lacks: never accepted) or smaller
    (the output may hold ids the draft cannot embed)."""
    pair = tiny_pair(draft_vocab=draft_vocab)
    target_vocab = pair.target.config.vocab_size
    assert pair.vocab_size == max(draft_vocab, target_vocab)
    drafted_outside = 0
    for prompt in PROMPTS:
        ids = encode(pair, prompt)
        for k in (1, 4):
            config = DecodeConfig(k=k, max_new_tokens=24, sampling=GREEDY)
            rounds = list(speculative_generate(pair, ids, config))
            assert spec_tokens(rounds) == ar_tokens(pair, ids, config)
            check_rounds(pair, rounds, config)
        config = DecodeConfig(k=4, max_new_tokens=24, sampling=SAMPLED, seed=1)
        rounds = list(speculative_generate(pair, ids, config))
        check_rounds(pair, rounds, config)
        assert all(t < target_vocab for t in spec_tokens(rounds))
        drafted_outside += sum(d.id >= target_vocab for r in rounds for d in r.drafted)
        assert all(d.status != ACCEPTED for r in rounds for d in r.drafted if d.id >= target_vocab)
    if draft_vocab > target_vocab:
        assert drafted_outside > 0  # the path was exercised


# --- events under sampling, seeds -------------------------------------------------------------


@pytest.mark.parametrize("sampling", [SAMPLED, SamplingParams(0.8, 20, 0.9)])
def test_sampled_rounds_are_consistent(tiny, sampling):
    for prompt in PROMPTS:
        for k in (1, 3, 8):
            config = DecodeConfig(k=k, max_new_tokens=20, sampling=sampling, seed=k)
            check_rounds(tiny, list(speculative_generate(tiny, encode(tiny, prompt), config)), config)


def test_the_same_seed_gives_the_same_run(tiny):
    ids = encode(tiny, "the a of")
    runs = [list(speculative_generate(tiny, ids, DecodeConfig(k=4, max_new_tokens=30, sampling=SAMPLED, seed=s)))
            for s in (5, 5, 6)]
    assert without_times(runs[0]) == without_times(runs[1])  # tokens, u values, accept/reject decisions
    assert spec_tokens(runs[0]) != spec_tokens(runs[2])
    assert [d.u for r in runs[0] for d in r.drafted] != [d.u for r in runs[2] for d in r.drafted]
    steps = [[s.token.id for s in autoregressive_generate(tiny, ids, DecodeConfig(max_new_tokens=30, sampling=SAMPLED,
                                                                                 seed=s))] for s in (5, 5, 6)]
    assert steps[0] == steps[1] != steps[2]


def test_a_shared_prompt_cache_reads_the_prompt_once_and_changes_nothing(tiny):
    from specviz.engine.plumbing import PromptCache

    ids = encode(tiny, "the a of")
    cache = PromptCache()
    for s in (5, 6, 7):  # each run crops its own copy: a later run must not see an earlier one's tokens
        config = DecodeConfig(k=4, max_new_tokens=20, sampling=SAMPLED, seed=s)
        fresh, shared = [list(speculative_generate(tiny, ids, config, prompt_cache=c)) for c in (None, cache)]
        assert without_times(fresh) == without_times(shared)
        ar = [[st.token.id for st in autoregressive_generate(tiny, ids, config, prompt_cache=c)] for c in (None, cache)]
        assert ar[0] == ar[1]
    assert len(cache.saved) == 2  # the prompt, read once by the target and once by the draft
    assert all(c.get_seq_length() == len(ids) - 1 for c in cache.saved.values())


# --- the caches: one target forward per round, the prefix never recomputed ----------------------


class Recording(torch.nn.Module):
    """Wraps a model and records (cache length before the call, tokens fed) for each forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.calls = inner, inner.config, []

    def forward(self, input_ids, cache=None, **kw):
        self.calls.append((cache.get_seq_length(), input_ids.shape[1]))
        return self.inner(input_ids, **{cache_keyword(self.inner): cache}, **kw)


def may_draft(config: DecodeConfig, r) -> int:
    """The drafts round `r` may make: K, or fewer near the end of the run."""
    return min(config.k, config.max_new_tokens - r.position - 1)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
def test_each_round_feeds_only_new_tokens(tiny, sampling):
    pair = replace(tiny, target=Recording(tiny.target), draft=Recording(tiny.draft))
    ids = encode(pair, "she said that")
    config = DecodeConfig(k=4, max_new_tokens=30, sampling=sampling)
    rounds = list(speculative_generate(pair, ids, config))
    prompt_read, *per_round = pair.target.calls
    assert prompt_read == (0, len(ids) - 1)  # the prefill: the prompt but its last token, once
    assert len(per_round) == len(rounds)  # then ONE target forward per round
    for r, (cached, fed) in zip(rounds, per_round):
        context = len(ids) + r.position  # tokens committed before this round
        # the cache holds all but the last committed token; that one and the drafts are new
        assert (cached, fed) == (context - 1, 1 + r.k)
    draft_prefill, *fed_to_draft = [fed for cached, fed in pair.draft.calls]
    assert draft_prefill == len(ids) - 1 and max(fed_to_draft) <= 2  # x_K and the bonus, at most
    # one draft forward per drafted token: all a round may draft where the cut is read once a round (a GPU)
    drafted = [may_draft(config, r) if cut_once(tiny.device) else r.k for r in rounds]
    assert sum(drafted) == len(fed_to_draft)


def test_prefill_is_timed_apart_on_the_first_event_only(tiny):
    ids = encode(tiny, "she said that")
    config = DecodeConfig(k=4, max_new_tokens=12, sampling=SAMPLED, adaptive="fixed")
    rounds = list(speculative_generate(tiny, ids, config))
    steps = list(autoregressive_generate(tiny, ids, config))
    for events in (rounds, steps):
        assert events[0].prefill_time > 0 and all(e.prefill_time == 0 for e in events[1:])
    pair = replace(tiny, target=Recording(tiny.target))
    first = next(speculative_generate(pair, [5], config))  # a one-token prompt: nothing to read ahead
    assert pair.target.calls[0] == (0, 1 + first.k)  # its first forward is the first round's verify


# --- host syncs: one transfer per round or step, nothing hidden ---------------------------------


class SyncCounter(TorchDispatchMode):
    """Counts tensor -> Python scalar reads, each a host sync on a GPU: .item(), int(t), float(t) and
    indexing with a 0-d tensor all dispatch to _local_scalar_dense (to `item` under inference_mode)."""

    SYNCS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.SYNCS
        return func(*args, **(kwargs or {}))


def syncs_per_event(events) -> tuple[list, list[int]]:
    """Run a decoder to its end; the syncs each of its events (rounds or steps) cost."""
    out, counts = [], []
    with SyncCounter() as counter:
        for event in events:  # the decoder runs inside the mode, one event per next()
            out.append(event)
            counts.append(counter.count)
            counter.count = 0
    return out, counts


def test_the_sync_counter_sees_item_and_zero_d_indexing():
    x, i = torch.arange(4.0), torch.tensor(2)
    with SyncCounter() as counter:
        x[i], x[1].item(), int(i), x.tolist()
    assert counter.count == 3  # tolist reads the host copy directly: no per-element dispatch


@pytest.mark.parametrize("drafter", ["model", "lookup", "hybrid", "self"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
def test_a_round_never_syncs_outside_its_one_transfer(tiny, drafter, sampling):
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=sampling, drafter=drafter, adaptive="fixed",
                          exit_layer=1)  # 'self': the first of the tiny target's two layers
    rounds, counts = syncs_per_event(speculative_generate(tiny, encode(tiny, "the a of"), config))
    assert len(rounds) > 1 and counts == [0] * len(rounds)
    steps, counts = syncs_per_event(autoregressive_generate(tiny, encode(tiny, "the a of"), config))
    assert len(steps) > 1 and counts == [0] * len(steps)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
def test_the_confidence_cut_syncs_once_per_token_that_may_have_a_successor(tiny, sampling):
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=sampling, adaptive="confidence", confidence=0.1)
    rounds, counts = syncs_per_event(speculative_generate(tiny, encode(tiny, "the a of"), config))
    may = [may_draft(config, r) for r in rounds]
    cut = [r.k < m for r, m in zip(rounds, may)]
    assert set(cut) == {True, False}  # rounds the cut stopped, and rounds that drafted all they could
    if cut_once(tiny.device):  # all K drafted, then the round's one host copy (`tolist`, not a per-value read)
        assert counts == [0] * len(rounds)
    else:  # the cut is checked after every drafted token except the last one a round may draft
        assert counts == [r.k if c else max(m - 1, 0) for r, c, m in zip(rounds, cut, may)]


# --- edges: end of sequence, lengths, tiny prompts, stop requests -------------------------------


V = len(tiny_tokenizer().get_vocab())


class BigramLM(torch.nn.Module):
    """Next-token logits = table[last token]; keeps a real DynamicCache so cropping is exercised. It takes the cache
    by its name before transformers 5.24 (`past_key_values`): the engine passes a model the name it takes."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table, self.config = table, PretrainedConfig(vocab_size=table.shape[1])

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        n = input_ids.shape[1]
        if past_key_values is not None:
            dummy = torch.zeros(1, 1, n, 1)
            past_key_values.update(dummy, dummy, 0)
        logits = self.table[input_ids]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def chain(successor: dict[int, int], default: int = 40) -> torch.Tensor:
    """Logits that make `successor[t]` (else `default`) the clear favourite after token t."""
    table = torch.zeros(V, V)
    table[:, default] = 5.0
    for t, nxt in successor.items():
        table[t] = 0.0
        table[t, nxt] = 5.0
    return table


def scripted_pair(target: dict[int, int], draft: dict[int, int]) -> ModelPair:
    return ModelPair(draft=BigramLM(chain(draft)), target=BigramLM(chain(target)), tokenizer=tiny_tokenizer(),
                     device=torch.device("cpu"), dtype=torch.float32, eos_token_ids=frozenset({EOS_ID}))


TARGET = {5: 6, 6: 7, 7: EOS_ID, EOS_ID: 8, 8: 9}  # after the prompt [5]: 6 7 <eos>


def run(pair, k, max_new_tokens=20, prompt=(5,), **kw):
    config = DecodeConfig(k=k, max_new_tokens=max_new_tokens, sampling=GREEDY, **kw)
    rounds = list(speculative_generate(pair, list(prompt), config))
    check_rounds(pair, rounds, config)
    return rounds


def test_eos_drafted_and_accepted_ends_the_output_there():
    rounds = run(scripted_pair(TARGET, TARGET), k=4)  # the draft goes on past <eos>: 6 7 <eos> 8
    assert len(rounds) == 1 and spec_tokens(rounds) == [6, 7, EOS_ID] == ar_tokens(
        scripted_pair(TARGET, TARGET), [5], DecodeConfig(max_new_tokens=20))
    r = rounds[0]
    assert [d.status for d in r.drafted] == [ACCEPTED] * 3 + [NOT_VERIFIED]
    assert r.emitted is None and r.finished == "eos" and r.n_accepted == 3


def test_eos_accepted_before_a_rejection_leaves_nothing_rejected():
    """The rule accepts 6 7 <eos> and rejects the 4th draft, but the output already ended at <eos>."""
    rounds = run(scripted_pair(TARGET, {**TARGET, EOS_ID: 30}), k=4)
    assert spec_tokens(rounds) == [6, 7, EOS_ID]
    assert [d.status for d in rounds[0].drafted] == [ACCEPTED] * 3 + [NOT_VERIFIED]
    assert rounds[0].emitted is None


def test_eos_as_the_correction():
    rounds = run(scripted_pair(TARGET, {**TARGET, 7: 30}), k=4)  # the draft says 30 where the target ends
    assert spec_tokens(rounds) == [6, 7, EOS_ID]
    r = rounds[-1]
    assert [d.status for d in r.drafted] == [ACCEPTED, ACCEPTED, REJECTED, NOT_VERIFIED]
    assert r.emitted.kind == CORRECTION and r.emitted.id == EOS_ID and r.finished == "eos"


def test_eos_as_the_bonus():
    rounds = run(scripted_pair(TARGET, TARGET), k=2)
    assert spec_tokens(rounds) == [6, 7, EOS_ID]
    assert rounds[0].emitted.kind == BONUS and rounds[0].emitted.id == EOS_ID and rounds[0].finished == "eos"


@pytest.mark.parametrize("k", [1, 3])
def test_eos_as_the_first_token(k):
    rounds = run(scripted_pair(TARGET, TARGET), k=k, prompt=(7,))
    assert spec_tokens(rounds) == [EOS_ID] and rounds[0].finished == "eos"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 4, 7, 10])
def test_max_new_tokens_is_exact(tiny, k, max_new_tokens):
    ids = encode(tiny, "the a of")  # no end-of-sequence in its first 24 greedy tokens
    for sampling in (GREEDY, SAMPLED):
        config = DecodeConfig(k=k, max_new_tokens=max_new_tokens, sampling=sampling)
        rounds = list(speculative_generate(tiny, ids, config))
        check_rounds(tiny, rounds, config)
        tokens = spec_tokens(rounds)
        assert len(tokens) == max_new_tokens or rounds[-1].finished == "eos"
        if sampling.greedy:
            assert tokens == ar_tokens(tiny, ids, config)
            assert rounds[-1].finished == "length"


def test_max_new_tokens_with_a_draft_that_is_always_right():
    pair = scripted_pair(TARGET, TARGET)
    for k in (1, 2, 5, 9):
        for max_new in (1, 2, 3):
            rounds = run(pair, k=k, max_new_tokens=max_new)
            assert spec_tokens(rounds) == [6, 7, EOS_ID][:max_new]


@pytest.mark.parametrize("k", KS)
def test_prompt_of_one_token(tiny, k):
    ids = encode(tiny, "we")
    assert len(ids) == 1
    config = DecodeConfig(k=k, max_new_tokens=16, sampling=GREEDY)
    rounds = list(speculative_generate(tiny, ids, config))
    assert spec_tokens(rounds) == ar_tokens(tiny, ids, config)
    check_rounds(tiny, rounds, config)


def test_a_stop_request_ends_the_run():
    calls = []

    def should_stop():
        calls.append(1)
        return "stopped" if len(calls) >= 2 else None

    pair = scripted_pair({}, {})  # no end-of-sequence anywhere
    config = DecodeConfig(k=3, max_new_tokens=50, sampling=GREEDY)
    rounds = list(speculative_generate(pair, [5], config, should_stop=should_stop))
    assert len(rounds) == 2 and rounds[-1].finished == "stopped" and rounds[0].finished is None
    assert spec_tokens(rounds) == [40] * 8  # two clean sweeps of 3 drafts + bonus
    calls.clear()
    steps = list(autoregressive_generate(pair, [5], config, should_stop=should_stop))
    assert len(steps) == 2 and steps[-1].finished == "stopped"


# --- near-ties: every token carries the target's top-2 gap; where two runs part ways ------------


@pytest.fixture(scope="module")
def greedy_runs(tiny):
    ids = encode(tiny, "she said that")
    config = DecodeConfig(k=4, max_new_tokens=24, sampling=GREEDY)
    return ids, list(speculative_generate(tiny, ids, config)), list(autoregressive_generate(tiny, ids, config))


def test_top2_gaps_sit_at_the_right_positions(tiny, greedy_runs):
    ids, rounds, steps = greedy_runs
    assert spec_tokens(rounds) == [s.token.id for s in steps]
    for i, step in enumerate(steps):  # the verify forward saw the same logits as the one-token step
        assert spec_gap_at(rounds, i) == pytest.approx(step.token.target_top2_gap, abs=1e-4)
    with torch.inference_mode():
        top2 = tiny.target(torch.tensor([ids], device=tiny.device)).logits[0, -1].topk(2).values
    assert steps[0].token.target_top2_gap == pytest.approx(float(top2[0] - top2[1]), abs=1e-5)


def test_no_divergence_when_the_runs_agree(greedy_runs):
    _, rounds, steps = greedy_runs
    assert first_divergence(rounds, steps) is None


@pytest.mark.parametrize("position", [0, 5, 23])
def test_first_divergence_reports_the_position_and_both_gaps(greedy_runs, position):
    _, rounds, steps = greedy_runs
    altered = copy.deepcopy(steps)
    altered[position].token.id = (altered[position].token.id + 1) % V
    d = first_divergence(rounds, altered)
    assert d.position == position
    assert d.target_top2_gap == steps[position].token.target_top2_gap
    assert d.spec_top2_gap == spec_gap_at(rounds, position)


def test_a_run_that_stops_early_diverges_where_it_stopped(greedy_runs):
    _, rounds, steps = greedy_runs
    d = first_divergence(rounds[:2], steps)
    assert d.position == sum(r.tokens_emitted for r in rounds[:2]) and d.spec_top2_gap is None
    assert d.target_top2_gap == steps[d.position].token.target_top2_gap
    d = first_divergence(rounds, steps[:3])
    assert d.position == 3 and d.target_top2_gap is None  # past the AR run's end (compare.py, c0c5bb5)


# --- a robust verify step -----------------------------------------------------------------------


def test_greedy_draws_no_random_numbers(tiny, ar_greedy, monkeypatch):
    def no_draws(*args, **kwargs):
        raise AssertionError("greedy decoding drew a random number")

    monkeypatch.setattr(torch, "rand", no_draws)
    ids = encode(tiny, PROMPTS[0])
    for drafter in ("model", "lookup", "hybrid"):
        config = DecodeConfig(k=4, max_new_tokens=24, sampling=GREEDY, drafter=drafter)
        rounds = list(speculative_generate(tiny, ids, config))
        assert same_greedy(spec_tokens(rounds), ar_greedy[PROMPTS[0]])
        assert all(d.u == 0.0 for r in rounds for d in r.drafted)
    alone = [s.token.id for s in ar_greedy[PROMPTS[0]]]
    assert ar_tokens(tiny, ids, DecodeConfig(max_new_tokens=24, sampling=GREEDY)) == alone


class KeepsEveryRow(torch.nn.Module):
    """A model (or wrapper) that ignores logits_to_keep and returns a row per input token."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0):
        return self.model(input_ids, **{cache_keyword(self.model): cache}, use_cache=use_cache, logits_to_keep=0)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
def test_a_target_that_ignores_logits_to_keep_decodes_the_same(tiny, sampling):
    ids = encode(tiny, PROMPTS[2])
    config = DecodeConfig(k=4, max_new_tokens=16, sampling=sampling, adaptive="fixed")
    wrapped = replace(tiny, target=KeepsEveryRow(tiny.target))
    assert without_times(speculative_generate(wrapped, ids, config)) == without_times(
        speculative_generate(tiny, ids, config))
    assert ar_tokens(wrapped, ids, config) == ar_tokens(tiny, ids, config)


def test_a_drafter_whose_q_gives_its_token_no_mass_is_refused(tiny):
    from specviz.engine.drafters import Draft
    from specviz.engine.speculative import DrafterError

    class Lying:
        name = "lying"

        def prefill(self, ids, room=0):
            pass

        def propose(self, ids, history, k):
            q = torch.zeros(1, tiny.vocab_size, device=tiny.device)
            q[0, 3] = 1.0  # claims to have sampled from a point mass on 3...
            return Draft(torch.tensor([4], device=tiny.device), q, q.log())  # ...yet proposes 4

        def rollback(self, keep):
            pass

    config = DecodeConfig(k=1, max_new_tokens=4, sampling=SAMPLED)
    with pytest.raises(DrafterError, match="no probability"):
        list(speculative_generate(tiny, encode(tiny, PROMPTS[0]), config, drafter=Lying()))


def test_a_rounds_phases_add_up_to_its_wall_time_and_each_is_the_time_between_its_marks():
    """`Phases` (CUDA events on a GPU, the host clock here): the round's draft, verify and overhead times."""
    import time

    from specviz.engine.plumbing import Phases

    phases = Phases(TEST_DEVICE)  # (on an idle GPU an event is reached as soon as it is recorded)
    t0 = time.perf_counter()
    phases.mark()
    for pause in (0.2, 0.0, 0.3):  # pauses far apart: a busy machine's preemption (ms) cannot blur them
        time.sleep(pause)
        phases.mark()
    wall = time.perf_counter() - t0
    spans = phases.seconds()
    assert len(spans) == 3 and spans[1] < 0.1
    assert spans[0] >= 0.2 and spans[2] >= 0.3 and sum(spans) <= wall


def test_every_round_reports_its_phases(tiny):
    rounds = list(speculative_generate(tiny, [5, 6, 7], DecodeConfig(k=3, max_new_tokens=12, adaptive="fixed")))
    assert all(r.draft_time > 0 and r.verify_time > 0 and r.overhead_time > 0 for r in rounds)


@pytest.mark.parametrize("drafter", ["model", "hybrid", "self", "tree", "lookup"])
def test_a_decode_calls_the_models_as_the_installed_transformers_asks(tiny, drafter):
    """No deprecation said while decoding (transformers 5.24 warns on every forward given `past_key_values`, the
    name 5.17 to 5.23 still need: the engine passes each model the name its forward takes), in the round loop of
    each drafter, the target alone, and the proof's exact distributions."""
    from specviz.engine.exact import path_distributions
    from specviz.engine.plumbing import PromptCache

    ids = encode(tiny, PROMPTS[0])
    config = DecodeConfig(k=3, max_new_tokens=10, sampling=SAMPLED, drafter=drafter, exit_layer=1)
    with deprecations_said() as said:
        rounds = list(speculative_generate(tiny, ids, config))
        ar_tokens(tiny, ids, config)
        path_distributions(tiny, ids, [spec_tokens(rounds)[:3]], SAMPLED, PromptCache())
    assert rounds and said == []


def test_a_run_verifies_with_the_rule_it_names(tiny):
    """`Rule`: the exact rule unless a run names another; a named control (the proof's always-accept) runs in its
    chain form with a chain drafter and its tree form with the tree drafter, and keeps every draft in both; a bare
    chain rule (a function shaped as `rules.verify`) runs a chain and is refused by a tree run, in one sentence."""
    from specviz.engine.rules import verify
    from specviz.engine.speculative import EXACT, Rule
    from specviz.runs.proof import ALWAYS_ACCEPT

    ids = encode(tiny, PROMPTS[0])
    for drafter in ("model", "tree"):
        config = DecodeConfig(k=4, max_new_tokens=16, sampling=SAMPLED, drafter=drafter, adaptive="fixed", seed=3)
        exact = without_times(speculative_generate(tiny, ids, config))
        assert without_times(speculative_generate(tiny, ids, config, rule=EXACT)) == exact
        kept = list(speculative_generate(tiny, ids, config, rule=ALWAYS_ACCEPT))
        assert all(r.n_accepted == r.k or r.finished == "eos" for r in kept)
        assert without_times(kept) != exact  # (the exact rule rejects some of these drafts)
    chain = DecodeConfig(k=4, max_new_tokens=16, sampling=SAMPLED, adaptive="fixed", seed=3)
    chain_only = Rule("chain only", verify)  # the exact chain rule with no tree form
    assert without_times(speculative_generate(tiny, ids, chain, rule=chain_only)) == without_times(
        speculative_generate(tiny, ids, chain))
    with pytest.raises(ValueError, match="'chain only' rule has no tree form"):
        next(speculative_generate(tiny, ids, replace(chain, drafter="tree"), rule=chain_only))
