"""Run the benchmark: for each prompt, the target alone, speculative decoding at each K, and
(optionally) transformers' assisted generation at the same K and at its defaults.

All methods of one prompt run back to back (interleaved), so a burst of machine noise hits them
alike; everything is warmed up first. Times are wall-clock around the whole call, prompt
reading included, exactly as a user would wait for it. The CPU stall seen during each call is
recorded (see `noise.py`); a prompt whose calls were disturbed is measured again, up to a limit,
and the least disturbed attempt is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specviz.bench.hf import HF_DEFAULT, HFAssisted, HFResult, HFSetting
from specviz.bench.noise import calmest, timed
from specviz.bench.prompts import BenchPrompt
from specviz.engine import DecodeConfig, Round, Step, autoregressive_generate, speculative_generate
from specviz.analysis.divergence import spec_token_ids
from specviz.models import encode_prompt


@dataclass
class TimedRun:
    events: list  # Rounds or Steps; the first carries the prompt's forward as prefill_time
    seconds: float  # the whole call, prompt reading included
    stall: float | None = None  # fraction of the call's wall time another task waited for a CPU

    @property
    def prefill(self) -> float:
        return self.events[0].prefill_time if self.events else 0.0

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.prefill


class SpecRun(TimedRun):
    @property
    def rounds(self) -> list[Round]:
        return self.events

    @property
    def tokens(self) -> list[int]:
        return spec_token_ids(self.events)


class ARRun(TimedRun):
    @property
    def steps(self) -> list[Step]:
        return self.events

    @property
    def tokens(self) -> list[int]:
        return [s.token.id for s in self.events]


@dataclass
class PromptResult:
    prompt: BenchPrompt
    prompt_tokens: int
    ar: ARRun
    spec: dict[int, SpecRun] = field(default_factory=dict)  # by K
    hf: dict[str, HFResult] = field(default_factory=dict)  # by setting name ("k=4", "default")
    attempts: int = 1

    @property
    def max_stall(self) -> float:
        runs = [self.ar, *self.spec.values(), *self.hf.values()]
        return max((r.stall for r in runs if r.stall is not None), default=0.0)


@dataclass(frozen=True)
class Plan:
    ks: tuple[int, ...]
    config: DecodeConfig  # its k is replaced by each of ks
    max_stall: float = 0.05  # re-measure a prompt when a call saw more CPU stall than this fraction
    retries: int = 2

    def hf_setting(self, k: int) -> HFSetting:
        """HF at the same K, drafting as specviz does: a constant K, or at most K with the same confidence cut."""
        return HFSetting.fixed(k, self.config.stop_below)

    def hf_settings(self) -> list[HFSetting]:
        return [self.hf_setting(k) for k in self.ks] + [HF_DEFAULT]

    def calls_per_prompt(self, hf: bool) -> int:
        return 1 + len(self.ks) + (len(self.hf_settings()) if hf else 0)


def run_ar(pair, ids: list[int], config: DecodeConfig) -> ARRun:
    return ARRun(*timed(lambda: list(autoregressive_generate(pair, ids, config)), pair.device))


def run_spec(pair, ids: list[int], config: DecodeConfig) -> SpecRun:
    return SpecRun(*timed(lambda: list(speculative_generate(pair, ids, config)), pair.device))


def run_hf(hf: HFAssisted, ids: list[int], max_new_tokens: int, setting: HFSetting) -> HFResult:
    return HFResult(*timed(lambda: hf.generate(ids, max_new_tokens, setting), hf.device))


def warm_up(pair, hf: HFAssisted | None, ids: list[int], plan: Plan, tokens: int = 8) -> None:
    """One short run of every method: first calls pay for allocations and kernel selection."""
    config = replace(plan.config, max_new_tokens=tokens)
    run_ar(pair, ids, config)
    for k in plan.ks:
        run_spec(pair, ids, replace(config, k=k))
    if hf is not None:
        for setting in plan.hf_settings():
            hf.generate(ids, tokens, setting)


def run_prompt(pair, hf: HFAssisted | None, prompt: BenchPrompt, plan: Plan,
               tick: Callable[[str], None] = lambda label: None) -> PromptResult:
    """AR, then for each K: specviz and HF at that K, then HF at its defaults."""
    ids = encode_prompt(pair.tokenizer, prompt.prompt)
    result = PromptResult(prompt, len(ids), run_ar(pair, ids, plan.config))
    tick(f"{prompt.id}: AR")
    for k in plan.ks:
        result.spec[k] = run_spec(pair, ids, replace(plan.config, k=k))
        tick(f"{prompt.id}: spec K={k}")
        if hf is not None:
            setting = plan.hf_setting(k)
            result.hf[setting.name] = run_hf(hf, ids, plan.config.max_new_tokens, setting)
            tick(f"{prompt.id}: HF {setting.name}")
    if hf is not None:
        result.hf[HF_DEFAULT.name] = run_hf(hf, ids, plan.config.max_new_tokens, HF_DEFAULT)
        tick(f"{prompt.id}: HF default")
    return result


def measure_prompt(pair, hf: HFAssisted | None, prompt: BenchPrompt, plan: Plan,
                   tick: Callable[[str], None] = lambda label: None,
                   on_retry: Callable[[], None] = lambda: None) -> PromptResult:
    """`run_prompt`, again while another process disturbed it (up to plan.retries); keeps the calmest."""
    best, attempts = calmest(lambda: run_prompt(pair, hf, prompt, plan, tick), lambda r: r.max_stall,
                             plan.max_stall, plan.retries, on_retry)
    best.attempts = attempts  # how many times this prompt was measured
    return best


def run_bench(pair, prompts: list[BenchPrompt], plan: Plan, hf: HFAssisted | None = None,
              progress: bool = True) -> list[PromptResult]:
    from tqdm.auto import tqdm

    warm_up(pair, hf, encode_prompt(pair.tokenizer, prompts[0].prompt), plan)
    results = []
    calls = plan.calls_per_prompt(hf is not None)
    with tqdm(total=len(prompts) * calls, desc="bench", unit="run", disable=not progress) as bar:
        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        def on_retry() -> None:
            bar.total += calls
            bar.refresh()

        for prompt in prompts:
            results.append(measure_prompt(pair, hf, prompt, plan, tick, on_retry))
    return results

