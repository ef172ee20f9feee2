"""The run paths' results as JSON-ready dicts: pure functions, no Gradio, no models."""

from __future__ import annotations

from dataclasses import asdict

from specviz.analysis.stats import run_stats
from specviz.engine import Round
from specviz.runs.distribution import DistributionResult
from specviz.runs.race import Lane, RaceState
from specviz.serving.recorded import iso_time
from specviz.runs.trace import Trace
from specviz.serving.turns import Waiting


def queued(w: Waiting) -> dict:
    """A job's place in the model's queue, before its first result: `position` 1 runs next, `ahead` counts the
    running job too, `estimate_s` (null until a kind ahead was timed) from the measured durations of those jobs."""
    return {"event": "queued", "position": w.position, "ahead": w.ahead, "estimate_s": w.estimate_s}


def round_event(r: Round) -> dict:
    return {"event": "round", "round": r.to_dict()}


def run_summary(trace: Trace) -> dict:
    """The last message of a run or a replay: its text, how it ended, its statistics and its meta."""
    rounds = trace.rounds
    return {"event": "done", "text": rounds[-1].text if rounds else "", "rounds": len(rounds),
            "finished": rounds[-1].finished if rounds else None,
            "stats": run_stats(rounds, trace.ar_steps or None).to_dict(), "meta": asdict(trace.meta),
            "recorded_at": iso_time(trace.recorded_at)}


def lane_dict(lane: Lane) -> dict:
    return {"tokens": lane.tokens, "clock_s": lane.clock, "tokens_per_s": lane.tokens_per_s,
            "prefill_s": lane.prefill, "decode_s": lane.decode_seconds, "decode_tokens_per_s": lane.decode_tokens_per_s,
            "text": lane.text, "finished": lane.finished}


def race_dict(state: RaceState) -> dict:
    d = state.divergence
    out = {"event": "done" if state.done else "race", "ar": lane_dict(state.ar), "spec": lane_dict(state.spec),
           "speedup": state.speedup, "decode_speedup": state.decode_speedup if state.done else None,
           "greedy": state.greedy, "divergence": None if d is None else asdict(d), "cpu_shared": state.shared_cpu,
           "timing_note": state.timing_note, "recorded_at": iso_time(state.recorded_at)}  # a recorded answer: when this server ran it
    if state.done:
        out.update(stats=state.stats().to_dict(), identical=state.identical, meta=asdict(state.meta))
    return out


def distribution_dict(result: DistributionResult) -> dict:
    positions = [{"position": c.position, "n_ar": c.stats_ar.n, "n_spec": c.stats_spec.n,
                  "tv_ar": c.stats_ar.tv, "tv_spec": c.stats_spec.tv, "tv_noise": c.stats_spec.tv_noise,
                  "p_ar": c.stats_ar.chi2_p, "p_spec": c.stats_spec.chi2_p,
                  "pit_p_ar": c.stats_ar.ks_p, "pit_p_spec": c.stats_spec.ks_p,
                  "tokens": [{"id": t, "text": x, "exact": e, "ar": a, "spec": sp}
                             for t, x, e, a, sp in zip(c.token_ids, c.texts, c.exact, c.ar, c.spec)]}
                 for c in result.positions]
    return {"event": "done" if result.done else "progress", "samples": min(result.ar.samples, result.spec.samples),
            "path_p_ar": result.ar.ks_p, "path_p_spec": result.spec.ks_p, "rejected": result.spec.rejected,
            "finished": result.finished, "note": result.note, "positions": positions}
