"""Statistical exactness: speculative sampling draws the first 3 tokens from the target's own distribution.

The pair. A purpose-built minimal causal LM (`causal_lm.py`: one attention layer with a real KV cache,
width 32) with a 16-token vocabulary (ids 0..15 of the tiny tokenizer, id 0 = <eos>): its next-token
distributions are spread enough that every branch of the rule is taken (acceptance about 0.71, <eos>
about 4% at the first position), yet concentrated enough that 20,000 samples pin them down (the expected
total-variation distance of 20,000 perfect samples is about 0.01). The draft is the target with noise on
its weights, far enough from it (TV about 0.29) for the always-accept control to stand out.

The exact distribution. Categories are the 16 ids plus END (the output stopped at an earlier
<eos>). With P_t(. | x_<t) the target's warped next-token distribution computed by one plain forward
over prompt + prefix for EVERY prefix of length 0, 1, 2 (1 + 16 + 256 prefixes, batched):
    P(x1) = P_1(x1)
    P(x1, x2) = P(x1) * P_2(x2 | x1)                  for x1 != <eos>;  x2 = END if x1 = <eos>
    P(x1, x2, x3) = P(x1, x2) * P_3(x3 | x1, x2)      for x1, x2 != <eos>; END after an <eos>
Summing the joint gives the exact marginal of each position. This is the distribution plain
autoregressive decoding of the target samples from (same warps, same stop rule).

The samplers.
- `simulate`: 20,000 runs of the engine's rule (`specviz.engine.rules.verify`, the function the
  round loop calls) with K = 2 and max_new_tokens = 3, using the tables above as the models: draft
  tokens are drawn with `sample` from the draft's exact table rows, p rows come from the target's.
  This is the engine's decision logic at full sample size without 60,000 model forwards.
- `end_to_end`: `speculative_generate` itself (real KV caches, cropping, events), one seed per run:
  8,000 runs at temperature 1 (TV < 0.03: 8,000 perfect samples score about 0.016); 3,000 with warps,
  and 3,000 with the hybrid drafter (prompt lookup's point-mass drafts), each with looser bounds
  (TV < 0.05, p > 0.001).
- another family: `speculative_generate` with a draft whose vocabulary holds 12 of the 16 ids, in other
  ids, and 2 tokens of its own (the target re-indexed, with noise: `helpers.other_family`), its q mapped into
  the target's ids: 2,000 runs (TV < 0.05, p > 0.001).
- self-speculation: `speculative_generate` with the 'self' drafter (the target's first layer of three
  drafts for it) on a target-only pair. `CausalLM` has no decoder layers to exit early from, so this
  pair is a 3-layer tiny Qwen2 on the same 16 ids: 1,000 runs (p > 0.001, TV under the bound 1,000 perfect
  samples stay under 999 times in 1,000, drawn by `tv_bound`).
- trees (3,000 runs) and int4 / int8 targets (3,000 runs each), the same way.
Each is compared with the exact marginals by a chi-square test (bins with expected count < 5
pooled) and the total-variation distance; a sequence the target cannot produce rejects outright.
Every configuration has a negative control: its statistic and verdict (`consistent`), with the rule patched to
accept every draft (for trees: the known trap of treating the draft's top candidates as sampled): the verdict must
fail, and by a margin no correct sampler reaches at any size (`detected`). A control runs fewer runs than its test,
each sized to what `detected` needs: the fewest (in round numbers) at which it misses the control at most once in
10,000 tries (power >= 0.9999, computed from the control's own output distribution, estimated from 3,000-8,000
runs on other seeds; the numbers beside each size). A fixed error's chi-square grows with the runs, so what the
control detects, the test's own runs detect. `test_mutants.py` shows subtler bugs of the rule and of the round
loops caught by the same statistics.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from causal_lm import CausalLM
from helpers import TEST_DEVICE, on_test_device, other_family
from scipy.stats import chisquare

from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.engine import rules, speculative
from specviz.engine.early_exit import EarlyExit
from specviz.engine.sampling import logits_to_probs, sample
from specviz.engine.siblings import children_of, tried_nodes, walk_tree
from specviz.engine.tree_round import point_mass_rule, tree_generate
from specviz.models.families import VocabMap
from specviz.models.pair import ModelPair
from specviz.models.tiny import EOS_ID, noisy_copy, tiny_model, tiny_tokenizer

V, END, LENGTH, K = 16, 16, 3, 2
PROMPT = [3, 1, 4, 1, 5]
LOOKUP_PROMPT = [3, 1, 4, 1]  # ends in a repeat: prompt lookup proposes "4 1" in the first round
TEMPERATURE_1 = SamplingParams(1.0)
WARPED = SamplingParams(1.0, top_k=8, top_p=0.9)


def cpu_pair() -> ModelPair:
    target = CausalLM(V, seed=7, scale=1.5)
    return ModelPair(draft=noisy_copy(target, 0.4, seed=2), target=target, tokenizer=tiny_tokenizer(),
                     device=torch.device("cpu"), dtype=torch.float32, eos_token_ids=frozenset({EOS_ID}))


@pytest.fixture(scope="module")
def pair() -> ModelPair:
    return on_test_device(cpu_pair())


@torch.inference_mode()
def tables(model, sampling: SamplingParams, prompt: list[int] = PROMPT) -> dict[tuple, torch.Tensor]:
    """Warped next-token distribution after prompt + every prefix of length 0..LENGTH-1."""
    out = {}
    for n in range(LENGTH):
        prefixes = list(itertools.product(range(V), repeat=n))
        ids = torch.tensor([prompt + list(x) for x in prefixes], device=TEST_DEVICE)
        probs = logits_to_probs(model(ids).logits[:, -1].float(), sampling)
        out.update(zip(prefixes, probs.cpu()))
    return out


def exact_joint(p: dict[tuple, torch.Tensor]) -> dict[tuple, float]:
    """P(x1, x2, x3) over ids and END, by enumeration (see the module docstring)."""
    joint: dict[tuple, float] = {}

    def extend(prefix: tuple, prob: float) -> None:
        if len(prefix) == LENGTH:
            joint[prefix] = joint.get(prefix, 0.0) + prob
        elif prefix and prefix[-1] in (EOS_ID, END):
            extend(prefix + (END,), prob)
        else:
            for x, px in enumerate(p[prefix].double().tolist()):
                if px > 0:
                    extend(prefix + (x,), prob * px)

    extend((), 1.0)
    return joint


def marginals(joint: dict[tuple, float]) -> np.ndarray:
    m = np.zeros((LENGTH, V + 1))
    for seq, prob in joint.items():
        for t, x in enumerate(seq):
            m[t, x] += prob
    return m


def finish(tokens: list[int]) -> tuple:
    """The first LENGTH tokens with END after an <eos>."""
    out = list(tokens[:LENGTH])
    if EOS_ID in out:
        out = out[:out.index(EOS_ID) + 1]
    return tuple(out + [END] * (LENGTH - len(out)))


def simulate(p: dict, q: dict, n: int, seed: int) -> list[tuple]:
    """n runs of the engine's round rule with the exact tables standing in for the two models."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    rounds: dict[tuple, tuple] = {}  # (output so far, drafts) -> the round's p rows, q rows and tokens, stacked once
    for _ in range(n):
        out: list[int] = []
        while len(out) < LENGTH and EOS_ID not in out:
            k = min(K, LENGTH - len(out) - 1)  # as the round loop: k drafts + 1 never overshoot
            drafted: list[int] = []
            for _ in range(k):
                drafted.append(int(sample(q[tuple(out + drafted)], gen)))
            key = (tuple(out), tuple(drafted))
            if key not in rounds:
                rounds[key] = (torch.stack([p[tuple(out + drafted[:j])] for j in range(k + 1)]),
                               torch.stack([q[tuple(out + drafted[:j])] for j in range(k)]) if k else torch.empty(0, V),
                               torch.tensor(drafted, dtype=torch.long))
            verdict = rules.verify(*rounds[key], gen)
            nacc = int(verdict.n_accepted)
            out += drafted[:nacc] + [int(verdict.next_token)]
        samples.append(finish(out))
    return samples


