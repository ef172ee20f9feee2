"""`specviz costs`: what one round costs on this device, eager and compiled, for any pair (synthetic shapes too).

    specviz costs --draft synthetic:qwen2.5-0.5b --target synthetic:qwen2.5-7b --device cuda --dtype bfloat16 \\
                  [--step eager,compiled] [--max-verify 32] [--forced-k 4,8] [--json OUT]

Random weights make acceptance meaningless, so this reports costs, not speedups: the target's step T1 and its
verify curve T(n)/T1, the draft's step and c = draft / T1, each step against the memory-bandwidth bound, the
cost model's speedup at acceptance 0.6, 0.7 and 0.8 with its best K, and the real round loop at full acceptance
(`forced.py`) against the ideal those costs allow: what the engine itself loses per round.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone

from specviz.models import PairSpec
from specviz.settings.options import add_options, several_values, values_of
from specviz.settings.spec import validate
from specviz.runs.outputs import write_atomic

ALPHAS = (0.6, 0.7, 0.8)


def register(sub) -> None:
    p = sub.add_parser("costs", help="what a round costs here, eager and compiled: T1, the verify curve, the "
                                     "draft's step and c, the predicted speedups, the loop at full acceptance")
    p.add_argument("--max-verify", type=int, default=32, metavar="N", help="the verify curve T(n) for n = 1..N")
    p.add_argument("--forced-k", default="4,8", metavar="KS",
                   help="run the round loop at full acceptance at these K (comma-separated; empty: none)")
    p.add_argument("--forced-tokens", type=int, default=128, help="new tokens per full-acceptance run")
    p.add_argument("--prompt-tokens", type=int, default=128, help="the context every step is measured at")
    p.add_argument("--reps", type=int, default=9, help="timed repetitions per size (the median is kept)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    add_options(p.add_argument_group("models"), PairSpec, several=("step",), defaults={
        "step": "eager,compiled", "draft": "synthetic:qwen2.5-0.5b", "target": "synthetic:qwen2.5-7b"})
    p.set_defaults(func=cmd_costs)


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


def step_report(pair, prompt: list[int], args, bandwidth: float) -> dict:
    """One step mode's costs, predictions and full-acceptance runs."""
    from specviz.bench.bandwidth import step_bound
    from specviz.bench.costs import measure_costs_once
    from specviz.bench.forced import forced_run
    from specviz.models.compiled import warm_sizes
    from specviz.models.kernels import step_bytes

    # what compiling each step cost (`steps.compiled_now`, at load): neither a step nor a surprise
    compile_s = {role: round(m.compile_s, 2) for role, m in (("draft", pair.draft), ("target", pair.target))
                 if hasattr(m, "compile_s")}
    warm_sizes(pair.target, sets=2)  # every cache size and buffer set the loops use, compiled before any timing
    warm_sizes(pair.draft)
    cost = measure_costs_once(pair, prompt, args.max_verify, args.reps)
    forced = [forced_run(pair, prompt, k, args.forced_tokens, cost) for k in map(int, several_values(args.forced_k))]
    return {
        "draft": pair.draft_name, "target": pair.target_name, "compile_s": compile_s,
        # to 0.1 µs: a small model's step is a fraction of a millisecond, and c and T(n)/T1 are read back from these
        "target_step_ms": round(1e3 * cost.target_step_s, 4), "draft_step_ms": round(1e3 * cost.draft_step_s, 4),
        "c": round(cost.c, 4), "verify_ms": [round(1e3 * t, 4) for t in cost.verify_s],
        "verify_ratio": [round(r, 4) for r in cost.verify_ratio],
        "bound": {"target": step_bound(step_bytes(pair.target), bandwidth, cost.target_step_s),
                  "draft": step_bound(step_bytes(pair.draft), bandwidth, cost.draft_step_s)},
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


def cmd_costs(args) -> int:
    import torch

    from specviz.bench.bandwidth import triad_bandwidth
    from specviz.bench.command import machine
    from specviz.models.loading import load_pair, with_speedups
    from specviz.models.memory import weights_bytes
    from specviz.models.compiled import VERIFY_WIDTHS
    from specviz.models.static_cache import SIZES
    from specviz.models.steps import failure, with_steps
    from specviz.models.synthetic import prompt_ids

    steps = several_values(args.step)
    spec = validate(PairSpec, {**values_of(args, PairSpec), "step": "eager"})
    for s in steps:
        validate(PairSpec, {**values_of(args, PairSpec), "step": s})  # each mode named is a valid one
    if spec.draft is None or args.max_verify < 2:
        print("specviz costs: needs a draft model and --max-verify of at least 2.", file=sys.stderr)
        return 2
    status = lambda s: print(s, file=sys.stderr)  # noqa: E731
    loaded = load_pair(spec.draft, spec.target, device=spec.device, dtype=spec.dtype, device_map=spec.device_map,
                       trust_remote_code=spec.trust_remote_code, status=status)
    eager = with_speedups(loaded, spec, status)
    prompt = prompt_ids(args.prompt_tokens, min(len(loaded.tokenizer), loaded.vocab_size))
    bandwidth = triad_bandwidth(device=loaded.device)
    estimate = weights_bytes(replace(spec, kernels="plain"))  # the weights as loaded, before any speed-up
    report = {"meta": {"machine": machine(), "device": str(loaded.device),
                       "dtype": str(loaded.dtype).removeprefix("torch."),
                       "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                       "args": {k: v for k, v in vars(args).items() if k != "func"},
                       "weights_estimate_bytes": estimate[0] if estimate else None},
              "bandwidth_gb_s": round(bandwidth / 1e9, 2), "steps": {}}
    # the one static cache size the runs here use (the prompt, a full-acceptance run and a round past it): each
    # size more is more graphs compiled, which a lent GPU's minutes can't spare
    k = max(map(int, several_values(args.forced_k)), default=0)
    longest = args.prompt_tokens + args.forced_tokens + 2 * (k + 1) + VERIFY_WIDTHS[-1]
    sizes = (next((size for size in SIZES if size >= longest), SIZES[-1]),)
    for s in steps:  # the JSON written after each mode: a call cut off at its limit keeps what was measured
        try:
            pair = eager if s == "eager" else with_steps(loaded, eager, replace(spec, step=s), status, sizes=sizes)
            status(f"Measuring the {s} steps of {pair.draft_name} → {pair.target_name}…")
            report["steps"][s] = step_report(pair, prompt, args, bandwidth)
        except Exception as e:  # noqa: BLE001 - a failing mode is recorded, and the next one still runs
            status(f"The {s} steps failed: {failure(e)}")
            report["steps"][s] = {"error": failure(e)}
        if loaded.device.type == "cuda":
            report["meta"]["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(loaded.device)
        if args.json:
            write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
    print(format_costs(report))
    if args.json:
        print(f"wrote {args.json}")
    return 0 if not any("error" in r for r in report["steps"].values()) else 1


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


if __name__ == "__main__":  # `python -m specviz.bench.shape_costs costs ...`: where the app's packages are missing
    import argparse

    parser = argparse.ArgumentParser(prog="specviz")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    sys.exit(parsed.func(parsed))
