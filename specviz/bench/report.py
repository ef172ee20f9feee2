"""Turn a benchmark into the JSON report (`table.py` prints it).

Every rate is a ratio of totals (tokens summed over prompts and repetitions / seconds summed), never a
mean of per-prompt ratios, so long and short prompts weigh what they cost. Every speedup carries a
bootstrap 95 % interval: the reported prompts are resampled with replacement, each keeping all its
methods' runs together (a prompt's runs are paired: they ran back to back).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from specviz.analysis.acceptance import calibration
from specviz.analysis.divergence import first_divergence
from specviz.analysis.intervals import ci95, ratio_of_ratios
from specviz.analysis.predict import CostModel, best_k, predicted_speedup, predicted_speedup_for_rounds
from specviz.analysis.stats import SpecStats, mean_beta, ratio, spec_stats, tested_drafts, tree_acceptance
from specviz.engine.events import ACCEPTED
from specviz.bench.runner import AR, AR_EAGER, AR_HF, AR_HF_STATIC, UNTUNED, Bench, PromptResult, setting_name
from specviz.models.step_timing import FLAT_FLOOR

PREDICT_KS = range(1, 17)
BASELINE_NAMES = {AR: "specviz's AR lane", AR_HF: "transformers generate()",
                  AR + UNTUNED: "specviz's AR lane on the kernels as loaded",
                  AR_EAGER: "specviz's AR lane on the eager one-token step",
                  AR_HF_STATIC: "transformers generate() on its static cache, compiled"}


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)


def runs_of(results: Sequence[PromptResult], method: str) -> list:
    return [rep[method] for r in results for rep in r.reps if method in rep]


def rate(results: Sequence[PromptResult], method: str) -> float:
    runs = runs_of(results, method)
    return ratio(sum(len(x.tokens) for x in runs), sum(x.seconds for x in runs))


def decode_rate(runs) -> float:
    """tokens/s after the prompt's forward (Σ tokens / Σ (seconds - prefill)): what the rounds speed up."""
    return ratio(sum(len(x.tokens) for x in runs), sum(x.decode_seconds for x in runs))


