"""`specviz prove`: rerun the exactness proof on any pair (`bench/prove.py`, `runs.proof`), as a table, JSON and HTML.

    specviz prove [--prompt P] [--samples N] [--length L] [--drafter model,lookup,hybrid]
                  [--adaptive fixed,confidence,acceptance] [--draft-quant int4,none] [--identity] [--json F] [--html F]

Exit status 0 only when every sampler came out as expected (speculative decoding and the target alone
pass, every negative control fails) and, in float32, greedy output equals transformers' generate().
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from specviz.bench.prove import IDENTITY_KS, PROMPT, ProofPlan
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.runs.outputs import write_atomic
from specviz.runs.proof import ALPHA, ProofSettings
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, several_values, values_of
from specviz.settings.spec import validate


def register(sub) -> None:
    p = sub.add_parser("prove", help="test that speculative decoding samples exactly the target's distribution")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--identity", action="store_true",
                   help="also check greedy output against transformers' generate(do_sample=False) for every "
                        f"drafter x K in {','.join(map(str, IDENTITY_KS))} x adaptive mode")
    p.add_argument("--identity-tokens", type=int, default=32, help="tokens per greedy identity run")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    p.add_argument("--html", default=None, metavar="OUT.html", help="write the report as one HTML page")
    p.add_argument("--no-progress", action="store_true")
    add_options(p.add_argument_group("models"), PairSpec, several=("draft_quant",))
    add_options(p.add_argument_group("the test"), ProofSettings, CLI_LIMITS)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS, several=("drafter", "adaptive"))
    p.set_defaults(func=cmd_prove, temperature=1.0)  # a distribution test samples


def configs_of(args) -> tuple[list[DecodeConfig], ProofSettings]:
    """Every drafter x adaptive mode asked for, each validated as a single run's settings are."""
    values = values_of(args, DecodeConfig)
    configs = [validate(DecodeConfig, {**values, "drafter": d, "adaptive": a}, CLI_LIMITS)
               for d in several_values(values["drafter"]) for a in several_values(values["adaptive"])]
    return configs, validate(ProofSettings, values_of(args, ProofSettings), CLI_LIMITS)


def plan_of(args) -> tuple[ProofPlan, PairSpec]:
    """The flags as a proof plan and the pair to load (its draft as loaded: each quantisation is made from it),
    every value validated before any model loads."""
    from specviz.runs.proof import matrix

    configs, settings = configs_of(args)
    if configs[0].sampling.greedy:
        raise InputError("the distribution test needs sampling: --temperature above 0 (greedy: see --identity)")
    quants = tuple(several_values(args.draft_quant))
    spec = validate(PairSpec, {**values_of(args, PairSpec), "draft_quant": "none"})
    for q in quants:
        validate(PairSpec, {**values_of(args, PairSpec), "draft_quant": q})
    greedy = replace(configs[0], sampling=replace(configs[0].sampling, temperature=0.0),
                     max_new_tokens=args.identity_tokens)
    identity = matrix(greedy, several_values(args.drafter), several_values(args.adaptive), IDENTITY_KS) \
        if args.identity else []
    return ProofPlan(tuple(configs), settings, quants, tuple(identity), spec.draft_vocab), spec


def cmd_prove(args) -> int:
    from tqdm.auto import tqdm

    from specviz.bench.meta import machine
    from specviz.bench.prove import format_table, passed, paths, proof_report, prove_all, report_html
    from specviz.models import encode_prompt, load_spec

    plan, spec = plan_of(args)  # a bad flag fails here, before any model loads
    # a cut head is the cheaper draft's, made per quantisation
    base = load_spec(replace(spec, draft_vocab=0), progress=not args.no_progress)
    ids = encode_prompt(base.tokenizer, args.prompt)
    config = plan.configs[0]
    meta = {"machine": machine(), "draft": base.draft_name, "target": base.target_name,
            "dtype": str(base.dtype).removeprefix("torch."), "device": str(base.device), "prompt": args.prompt,
            "prompt_tokens": len(ids), "alpha": ALPHA, **asdict(plan.settings), "sampling": asdict(config.sampling),
            "seed": config.seed}
    with tqdm(total=len(plan.quants) * paths(base, plan), desc="prove", unit="path", disable=args.no_progress) as bar:
        report = proof_report(meta, *prove_all(base, ids, plan, bar.update))
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    if args.html:
        write_atomic(args.html, report_html(report))
        print(f"wrote {args.html}")
    return 0 if passed(report) else 1