def end_to_end(pair, sampling: SamplingParams, n: int, drafter: str = "model",
               prompt: list[int] = PROMPT, exit_layer: int = 1) -> tuple[list[tuple], int]:
    """n runs of `speculative_generate`, seed i for run i; also counts point-mass (lookup) drafts."""
    samples, point_masses = [], 0
    for seed in range(n):
        config = DecodeConfig(k=K, max_new_tokens=LENGTH, sampling=sampling, seed=seed, drafter=drafter,
                              adaptive="fixed", exit_layer=exit_layer)
        rounds = list(speculative_generate(pair, prompt, config))
        samples.append(finish([t for r in rounds for t in r.new_token_ids]))
        point_masses += sum(d.q == 1.0 for r in rounds for d in r.drafted)
    return samples, point_masses


def always_accept(monkeypatch) -> None:
    """The negative control: the rule patched to keep every draft."""
    monkeypatch.setattr(rules, "accepted_prefix", lambda accept_prob, u: torch.tensor(accept_prob.shape[0], device=accept_prob.device))


def end_to_end_stats(pair, n: int, drafter: str = "model") -> dict:
    """`statistics` of n end-to-end runs at temperature 1 against the target's exact distribution."""
    return statistics(end_to_end(pair, TEMPERATURE_1, n, drafter)[0], exact_joint(tables(pair.target, TEMPERATURE_1)))