def totals(results: Sequence[PromptResult], method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: tokens and seconds summed over its repetitions."""
    tokens = [sum(len(rep[method].tokens) for rep in r.reps) for r in results]
    seconds = [sum(rep[method].seconds for rep in r.reps) for r in results]
    return np.array(tokens, float), np.array(seconds, float)


def speedup_ci95(results: Sequence[PromptResult], method: str, base: str) -> list[float] | None:
    """Bootstrap percentile interval of rate(method) / rate(base) over prompts; None below 3 prompts."""
    ci = ci95((*totals(results, method), *totals(results, base)), ratio_of_ratios)
    return [_round(ci[0]), _round(ci[1])] if ci else None


def pooled_spec(results: Sequence[PromptResult], method: str) -> SpecStats:
    """All prompts' rounds for one speculative method as one stream, timed by the summed wall-clock."""
    runs = runs_of(results, method)
    return spec_stats([e for x in runs for e in x.events], sum(x.seconds for x in runs))


def predicted_for(rounds, stats: SpecStats, cost: CostModel | None) -> float | None:
    """The cost model over these rounds' own K's and tokens (see `predicted_speedup_for_rounds`); None for tree
    rounds, which the chain's model does not describe (a round verifies its nodes, not K + 1 tokens)."""
    if cost is None or not stats.tested or any(r.tree for r in rounds):
        return None
    return predicted_speedup_for_rounds([r.k for r in rounds], stats.tokens, cost)


def rounds_of(results: Sequence[PromptResult], method: str) -> list:
    return [e for x in runs_of(results, method) for e in x.events]


def setting_record(results: Sequence[PromptResult], method: str, cost: CostModel | None) -> dict:
    """One speculative setting pooled over prompts: its rate, acceptance and where its time goes."""
    runs = runs_of(results, method)
    rounds = rounds_of(results, method)
    stats = spec_stats(rounds, sum(x.seconds for x in runs))  # the rounds pooled, as `pooled_spec`
    return {
        "spec_tokens_per_s": _round(stats.tokens_per_s), "acceptance_rate": _round(stats.acceptance_rate),
        "mean_accepted_tokens": _round(stats.mean_accepted_tokens),
        "per_position_acceptance": [_round(a) for a in stats.per_position], "accepted_lengths": stats.accepted_lengths,
        "predicted_speedup": _round(predicted_for(rounds, stats, cost)), "event_overhead": _round(stats.event_overhead),
        "round_ms": {"draft": _round(1e3 * stats.draft_s / stats.rounds, 2),
                     "verify": _round(1e3 * stats.verify_s / stats.rounds, 2),
                     "overhead": _round(1e3 * stats.overhead_s / stats.rounds, 2)} if stats.rounds else None,
    }


def expected_vs_realised(rounds) -> dict:
    tested = tested_drafts(rounds)
    return {"mean_beta": _round(mean_beta([t.beta for t in tested])),
            "accepted_when_tested": _round(ratio(sum(t.status == ACCEPTED for t in tested), len(tested))),
            "tested": len(tested)}


def run_record(res: PromptResult, rep: int, spec: str, base: str, greedy: bool, cost: CostModel | None) -> dict:
    """One prompt and repetition: every method's rate, and ratios within the repetition (pairwise)."""
    runs = res.reps[rep]
    s, ar = runs[spec], runs[AR]
    stats = spec_stats(s.events, s.seconds)
    rates = {m: ratio(len(x.tokens), x.seconds) for m, x in runs.items()}
    div = first_divergence(s.events, ar.events) if greedy else None
    return {
        "id": res.prompt.id, "kind": res.prompt.kind, "rep": rep, "order": res.orders[rep],
        "k": max((r.k for r in s.events), default=0), "new_tokens": stats.tokens,
        "ar_tokens_per_s": _round(rates[AR]), "ar_hf_tokens_per_s": _round(rates.get(AR_HF)),
        "spec_tokens_per_s": _round(rates[spec]),
        "hf_tokens_per_s": {m: _round(v) for m, v in rates.items() if m.startswith("hf ")},
        "speedup": _round(ratio(rates[spec], rates[base])),
        "decode_speedup": _round(ratio(decode_rate([s]), decode_rate([ar]))),
        "acceptance_rate": _round(stats.acceptance_rate), "mean_accepted_tokens": _round(stats.mean_accepted_tokens),
        "identical_to_ar": div is None if greedy else None,
        "first_divergence": None if div is None else {
            "position": div.position, "target_top2_gap": _round(div.target_top2_gap),
            "spec_top2_gap": _round(div.spec_top2_gap)},
        "identical_to_ar_hf": runs[AR_HF].tokens == ar.tokens if greedy and AR_HF in runs else None,
        "prompt_tokens": res.prompt_tokens, "predicted_speedup": _round(predicted_for(s.events, stats, cost)),
        "cpu_stall": {m: _round(x.stall) for m, x in runs.items()},
        "per_position_acceptance": [_round(a) for a in stats.per_position], "accepted_lengths": stats.accepted_lengths,
        "prefill_s": {"ar": _round(ar.prefill), "spec": _round(s.prefill)},
        "seconds": {m: _round(x.seconds) for m, x in runs.items()},
    }


def by_kind(results: Sequence[PromptResult]) -> dict[str, list[PromptResult]]:
    return {kind: [r for r in results if r.prompt.kind == kind] for kind in sorted({r.prompt.kind for r in results})}


def best_of(results: Sequence[PromptResult], methods: list[str]) -> str | None:
    """The fastest of these methods over the reported prompts (choosing here favours the baseline, not specviz)."""
    return max(methods, key=lambda m: rate(results, m)) if methods else None


BASELINE_FLOOR = FLAT_FLOOR  # T(n)/T1 below this for some n > 1: the one-token step is not the machine's best


def baseline_check(cost: CostModel) -> dict:
    """Whether the target alone runs its one-token step at its best: no wider forward may cost less than it
    (a tuned kernel can always run one row as n rows). One sentence names the row counts that do."""
    cheaper = [n for n, r in enumerate(cost.verify_ratio, 1) if n > 1 and r < BASELINE_FLOOR]
    worst = min(cost.verify_ratio[1:], default=1.0)
    sentence = None if not cheaper else (
        f"a forward over {', '.join(map(str, cheaper))} tokens cost less than one token's step (lowest "
        f"T(n)/T1 {worst:.2f}): the target alone does not run on this machine's fastest one-token kernel, "
        "so speedups over it are inflated")
    return {"min_ratio": _round(worst), "floor": BASELINE_FLOOR, "ok": not cheaper, "sentence": sentence}


def cost_record(cost: CostModel | None, stall: float | None = None) -> dict | None:
    if cost is None:
        return None
    return {"target_step_ms": _round(1e3 * cost.target_step_s), "draft_step_ms": _round(1e3 * cost.draft_step_s),
            "c": _round(cost.c), "verify_ms": [_round(1e3 * t, 2) for t in cost.verify_s],
            "verify_ratio": [_round(r) for r in cost.verify_ratio], "cpu_stall": _round(stall),
            "baseline_check": baseline_check(cost)}


@dataclass(frozen=True)
class Beside:
    """What a bench measured beside its runs, each reported as it is: the cost curve's CPU stall, the same curve on
    the kernels as loaded, the bandwidth anchors (`bandwidth.anchors`) and llama.cpp on the same files."""

    cost_stall: float | None = None
    untuned_cost: CostModel | None = None
    anchors: dict | None = None
    llamacpp: dict | None = None


@dataclass(frozen=True)
class Compared:
    """The reported prompts and the lanes a report compares: the chosen setting, the fastest target alone, and
    transformers' assisted generation with specviz's draft (or prompt lookup) and with the draft as loaded."""

    results: Sequence[PromptResult]
    methods: list[str]  # every method run on them, in the order stored
    spec: str  # the chosen setting's method
    base: str  # the fastest target alone: the baseline every speedup is over
    same: str | None  # the fastest of transformers' with specviz's draft (or its prompt lookup)
    other: str | None  # the fastest of transformers' with the draft as loaded


def compared_of(bench: Bench) -> Compared:
    results = bench.reported
    methods = list(results[0].reps[0])
    return Compared(results, methods, f"spec {setting_name(bench.chosen)}",
                    best_of(results, [m for m in BASELINE_NAMES if m in methods]),
                    best_of(results, [m for m in methods if m.startswith(("hf same ", "hf lookup "))]),
                    best_of(results, [m for m in methods if m.startswith("hf loaded ")]))


def method_record(compared: Compared, m: str, greedy: bool) -> dict:
    """One method over the reported prompts: its rate, its speedup over the baseline with its interval, how often
    it made the AR lane's very tokens (greedy), and its acceptance (a speculative method)."""
    results, base = compared.results, compared.base
    return {"tokens_per_s": _round(rate(results, m)), "speedup": _round(ratio(rate(results, m), rate(results, base))),
            "speedup_ci95": speedup_ci95(results, m, base) if m != base else None,
            "identical_fraction": _round(sum(rep[m].tokens == rep[AR].tokens for r in results for rep in r.reps)
                                         / sum(len(r.reps) for r in results)) if greedy else None,
            "acceptance_rate": _round(pooled_spec(results, m).acceptance_rate) if m.startswith("spec ") else None}


def speedups(compared: Compared, ci: list[float] | None, cost: CostModel | None) -> dict:
    """The chosen setting's speedup over the target alone with its interval `ci`, by kind, its decode alone, and
    against transformers. Where a wider forward of the AR lane's own target cost less than its one-token step, that
    lane was not on its fastest one-token path: the speedup over it is scaled by the cheapest T(n)/T1 (as if it had
    run one token padded to n rows), never reported inflated."""
    results, spec, base = compared.results, compared.spec, compared.base
    speedup = ratio(rate(results, spec), rate(results, base))
    check = baseline_check(cost) if cost else None
    deflate = check["min_ratio"] if check and not check["ok"] and base == AR else 1.0

    def vs(hf_method):
        return (_round(ratio(rate(results, spec), rate(results, hf_method))),
                speedup_ci95(results, spec, hf_method)) if hf_method else (None, None)

    (vs_hf, vs_hf_ci), (vs_other, vs_other_ci) = vs(compared.same), vs(compared.other)
    return {
        "speedup": _round(speedup * deflate), "speedup_ci95": [_round(x * deflate) for x in ci] if ci else None,
        "speedup_as_measured": _round(speedup), "baseline_check_ok": check["ok"] if check else None,
        "speedup_by_kind": {kind: _round(ratio(rate(rs, spec), rate(rs, base)))
                            for kind, rs in by_kind(results).items()},
        "decode_speedup": _round(ratio(decode_rate(runs_of(results, spec)), decode_rate(runs_of(results, AR)))),
        "vs_hf": vs_hf, "vs_hf_ci95": vs_hf_ci, "vs_hf_other_draft": vs_other, "vs_hf_other_draft_ci95": vs_other_ci,
    }


def summary_record(bench: Bench, compared: Compared, by_method: dict, record: dict, cost: CostModel | None,
                   device: str, dtype: str) -> dict:
    """The report's summary: the chosen setting against every baseline, how it was chosen, and how calm it ran."""
    results, chosen, spec = compared.results, bench.chosen, compared.spec
    alpha, predicted = record["per_position_acceptance"], record["predicted_speedup"]
    kept = [*bench.tuning, *results]
    return {
        **speedups(compared, by_method[spec]["speedup_ci95"], cost),
        "acceptance_rate": record["acceptance_rate"], "identical_fraction": by_method[spec]["identical_fraction"],
        "predicted_speedup": predicted,
        "efficiency": _round(ratio(ratio(rate(results, spec), rate(results, compared.base)), predicted))
        if predicted else None,
        # the same, like for like: the cost model has no prompt reading, so the decode speedup over the AR lane (whose
        # step it models) against it; the end-to-end one above also pays the draft's prompt and a faster baseline
        "decode_efficiency": _round(ratio(ratio(decode_rate(runs_of(results, spec)),
                                                decode_rate(runs_of(results, AR))), predicted)) if predicted else None,
        # each lane's share of seconds reading the prompt (both models' in the speculative lane): the cost model has
        # none, so this is where the end-to-end efficiency's gap goes
        "prompt_share": {lane: _round(ratio(sum(x.prefill for x in runs_of(results, m)),
                                            sum(x.seconds for x in runs_of(results, m))))
                         for lane, m in (("ar", AR), ("spec", spec))},
        "event_overhead": record["event_overhead"], "device": device, "dtype": dtype,
        # extras beyond the keys
        "setting": setting_name(chosen), "k": chosen.k, "adaptive": chosen.adaptive,
        "confidence": chosen.cut or None,
        "baseline": BASELINE_NAMES[compared.base], "ar_tokens_per_s": _round(rate(results, AR)),
        "ar_hf_tokens_per_s": _round(rate(results, AR_HF)) if AR_HF in compared.methods else None,
        "spec_tokens_per_s": _round(rate(results, spec)),
        "hf_same_draft_setting": compared.same, "hf_other_draft_setting": compared.other,
        "best_k_predicted": best_k(alpha, cost, PREDICT_KS) if cost and alpha else None,
        "tuned_on": [r.prompt.id for r in bench.tuning], "reported_on": [r.prompt.id for r in results],
        "reps": len(results[0].reps),
        # CPU contention from other processes (see bench/noise.py): the worst call kept, and re-measurements
        "max_cpu_stall": _round(max((r.max_stall for r in kept), default=0.0)),
        "remeasured": sum(r.attempts - len(r.reps) for r in kept),
        # graphs torch compiled (or CUDA graphs skipped) inside the calls kept: 0, or the numbers are not a speed
        "compiles_in_timed_runs": sum(x.compiles for r in kept for rep in r.reps for x in rep.values()),
    }


def build_report(bench: Bench, cost: CostModel | None, *, device: str, dtype: str, meta: dict | None = None,
                 beside: Beside = Beside()) -> dict:
    """The whole report of a bench (`cost`: the cost model measured after the runs; None: no prediction)."""
    compared = compared_of(bench)
    results, chosen, spec = compared.results, bench.chosen, compared.spec
    by_method = {m: method_record(compared, m, chosen.sampling.greedy) for m in compared.methods}
    record = setting_record(results, spec, cost)
    alpha = record["per_position_acceptance"]
    curve = {k: _round(predicted_speedup(alpha, cost, k)) for k in PREDICT_KS} if cost and alpha else {}
    tuned = bench.tuning or results  # without a grid, the one setting's numbers come from the reported prompts
    settings = {setting_name(c): setting_record(tuned, f"spec {setting_name(c)}", cost)
                for c in bench.settings + bench.trees}
    kinds = by_kind(results)
    return {
        "summary": summary_record(bench, compared, by_method, record, cost, device, dtype),
        "runs": [run_record(r, i, spec, compared.base, chosen.sampling.greedy, cost)
                 for r in results for i in range(len(r.reps))],
        "methods": by_method,
        "settings": settings,
        "chosen": record,
        "acceptance_by_kind": {kind: _round(pooled_spec(rs, spec).acceptance_rate) for kind, rs in kinds.items()},
        # what acceptance should be: the mean β = Σ min(p, q) of the tested drafts, beside the realised rate of the
        # same drafts (accepted / tested)
        "expected_acceptance_by_kind": {kind: expected_vs_realised(rounds_of(rs, spec)) for kind, rs in kinds.items()},
        "costs": cost_record(cost, beside.cost_stall),
        # fitted on the tuning prompts' rounds (or every other reported prompt, without a grid), judged on the rest
        "acceptance_model": calibration(*([rounds_of(bench.tuning, spec), rounds_of(results, spec)] if bench.tuning
                                          else [rounds_of(results[::2], spec), rounds_of(results[1::2], spec)])),
        "tree": tree_record(bench, results, spec, compared.base) if bench.chosen_tree else None,
        "untuned": untuned_record(bench, results, beside.untuned_cost) if spec + UNTUNED in compared.methods
        else None,
        "anchors": beside.anchors,
        "llamacpp": beside.llamacpp,
        "predicted_by_k": {str(k): v for k, v in curve.items()},
        "config": {"settings": list(settings), "max_new_tokens": chosen.max_new_tokens,
                   "sampling": asdict(chosen.sampling), "seed": chosen.seed, "drafter": chosen.drafter,
                   "adaptive": chosen.adaptive},
        "meta": meta or {},
    }


def tree_record(bench: Bench, results: Sequence[PromptResult], chain: str, base: str) -> dict:
    """The best tree beside the best chain on the reported prompts: speedups (over the target alone and over
    the chain, overall and by kind), tokens per round, and acceptance per depth and per sibling rank."""
    tree = f"spec {setting_name(bench.chosen_tree)}"
    kinds = by_kind(results)
    return {
        "setting": setting_name(bench.chosen_tree), "budget": bench.chosen_tree.tree_budget,
        "speedup": _round(ratio(rate(results, tree), rate(results, base))),
        "speedup_ci95": speedup_ci95(results, tree, base),
        "vs_chain": _round(ratio(rate(results, tree), rate(results, chain))),
        "vs_chain_ci95": speedup_ci95(results, tree, chain),
        "vs_chain_by_kind": {kind: _round(ratio(rate(rs, tree), rate(rs, chain))) for kind, rs in kinds.items()},
        "speedup_by_kind": {kind: _round(ratio(rate(rs, tree), rate(rs, base))) for kind, rs in kinds.items()},
        "tokens_per_round": {"tree": _round(pooled_spec(results, tree).mean_accepted_tokens),
                             "chain": _round(pooled_spec(results, chain).mean_accepted_tokens)},
        "nodes_per_round": _round(ratio(sum(len(r.tree) for r in rounds_of(results, tree)),
                                        len(rounds_of(results, tree)))),
        **tree_acceptance(rounds_of(results, tree)),
    }


def untuned_record(bench: Bench, results: Sequence[PromptResult], untuned_cost: CostModel | None) -> dict:
    """Tuned kernels against the kernels as loaded, on the same prompts: the target alone and the chosen chain
    (and tree) both ways, tuned over untuned overall (with CI) and by kind, and the untuned verify-cost curve."""
    def gain(name):
        tuned, plain = name, name + UNTUNED
        return {"tuned_over_untuned": _round(ratio(rate(results, tuned), rate(results, plain))),
                "ci95": speedup_ci95(results, tuned, plain), "untuned_tokens_per_s": _round(rate(results, plain)),
                "by_kind": {kind: _round(ratio(rate(rs, tuned), rate(rs, plain)))
                            for kind, rs in by_kind(results).items()}}
    return {"ar": gain(AR), "chain": gain(f"spec {setting_name(bench.chosen)}"),
            "tree": gain(f"spec {setting_name(bench.chosen_tree)}") if bench.chosen_tree else None,
            "costs": cost_record(untuned_cost)}
