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

from specviz.analysis.proof import PositionResult, Verdict
from specviz.engine import SamplingParams
from specviz.runs.errors import InputError
from specviz.runs.job import prepare
from specviz.runs.limits import Limits
from specviz.runs.proof import ProofSettings, prove
from specviz.runs.session import Session
from specviz.runs.settings import validate

POSITIONS = 3


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


def compare_position(spec_p: PositionResult, ar_p: PositionResult, decode) -> PositionComparison:
    spec_top, ar_top = {t: (e, o) for t, e, o in spec_p.top}, {t: (e, o) for t, e, o in ar_p.top}
    both = spec_p.n + ar_p.n

    def exact(t):  # pooled over both samplers' prefixes, weighted by their sample counts
        return (spec_top.get(t, (0, 0))[0] * spec_p.n + ar_top.get(t, (0, 0))[0] * ar_p.n) / both

    ids = sorted(spec_top.keys() | ar_top.keys(), key=lambda t: -exact(t))[:12]
    return PositionComparison(spec_p.position, ids, [decode([t]) for t in ids], [exact(t) for t in ids],
                              [spec_top.get(t, (0, 0))[1] for t in ids], [ar_top.get(t, (0, 0))[1] for t in ids],
                              spec_p, ar_p)


def sample_distribution(session: Session, limits: Limits, prompt, settings: dict, experiment: dict
                        ) -> Iterator[DistributionResult]:
    """Validate, then yield both samplers' results after each batch of paths.
    `settings`: the decoding settings (their temperature is the experiment's)."""
    exp = validate(DistributionSettings, experiment, limits)
    job = prepare(session, limits, prompt, {**settings, "temperature": exp.temperature})
    if job.config.sampling.greedy:
        raise InputError("the same-distribution test needs sampling: set a temperature above 0.")
    proof = ProofSettings(samples=exp.samples, length=POSITIONS, controls=False, control_samples=exp.samples)
    decode = job.pair.tokenizer.decode
    for progress in session.stream(lambda pair: prove(pair, job.ids, job.config, proof)):
        spec_v, ar_v = progress.verdicts
        positions = [compare_position(s, a, decode) for s, a in zip(spec_v.positions, ar_v.positions)]
        yield DistributionResult(positions, spec_v, ar_v, job.prompt, progress.done == progress.total)
