"""The proof: sampled paths of the real round loop scored against the target's exact distributions.

For one decoding configuration, N continuations of L tokens are sampled (seed = seed + i) by each
sampler below, and each is scored position by position against the target's exact conditionals
(`analysis.proof`). Speculative decoding must pass; so must the target alone (the harness is
calibrated); the negative controls must fail, or the test could not have seen a bug:
- "draft alone": the draft model sampled by itself (what a sampler that trusts the draft produces),
- "always accept": the round loop with the rule's coin removed (every draft kept, bonus from p).
Each speculative sample runs with max_new_tokens = L + K, so the end of the budget never shortens a
draft inside positions 1..L, and a draft made right after a clean sweep is counted (`clean_sweep`).

`identity` is the greedy half: speculative greedy output against transformers' own
`generate(do_sample=False)` of the target, for every drafter x K x adaptive mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass as spec

from specviz.analysis.divergence import first_difference, spec_gap_at, spec_token_ids
from specviz.analysis.proof import PooledPosition, PositionTally, Verdict, pooled, verdict
from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.engine.events import NOT_VERIFIED
from specviz.engine.exact import path_distributions
from specviz.engine.plumbing import PromptCache, at
from specviz.engine.rules import Verdict as RoundVerdict
from specviz.engine.sampling import draw, make_generator
from specviz.engine.siblings import walk_point_masses
from specviz.engine.speculative import EXACT, Rule
from specviz.models import ModelPair

ALPHA = 1e-3  # family-wise, per sampler: a correct sampler is flagged 1 time in 1000
BATCH = 16  # paths drawn between two progress reports, scored together
SHOWN_POOLED = 12  # tokens per position in the side-by-side view
PROMPT_COPIES = 4096  # prompt tokens copied into one scoring forward's cache: a long prompt's batch is split


@spec(frozen=True)
class ProofSettings:
    samples: int = Field(200, ge=10, title="samples", description="sampled continuations per sampler",
                         json_schema_extra={"limit": "max_samples"})
    length: int = Field(3, ge=1, le=8, title="positions", description="tokens per continuation, each one tested")
    controls: bool = Field(True, title="negative controls",
                           description="also run samplers that are wrong on purpose: each must fail")
    control_samples: int = Field(200, ge=10, title="control samples",
                                 description="continuations for the target alone and each control (they are "
                                             "calibration: the target alone must pass, a control must fail)",
                                 json_schema_extra={"limit": "max_samples"})


def accept_every_draft(p, q, tokens, generator, greedy: bool = False) -> RoundVerdict:
    """A broken rule, for the negative control: no coin, every draft kept, the bonus from p's last row."""
    k = tokens.shape[0]
    n = torch.tensor(k, device=p.device)
    token = draw(p[k], p[k], greedy, generator)
    ones = torch.ones(k, device=p.device)
    return RoundVerdict(n, token, at(p[k], token), ones, 0 * ones, p[k])


def accept_first_children(parents, p_at, q_at, u):
    """The same control for trees: down the first children, whatever p says."""
    return walk_point_masses(parents, [1.0] * len(parents), u)


ALWAYS_ACCEPT = Rule("always accept", accept_every_draft, accept_first_children)  # the "always accept" control


def speculative_path(pair, ids, config, length, prompt_cache, rule: Rule = EXACT) -> tuple[list[int], int]:
    """The first `length` tokens, and how many of them were drafted in a round right after a clean sweep."""
    config = replace(config, max_new_tokens=length + config.k)
    tokens, swept, after_sweep = [], False, 0
    events = speculative_generate(pair, ids, config, prompt_cache=prompt_cache, rule=rule)
    try:
        for r in events:
            if swept:
                after_sweep += sum(r.position + i < length and t.status != NOT_VERIFIED
                                   for i, t in enumerate(r.drafted))
            swept = r.k > 0 and r.n_accepted == r.k
            tokens += r.new_token_ids
            if len(tokens) >= length or r.finished:
                break
    finally:
        events.close()  # frees the run's caches now
    return tokens[:length], after_sweep


def target_path(pair, ids, config, length, prompt_cache) -> tuple[list[int], int]:
    steps = autoregressive_generate(pair, ids, replace(config, max_new_tokens=length), prompt_cache=prompt_cache)
    return [s.token.id for s in steps], 0


@dataclass(frozen=True)
class Sampler:
    name: str
    expect_pass: bool
    path: Callable  # (pair, ids, config, length, prompt_cache) -> (tokens, drafts after a clean sweep)


def samplers(pair: ModelPair, settings: ProofSettings, calibrate: bool = True) -> list[Sampler]:
    """`calibrate=False` leaves out the samplers that do not depend on the drafter or adaptive mode (the target
    alone, the draft alone): with the same seeds they would draw the very same paths again."""
    out = [Sampler("speculative", True, speculative_path)]
    if calibrate:
        out.append(Sampler("target alone", True, target_path))
    if settings.controls:
        # (a draft of another family speaks other ids: sampled alone, its paths mean nothing to the target)
        if pair.draft is not None and pair.vocab_map is None and calibrate:
            draft_as_target = replace(pair, target=pair.draft)
            out.append(Sampler("draft alone (control)", False,
                               lambda _, *a: target_path(draft_as_target, *a)))
        out.append(Sampler(f"{ALWAYS_ACCEPT.name} (control)", False,
                           lambda *a: speculative_path(*a, rule=ALWAYS_ACCEPT)))
    return out