def pooled_chisquare(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against probs, bins with expected count < 5 pooled into one."""
    n = counts.sum()
    if counts[probs == 0].sum():  # a sample the distribution cannot produce: rejected with certainty
        return 0.0
    expected = probs * n
    small = (expected < 5) & (probs > 0)
    big = ~small & (probs > 0)
    obs, exp = list(counts[big]), list(expected[big])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
        if exp[-1] < 5:  # still too small: merge the pool into the smallest regular bin
            i = int(np.argmin(exp[:-1]))
            obs[i] += obs.pop()
            exp[i] += exp.pop()
    exp = np.array(exp) * n / np.sum(exp)
    return float(chisquare(obs, exp).pvalue)


def statistics(samples: list[tuple], joint: dict[tuple, float]) -> dict:
    """Per-position chi-square p-values and TV distances, plus a chi-square on the whole 3-token joint."""
    exact = marginals(joint)
    arr = np.array(samples)
    counts = np.stack([np.bincount(arr[:, t], minlength=V + 1) for t in range(LENGTH)])
    keys = list(joint)
    index = {s: i for i, s in enumerate(keys)}
    joint_counts = np.bincount([index.get(s, len(keys)) for s in samples], minlength=len(keys) + 1)
    impossible = int(joint_counts[-1])  # sequences the target cannot produce: the joint test rejects outright
    return {
        "p": [pooled_chisquare(counts[t], exact[t]) for t in range(LENGTH)],
        "tv": [0.5 * np.abs(counts[t] / len(samples) - exact[t]).sum() for t in range(LENGTH)],
        "p_joint": 0.0 if impossible else pooled_chisquare(joint_counts[:-1], np.array([joint[s] for s in keys])),
        "impossible": impossible,
    }


def consistent(stats: dict, min_p: float, max_tv: float) -> bool:
    """The verdict every end-to-end test asserts and its negative control must fail: no sequence the target
    cannot produce, each position's chi-square p above min_p, each position's TV below max_tv."""
    return stats["impossible"] == 0 and min(stats["p"]) > min_p and max(stats["tv"]) < max_tv


DETECTED_P = 1e-13 / LENGTH  # any of the LENGTH positions' chi-squares below it: a correct sampler, once in 10^13


def detected(stats: dict, min_p: float, max_tv: float) -> bool:
    """A negative control's verdict: it fails the test's own (`consistent`), and some position's chi-square is below
    1e-13 / LENGTH, which a correct sampler reaches by chance at most once in 10^13 runs of the test (Bonferroni over
    the positions). A control's error need not be largest at position 1: the tree trap on the compiled pair moves
    position 2 most."""
    return not consistent(stats, min_p, max_tv) and min(stats["p"]) < DETECTED_P


def tv_bound(joint: dict[tuple, float], n: int, quantile: float = 0.999, reps: int = 2_000) -> float:
    """The largest per-position TV that n perfect samples of `joint` stay under with probability `quantile`,
    by drawing them (seeded): a bound set by the distribution and the sample size, not by hand. Remembered per
    (joint, n): a test and its control ask for the same bound again (the draws cost ~0.4 s)."""
    return _tv_bound(tuple(joint.items()), n, quantile, reps)


@functools.cache
def _tv_bound(items: tuple, n: int, quantile: float, reps: int) -> float:
    joint = dict(items)
    keys = list(joint)
    probs = np.array([joint[k] for k in keys])
    onehot = np.zeros((len(keys), LENGTH * (V + 1)))
    for i, seq in enumerate(keys):
        onehot[i, [t * (V + 1) + x for t, x in enumerate(seq)]] = 1
    # (counts as float64: the same sums, exact below 2**53, on the fast matrix product)
    drawn = np.random.default_rng(0).multinomial(n, probs / probs.sum(), size=reps).astype(float) @ onehot / n
    tv = 0.5 * np.abs(drawn.reshape(reps, LENGTH, V + 1) - marginals(joint)).sum(-1).max(-1)
    return float(np.quantile(tv, quantile))


@pytest.fixture(scope="module")
def setups(pair):
    return {name: (tables(pair.target, s), tables(pair.draft, s))
            for name, s in (("temperature 1", TEMPERATURE_1), ("top-k 8, top-p 0.9", WARPED))}


def test_the_pair_exercises_the_rule(setups):
    """The setting is not degenerate: drafts are often but not always accepted, <eos> shows up early."""
    p, q = setups["temperature 1"]
    acceptance = float(torch.minimum(p[()], q[()]).sum())
    assert 0.5 < acceptance < 0.9
    assert marginals(exact_joint(p))[1, END] > 0.02
    warped_p = setups["top-k 8, top-p 0.9"][0]
    assert all(int((row > 0).sum()) <= 8 for row in warped_p.values())


@pytest.mark.parametrize("name", ["temperature 1", "top-k 8, top-p 0.9"])
def test_rule_samples_the_target_distribution(setups, name):
    p, q = setups[name]
    stats = statistics(simulate(p, q, 20_000, seed=0), exact_joint(p))
    print(name, stats)
    assert min(stats["p"]) > 0.01, stats
    assert max(stats["tv"]) < 0.02, stats
    assert stats["p_joint"] > 0.01, stats


RULE_CONTROL_RUNS = 1_000  # its output is q, q, then p: computed exactly, no miss in 100,000 tries at this size
# (P(miss) < 3e-5; at 600 runs the joint's p-value misses 1e-6 once in 10,000)


@pytest.mark.parametrize("name", ["temperature 1", "top-k 8, top-p 0.9"])
def test_negative_control_always_accept_is_detected(setups, monkeypatch, name):
    """The rule's own runs with every draft accepted, a twentieth as many: the test's verdict fails, by far."""
    always_accept(monkeypatch)
    p, q = setups[name]
    stats = statistics(simulate(p, q, RULE_CONTROL_RUNS, seed=0), exact_joint(p))
    print("always accept", name, stats)
    assert not (min(stats["p"]) > 0.01 and max(stats["tv"]) < 0.02 and stats["p_joint"] > 0.01)  # the test's verdict
    assert stats["p"][0] < 1e-6 and stats["tv"][0] > 0.02, stats
    assert stats["p_joint"] < 1e-6, stats


END_TO_END = [  # (sampling, drafter, runs, max TV, min p, control's runs): one test and one always-accept control each
    # (the controls' P(not detected), in 200,000 tries: temperature 1 1.5e-5 at 450 runs (2e-4 at 400); warped 0 at
    # 100 and 125 (9e-5 at 75); hybrid none: it always emits the lookup's "4 1", seen once token 4 (p 0.074) has a bin
    # of its own, from 68 runs (at 50 it is pooled: p 3e-13, missed))
    pytest.param(TEMPERATURE_1, "model", 8_000, 0.03, 0.01, 450, id="temperature 1"),
    pytest.param(WARPED, "model", 3_000, 0.05, 1e-3, 125, id="top-k 8, top-p 0.9"),
    # prompt-lookup drafts are point masses: accepted with probability p(x)
    pytest.param(TEMPERATURE_1, "hybrid", 3_000, 0.05, 1e-3, 100, id="hybrid drafter"),
]


def end_to_end_of(pair, sampling, drafter, n) -> tuple[dict, int]:
    prompt = LOOKUP_PROMPT if drafter == "hybrid" else PROMPT
    samples, point_masses = end_to_end(pair, sampling, n, drafter, prompt)
    return statistics(samples, exact_joint(tables(pair.target, sampling, prompt))), point_masses


@pytest.mark.parametrize("sampling,drafter,n,max_tv,min_p,control_n", END_TO_END)
def test_speculative_generate_samples_the_target_distribution(pair, sampling, drafter, n, max_tv, min_p, control_n):
    """The full loop, caches and all: 8,000 runs at temperature 1 (the rule alone runs 20,000). The two smaller
    runs are secondary checks: a looser TV bound, and p > 0.001 so that their six p-values together rarely fail
    by chance. Each has a control below: the same runs with the rule accepting every draft, which must fail."""
    stats, point_masses = end_to_end_of(pair, sampling, drafter, n)
    print(sampling, drafter, n, stats, "point-mass drafts", point_masses)
    assert (point_masses > n) == (drafter == "hybrid")  # lookup drafted in every hybrid run
    assert min(stats["p"]) > min_p, stats
    assert max(stats["tv"]) < max_tv, stats
    assert consistent(stats, min_p, max_tv)


@pytest.mark.parametrize("sampling,drafter,n,max_tv,min_p,control_n", END_TO_END)
def test_negative_control_end_to_end(pair, monkeypatch, sampling, drafter, n, max_tv, min_p, control_n):
    """Each configuration's statistic and verdict on its control's runs, with every draft accepted: detected
    (printed: each position's p and TV, and how many sequences the target cannot produce)."""
    always_accept(monkeypatch)
    stats, _ = end_to_end_of(pair, sampling, drafter, control_n)
    print("always accept,", sampling, drafter, control_n, stats)
    assert detected(stats, min_p, max_tv), stats


@pytest.fixture(scope="module")
def self_pair() -> ModelPair:
    """A 3-layer tiny Qwen2 target on the 16 ids and no draft model: the 'self' drafter exits after layer 1."""
    return on_test_device(ModelPair(draft=None, target=tiny_model(2, V, layers=3), tokenizer=tiny_tokenizer(),
                                    device=torch.device("cpu"), dtype=torch.float32, eos_token_ids=frozenset({EOS_ID})))


SELF_RUNS = 1_000
SELF_CONTROL_RUNS = 200  # P(not detected) 0 in 200,000 tries (5e-6 at 175); the 125 it had (an eighth): 4e-3


@torch.inference_mode()
def test_self_speculation_samples_the_target_distribution(self_pair):
    """1,000 runs. The setting is not degenerate: the early exit's first token is accepted about 65% of the
    time. The TV bound is the one 1,000 perfect samples of these marginals stay under 999 times in 1,000 (drawn:
    0.081; the hand-set 0.085 it replaces was no tighter in effect, and a tighter one needs more runs: TV shrinks
    as 1/sqrt(n)). The power at this size comes from the chi-square: `test_mutants` catches a q one row behind
    here with p < 1e-6."""
    from transformers import DynamicCache

    prompt = torch.tensor([PROMPT], device=TEST_DEVICE)
    p = logits_to_probs(self_pair.target(prompt).logits[0, -1].float(), TEMPERATURE_1)
    q = logits_to_probs(EarlyExit(self_pair.target, 1)(prompt, DynamicCache()).logits[0, -1].float(), TEMPERATURE_1)
    assert 0.5 < float(torch.minimum(p, q).sum()) < 0.8
    stats = end_to_end_stats(self_pair, SELF_RUNS, "self")
    bound = tv_bound(exact_joint(tables(self_pair.target, TEMPERATURE_1)), SELF_RUNS)
    print("self drafter", stats, "TV bound", bound)
    assert consistent(stats, 1e-3, bound), stats


def test_negative_control_self_speculation(self_pair, monkeypatch):
    always_accept(monkeypatch)
    stats = end_to_end_stats(self_pair, SELF_CONTROL_RUNS, "self")
    print("always accept, self drafter", stats)
    assert detected(stats, 1e-3, tv_bound(exact_joint(tables(self_pair.target, TEMPERATURE_1)), SELF_CONTROL_RUNS))


CROSS_RUNS = 2_000
CROSS_CONTROL_RUNS = 175  # P(not detected) 0 in 200,000 tries at 150 and 175 (4e-3 at 125)
CROSS_SHARED = 12  # target ids 0..11 are draft ids 11..0; 12..15 the target's alone; draft ids 12, 13 its own


def cross_translate(ids: list[int], before: list[int] = ()) -> list[int]:
    """A shared id is its draft id; an id the draft lacks becomes two tokens of the draft's own."""
    return [d for t in ids for d in ([CROSS_SHARED - 1 - t] if t < CROSS_SHARED else [12, 13])]


@pytest.fixture(scope="module")
def cross_pair() -> ModelPair:
    """The module's target with a draft of "another family": 14 tokens, 12 of them the target's."""
    words = [str(i) for i in range(V)]
    draft_words = words[:CROSS_SHARED][::-1] + ["own-1", "own-2"]
    rows = [*range(CROSS_SHARED)][::-1] + [None, None]
    base = cpu_pair()
    return on_test_device(ModelPair(
        draft=other_family(base.target, rows, 0.4, seed=2), target=base.target, tokenizer=base.tokenizer,
        device=base.device, dtype=torch.float32, eos_token_ids=base.eos_token_ids,
        vocab_map=VocabMap.build(draft_words, words, cross_translate, device=TEST_DEVICE)))


@torch.inference_mode()
def test_a_draft_of_another_family_samples_the_target_distribution(cross_pair):
    """2,000 runs (~15 s; 2,000 perfect samples score TV about 0.03). Not degenerate: the target gives its own
    ids 12..15 some mass, which only corrections can emit, and the draft's first token is accepted often, but far
    from always."""
    p = tables(cross_pair.target, TEMPERATURE_1)[()]
    q = logits_to_probs(cross_pair.vocab_map.target_logits(
        cross_pair.draft(torch.tensor([cross_translate(PROMPT)], device=TEST_DEVICE)).logits[0, -1].float()),
        TEMPERATURE_1).cpu()
    assert float(p[CROSS_SHARED:].sum()) > 0.1 and float(q[CROSS_SHARED:].sum()) == 0
    assert 0.4 < float(torch.minimum(p, q).sum()) < 0.85
    stats = end_to_end_stats(cross_pair, CROSS_RUNS)
    print("another family", stats)
    assert min(stats["p"]) > 1e-3, stats
    assert max(stats["tv"]) < 0.05, stats
    assert consistent(stats, 1e-3, 0.05)


def test_negative_control_another_family(cross_pair, monkeypatch):
    always_accept(monkeypatch)
    stats = end_to_end_stats(cross_pair, CROSS_CONTROL_RUNS)
    print("always accept, another family", stats)
    assert detected(stats, 1e-3, 0.05), stats


TREE_RUNS = 3_000
TREE_CONTROL_RUNS = 125  # the trap: P(not detected) 0 in 200,000 tries at 100 and 125 (0.035 at 75)
TREE_BUDGET = 6  # with K = 2: the root's top 4 candidates and a couple below them, so siblings get tried


def tree_samples(pair, n: int, rule=point_mass_rule) -> tuple[list[tuple], int]:
    """n runs of the tree drafter's round loop at temperature 1, seed i for run i; also counts the second (or
    later) siblings the walk tried."""
    samples, later_siblings = [], 0
    for seed in range(n):
        config = DecodeConfig(k=K, max_new_tokens=LENGTH, sampling=TEMPERATURE_1, seed=seed, drafter="tree",
                              tree_budget=TREE_BUDGET)
        rounds = list(tree_generate(pair, PROMPT, config, rule=rule))
        samples.append(finish([t for r in rounds for t in r.new_token_ids]))
        later_siblings += sum(n.rank > 0 and n.accept_prob is not None for r in rounds for n in r.tree)
    return samples, later_siblings


def as_if_drawn_from_q(parents, p_at, q_at, u):
    """The known trap, as a negative control: the draft's top candidates treated as if drawn from q without
    replacement (try x with min(1, p(x)/q(x)), on rejection p <- norm(max(0, p - q)), q <- q without x) when
    they were chosen deterministically."""
    children = children_of(parents)
    rows = [children.get(node, []) for node in range(-1, len(parents))]
    short = lambda at, kids: torch.tensor([*(at[c] for c in kids), max(1e-9, 1 - sum(at[c] for c in kids))],
                                          dtype=torch.float64)
    p_rows, q_rows = [short(p_at, kids) for kids in rows], [short(q_at, kids) for kids in rows]
    ranks = [children[parent].index(i) for i, parent in enumerate(parents)]
    verdict = walk_tree(parents, ranks, [r / r.sum() for r in p_rows], [r / r.sum() for r in q_rows], u)
    return verdict, tried_nodes(children, verdict)


def test_tree_speculation_samples_the_target_distribution(pair):
    """3,000 runs of the tree round loop (about 20 s): the draft's top candidates as a tree, tried with the
    point-mass rule. Not degenerate: later siblings are tried thousands of times. 3,000 perfect samples score
    TV about 0.027 (measured: 0.012-0.022 at 4,000; the trap below: 0.49)."""
    samples, later_siblings = tree_samples(pair, TREE_RUNS)
    stats = statistics(samples, exact_joint(tables(pair.target, TEMPERATURE_1)))
    print("tree", stats, "later siblings tried", later_siblings)
    assert later_siblings > 1_000
    assert min(stats["p"]) > 1e-3, stats
    assert max(stats["tv"]) < 0.045, stats
    assert consistent(stats, 1e-3, 0.045)


def test_negative_control_tree_children_treated_as_sampled(pair):
    """The trap the issue warns of must fail the same runs' verdict."""
    samples, _ = tree_samples(pair, TREE_CONTROL_RUNS, rule=as_if_drawn_from_q)
    stats = statistics(samples, exact_joint(tables(pair.target, TEMPERATURE_1)))
    print("tree, children treated as drawn from q", stats)
    assert detected(stats, 1e-3, 0.045), stats


@pytest.fixture(scope="module")
def quantized_pairs(pair) -> dict[str, ModelPair]:
    """The module's pair with its target's weights in int4 / int8 (every linear, the head too): both lanes run
    this target, so it is the distribution speculative sampling must reproduce."""
    from dataclasses import replace

    from specviz.models.draft.quantized import DraftQuant
    from specviz.models.target import quantize_target
    return {q: replace(pair, target=quantize_target(pair.target, DraftQuant.named(q))) for q in ("int4", "int8")}


QUANT_RUNS = 3_000
QUANT_CONTROL_RUNS = {"int4": 400, "int8": 450}  # P(not detected) 0 in 200,000 tries (int4), 2e-5 (int8); the 375
# they had (an eighth) missed int8's control 5e-4 of the time
# reported as skipped, with this reason, where the suite runs on a GPU (SPECVIZ_TEST_DEVICE=cuda)
CPU_KERNELS = pytest.mark.skipif(TEST_DEVICE.type != "cpu", reason="int4 and int8 targets run on CPU kernels only")


@CPU_KERNELS
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_quantized_target_is_sampled_exactly(quantized_pairs, pair, quant):
    """3,000 runs each, end to end (TV < 0.05, p > 0.001, as the other secondary checks)."""
    stats = end_to_end_stats(quantized_pairs[quant], QUANT_RUNS)
    print(quant, "target", stats)
    assert min(stats["p"]) > 1e-3, stats
    assert max(stats["tv"]) < 0.05, stats
    assert consistent(stats, 1e-3, 0.05)


@CPU_KERNELS
def test_the_quantized_target_is_a_distribution_of_its_own(quantized_pairs, pair):
    """int4 moves this target's marginals by TV ~0.03 from the loaded float target: 20,000 runs of the rule on the
    int4 tables match the int4 target and fail against the float one. Exactness is against the target both lanes
    run, and the statistics can tell which target that is."""
    qp, q = tables(quantized_pairs["int4"].target, TEMPERATURE_1), tables(pair.draft, TEMPERATURE_1)
    samples = simulate(qp, q, 20_000, seed=1)
    own, float_ = (statistics(samples, exact_joint(t)) for t in (qp, tables(pair.target, TEMPERATURE_1)))
    print("int4 rule samples", own, "against the float target", float_)
    assert min(own["p"]) > 0.01 and own["p_joint"] > 0.01, own
    assert min(float_["p"]) < 1e-6, float_


@CPU_KERNELS
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_negative_control_quantized_target(quantized_pairs, monkeypatch, quant):
    always_accept(monkeypatch)
    stats = end_to_end_stats(quantized_pairs[quant], QUANT_CONTROL_RUNS[quant])
    print("always accept,", quant, "target", stats)
    assert detected(stats, 1e-3, 0.05), stats


COMPILED_RUNS = 1_000
# (both controls' distributions estimated on the same models uncompiled: the compiled steps compute the same)
COMPILED_CONTROL_RUNS = 125  # P(not detected) 0 in 200,000 tries at 100 and 125 (0.034 at 75)
COMPILED_TREE_CONTROL_RUNS = 700  # the trap: P(not detected) 5e-6 (2e-4 at 600); at position 1 alone 0.2 at 600


@pytest.fixture(scope="module")
def compiled_pair() -> ModelPair:
    """A tiny Qwen2 target and a noisy copy of it as the draft, both on compiled one-token steps, the target's verify
    compiled too, padded to 4 tokens (K = 2 verifies 3, fewer at the end) or 8 (a tree of `TREE_BUDGET` nodes and
    the pending token)."""
    from specviz.models.compiled import with_compiled_step

    target = tiny_model(3, V)
    pair = on_test_device(ModelPair(draft=noisy_copy(target, 0.4, seed=2), target=target, tokenizer=tiny_tokenizer(),
                                    device=torch.device("cpu"), dtype=torch.float32,
                                    eos_token_ids=frozenset({EOS_ID})))
    return replace(pair, draft=with_compiled_step(pair.draft, sizes=(16,)),
                   target=with_compiled_step(pair.target, sizes=(16,), widths=(4, 8)))


def test_the_compiled_path_samples_the_target_distribution(compiled_pair):
    """1,000 runs on the compiled steps and verify (the exact distribution from the target's eager forwards): the
    TV bound is the one 1,000 perfect samples stay under 999 times in 1,000, as for the self drafter."""
    stats = end_to_end_stats(compiled_pair, COMPILED_RUNS)
    bound = tv_bound(exact_joint(tables(compiled_pair.target, TEMPERATURE_1)), COMPILED_RUNS)
    print("compiled path", stats, "TV bound", bound)
    assert consistent(stats, 1e-3, bound), stats


def test_negative_control_compiled_path(compiled_pair, monkeypatch):
    always_accept(monkeypatch)
    stats = end_to_end_stats(compiled_pair, COMPILED_CONTROL_RUNS)
    print("always accept, compiled path", stats)
    assert detected(stats, 1e-3, tv_bound(exact_joint(tables(compiled_pair.target, TEMPERATURE_1)),
                                          COMPILED_CONTROL_RUNS))


def test_the_compiled_tree_path_samples_the_target_distribution(compiled_pair):
    """1,000 runs of the tree round loop on the compiled target: each tree's verify one compiled graph on the
    static cache (its mask moved onto the static slots, padded to 8 rows), the accepted path moved down in place."""
    samples, later_siblings = tree_samples(compiled_pair, COMPILED_RUNS)
    joint = exact_joint(tables(compiled_pair.target, TEMPERATURE_1))
    stats = statistics(samples, joint)
    bound = tv_bound(joint, COMPILED_RUNS)
    print("compiled tree", stats, "later siblings tried", later_siblings, "TV bound", bound)
    assert later_siblings > 300
    assert consistent(stats, 1e-3, bound), stats


def test_negative_control_compiled_tree_path(compiled_pair):
    """The trap on this pair (a noisier draft than the tree test's) shifts position 1 by a TV of about 0.15 and
    position 2 by 0.23: 700 runs detect it (1,000 did at position 1 alone)."""
    samples, _ = tree_samples(compiled_pair, COMPILED_TREE_CONTROL_RUNS, rule=as_if_drawn_from_q)
    joint = exact_joint(tables(compiled_pair.target, TEMPERATURE_1))
    stats = statistics(samples, joint)
    print("tree on the compiled path, children treated as drawn from q", stats)
    assert detected(stats, 1e-3, tv_bound(joint, COMPILED_TREE_CONTROL_RUNS))


CUT_RUNS = 1_000
CUT_CONTROL_RUNS = 450  # P(not detected) 2e-5 (0 in 200,000 tries at the 500 it had)


def cut_once_samples(pair, n: int) -> list[tuple]:
    """n runs with the confidence cut applied once a round (all K drafted, then cut), as on a GPU."""
    samples = []
    for seed in range(n):
        config = DecodeConfig(k=K, max_new_tokens=LENGTH, sampling=TEMPERATURE_1, seed=seed, adaptive="confidence",
                              confidence=0.5)
        samples.append(finish([t for r in speculative_generate(pair, PROMPT, config) for t in r.new_token_ids]))
    return samples


def test_the_cut_applied_once_a_round_samples_the_target_distribution(pair, monkeypatch):
    """The drafts past the cut take draws from the generator and are dropped: the kept ones are still what the draft
    sampled, so the output is still the target's distribution (1,000 runs, the bound 1,000 perfect samples stay
    under 999 times in 1,000)."""
    monkeypatch.setattr(speculative, "cut_once", lambda device: True)
    joint = exact_joint(tables(pair.target, TEMPERATURE_1))
    stats = statistics(cut_once_samples(pair, CUT_RUNS), joint)
    print("cut once a round", stats)
    assert consistent(stats, 1e-3, tv_bound(joint, CUT_RUNS)), stats


def test_negative_control_cut_once(pair, monkeypatch):
    monkeypatch.setattr(speculative, "cut_once", lambda device: True)
    always_accept(monkeypatch)
    joint = exact_joint(tables(pair.target, TEMPERATURE_1))
    # (a cut drafts fewer tokens, so an always-accept rule strays less per run: nearly half the runs)
    stats = statistics(cut_once_samples(pair, CUT_CONTROL_RUNS), joint)
    print("always accept, cut once a round", stats)
    assert detected(stats, 1e-3, tv_bound(joint, CUT_CONTROL_RUNS)), stats


BF16_RUNS = 1_000
BF16_CONTROL_RUNS = 125  # the compiled pair's models, rounded to bfloat16: its control's size (see above)


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory) -> ModelPair:
    """The compiled pair's tiny Qwen2 target and noisy draft in bfloat16, the target on the invariant verify
    (`--dtype auto`'s precision, the served default): what a user runs, sampled exactly."""
    from specviz.models.target import with_target

    target = tiny_model(3, V)
    pair = ModelPair(draft=noisy_copy(target, 0.4, seed=2).to(torch.bfloat16), target=target.to(torch.bfloat16),
                     tokenizer=tiny_tokenizer(), device=torch.device("cpu"), dtype=torch.bfloat16,
                     eos_token_ids=frozenset({EOS_ID}))
    invariant, _ = with_target(pair, "none", "tuned", invariant=True, folder=tmp_path_factory.mktemp("kernels"))
    assert invariant.not_invariant is None
    return invariant


@CPU_KERNELS
def test_bf16_on_the_invariant_verify_samples_the_target_distribution(bf16_pair):
    """1,000 runs in bfloat16 (the exact distribution from the same target's plain forwards, in bfloat16): the TV
    bound 1,000 perfect samples stay under 999 times in 1,000."""
    stats = end_to_end_stats(bf16_pair, BF16_RUNS)
    bound = tv_bound(exact_joint(tables(bf16_pair.target, TEMPERATURE_1)), BF16_RUNS)
    print("bfloat16, invariant verify", stats, "TV bound", bound)
    assert consistent(stats, 1e-3, bound), stats


@CPU_KERNELS
def test_negative_control_bf16(bf16_pair, monkeypatch):
    always_accept(monkeypatch)
    stats = end_to_end_stats(bf16_pair, BF16_CONTROL_RUNS)
    print("always accept, bfloat16", stats)
    assert detected(stats, 1e-3, tv_bound(exact_joint(tables(bf16_pair.target, TEMPERATURE_1)), BF16_RUNS)), stats
