"""`specviz bench`: measure speculative decoding against the target alone and transformers (the pairs in
`bench/pairs.py`, the runs in `bench/runner.py`, the report in `bench/report.py`, `table.py` and `html.py`).

    specviz bench [--prompts FILE.jsonl] [--k 4 | --k 4,6,8] [--confidence 0.3,0.4] [--reps N] [--compare-hf]
                  [--draft none --drafter self --exit-layer 16,20,24] [--draft smollm2]
                  [--also-adaptive predicted] [--save-predictor OUT.json] [--json OUT] [--html OUT]
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import get_args

from pydantic import Field
from pydantic.dataclasses import dataclass as spec

from specviz.bench.pairs import BenchPairs
from specviz.bench.report import Beside
from specviz.bench.runner import Plan
from specviz.engine import DecodeConfig
from specviz.engine.config import CUT_MODES, Adaptive
from specviz.models import PairSpec
from specviz.runs.outputs import write_atomic
from specviz.settings.errors import INTERRUPTED, InputError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, several_values, values_of
from specviz.settings.spec import fields_of, short, validate

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


@spec(frozen=True)
class BenchFlags:
    """The ranges of the bench's own numeric flags (argparse reads them; `validate` checks them with the decoding
    flags, before anything loads, so a bad one is one sentence naming it)."""

    reps: int = Field(ge=1, title="--reps")
    limit: int | None = Field(ge=1, title="--limit")
    retries: int = Field(ge=0, title="--retries")
    max_stall: float = Field(ge=0, le=1, title="--max-stall")
    verify_curve: int = Field(ge=0, title="--verify-curve")
    draft_group: int = Field(ge=1, title="--draft-group")


def plan_of(args) -> Plan:
    """The decoding flags as a plan: every K, confidence cut and exit layer listed validated, as any single run's
    settings are (and the bench's own flags)."""
    validate(BenchFlags, {s.name: getattr(args, s.name) for s in fields_of(BenchFlags)})
    values = values_of(args, DecodeConfig)
    listed = {n: several_values(values[n]) for n in GRID}
    if empty := [s.label for s in fields_of(DecodeConfig) if s.name in GRID and not listed[s.name]]:
        raise InputError(f"{empty[0]} needs a value: one, or several comma-separated.")
    points = [dict(zip(GRID, point)) for point in itertools.product(*listed.values())]
    configs = [validate(DecodeConfig, {**values, **point}, CLI_LIMITS) for point in points]
    also = tuple(also_mode(a) for a in args.also_adaptive.split(",") if a)
    try:
        budgets = tuple(sorted({validate(DecodeConfig, {**values, **points[0], "tree_budget": b}, CLI_LIMITS)
                                .tree_budget for b in several_values(args.also_tree)})) if args.also_tree else ()
    except InputError as e:
        raise InputError(f"--also-tree: {e}") from None
    return Plan(configs[0], ks=tuple(sorted({c.k for c in configs})), tree_budgets=budgets,
                confidences=tuple(sorted({c.confidence for c in configs})),
                exit_layers=tuple(sorted({c.exit_layer for c in configs})), also_adaptive=also, reps=args.reps,
                max_stall=args.max_stall, retries=args.retries)


def also_mode(text: str) -> tuple[str, float | None]:
    """'predicted' or 'confidence:0.4': a mode measured beside the chosen setting, at its own cut if given."""
    mode, _, cut = text.partition(":")
    if mode not in get_args(Adaptive):
        raise InputError(f"--also-adaptive: unknown mode {short(mode)}; choose from {', '.join(get_args(Adaptive))}.")
    if not cut:
        return mode, None
    if mode not in CUT_MODES:
        raise InputError(f"--also-adaptive: {mode!r} has no cut ({short(text)}); only {' and '.join(CUT_MODES)} do.")
    try:
        value = float(cut)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:  # (False for nan too)
        raise InputError(f"--also-adaptive: the cut in {short(text)} must be a number between 0 and 1.")
    return mode, value


def refuse(problem) -> int:
    """The bench's input refused (a prompt file, too few prompts, a drafter the pair cannot run), before it ran."""
    print(f"specviz bench: {problem}", file=sys.stderr)
    return 2


def status(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class Ready:
    """A bench ready to run, every flag validated and every model loaded: the plan on the prompts, the pairs
    (`bench.pairs`), and transformers' assistants ({}: no assisted generation)."""

    plan: Plan
    spec: PairSpec
    prompts: list
    pairs: BenchPairs
    assistants: dict


@dataclass(frozen=True)
class Account:
    """What every report of this bench says of its run (the device, the dtype, the meta: machine, pair, flags),
    and the files it goes to."""

    device: str
    dtype: str
    meta: dict
    json: str | None = None
    html: str | None = None

    def report(self, bench, cost=None, beside: Beside = Beside(), partial: dict | None = None) -> dict:
        from specviz.bench.report import build_report

        meta = self.meta if partial is None else {**self.meta, "partial": partial}
        return build_report(bench, cost, device=self.device, dtype=self.dtype, meta=meta, beside=beside)

    def write(self, report: dict, say: bool = True) -> None:
        """The report as JSON and as HTML, where asked (each whole or not at all)."""
        from specviz.bench.html import write_html

        if self.json:
            write_atomic(self.json, json.dumps(report, indent=1, ensure_ascii=False))
            if say:
                print(f"wrote {self.json}")
        if self.html:
            write_html(report, self.html)
            if say:
                print(f"wrote {self.html}")


def meta_of(args, info: dict, ready: Ready) -> dict:
    from specviz.models.compiled import is_compiled
    from specviz.models.memory import resident

    pairs = ready.pairs
    draft, quant = pairs.spec_pair.draft, pairs.quant
    return {"machine": info, "draft": pairs.spec_pair.draft_name, "target": pairs.spec_pair.target_name,
            "draft_quant": {"bits": quant.bits, "group_size": quant.group_size,
                            "applied": draft is not pairs.pair.draft and not is_compiled(draft),
                            "step": "compiled" if is_compiled(draft) else type(draft).__name__},
            "hf_drafts": list(ready.assistants), "prompts": str(args.prompts or "specviz/data/prompts.jsonl"),
            "target_quant": ready.spec.target_quant, "kernels": ready.spec.kernels,
            # when and how it ran: the docs' benchmark pages name both (scripts/docs.py renders the flags as a command)
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "time": datetime.now(timezone.utc).strftime("%H:%M:%S"),  # (newer of one day: docs' staleness check)
            "args": {k: v for k, v in vars(args).items() if k != "func"},
            # the raced pair's weights, and the process (which also holds the pair as loaded, for transformers' lanes;
            # `specviz serve` releases the dense weights the tuned target never uses and logs its own), before the runs
            "memory": resident(pairs.spec_pair)}


def partial_note(bench, prompts) -> dict:
    """What a report of an unfinished bench covers, and how to finish it."""
    done = [r.prompt.id for r in bench.reported]
    return {"reported_prompts": len(done), "of": len(prompts) - len(bench.tuning), "done": done,
            "to_finish": "run the bench again on the prompts not in `done` (--prompts FILE), or on all of them"}


def report_stopped(bench, account: Account, prompts) -> int:
    """An interrupted bench's report of the prompts it finished (no cost model: that is measured after the runs)."""
    from specviz.bench.table import format_table

    note = partial_note(bench, prompts)
    report = account.report(bench, partial=note)
    print(format_table(report))
    account.write(report, say=False)
    written = " and ".join(filter(None, (account.json, account.html)))
    print(f"specviz bench: stopped after {note['reported_prompts']} of {note['of']} reported prompts; "
          + (f"{written} covers those." if written else "the table above covers those."), file=sys.stderr)
    return INTERRUPTED


def untuned(args, ready: Ready) -> bool:
    """--also-untuned where the target was tuned (plain asked for: nothing to compare)."""
    return args.also_untuned and ready.pairs.tuning is not None


def beside_runs(args, bench, ready: Ready) -> tuple[object | None, Beside]:
    """The cost model, and what else is measured after the runs: the untuned curve, the bandwidth, llama.cpp."""
    from specviz.bench.bandwidth import anchors, triad_bandwidth
    from specviz.bench.pairs import cost_pair_of, measured_costs
    from specviz.models import encode_prompt

    plan, pairs = ready.plan, ready.pairs
    cost_pair = cost_pair_of(pairs, plan)
    widest = max(max(plan.ks + plan.tree_budgets) + 1, args.verify_curve)  # the verify-cost curve's reach
    first_ids = encode_prompt(pairs.pair.tokenizer, ready.prompts[0].prompt)
    cost, stall, untuned_cost = measured_costs(pairs, cost_pair, first_ids, widest, plan, untuned(args, ready))
    bandwidth = triad_bandwidth()
    llamacpp = None
    if args.compare_llamacpp:
        from specviz.bench.llamacpp import compare_llamacpp

        llamacpp = compare_llamacpp(args.compare_llamacpp, ready.spec, [r.prompt for r in bench.reported],
                                    bench.chosen, status=status)
    return cost, Beside(stall, untuned_cost, anchors(cost, cost_pair, bandwidth, pairs.tuning), llamacpp)


def run_and_report(args, ready: Ready, account: Account) -> int:
    """The runs, the report kept as each reported prompt finishes (a killed bench keeps what it finished), then
    the costs and the whole report, printed and written."""
    from specviz.bench.pairs import hf_baseline
    from specviz.bench.runner import run_bench
    from specviz.bench.table import format_table

    done = []  # the bench after each reported prompt

    def keep(partial) -> None:
        done[:] = [partial]
        if account.json:  # (whole or not at all: a kill mid-write leaves the report of the prompts before)
            report = account.report(partial, partial=partial_note(partial, ready.prompts))
            write_atomic(account.json, json.dumps(report, indent=1, ensure_ascii=False))
    pairs = ready.pairs
    try:
        bench = run_bench(pairs.spec_pair, ready.prompts, ready.plan, hf_baseline(pairs.pair, ready.plan),
                          ready.assistants, progress=not args.no_progress,
                          untuned=pairs.cheap if untuned(args, ready) else None, on_prompt=keep)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the prompts finished are reported, said in one sentence
        if not done:
            raise
        return report_stopped(done[0], account, ready.prompts)
    report = account.report(bench, *beside_runs(args, bench, ready))
    print(format_table(report))
    account.write(report)
    if args.save_predictor:
        save_predictor(bench, account.meta, args.save_predictor)
    return 0


def cmd_bench(args) -> int:
    from specviz.bench.meta import machine
    from specviz.bench.pairs import bench_pairs, drafter_problem_of, hf_assistants, tuned_target
    from specviz.bench.prompts import PromptFileError, load_prompts
    from specviz.models.draft import DraftQuant

    plan = plan_of(args)  # a bad flag fails here, before any model loads
    spec = validate(PairSpec, values_of(args, PairSpec))
    try:
        prompts = load_prompts(args.prompts)[:args.limit]
    except PromptFileError as e:
        return refuse(f"--prompts: {e}")
    if len(plan.settings()) > 1 and len(prompts) < 2:
        return refuse("choosing among several settings needs at least 2 prompts (one to tune on, one to report on); "
                      "give one --k and one --confidence, or more prompts.")
    info = machine()
    if info["cpu_count"] and info["torch_threads"] != info["cpu_count"]:
        log.warning("torch uses %s threads on %s cores", info["torch_threads"], info["cpu_count"])
    loaded, pair, tuning = tuned_target(spec, status, progress=not args.no_progress)
    if problem := drafter_problem_of(plan, pair):
        return refuse(problem)
    pairs = bench_pairs(loaded, pair, tuning, spec, DraftQuant.named(spec.draft_quant, args.draft_group),
                        args.draft_step == "lean", status)
    ready = Ready(plan, spec, prompts, pairs, hf_assistants(pairs, plan) if args.compare_hf else {})
    account = Account(str(pair.device), str(pair.dtype).removeprefix("torch."), meta_of(args, info, ready),
                      args.json, args.html)
    return run_and_report(args, ready, account)


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
