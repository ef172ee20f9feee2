"""`specviz bench`: measure speculative decoding against the target alone and transformers.

    specviz bench [--prompts FILE.jsonl] [--k 4 | --k 4,6,8] [--confidence 0.3,0.4] [--reps N] [--compare-hf]
                  [--draft none --drafter self --exit-layer 16,20,24] [--draft smollm2]
                  [--also-adaptive predicted] [--save-predictor OUT.json] [--json OUT] [--html OUT]
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import get_args

from specviz.bench.runner import Plan
from specviz.engine import DecodeConfig
from specviz.engine.config import CUT_MODES, Adaptive
from specviz.engine.drafters import drafter_problem
from specviz.engine.early_exit import EarlyExit
from specviz.models import PairSpec
from specviz.settings.errors import INTERRUPTED
from specviz.settings.limits import CLI_LIMITS
from specviz.remote.machine import machine as base_machine
from specviz.settings.options import add_options, several_values, values_of
from specviz.runs.outputs import write_atomic
from specviz.settings.spec import validate

log = logging.getLogger(__name__)
GRID = ("k", "confidence", "exit_layer")  # the settings a bench may list several of: their product is tuned


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure speedups: target alone vs speculative (vs transformers)")
    p.add_argument("--prompts", default=None, help="JSON Lines: {\"id\", \"prompt\", \"kind\"} per line "
                                                  "(default: the shipped set, specviz/data/prompts.jsonl)")
    p.add_argument("--compare-hf", action="store_true",
                   help="also run transformers' assisted generation at the chosen K and at its defaults, with "
                        "specviz's draft and with the draft as loaded (prompt lookup for --drafter lookup)")
    p.add_argument("--reps", type=int, default=1, help="repetitions per prompt, each in a fresh random method order")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the full report as JSON")
    p.add_argument("--html", default=None, metavar="OUT.html", help="write plots (plotly, self-contained)")
    p.add_argument("--draft-group", type=int, default=32, help="int4: weights per scale/zero group")
    p.add_argument("--draft-step", default="lean", choices=["lean", "hf"],
                   help="the draft's one-token step: specviz's lean int4 layer loop, or the Hugging Face forward")
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    p.add_argument("--max-stall", type=float, default=0.05,
                   help="measure a prompt again when another process kept the CPU busy for more than this "
                        "fraction of a call (Linux pressure stall information)")
    p.add_argument("--retries", type=int, default=2, help="at most this many re-measurements per prompt")
    p.add_argument("--also-adaptive", default="", metavar="MODES",
                   help="other adaptive modes to measure beside the chosen setting at its K, at its cut or one of "
                        "their own (comma-separated, e.g. predicted or confidence:0.4)")
    p.add_argument("--also-tree", default="", metavar="BUDGETS",
                   help="also measure the tree drafter at these node budgets (comma-separated, e.g. 8,16), at each "
                        "setting's K and cut: the best budget is chosen on the tuning prompts like the chain's "
                        "setting, and reported beside it (per depth and sibling rank acceptance, tree vs chain)")
    p.add_argument("--also-untuned", action="store_true",
                   help="also run the target alone and the chosen chain (and tree) on the kernels as loaded "
                        "(--kernels plain), and measure their verify-cost curve: what tuning changes, in both lanes")
    p.add_argument("--verify-curve", type=int, default=0, metavar="N",
                   help="measure the target's verify-cost curve up to N tokens (default: the widest verify the "
                        "settings make, K + 1 or a tree's nodes + 1)")
    p.add_argument("--compare-llamacpp", default=None, metavar="DIR",
                   help="a llama.cpp build folder (scripts/build_llamacpp.sh makes one): time llama-bench and "
                        "llama-speculative-simple on the same GGUF files and reported prompts, beside specviz")
    p.add_argument("--save-predictor", default=None, metavar="OUT.json",
                   help="fit the acceptance predictor on every round of this bench's speculative runs and write "
                        "it (specviz/data/acceptance_model.json is the one the app and the 'predicted' mode use)")
    p.add_argument("--no-progress", action="store_true")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS, several=GRID)
    p.set_defaults(func=cmd_bench)


def plan_of(args) -> Plan:
    """The decoding flags as a plan: every K, confidence cut and exit layer listed validated, as any single run's
    settings are."""
    values = values_of(args, DecodeConfig)
    points = [dict(zip(GRID, point)) for point in itertools.product(*(several_values(values[n]) for n in GRID))]
    configs = [validate(DecodeConfig, {**values, **point}, CLI_LIMITS) for point in points]
    if args.reps < 1:
        raise SystemExit("specviz bench: --reps must be at least 1.")
    also = tuple(also_mode(a) for a in args.also_adaptive.split(",") if a)
    budgets = tuple(sorted({validate(DecodeConfig, {**values, **points[0], "tree_budget": b}, CLI_LIMITS).tree_budget
                            for b in several_values(args.also_tree)})) if args.also_tree else ()
    return Plan(configs[0], ks=tuple(sorted({c.k for c in configs})), tree_budgets=budgets,
                confidences=tuple(sorted({c.confidence for c in configs})),
                exit_layers=tuple(sorted({c.exit_layer for c in configs})), also_adaptive=also, reps=args.reps,
                max_stall=args.max_stall, retries=args.retries)


def also_mode(text: str) -> tuple[str, float | None]:
    """'predicted' or 'confidence:0.4': a mode measured beside the chosen setting, at its own cut if given."""
    mode, _, cut = text.partition(":")
    if mode not in get_args(Adaptive):
        raise SystemExit(f"specviz bench: --also-adaptive: unknown mode {mode!r}; choose from "
                         f"{', '.join(get_args(Adaptive))}.")
    if not cut:
        return mode, None
    if mode not in CUT_MODES:
        raise SystemExit(f"specviz bench: --also-adaptive: {mode!r} has no cut ({text!r}); only "
                         f"{' and '.join(CUT_MODES)} do.")
    try:
        value = float(cut)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:  # (False for nan too)
        raise SystemExit(f"specviz bench: --also-adaptive: the cut in {text!r} must be a number between 0 and 1.")
    return mode, value


def cost_exit_layer(plan: Plan) -> int | None:
    """The exit layer whose draft step the cost model measures for the 'self' drafter: the plan's one layer;
    None for a sweep, where one draft cost would mispredict every other layer."""
    layers = {c.exit_layer for c in plan.settings()}
    return layers.pop() if len(layers) == 1 else None


def machine() -> dict:
    import torch
    import transformers

    return base_machine() | {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                             "transformers": transformers.__version__,
                             "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def cmd_bench(args) -> int:
    from specviz.bench.costs import measure_costs
    from specviz.bench.hf import HFGenerate
    from specviz.bench.html import write_html
    from specviz.bench.prompts import PromptFileError, load_prompts
    from specviz.bench.report import build_report
    from specviz.bench.table import format_table
    from specviz.bench.runner import run_bench
    from specviz.models import encode_prompt, load_spec
    from specviz.models.draft import DraftQuant, cheaper_draft, with_cheaper_draft
    from specviz.bench.bandwidth import triad_bandwidth
    from specviz.models.draft.lean import LeanDraft
    from specviz.models.cut_head import draft_vocab_ids
    from specviz.models.compiled import is_compiled
    from specviz.models.memory import resident
    from specviz.models.steps import with_steps
    from specviz.models.target import with_target, with_tuned_draft

    plan = plan_of(args)  # a bad flag fails here, before any model loads
    spec = validate(PairSpec, values_of(args, PairSpec))
    try:
        prompts = load_prompts(args.prompts)[:args.limit]
    except PromptFileError as e:
        print(f"specviz bench: {e}", file=sys.stderr)
        return 2
    if len(plan.settings()) > 1 and len(prompts) < 2:
        print("specviz bench: choosing among several settings needs at least 2 prompts (one to tune on, one to "
              "report on); give one --k and one --confidence, or more prompts.", file=sys.stderr)
        return 2
    info = machine()
    if info["cpu_count"] and info["torch_threads"] != info["cpu_count"]:
        log.warning("torch uses %s threads on %s cores", info["torch_threads"], info["cpu_count"])
    # the draft as loaded (the cheaper one is chosen below) and the target at its precision, on the kernels as loaded
    # (the one-token steps are chosen below, on the pair as the runs use it: the tuned kernels, the cheaper draft)
    loaded = load_spec(replace(spec, draft_quant="none", draft_vocab=0, kernels="plain", step="eager"))
    pair, tuning = with_target(loaded, "none", spec.kernels, status=lambda s: print(s, file=sys.stderr))
    untuned = loaded if args.also_untuned and tuning is not None else None
    problem = next(filter(None, (drafter_problem(c.drafter, pair.draft, pair.target, c.exit_layer, pair.vocab_map)
                                 for c in plan.settings())), None)
    if problem:
        print(f"specviz bench: {problem}", file=sys.stderr)
        return 2
    quant = DraftQuant.named(spec.draft_quant, args.draft_group)
    vocab_ids = draft_vocab_ids(loaded, spec.draft_vocab)
    cheap = with_cheaper_draft(loaded, quant, lean=args.draft_step == "lean", vocab_ids=vocab_ids)
    spec_pair = replace(cheap, target=pair.target, target_name=pair.target_name)
    if tuning is not None:
        spec_pair = with_tuned_draft(spec_pair)
    spec_pair = with_steps(loaded, spec_pair, spec, status=lambda s: print(s, file=sys.stderr))
    hf = HFGenerate(pair.target, pair.eos_token_ids, pair.tokenizer.pad_token_id, pair.device,
                    plan.config.sampling, plan.config.seed)  # the same warps and seed as specviz's runs
    assistants = {}
    # lookup: transformers' own prompt lookup instead; self: not wired yet (generate(assistant_early_exit=L))
    # (nor a draft of another family: transformers would need both tokenizers, universal assisted generation)
    if args.compare_hf and plan.config.drafter not in ("lookup", "self") and pair.vocab_map is None:
        # "same": specviz's cheaper draft through the Hugging Face forward generate() needs; "loaded": as a user
        # would hand it over
        # (a compiled draft step is the loaded draft's: transformers gets that draft as loaded)
        same = cheaper_draft(pair, quant, lean=False, vocab_ids=vocab_ids) \
            if isinstance(spec_pair.draft, LeanDraft) else \
            pair.draft if is_compiled(spec_pair.draft) else spec_pair.draft
        assistants = {"same": same, **({"loaded": pair.draft} if same is not pair.draft else {})}
    cost_pair = spec_pair
    if plan.config.drafter == "self":  # the draft step is the target's early exit (no cost model for a sweep)
        layer = cost_exit_layer(plan)
        cost_pair = replace(spec_pair, draft=EarlyExit(pair.target, layer)) if layer else None
    elif spec_pair.draft is None:  # prompt lookup alone: no draft step to time, so no cost model
        cost_pair = None
    widest = max(max(plan.ks + plan.tree_budgets) + 1, args.verify_curve)  # the verify-cost curve's reach
    first_ids = encode_prompt(pair.tokenizer, prompts[0].prompt)
    untuned_pair = cheap if untuned else None
    meta = {"machine": info, "draft": spec_pair.draft_name, "target": spec_pair.target_name,
            "draft_quant": {"bits": quant.bits, "group_size": quant.group_size,
                            "applied": spec_pair.draft is not pair.draft and not is_compiled(spec_pair.draft),
                            "step": "compiled" if is_compiled(spec_pair.draft) else type(spec_pair.draft).__name__},
            "hf_drafts": list(assistants), "prompts": str(args.prompts or "specviz/data/prompts.jsonl"),
            "target_quant": spec.target_quant, "kernels": spec.kernels,
            # when and how it ran: the docs' benchmark pages name both (scripts/docs.py renders the flags as a command)
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "args": {k: v for k, v in vars(args).items() if k != "func"},
            # the raced pair's weights, and the process (which also holds the pair as loaded, for transformers' lanes;
            # `specviz serve` releases the dense weights the tuned target never uses and logs its own), before the runs
            "memory": resident(spec_pair)}
    device, dtype = str(pair.device), str(pair.dtype).removeprefix("torch.")
    done = []  # the bench after each reported prompt: its report is kept as it goes

    def keep(partial) -> None:
        done[:] = [partial]
        if args.json:  # (whole or not at all: a kill mid-write leaves the report of the prompts before)
            write_atomic(args.json, json.dumps(build_report(partial, None, device=device, dtype=dtype, meta={
                **meta, "partial": partial_note(partial, plan, prompts)}), indent=1, ensure_ascii=False))
    try:
        bench = run_bench(spec_pair, prompts, plan, hf, assistants, progress=not args.no_progress,
                          untuned=untuned_pair, on_prompt=keep)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the prompts finished are reported, said in one sentence
        if not done:
            raise
        return report_stopped(done[0], args, plan, prompts, device, dtype, meta)
    # the costs after the runs: in their steady state (measured first, a fresh process's first forwards ran
    # up to 30 % slower for a while, which bent the curve against the one-token step)
    cost, cost_stall = measure_costs(cost_pair, first_ids, widest, max_stall=args.max_stall,
                                     retries=args.retries) if cost_pair else (None, None)
    untuned_cost = None
    if untuned and cost_pair:  # the same curve on the kernels as loaded: what tuning changes, per size
        untuned_cost, _ = measure_costs(replace(cost_pair, target=untuned.target, draft=cheap.draft
                                                if cost_pair.draft is spec_pair.draft else cost_pair.draft),
                                        first_ids, widest, max_stall=args.max_stall, retries=args.retries)
    bandwidth = triad_bandwidth()
    llamacpp = None
    if args.compare_llamacpp:
        from specviz.bench.llamacpp import compare_llamacpp

        llamacpp = compare_llamacpp(args.compare_llamacpp, spec, [r.prompt for r in bench.reported], bench.chosen,
                                    status=lambda s: print(s, file=sys.stderr))
    report = build_report(bench, cost, device=device, dtype=dtype, meta=meta, cost_stall=cost_stall, untuned_cost=untuned_cost,
                          anchors=anchors(cost, cost_pair, bandwidth, tuning), llamacpp=llamacpp)
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    if args.html:
        write_html(report, args.html)
        print(f"wrote {args.html}")
    if args.save_predictor:
        save_predictor(bench, meta, args.save_predictor)
    return 0


def partial_note(bench, plan, prompts) -> dict:
    """What a report of an unfinished bench covers, and how to finish it."""
    done = [r.prompt.id for r in bench.reported]
    return {"reported_prompts": len(done), "of": len(prompts) - len(bench.tuning), "done": done,
            "to_finish": "run the bench again on the prompts not in `done` (--prompts FILE), or on all of them"}


def report_stopped(bench, args, plan, prompts, device: str, dtype: str, meta: dict) -> int:
    """An interrupted bench's report of the prompts it finished (no cost model: that is measured after the runs)."""
    from specviz.bench.html import write_html
    from specviz.bench.report import build_report
    from specviz.bench.table import format_table

    note = partial_note(bench, plan, prompts)
    report = build_report(bench, None, device=device, dtype=dtype, meta={**meta, "partial": note})
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
    if args.html:
        write_html(report, args.html)
    written = " and ".join(filter(None, (args.json, args.html)))
    print(f"specviz bench: stopped after {note['reported_prompts']} of {note['of']} reported prompts; "
          + (f"{written} covers those." if written else "the table above covers those."), file=sys.stderr)
    return INTERRUPTED


