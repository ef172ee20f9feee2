"""The "same distribution" experiment: speculative decoding samples exactly what the target samples.

The app's view of the proof (`runs.proof`): N continuations of 3 tokens drawn with speculative decoding
and N with the target alone (seed i for the i-th, in alternating batches so a stopped run stays fair),
each position scored against the target's exact conditionals. Position 1 is where every drafter is
usually right; positions 2 and 3 come after accepted drafts, corrections and bonuses, and (with
max_new_tokens = 3 + K) include drafts made right after a clean sweep.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic.dataclasses import dataclass as spec

from specviz.analysis.proof import PooledPosition, PositionResult, Verdict
from specviz.engine import SamplingParams
from specviz.settings.errors import InputError
from specviz.runs.job import prepare
from specviz.settings.limits import Limits, budget
from specviz.runs.proof import ProofSettings, prove
from specviz.serving.session import Session
from specviz.settings.spec import validate
from specviz.serving.turns import Waiting

POSITIONS = 3
FULL_SAMPLES_UP_TO = 256  # prompt tokens: longer prompts get proportionally fewer samples (see `samples_for`)


@spec(frozen=True)
class DistributionSettings:
    samples: int = Field(200, ge=16, title="samples", description="continuations per side",
                         json_schema_extra={"limit": "max_samples"})
    # the decoder's own temperature setting (range, checks), with the experiment's default and help
    temperature: float = FieldInfo.merge_field_infos(SamplingParams.__pydantic_fields__["temperature"], default=1.0,
                                                     description="the test needs sampling: > 0")


@dataclass(frozen=True)
class PositionComparison:
    """One position, both samplers: the shown tokens' exact and observed shares, and the statistics."""

    position: int
    token_ids: list[int]
    texts: list[str]
    exact: list[float]  # mean of each sample's exact conditional (both samplers' samples pooled)
    spec: list[float]
    ar: list[float]
    stats_spec: PositionResult
    stats_ar: PositionResult


@dataclass(frozen=True)
class DistributionResult:
    positions: list[PositionComparison]
    spec: Verdict  # whole-path results: the sequential test, the verdict
    ar: Verdict
    prompt: str
    done: bool
    finished: str | None = None  # "budget": the request's time ran out; the results cover what was drawn
    note: str = ""  # why fewer samples ran than were asked for, if they did


def samples_for(asked: int, prompt_tokens: int, limits: Limits) -> tuple[int, str]:
    """The samples a request may run, and a note when it is fewer than asked. Each path copies the
    prompt's cache for both models and attends over the whole prompt, so its cost grows with the
    prompt: the allowance shrinks in proportion past FULL_SAMPLES_UP_TO tokens, for the budget to hold."""
    allowed = max(16, limits.max_samples * FULL_SAMPLES_UP_TO // max(prompt_tokens, FULL_SAMPLES_UP_TO))
    if asked <= allowed:
        return asked, ""
    return allowed, (f"{allowed} samples per side, not {asked}: a {prompt_tokens}-token prompt allows at most "
                     f"{allowed} (the allowance shrinks with the prompt's length).")


def compare_position(spec_p: PositionResult, ar_p: PositionResult, both: PooledPosition, decode
                     ) -> PositionComparison:
    spec, ar = both.observed
    return PositionComparison(spec_p.position, both.token_ids, [decode([t]) for t in both.token_ids], both.exact,
                              spec, ar, spec_p, ar_p)


def sample_distribution(session: Session, limits: Limits, prompt, settings: dict, experiment: dict,
                        owner: str | None = None) -> Iterator[DistributionResult | Waiting]:
    """Validate, then yield both samplers' results after each batch of paths (before them, a `Waiting` while
    other jobs are ahead in the queue). `settings`: the decoding settings (their temperature is the experiment's)."""
    exp = validate(DistributionSettings, experiment, limits)
    job = prepare(session, limits, prompt, {**settings, "temperature": exp.temperature})
    if job.config.sampling.greedy:
        raise InputError("the same-distribution test needs sampling: set a temperature above 0.")
    samples, note = samples_for(exp.samples, len(job.ids), limits)
    proof = ProofSettings(samples=samples, length=POSITIONS, controls=False, control_samples=samples)
    decode = job.pair.tokenizer.decode
    runs = session.stream(lambda pair: prove(pair, job.ids, job.config, proof, should_stop=budget(limits.max_seconds)),
                          kind="distribution", work=samples, owner=owner)
    for progress in runs:
        if isinstance(progress, Waiting):
            yield progress
            continue
        spec_v, ar_v = progress.verdicts
        positions = [compare_position(s, a, both, decode)
                     for s, a, both in zip(spec_v.positions, ar_v.positions, progress.pooled)]
        done = progress.done == progress.total or progress.finished is not None
        yield DistributionResult(positions, spec_v, ar_v, job.prompt, done, progress.finished, note)
