"""Turn benchmark results into the JSON report and a readable table.

Every aggregate is a ratio of totals (tokens summed over prompts / seconds summed over prompts),
never a mean of per-prompt ratios, so long and short prompts weigh what they cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

from specviz.analysis.predict import CostModel, best_k, predicted_speedup, predicted_speedup_for_rounds
from specviz.bench.runner import Plan, PromptResult
from specviz.analysis.stats import SpecStats, ratio, spec_stats
from specviz.analysis.divergence import first_divergence

PREDICT_KS = range(1, 17)


def pooled_spec(results: Sequence[PromptResult], k: int) -> SpecStats:
    """All prompts' rounds at K as one stream, timed by the summed wall-clock."""
    rounds = [r for res in results for r in res.spec[k].rounds]
    return spec_stats(rounds, sum(res.spec[k].seconds for res in results))


def pooled_rate(pairs: Sequence[tuple[int, float]]) -> float:
    """tokens/s over (tokens, seconds) pairs: Σ tokens / Σ seconds."""
    return ratio(sum(t for t, _ in pairs), sum(s for _, s in pairs))


def ar_rate(results: Sequence[PromptResult]) -> float:
    return pooled_rate([(len(r.ar.tokens), r.ar.seconds) for r in results])


def by_kind(results: Sequence[PromptResult]) -> dict[str, list[PromptResult]]:
    return {kind: [r for r in results if r.prompt.kind == kind] for kind in sorted({r.prompt.kind for r in results})}


def decode_rate(runs) -> float:
    """tokens/s after the prompt's forward (Σ tokens / Σ (seconds - prefill)): what the rounds speed up."""
    return pooled_rate([(len(r.tokens), r.decode_seconds) for r in runs])


def hf_rate(results: Sequence[PromptResult], setting: str) -> float | None:
    runs = [r.hf[setting] for r in results if setting in r.hf]
    return pooled_rate([(len(h.tokens), h.seconds) for h in runs]) if runs else None


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, digits)


def predicted_for(rounds, stats: SpecStats, cost: CostModel | None) -> float | None:
    """The cost model over these rounds' own K's and tokens (see `predicted_speedup_for_rounds`)."""
    if cost is None or not stats.tested:
        return None
    return predicted_speedup_for_rounds([r.k for r in rounds], stats.tokens, cost)


def run_record(res: PromptResult, k: int, greedy: bool, cost: CostModel | None) -> dict:
    spec = res.spec[k]
    stats = spec_stats(spec.rounds, spec.seconds)
    ar_tps, spec_tps = ratio(len(res.ar.tokens), res.ar.seconds), stats.tokens_per_s
    hf = res.hf.get(f"k={k}")
    hf_default = res.hf.get("default")
    div = first_divergence(spec.rounds, res.ar.steps) if greedy else None
    return {
        "id": res.prompt.id, "kind": res.prompt.kind, "k": k, "new_tokens": stats.tokens,
        "ar_tokens_per_s": _round(ar_tps), "spec_tokens_per_s": _round(spec_tps),
        "hf_tokens_per_s": _round(ratio(len(hf.tokens), hf.seconds)) if hf else None,
        "speedup": _round(ratio(spec_tps, ar_tps)),
        "decode_speedup": _round(ratio(decode_rate([spec]), decode_rate([res.ar]))),
        "acceptance_rate": _round(stats.acceptance_rate), "mean_accepted_tokens": _round(stats.mean_accepted_tokens),
        "identical_to_ar": div is None if greedy else None,
        "first_divergence": None if div is None else {
            "position": div.position, "target_top2_gap": _round(div.target_top2_gap),
            "spec_top2_gap": _round(div.spec_top2_gap)},
        # extras beyond the issue's keys
        "prompt_tokens": res.prompt_tokens, "ar_new_tokens": len(res.ar.tokens),
        "hf_default_tokens_per_s": _round(ratio(len(hf_default.tokens), hf_default.seconds)) if hf_default else None,
        "hf_identical_to_ar": (hf.tokens == res.ar.tokens) if hf and greedy else None,
        "hf_default_identical_to_ar": (hf_default.tokens == res.ar.tokens) if hf_default and greedy else None,
        "predicted_speedup": _round(predicted_for(spec.rounds, stats, cost)),
        "cpu_stall": {"ar": _round(res.ar.stall), "spec": _round(spec.stall),
                      "hf": _round(hf.stall) if hf else None, "hf_default": _round(hf_default.stall) if hf_default else None},
        "attempts": res.attempts,
        "rounds": stats.rounds, "per_position_acceptance": [_round(a) for a in stats.per_position],
        "accepted_lengths": stats.accepted_lengths,
        "prefill_s": {"ar": _round(res.ar.prefill), "spec": _round(spec.prefill)},
        "seconds": {"ar": _round(res.ar.seconds), "spec": _round(spec.seconds), "draft": _round(stats.draft_s),
                    "verify": _round(stats.verify_s), "overhead": _round(stats.overhead_s)},
    }