def anchors(cost, cost_pair, bandwidth: float, tuning) -> dict:
    """The measured bandwidth, each model's step against its bound, and where the kernel table came from."""
    from torch import nn

    from specviz.bench.bandwidth import step_bound
    from specviz.models.kernels import step_bytes

    steps = {}
    if cost is not None:  # (a 'self' drafter's step is the target's first layers: no weights of its own)
        steps = {"target": step_bound(step_bytes(cost_pair.target), bandwidth, cost.target_step_s),
                 **({"draft": step_bound(step_bytes(cost_pair.draft), bandwidth, cost.draft_step_s)}
                    if isinstance(cost_pair.draft, nn.Module) else {})}
    return {"bandwidth_gb_s": round(bandwidth / 1e9, 2), **steps,
            "kernel_table": None if tuning is None else {
                "path": str(tuning.path), "cached": tuning.cached,
                "one_row": {shape: [plan[1].kernel, plan[1].rows] for shape, plan in tuning.plans.items()},
                "verify_9": {shape: [plan[9].kernel, plan[9].rows]
                             for shape, plan in tuning.plans.items() if 9 in plan},
                # per shape: what one copy of the weight costs at a race's widths (0: the fastest plan needs one)
                "one_copy_cost": {shape: round(x, 4) for shape, x in tuning.one_copy_cost.items()}}}


def save_predictor(bench, meta: dict, path: str) -> None:
    """The acceptance predictor fitted on every round of the bench's speculative runs, with where it came from."""
    from specviz.analysis.acceptance import examples, fit

    rounds = [e for r in [*bench.tuning, *bench.reported] for rep in r.reps for name, run in rep.items()
              if name.startswith("spec ") for e in run.events]
    x, y = examples(rounds)
    fitted = {"fitted_on": f"`specviz bench` rounds: {meta['draft']} -> {meta['target']}, "
                           f"{len(bench.tuning) + len(bench.reported)} prompts, {bench.chosen.sampling}",
              "tokens": len(y), **fit(x, y).to_dict()}
    write_atomic(path, json.dumps(fitted, indent=1) + "\n")
    print(f"wrote {path}: the acceptance predictor fitted on {len(y)} verified drafted tokens")
