"""The JSON side of the app, for scripts (gradio_client): the same work as the UI, as plain dicts.

app.py registers these under named endpoints (/generate, /race, /replay, /same_distribution).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import asdict

from specviz.engine import Round, Step, speculative_generate
from specviz.limits import Limits
from specviz.race import RaceState, race, replay_race
from specviz.ui.handlers import (
    Options, RunRecord, Settings, locked, paced, prepare, sample_distributions, trace_data, trace_text_or_name,
    user_errors,
)
from specviz.ui.session import Session
from specviz.ui.stats import RunStats, race_stats, summarize


def lane_dict(lane) -> dict:
    return {"tokens": lane.tokens, "clock_s": lane.clock, "tokens_per_s": lane.tokens_per_s,
            "text": lane.text, "finished": lane.finished}


def stats_dict(s: RunStats) -> dict:
    return asdict(s)


def rounds_summary(meta: dict, rounds: list[Round], steps: list[Step] | None = None) -> dict:
    s = summarize(rounds, steps)
    return {"event": "done", "text": rounds[-1].text if rounds else "", "rounds": len(rounds),
            "finished": rounds[-1].finished if rounds else None, "stats": stats_dict(s), "meta": meta}


@user_errors
def generate(session: Session, limits: Limits, prompt, settings: Settings) -> Iterator[dict]:
    job = prepare(session, limits, prompt, settings)
    rounds: list[Round] = []
    with closing(locked(session, lambda pair: speculative_generate(pair, job.ids, job.config))) as events:
        for r in events:
            rounds.append(r)
            yield {"event": "round", "round": r.to_dict()}
    yield rounds_summary(job.meta, rounds)


def race_dict(state: RaceState, meta: dict | None = None) -> dict:
    d = state.divergence
    out = {"event": "done" if state.done else "race", "ar": lane_dict(state.ar), "spec": lane_dict(state.spec),
           "speedup": state.speedup, "greedy": state.greedy,
           "divergence": None if d is None else asdict(d)}
    if state.done:
        out["stats"] = stats_dict(race_stats(state))
        out["identical"] = state.identical
        out["meta"] = meta
    return out


@user_errors
def run_race(session: Session, limits: Limits, prompt, settings: Settings,
             options: Options = Options()) -> Iterator[dict]:
    job = prepare(session, limits, prompt, settings)
    with closing(paced(locked(session, lambda pair: race(pair, job.ids, job.config)), options.min_interval)) as events:
        for state, show in events:
            if show:
                yield race_dict(state, job.meta)


@user_errors
@trace_data
def replay(trace: str, options: Options = Options()) -> Iterator[dict]:
    t, _ = trace_text_or_name(trace, options)
    for r in t.rounds:
        yield {"event": "round", "round": r.to_dict()}
    out = rounds_summary(t.meta, t.rounds, t.ar_steps or None)
    if t.ar_steps:
        *_, final = replay_race(t.rounds, t.ar_steps, RunRecord(t.meta).greedy)
        out["race"] = race_dict(final, t.meta)
    yield out


@user_errors
def same_distribution(session: Session, limits: Limits, prompt, settings: Settings, n, temperature) -> Iterator[dict]:
    with closing(sample_distributions(session, limits, prompt, settings, n, temperature)) as results:
        for c, texts, done in results:
            tokens = [{"id": t, "text": x, "exact": e, "ar": a, "spec": sp}
                      for t, x, e, a, sp in zip(c.token_ids, texts, c.exact, c.ar, c.spec)]
            yield {"event": "done" if done else "progress", "samples": min(c.n_ar, c.n_spec), "tv_ar": c.tv_ar,
                   "tv_spec": c.tv_spec, "p_ar": c.p_ar, "p_spec": c.p_spec, "tv_noise": c.tv_noise,
                   "tokens": tokens}