def k_summary(results: Sequence[PromptResult], k: int, greedy: bool, cost: CostModel | None,
              ar_tps: float, ar_by_kind: dict[str, float]) -> dict:
    """All prompts pooled at K; `ar_tps` and `ar_by_kind` are the target alone's pooled rates."""
    stats = pooled_spec(results, k)
    speedup = ratio(stats.tokens_per_s, ar_tps)
    predicted = predicted_for([r for res in results for r in res.spec[k].rounds], stats, cost)
    kinds = {kind: pooled_spec(rs, k) for kind, rs in by_kind(results).items()}
    hf_same_k = hf_rate(results, f"k={k}")
    return {
        "k": k, "spec_tokens_per_s": _round(stats.tokens_per_s), "speedup": _round(speedup),
        "speedup_by_kind": {kind: _round(ratio(ks.tokens_per_s, ar_by_kind[kind])) for kind, ks in kinds.items()},
        "decode_speedup": _round(ratio(decode_rate([r.spec[k] for r in results]), decode_rate([r.ar for r in results]))),
        "prefill_s": {"ar": _round(sum(r.ar.prefill for r in results)),
                      "spec": _round(sum(r.spec[k].prefill for r in results))},
        "acceptance_rate": _round(stats.acceptance_rate),
        "acceptance_by_kind": {kind: _round(ks.acceptance_rate) for kind, ks in kinds.items()},
        "mean_accepted_tokens": _round(stats.mean_accepted_tokens),
        "per_position_acceptance": [_round(a) for a in stats.per_position],
        "accepted_lengths": stats.accepted_lengths,
        "identical_fraction": _round(sum(r.spec[k].tokens == r.ar.tokens for r in results) / len(results))
        if greedy else None,
        "predicted_speedup": _round(predicted), "efficiency": _round(ratio(speedup, predicted) if predicted else None),
        "predicted_speedup_fixed_k": _round(predicted_speedup(stats.per_position, cost, k)) if cost and stats.tested else None,
        "event_overhead": _round(stats.event_overhead),
        "round_ms": {"draft": _round(1e3 * stats.draft_s / stats.rounds, 2),
                     "verify": _round(1e3 * stats.verify_s / stats.rounds, 2),
                     "overhead": _round(1e3 * stats.overhead_s / stats.rounds, 2)} if stats.rounds else None,
        "hf_tokens_per_s": _round(hf_same_k),
        "vs_hf_same_k": _round(ratio(stats.tokens_per_s, hf_same_k)) if hf_same_k else None,
    }


def cost_record(cost: CostModel | None, stall: float | None = None) -> dict | None:
    if cost is None:
        return None
    return {"target_step_ms": _round(1e3 * cost.target_step_s, 2), "draft_step_ms": _round(1e3 * cost.draft_step_s, 2),
            "c": _round(cost.c), "verify_ms": [_round(1e3 * t, 2) for t in cost.verify_s],
            "verify_ratio": [_round(r) for r in cost.verify_ratio], "cpu_stall": _round(stall)}


def build_report(results: Sequence[PromptResult], plan: Plan, cost: CostModel | None, *,
                 device: str, dtype: str, meta: dict | None = None, cost_stall: float | None = None) -> dict:
    greedy = plan.config.sampling.greedy
    ar_tps = ar_rate(results)
    ar_by_kind = {kind: ar_rate(rs) for kind, rs in by_kind(results).items()}
    by_k = {k: k_summary(results, k, greedy, cost, ar_tps, ar_by_kind) for k in plan.ks}
    k_best = max(plan.ks, key=lambda k: by_k[k]["spec_tokens_per_s"] or 0.0)
    best = by_k[k_best]
    settings = sorted({name for r in results for name in r.hf})
    hf_tps = {name: hf_rate(results, name) for name in settings}
    hf = {name: {"tokens_per_s": _round(hf_tps[name]), "speedup": _round(ratio(hf_tps[name], ar_tps)),
                 "identical_fraction": _round(sum(r.hf[name].tokens == r.ar.tokens for r in results) / len(results))
                 if greedy else None}
          for name in settings}
    hf_best = max(settings, key=lambda n: hf[n]["tokens_per_s"] or 0.0) if settings else None
    alpha = pooled_spec(results, max(plan.ks)).per_position
    curve = {k: _round(predicted_speedup(alpha, cost, k)) for k in PREDICT_KS} if cost and alpha else {}
    summary = {
        "speedup": best["speedup"], "speedup_by_kind": best["speedup_by_kind"],
        "decode_speedup": best["decode_speedup"],
        "vs_hf": _round(ratio(best["spec_tokens_per_s"], hf[hf_best]["tokens_per_s"])) if hf_best else None,
        "acceptance_rate": best["acceptance_rate"], "identical_fraction": best["identical_fraction"],
        "predicted_speedup": best["predicted_speedup"], "efficiency": best["efficiency"],
        "event_overhead": best["event_overhead"], "device": device, "dtype": dtype,
        # extras beyond the issue's keys
        "k": k_best, "ar_tokens_per_s": _round(ar_tps), "spec_tokens_per_s": best["spec_tokens_per_s"],
        "hf_best_setting": hf_best, "hf_tokens_per_s": hf[hf_best]["tokens_per_s"] if hf_best else None,
        "best_k_predicted": best_k(alpha, cost, PREDICT_KS) if curve else None,
        # CPU contention from other processes (see bench/noise.py): the worst call kept, and how
        # many prompts had to be measured again
        "max_cpu_stall": _round(max((r.max_stall for r in results), default=0.0)),
        "remeasured_prompts": sum(r.attempts > 1 for r in results),
    }
    return {
        "summary": summary,
        "runs": [run_record(r, k, greedy, cost) for r in results for k in plan.ks],
        "by_k": {str(k): v for k, v in by_k.items()},
        "hf": hf,
        "costs": cost_record(cost, cost_stall),
        "predicted_by_k": {str(k): v for k, v in curve.items()},
        "config": {"ks": list(plan.ks), "max_new_tokens": plan.config.max_new_tokens,
                   "sampling": asdict(plan.config.sampling), "seed": plan.config.seed,
                   "drafter": plan.config.drafter, "adaptive": plan.config.adaptive},
        "meta": meta or {},
    }