@dataclass(frozen=True)
class Progress:
    done: int  # samples drawn so far, over every sampler
    total: int
    verdicts: list[Verdict]  # every sampler's, from its paths so far
    finished: str | None = None  # "budget": stopped early by `should_stop`; the verdicts cover what was drawn
    # per position: the samplers expected to pass (the method, the target alone) pooled, for side-by-side views
    pooled: list[PooledPosition] = field(default_factory=list)


def prove(pair: ModelPair, ids: list[int], config: DecodeConfig, settings: ProofSettings, *,
          prompt_cache: PromptCache | None = None, calibrate: bool = True,
          should_stop: Callable[[], str | None] = lambda: None) -> Iterator[Progress]:
    """Run every sampler, taking turns path by path (so results stopped early stay comparable); score and
    yield after each batch of paths (the last `Progress` is final). `should_stop()` is asked before every path."""
    if config.sampling.greedy:
        raise ValueError("a distribution test needs sampling: temperature > 0 (greedy is checked by `identity`)")
    prompt_cache = prompt_cache or PromptCache()
    scorer = make_generator(pair.device, config.seed)  # the PIT's and the chance level's own randomness
    todo = samplers(pair, settings, calibrate)
    n, length, base = settings.samples, settings.length, config.seed or 0
    tallies = {s.name: [PositionTally() for _ in range(length)] for s in todo}
    after_sweep, drawn = dict.fromkeys(tallies, 0), dict.fromkeys(tallies, 0)
    wanted = {s.name: n if s.name == "speculative" else min(n, settings.control_samples) for s in todo}
    stopped = None
    for start in range(0, n, BATCH):
        paths = {s.name: [] for s in todo}
        for i in range(start, min(n, start + BATCH)):  # the samplers take turns path by path: stopped early,
            for sampler in todo:                          # they have drawn as many paths as each other
                if i >= wanted[sampler.name] or (stopped := stopped or should_stop()):
                    continue
                tokens, swept = sampler.path(pair, ids, replace(config, seed=base + i), length, prompt_cache)
                paths[sampler.name].append(tokens)
                after_sweep[sampler.name] += swept
        for sampler in todo:
            if batch := paths[sampler.name]:
                drawn[sampler.name] += len(batch)
                score(pair, ids, batch, config, tallies[sampler.name], scorer, prompt_cache)
        yield Progress(sum(drawn.values()), sum(wanted.values()), [
            verdict(s.name, s.expect_pass, tallies[s.name], ALPHA,
                    **({"drafts_after_clean_sweep": after_sweep[s.name]} if s.name == "speculative" else {}))
            for s in todo], finished=stopped,
            pooled=[pooled([tallies[s.name][t] for s in todo if s.expect_pass], SHOWN_POOLED) for t in range(length)])
        if stopped:
            return


def score(pair, ids, paths: list[list[int]], config: DecodeConfig, tallies: list[PositionTally], generator,
          prompt_cache: PromptCache | None = None) -> None:
    """Add paths to the tallies, a few per forward when the prompt is long (each holds a copy of its cache)."""
    step = max(1, PROMPT_COPIES // len(ids))
    for chunk in (paths[i:i + step] for i in range(0, len(paths), step)):
        probs = path_distributions(pair, ids, chunk, config.sampling, prompt_cache)  # [B, L, V]
        for t, tally in enumerate(tallies):
            rows = [b for b, x in enumerate(chunk) if len(x) > t]  # paths that reached position t (no <eos> before)
            if rows:
                tally.add(probs[rows, t], torch.tensor([chunk[b][t] for b in rows], device=probs.device), generator)


def matrix(config: DecodeConfig, drafters, adaptives, ks=None) -> list[DecodeConfig]:
    """Every drafter x adaptive mode (x K) variant of `config`."""
    return [replace(config, drafter=d, adaptive=a, k=k if k is not None else config.k)
            for d, a, k in itertools.product(drafters, adaptives, ks or [None])]


@dataclass(frozen=True)
class Identity:
    drafter: str
    adaptive: str
    k: int
    tokens: int
    identical: bool
    first_difference: int | None  # index of the first token that differs
    top2_gap: float | None  # the target's top-1 minus top-2 logit there (a near-tie explains a bf16 flip)


@torch.inference_mode()
def hf_greedy(pair: ModelPair, ids: list[int], max_new_tokens: int) -> list[int]:
    """The outside reference: transformers' own greedy generate() of the target."""
    eos = sorted(pair.eos_token_ids) or None
    x = torch.tensor([ids], device=pair.device)
    out = pair.target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                               eos_token_id=eos, pad_token_id=eos[0] if eos else None,
                               temperature=None, top_k=None, top_p=None)
    return out[0, len(ids):].tolist()


def identity(pair: ModelPair, ids: list[int], configs: list[DecodeConfig]) -> Iterator[Identity]:
    """Greedy speculative output of each config (its own max_new_tokens) against transformers' greedy generate()."""
    if not configs:
        return
    reference = hf_greedy(pair, ids, max(c.max_new_tokens for c in configs))
    for c in configs:
        rounds = list(speculative_generate(pair, ids, c))
        tokens = spec_token_ids(rounds)
        diff = first_difference(tokens, reference[:c.max_new_tokens])
        yield Identity(c.drafter, c.adaptive, c.k, len(tokens), diff is None, diff,
                       None if diff is None else spec_gap_at(rounds, diff))
