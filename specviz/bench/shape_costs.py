"""What one round costs on this device, eager and compiled, for any pair (synthetic shapes too), as `specviz costs`
measures and prints it (the command is `specviz.commands.costs`).

Random weights make acceptance meaningless, so this reports costs, not speedups: the target's step T1 and its
verify curve T(n)/T1, the draft's step and c = draft / T1, each step against the memory-bandwidth bound, the
cost model's speedup at acceptance 0.6, 0.7 and 0.8 with its best K, and the real round loop at full acceptance
(`forced.py`) against the ideal those costs allow: what the engine itself loses per round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

ALPHAS = (0.6, 0.7, 0.8)


@dataclass(frozen=True)
class CostSettings:
    """What each step mode is measured at: the verify curve T(n) for n = 1..max_verify, the timed repetitions per
    size (the median is kept), and the round loop at full acceptance at each K, `forced_tokens` new tokens a run,
    all from a context of `prompt_tokens`."""

    max_verify: int = 32
    reps: int = 9
    forced_ks: tuple[int, ...] = (4, 8)
    forced_tokens: int = 128
    prompt_tokens: int = 128

    def cache_sizes(self) -> tuple[int, ...]:
        """The one static cache size the runs here use (the prompt, a full-acceptance run and a round past it): each
        size more is more graphs compiled, which a lent GPU's minutes can't spare."""
        from specviz.models.compiled import VERIFY_WIDTHS
        from specviz.models.static_cache import SIZES

        longest = self.prompt_tokens + self.forced_tokens + 2 * (max(self.forced_ks, default=0) + 1) + VERIFY_WIDTHS[-1]
        return (next((size for size in SIZES if size >= longest), SIZES[-1]),)


def predictions(cost, alphas=ALPHAS) -> list[dict]:
    """The cost model's best K and speedup at each constant per-position acceptance (K up to the measured curve)."""
    from specviz.analysis.predict import best_k, predicted_speedup

    ks = range(1, len(cost.verify_s))  # a round at K verifies K + 1 tokens
    out = []
    for a in alphas:
        k = best_k([a], cost, ks)
        out.append({"acceptance": a, "best_k": k, "speedup": round(predicted_speedup([a], cost, k), 3)})
    return out


def cost_of(step: dict):
    """The cost model of one step mode's report (`step_report`): to predict at other acceptances from it later."""
    from specviz.analysis.predict import CostModel

    return CostModel(step["target_step_ms"] / 1e3, step["draft_step_ms"] / 1e3,
                     tuple(t / 1e3 for t in step["verify_ms"]))


def step_report(pair, prompt: list[int], settings: CostSettings, bandwidth: float) -> dict:
    """One step mode's costs, predictions and full-acceptance runs."""
    from specviz.bench.bandwidth import step_bound
    from specviz.bench.costs import measure_costs_once
    from specviz.bench.draft_split import draft_split
    from specviz.bench.forced import forced_run
    from specviz.models.compiled import warm_sizes
    from specviz.models.resident import step_bytes

    # what compiling each step cost (`steps.compiled_now`, at load): neither a step nor a surprise
    compile_s = {role: round(m.compile_s, 2) for role, m in (("draft", pair.draft), ("target", pair.target))
                 if hasattr(m, "compile_s")}
    warm_sizes(pair.target, sets=2)  # every cache size and buffer set the loops use, compiled before any timing
    warm_sizes(pair.draft)
    cost = measure_costs_once(pair, prompt, settings.max_verify, settings.reps)
    forced = [forced_run(pair, prompt, k, settings.forced_tokens, cost) for k in settings.forced_ks]
    return {
        "draft": pair.draft_name, "target": pair.target_name, "compile_s": compile_s,
        # to 0.1 µs: a small model's step is a fraction of a millisecond, and c and T(n)/T1 are read back from these
        "target_step_ms": round(1e3 * cost.target_step_s, 4), "draft_step_ms": round(1e3 * cost.draft_step_s, 4),
        "c": round(cost.c, 4), "verify_ms": [round(1e3 * t, 4) for t in cost.verify_s],
        "verify_ratio": [round(r, 4) for r in cost.verify_ratio],
        "bound": {"target": step_bound(step_bytes(pair.target), bandwidth, cost.target_step_s),
                  "draft": step_bound(step_bytes(pair.draft), bandwidth, cost.draft_step_s)},
        "draft_split": draft_split(pair.draft, settings.prompt_tokens),  # products / attention / rest
        "predicted": predictions(cost),
        "forced": [forced_summary(f) for f in forced],
        # the loop's host reads (aim: at most 2 a round, 1 a token) and what compiled inside the timed loops (aim 0)
        "host_syncs_per_round": max((round(f.host_syncs_per_round, 2) for f in forced), default=None),
        "host_syncs_per_ar_token": max((round(f.host_syncs_per_ar_token, 2) for f in forced), default=None),
        "compiles_in_timed_runs": sum(f.compiles for f in forced),
        "cudagraph_skips": sum(f.cudagraph_skips for f in forced),
    }


