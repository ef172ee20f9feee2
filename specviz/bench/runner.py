"""Run the benchmark so that a skeptic accepts its ratios.

Methods, each timed wall-clock around the whole call (prompt reading included, as a user waits):
- the target alone, twice: specviz's AR lane and transformers' plain `generate()` (and where the target's
  one-token step runs compiled, the AR lane on its eager step too; on a GPU, `generate()` on its static cache,
  compiled). The fastest is the baseline, so neither the AR lane's per-token instrumentation nor a step that
  loses in use can inflate a speedup;
- speculative decoding at a setting (K, confidence cut);
- transformers' assisted generation with the SAME draft specviz runs (its int4 weights, through the
  Hugging Face forward generate() needs) and with the draft as loaded, each at specviz's K and at HF's
  defaults; with the lookup drafter, transformers' prompt lookup at the same K.

Per prompt and repetition every method runs back to back, in an order shuffled afresh (seeded), so
neither a warm cache nor a burst of noise favours a fixed slot, and ratios compare runs of the same
prompt and repetition. A repetition disturbed by another process (CPU stall, `noise.py`) is measured
again, up to a limit, and the calmest kept.

Several settings (K x confidence cut x exit layer) are tried on a tuning split of the prompts; the best
is then reported on the other prompts only: choosing on the measurements one reports would flatter them.
Other adaptive modes may run beside it there at the same K (`Plan.also_adaptive`), for comparison, and the
tree drafter (`Plan.tree_budgets`): its budgets are tuned on the same split, and the best tree is reported beside
the best chain.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specviz.analysis.divergence import spec_token_ids
from specviz.bench.hf import HF_DEFAULT, HFGenerate, HFSetting
from specviz.bench.noise import calmest, timed
from specviz.bench.prompts import BenchPrompt
from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.engine.config import CUT_MODES
from specviz.models import encode_prompt
from specviz.models.compiled import CompileCounts, warm_sizes

AR, AR_HF = "ar", "ar_hf"  # the target alone: specviz's lane, transformers' generate()
AR_HF_STATIC = "ar_hf static"  # generate() on its static cache, compiled: run on a GPU only (on a CPU it is slower)
EAGER = " eager"  # a method's suffix: the same lane on the eager one-token step (the pair's runs compiled)
AR_EAGER = AR + EAGER


@dataclass
class Timed:
    tokens: list[int]
    seconds: float  # the whole call, prompt reading included
    stall: float | None = None  # fraction of the call's wall time another task waited for a CPU
    events: list | None = None  # specviz's Rounds or Steps (the first carries the prompt's forward)
    compiles: int = 0  # graphs torch compiled (or CUDA graphs skipped) during the call: then no measure of speed

    @property
    def prefill(self) -> float:
        return self.events[0].prefill_time if self.events else 0.0

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.prefill


@dataclass(frozen=True)
class Method:
    name: str  # "ar", "ar_hf", "spec k=6 c=0.4", "hf same k=6 c=0.4", "hf loaded default", "hf lookup k=6"
    run: Callable[[list[int]], Timed]


@dataclass
class PromptResult:
    prompt: BenchPrompt
    prompt_tokens: int
    reps: list[dict[str, Timed]] = field(default_factory=list)  # per repetition: method name -> run
    orders: list[list[str]] = field(default_factory=list)  # the order the methods ran in, per repetition
    attempts: int = 0  # measurements taken (more than reps: some were disturbed and taken again)

    @property
    def max_stall(self) -> float:
        return max((r.stall or 0.0 for rep in self.reps for r in rep.values()), default=0.0)


UNTUNED = " untuned"  # a method's suffix: the same lane on the kernels as loaded (`PairSpec.kernels` plain)


def setting_name(config: DecodeConfig) -> str:
    """k=8 c=0.4 (confidence cut), k=8 a=0.4 (predicted-acceptance cut), k=8 L=24 (exit layer), tree n=16 k=8 c=0.4
    (the tree drafter, 16 nodes) ..."""
    cut = {"confidence": " c=", "predicted": " a="}.get(config.adaptive, "")
    return ((f"tree n={config.tree_budget} " if config.drafter == "tree" else "") + f"k={config.k}" + (f"{cut}{config.cut:g}" if config.cut else "")
            + (" grow" if config.adaptive == "acceptance" else "")
            + (f" L={config.exit_layer}" if config.drafter == "self" else ""))


@dataclass(frozen=True)
class Plan:
    config: DecodeConfig  # the decoding settings; k, confidence and exit layer are replaced by each of the grid's
    ks: tuple[int, ...]
    confidences: tuple[float, ...] = ()  # tried in "confidence" mode (default: config.confidence)
    exit_layers: tuple[int, ...] = ()  # tried with the 'self' drafter (default: config.exit_layer)
    # other adaptive modes measured beside the chosen setting on the reported prompts, at its K, and at its cut
    # or the one given: (mode, cut or None)
    also_adaptive: tuple[tuple[str, float | None], ...] = ()
    # tree budgets to measure beside the chain: the tree drafter at each grid setting's K and cut, tuned on the
    # same prompts as the chain; the best tree is reported beside the best chain
    tree_budgets: tuple[int, ...] = ()
    reps: int = 1
    max_stall: float = 0.05  # re-measure a repetition when a call saw more CPU stall than this fraction
    retries: int = 2

    def settings(self) -> list[DecodeConfig]:
        cut_matters = self.config.adaptive in CUT_MODES and self.config.drafter != "lookup"  # lookup has no q
        cuts = self.confidences if cut_matters and self.confidences else (self.config.confidence,)
        layers = self.exit_layers if self.config.drafter == "self" and self.exit_layers else (self.config.exit_layer,)
        return [replace(self.config, k=k, confidence=c, exit_layer=n) for k in self.ks for c in cuts for n in layers]

    def tree_settings(self) -> list[DecodeConfig]:
        return [replace(c, drafter="tree", tree_budget=b) for c in self.settings() for b in self.tree_budgets]


def split(prompts: list[BenchPrompt]) -> tuple[list[BenchPrompt], list[BenchPrompt]]:
    """(tuning, reported): within each kind, every second prompt tunes, so both halves span the kinds."""
    seen: dict[str, int] = {}
    tune, report = [], []
    for p in prompts:
        seen[p.kind] = seen.get(p.kind, 0) + 1
        (tune if seen[p.kind] % 2 == 0 else report).append(p)
    if not tune and len(report) > 1:  # one prompt per kind: alternate over the whole set
        return report[1::2], report[0::2]
    return tune, report


def guarded(fn: Callable[[], object], device, tokens_of: Callable[[object], list[int]] = lambda out: out,
            events: bool = True) -> Timed:
    """fn() timed (`noise.timed`), with what torch compiled meanwhile (a compile inside a timed call is no measure
    of speed: `measure` takes such a call again)."""
    before = CompileCounts.now()
    out, seconds, stall = timed(fn, device)
    changed = CompileCounts.now().since(before)
    return Timed(tokens_of(out), seconds, stall, out if events else None, changed.graphs + changed.cudagraph_skips)


def spec_method(pair, config: DecodeConfig, suffix: str = "") -> Method:
    def run(ids):
        return guarded(lambda: list(speculative_generate(pair, ids, config)), pair.device, spec_token_ids)
    return Method(f"spec {setting_name(config)}{suffix}", run)


def ar_method(pair, config: DecodeConfig, suffix: str = "") -> Method:
    def run(ids):
        return guarded(lambda: list(autoregressive_generate(pair, ids, config)), pair.device,
                       lambda steps: [s.token.id for s in steps])
    return Method(AR + suffix, run)


def hf_method(hf: HFGenerate, name: str, max_new_tokens: int, setting: HFSetting | None = None,
              assistant=None, lookup: bool = False, static: bool = False) -> Method:
    def run(ids):
        return guarded(lambda: hf.generate(ids, max_new_tokens, setting, assistant, lookup, static), hf.device,
                       events=False)
    return Method(name, run)


def hf_assisted(hf: HFGenerate, config: DecodeConfig, assistants: dict[str, object]) -> list[Method]:
    """transformers' assisted generation beside specviz at `config`: prompt lookup at the same K for the lookup
    drafter; otherwise each assistant ("same": specviz's draft, "loaded": as loaded) at K and at HF's defaults."""
    n = config.max_new_tokens
    if config.drafter == "lookup":
        return [hf_method(hf, f"hf lookup k={config.k}", n, HFSetting.fixed(config.k), lookup=True)]
    same_k = HFSetting.fixed(config.k, config.stop_below,  # drafting as specviz does
                             "heuristic" if config.adaptive == "acceptance" else "constant")
    return [hf_method(hf, f"hf {label} {s.name}", n, s, assistant)
            for label, assistant in assistants.items() for s in (same_k, HF_DEFAULT)]


def disturbance(runs: dict[str, Timed]) -> float:
    """How disturbed a repetition was: its worst CPU stall, or wholly (1.0) where torch compiled inside a call."""
    return max((1.0 if r.compiles else r.stall or 0.0 for r in runs.values()), default=0.0)


def measure(prompt: BenchPrompt, ids: list[int], methods: list[Method], plan: Plan,
            tick: Callable[[str], None] = lambda label: None,
            on_retry: Callable[[], None] = lambda: None) -> PromptResult:
    """Every method once per repetition, in a seeded shuffled order; a disturbed repetition is taken again."""
    result = PromptResult(prompt, len(ids))
    for rep in range(plan.reps):
        order = list(methods)
        random.Random(f"{plan.config.seed}:{prompt.id}:{rep}").shuffle(order)

        def once() -> dict[str, Timed]:
            runs = {}
            for m in order:
                runs[m.name] = m.run(ids)
                tick(f"{prompt.id}: {m.name}")
            return {m.name: runs[m.name] for m in methods}  # stored in the methods' own order

        runs, attempts = calmest(once, disturbance, plan.max_stall, plan.retries, on_retry)
        result.reps.append(runs)
        result.orders.append([m.name for m in order])
        result.attempts += attempts
    return result


@dataclass
class Bench:
    settings: list[DecodeConfig]  # the grid
    chosen: DecodeConfig  # the best on the tuning split (the only one, without a grid)
    tuning: list[PromptResult]  # every setting, on the tuning prompts
    reported: list[PromptResult]  # the baselines, the chosen setting and transformers, on the other prompts
    trees: list[DecodeConfig] = field(default_factory=list)  # the tree settings tried (`Plan.tree_budgets`)
    chosen_tree: DecodeConfig | None = None  # the best of them on the tuning split, reported beside `chosen`


def tuned_best(tuning: list[PromptResult], settings: list[DecodeConfig]) -> DecodeConfig:
    """The setting with the most tokens per second pooled over the tuning prompts (ratio of totals)."""
    def rate(config):
        runs = [rep[f"spec {setting_name(config)}"] for r in tuning for rep in r.reps]
        seconds = sum(x.seconds for x in runs)
        return sum(len(x.tokens) for x in runs) / seconds if seconds else 0.0
    return max(settings, key=rate)


@dataclass(frozen=True)
class Lanes:
    """What a bench's methods run on: the pair, transformers' generate() with its assistants ({}: no assisted
    generation), the pair on the kernels as loaded (`UNTUNED`) and on its eager one-token steps (`EAGER`), where
    asked for and where different."""

    pair: object
    hf: HFGenerate
    assistants: dict[str, object]
    untuned: object | None = None
    eager: object | None = None


def eager_of(pair):
    """`pair` on its eager one-token steps where its target step runs compiled (None: it runs eager already)."""
    eager = getattr(pair, "eager_steps", None)
    return eager if eager is not None and eager.target is not pair.target else None


def reported_methods(lanes: Lanes, plan: Plan, chosen: DecodeConfig, tree: DecodeConfig | None = None) -> list[Method]:
    """Every method a reported prompt runs: the target alone (specviz's lane, transformers', and on a GPU its static
    compiled generate()), the chosen setting, the chosen tree and the other adaptive modes beside it, the untuned and
    eager lanes, and transformers' assisted generation."""
    pair, hf, untuned, eager, n = lanes.pair, lanes.hf, lanes.untuned, lanes.eager, chosen.max_new_tokens
    specs = {setting_name(chosen): chosen}  # each setting once, the chosen one first
    if tree is not None:
        specs[setting_name(tree)] = tree
    for mode, cut in plan.also_adaptive:
        c = replace(chosen, adaptive=mode, confidence=chosen.confidence if cut is None else cut)
        specs.setdefault(setting_name(c), c)
    return [ar_method(pair, chosen), hf_method(hf, AR_HF, n),
            *([hf_method(hf, AR_HF_STATIC, n, static=True)] if hf.device.type == "cuda" else []),
            *(spec_method(pair, c) for c in specs.values()),
            *([ar_method(untuned, chosen, UNTUNED)] if untuned is not None else []),
            *([ar_method(eager, chosen, EAGER)] if eager is not None else []),
            *(spec_method(untuned, c, UNTUNED) for c in (chosen, tree) if untuned is not None and c is not None),
            *(hf_assisted(hf, chosen, lanes.assistants) if lanes.assistants else [])]


def warm_up(lanes: Lanes, plan: Plan, ids: list[int]) -> None:
    """Every method once on a short run, before any timing: first calls pay for allocations and kernel selection,
    and a compiled step's every cache size and buffer set is made."""
    def short(c):
        return replace(c, max_new_tokens=8)
    settings = plan.settings() + plan.tree_settings()
    warm_sizes(lanes.pair.target, sets=2)
    warm_sizes(lanes.pair.draft)
    for m in [*(spec_method(lanes.pair, short(c)) for c in settings), *reported_methods(lanes, plan, short(settings[0]))]:
        m.run(ids)


def run_bench(pair, prompts: list[BenchPrompt], plan: Plan, hf: HFGenerate, assistants: dict[str, object] | None = None,
              progress: bool = True, untuned=None, on_prompt: Callable[[Bench], None] | None = None) -> Bench:
    """Tune (with several settings), then measure the chosen one against every baseline; `on_prompt` gets the bench
    so far after each reported prompt (a report written as it goes: a killed run keeps what it finished).
    `assistants`: the drafts transformers gets ({} or None: no assisted generation). `untuned`: `pair` on the
    kernels as loaded; the target alone and the chosen chain and tree run on it too (methods named ...`UNTUNED`).
    Where `pair`'s target step runs compiled, the target alone also runs on its eager step (`AR_EAGER`)."""
    from tqdm.auto import tqdm

    lanes = Lanes(pair, hf, assistants or {}, untuned, eager_of(pair))
    settings, trees = plan.settings(), plan.tree_settings()
    several = len(settings) > 1 or len(trees) > 1
    tune, report = split(prompts) if several else ([], prompts)
    if several and not tune:
        raise ValueError("choosing among several settings needs at least 2 prompts: one to tune on, one to report")
    encoded = {p.id: encode_prompt(pair.tokenizer, p.prompt) for p in prompts}
    tuning_methods = [spec_method(pair, c) for c in settings + trees]
    warm_up(lanes, plan, encoded[prompts[0].id])
    per_report = len(reported_methods(lanes, plan, plan.config, trees[0] if trees else None))
    calls = plan.reps * (len(tune) * len(tuning_methods) + len(report) * per_report)
    with tqdm(total=calls, desc="bench", unit="run", disable=not progress) as bar:
        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        def grow(n: int) -> None:  # a repetition measured again
            bar.total += n
            bar.refresh()

        tuning = [measure(p, encoded[p.id], tuning_methods, plan, tick, lambda: grow(len(tuning_methods)))
                  for p in tune]
        chosen = tuned_best(tuning, settings) if tuning else settings[0]
        tree = (tuned_best(tuning, trees) if tuning else trees[0]) if trees else None
        methods = reported_methods(lanes, plan, chosen, tree)
        reported = []
        for p in report:
            reported.append(measure(p, encoded[p.id], methods, plan, tick, lambda: grow(per_report)))
            if on_prompt is not None:
                on_prompt(Bench(settings, chosen, tuning, list(reported), trees, tree))
    return Bench(settings, chosen, tuning, reported, trees, tree)