def _fmt(x, spec: str = ".2f", none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return format(x, spec)


def format_table(report: dict) -> str:
    """The runs side by side, then the summary ratios."""
    header = ("prompt", "kind", "K", "AR tok/s", "spec tok/s", "HF@K tok/s", "HF def tok/s", "speedup",
              "prefill s AR/spec", "decode x", "pred", "accept", "tok/round", "identical")
    rows = [(r["id"], r["kind"], str(r["k"]), _fmt(r["ar_tokens_per_s"]), _fmt(r["spec_tokens_per_s"]),
             _fmt(r["hf_tokens_per_s"]), _fmt(r["hf_default_tokens_per_s"]), _fmt(r["speedup"], ".2f") + "x",
             f"{_fmt(r['prefill_s']['ar'])}/{_fmt(r['prefill_s']['spec'])}", _fmt(r["decode_speedup"]) + "x",
             _fmt(r["predicted_speedup"]), _fmt(r["acceptance_rate"]), _fmt(r["mean_accepted_tokens"]),
             _fmt(r["identical_to_ar"]) if r["first_divergence"] is None
             else f"NO@{r['first_divergence']['position']} gap {_fmt(r['first_divergence']['target_top2_gap'], '.3f')}")
            for r in report["runs"]]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    s, c = report["summary"], report["costs"]
    lines += ["", "per K (ratios of totals over all prompts):"]
    for k, b in report["by_k"].items():
        lines.append(f"  K={k}: {_fmt(b['spec_tokens_per_s'])} tok/s, speedup {_fmt(b['speedup'])}x "
                     f"(decode alone {_fmt(b['decode_speedup'])}x; prefill AR {_fmt(b['prefill_s']['ar'])} s, "
                     f"spec {_fmt(b['prefill_s']['spec'])} s) "
                     f"(predicted {_fmt(b['predicted_speedup'])}x, efficiency {_fmt(b['efficiency'])}), "
                     f"acceptance {_fmt(b['acceptance_rate'])}, HF@K {_fmt(b['hf_tokens_per_s'])} tok/s, "
                     f"round ms {b['round_ms']}")
    for name, h in report["hf"].items():
        lines.append(f"  HF {name}: {_fmt(h['tokens_per_s'])} tok/s ({_fmt(h['speedup'])}x over AR), "
                     f"identical to AR {_fmt(h['identical_fraction'])}")
    lines += ["", f"summary (best measured K={s['k']}, {s['device']}, {s['dtype']}):",
              f"  speedup over AR {_fmt(s['speedup'])}x (decode alone {_fmt(s['decode_speedup'])}x)   "
              f"by kind {s['speedup_by_kind']}",
              f"  vs HF (best setting: {s['hf_best_setting']}) {_fmt(s['vs_hf'])}x",
              f"  acceptance {_fmt(s['acceptance_rate'])}   identical to AR {_fmt(s['identical_fraction'])}",
              f"  predicted {_fmt(s['predicted_speedup'])}x   efficiency {_fmt(s['efficiency'])}   "
              f"event overhead {_fmt(s['event_overhead'], '.3f')}   best K predicted {s['best_k_predicted']}",
              f"  CPU contention: worst call kept stalled {_fmt(s['max_cpu_stall'], '.1%')} of its time; "
              f"{s['remeasured_prompts']} prompt(s) measured again"]
    if c:
        lines.append(f"  costs: target step {c['target_step_ms']} ms, draft step {c['draft_step_ms']} ms "
                     f"(c = {c['c']}), verify/T1 for n=1..: {c['verify_ratio']}")
    return "\n".join(lines)