def forced_summary(f) -> dict:
    """A full-acceptance run's fields, its rates and ratios, and each part of a round in milliseconds."""
    per_round = lambda s: round(1e3 * s / f.rounds, 3)  # noqa: E731
    return {**asdict(f),
            "tokens_per_s": round(f.tokens_per_s, 2), "ideal_tokens_per_s": round(f.ideal_tokens_per_s, 2),
            "target_alone_tokens_per_s": round(f.target_alone_tokens_per_s, 2),
            "speedup": round(f.speedup, 3), "efficiency": round(f.efficiency, 3),
            "draft_ms_per_round": per_round(f.draft_s), "verify_ms_per_round": per_round(f.verify_s),
            "event_ms_per_round": per_round(f.event_s), "overhead_ms_per_round": round(f.overhead_ms_per_round, 3)}


def measure_mode(loaded, eager, spec, prompt: list[int], settings: CostSettings, bandwidth: float,
                 status: Callable[[str], None]) -> dict:
    """One step mode's report (`spec.step`: eager, or compiled from `loaded` beside the `eager` pair); a mode that
    fails (a compile error) is its error in one line, and the next mode still runs."""
    from specviz.models.steps import failure, with_steps

    try:
        pair = eager if spec.step == "eager" else with_steps(loaded, eager, spec, status, sizes=settings.cache_sizes())
        status(f"Measuring the {spec.step} steps of {pair.draft_name} → {pair.target_name}…")
        return step_report(pair, prompt, settings, bandwidth)
    except Exception as e:  # noqa: BLE001 - a failing mode is recorded, and the next one still runs
        status(f"The {spec.step} steps failed: {failure(e)}")
        return {"error": failure(e)}


def split_text(split: dict | None) -> str:
    if not split:
        return "-"
    attention = "-" if split["attention_ms"] is None else f"{split['attention_ms']:.1f}"
    return f"{split['products_ms']:.1f}, {attention}, {split['rest_ms']:.1f}"


def format_costs(report: dict) -> str:
    """The report side by side, one column per step mode (a failed mode's error below)."""
    modes = [m for m, r in report["steps"].items() if "error" not in r]
    failed = [f"{m}: failed ({r['error']})" for m, r in report["steps"].items() if "error" in r]
    if not modes:
        return "\n".join(failed)
    rows = [("", modes)]

    def row(label, get):
        rows.append((label, [get(report["steps"][m]) for m in modes]))

    row("target step T1 (ms)", lambda r: f"{r['target_step_ms']:.2f}")
    row("  of its bound", lambda r: f"{r['bound']['target']['fraction_of_bound']:.2f}")
    row("draft step (ms)", lambda r: f"{r['draft_step_ms']:.2f}")
    row("  of its bound", lambda r: f"{r['bound']['draft']['fraction_of_bound']:.2f}")
    row("  products, attention, rest (ms)", lambda r: split_text(r.get("draft_split")))
    row("c = draft / T1", lambda r: f"{r['c']:.3f}")
    for n in (2, 5, 9, 17, 33):
        if n <= len(report["steps"][modes[0]]["verify_ratio"]):
            row(f"T({n}) / T1", lambda r, n=n: f"{r['verify_ratio'][n - 1]:.2f}")
    for i, a in enumerate(ALPHAS):
        row(f"predicted at acceptance {a}",
            lambda r, i=i: f"{r['predicted'][i]['speedup']:.2f}x (K {r['predicted'][i]['best_k']})")
    for j, f in enumerate(report["steps"][modes[0]]["forced"]):
        row(f"K={f['k']} full acceptance tok/s", lambda r, j=j: f"{r['forced'][j]['tokens_per_s']:.1f}")
        row("  target alone tok/s, speedup", lambda r, j=j: f"{r['forced'][j]['target_alone_tokens_per_s']:.1f}, "
                                                            f"{r['forced'][j]['speedup']:.2f}x")
        row("  ideal tok/s, efficiency", lambda r, j=j: f"{r['forced'][j]['ideal_tokens_per_s']:.1f}, "
                                                        f"{r['forced'][j]['efficiency']:.2f}")
        row("  ms/round: draft, verify, rest", lambda r, j=j: f"{r['forced'][j]['draft_ms_per_round']:.1f}, "
                                                              f"{r['forced'][j]['verify_ms_per_round']:.1f}, "
                                                              f"{r['forced'][j]['overhead_ms_per_round']:.2f}")
        row("  verify's argmax = recording", lambda r, j=j: f"{r['forced'][j]['argmax_agreement']:.2f}")
        row("  host reads: a round, an AR token", lambda r, j=j: f"{r['forced'][j]['host_syncs_per_round']:.1f}, "
                                                                f"{r['forced'][j]['host_syncs_per_ar_token']:.1f}")
    row("compiled / skipped in timed loops", lambda r: f"{r['compiles_in_timed_runs']} / {r['cudagraph_skips']}")
    width = max(len(label) for label, _ in rows) + 2
    meta = report["meta"]
    head = (f"{meta['machine'].get('gpu') or meta['machine']['cpu']}, {meta['device']}, {meta['dtype']}, "
            f"torch {meta['machine']['torch']}; bandwidth (triad) {report['bandwidth_gb_s']} GB/s")
    lines = [head] + [label.ljust(width) + "".join(v.rjust(22) for v in values) for label, values in rows]
    return "\n".join(lines + failed)
