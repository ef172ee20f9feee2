"""The "same distribution" experiment: speculative decoding samples exactly what the target samples.

Draw N short continuations with speculative decoding and N with the target alone (seed i for the
i-th), and compare the first generated token's empirical frequencies with the target's exact
distribution at the prompt (`analysis.distribution`). With max_new_tokens = 2 the speculative run
drafts one token in its first round, so every first token has been through accept/reject
(accepted draft or correction).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic.dataclasses import dataclass as spec

from specviz.analysis.distribution import Comparison, compare
from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.exact import next_token_distribution
from specviz.runs.errors import InputError
from specviz.runs.job import prepare
from specviz.runs.limits import Limits
from specviz.runs.session import Session
from specviz.runs.settings import validate

SPEC_TOKENS = 2  # one drafted + verified token, then its correction/bonus


@spec(frozen=True)
class DistributionSettings:
    samples: int = Field(200, ge=1, title="samples", description="continuations per side",
                         json_schema_extra={"limit": "max_samples"})
    # the decoder's own temperature setting (range, checks), with the experiment's default and help
    temperature: float = FieldInfo.merge_field_infos(SamplingParams.__pydantic_fields__["temperature"], default=1.0,
                                                     description="the test needs sampling: > 0")


@dataclass(frozen=True)
class DistributionResult:
    comparison: Comparison
    texts: list[str]  # the shown tokens' texts, in `comparison.token_ids` order
    prompt: str
    done: bool


def _first(events: Iterator):
    try:
        return next(events)
    finally:
        events.close()  # only the first event is needed: free the run's caches now


def first_token_spec(pair, prompt_ids: list[int], config: DecodeConfig) -> int:
    return _first(speculative_generate(pair, prompt_ids, replace(config, max_new_tokens=SPEC_TOKENS))).new_token_ids[0]


def first_token_ar(pair, prompt_ids: list[int], config: DecodeConfig) -> int:
    return _first(autoregressive_generate(pair, prompt_ids, replace(config, max_new_tokens=1))).token.id


def sample_both(pair, prompt_ids: list[int], config: DecodeConfig, n: int,
                every: int = 10) -> Iterator[tuple[Counter, Counter, int]]:
    """Alternate one speculative and one target-alone sample (seed = config.seed + i); yield the
    counts every `every` pairs and at the end. Interleaving keeps both sides comparable if stopped early."""
    base = config.seed or 0
    counts_ar, counts_spec = Counter(), Counter()
    for i in range(n):
        c = replace(config, seed=base + i)
        counts_spec[first_token_spec(pair, prompt_ids, c)] += 1
        counts_ar[first_token_ar(pair, prompt_ids, c)] += 1
        if (i + 1) % every == 0 or i + 1 == n:
            yield counts_ar, counts_spec, i + 1


def sample_distribution(session: Session, limits: Limits, prompt, settings: dict, experiment: dict
                        ) -> Iterator[DistributionResult]:
    """Validate, then compare both samplers with the exact distribution every n/20 sample pairs.
    `settings`: the decoding settings (their temperature and max new tokens are the experiment's)."""
    exp = validate(DistributionSettings, experiment, limits)
    job = prepare(session, limits, prompt, {**settings, "temperature": exp.temperature,
                                            "max_new_tokens": SPEC_TOKENS})
    if job.config.sampling.greedy:
        raise InputError("the same-distribution test needs sampling: set a temperature above 0.")
    with session.using() as pair:
        exact = next_token_distribution(pair, job.ids, job.config.sampling)
    n = exp.samples
    for counts_ar, counts_spec, done in session.stream(
            lambda pair: sample_both(pair, job.ids, job.config, n, max(1, n // 20))):
        c = compare(exact, counts_ar, counts_spec)
        yield DistributionResult(c, [job.pair.tokenizer.decode([t]) for t in c.token_ids], job.prompt, done == n)
