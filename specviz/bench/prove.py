"""`specviz prove`: rerun the exactness proof on any pair (`runs.proof`), as a table, JSON and HTML.

    specviz prove [--prompt P] [--samples N] [--length L] [--drafter model,lookup,hybrid]
                  [--adaptive fixed,confidence,acceptance] [--draft-quant int4,none] [--identity] [--json F] [--html F]

Exit status 0 only when every sampler came out as expected (speculative decoding and the target alone
pass, every negative control fails) and, in float32, greedy output equals transformers' generate().
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, replace

from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, several_values, values_of
from specviz.runs.proof import ALPHA, ProofSettings
from specviz.settings.spec import validate
from specviz.runs.outputs import write_atomic

PROMPT = "Write a haiku about the sea."
IDENTITY_KS = (1, 2, 4, 8)


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


def cmd_prove(args) -> int:
    from tqdm.auto import tqdm

    from specviz.bench.command import machine
    from specviz.models import encode_prompt, load_spec
    from specviz.models.draft import DraftQuant, with_cheaper_draft
    from specviz.models.cut_head import draft_vocab_ids
    from specviz.settings.errors import InputError
    from specviz.runs.proof import identity, matrix, prove, samplers

    configs, settings = configs_of(args)  # a bad flag fails here, before any model loads
    if configs[0].sampling.greedy:
        raise InputError("the distribution test needs sampling: --temperature above 0 (greedy: see --identity)")
    quants = several_values(args.draft_quant)
    spec = validate(PairSpec, {**values_of(args, PairSpec), "draft_quant": "none"})
    for q in quants:
        validate(PairSpec, {**values_of(args, PairSpec), "draft_quant": q})
    base = load_spec(replace(spec, draft_vocab=0))  # a cut head is the cheaper draft's, made below
    ids = encode_prompt(base.tokenizer, args.prompt)
    report = {"meta": {"machine": machine(), "draft": base.draft_name, "target": base.target_name,
                       "dtype": str(base.dtype).removeprefix("torch."), "device": str(base.device),
                       "prompt": args.prompt, "prompt_tokens": len(ids), "alpha": ALPHA, **asdict(settings),
                       "sampling": asdict(configs[0].sampling), "seed": configs[0].seed},
              "runs": [], "identity": []}
    identity_configs = matrix(replace(configs[0], sampling=replace(configs[0].sampling, temperature=0.0),
                                      max_new_tokens=args.identity_tokens),
                              several_values(args.drafter), several_values(args.adaptive), IDENTITY_KS
                              ) if args.identity else []
    def paths(calibrate):
        return settings.samples + settings.control_samples * (len(samplers(base, settings, calibrate)) - 1)

    total = paths(True) + (len(configs) - 1) * paths(False) + len(identity_configs)
    with tqdm(total=len(quants) * total, desc="prove", unit="path", disable=args.no_progress) as bar:
        for q in quants:
            pair = base if q == "none" or base.draft is None else \
                with_cheaper_draft(base, DraftQuant.named(q), vocab_ids=draft_vocab_ids(base, spec.draft_vocab))
            for i, config in enumerate(configs):
                last = 0
                # the target alone and the draft alone run once per quantisation: no drafter changes their paths
                for progress in prove(pair, ids, config, settings, calibrate=i == 0):
                    bar.update(progress.done - last)
                    last = progress.done
                report["runs"].append({"draft_quant": q, "drafter": config.drafter, "adaptive": config.adaptive,
                                       "k": config.k, "verdicts": [verdict_dict(v) for v in progress.verdicts]})
            for row in identity(pair, ids, identity_configs):
                report["identity"].append({"draft_quant": q, **asdict(row)})
                bar.update(1)
    report["all_as_expected"] = all(v["as_expected"] for r in report["runs"] for v in r["verdicts"])
    report["identical"] = all(r["identical"] for r in report["identity"])
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    if args.html:
        write_atomic(args.html, report_html(report))
        print(f"wrote {args.html}")
    exact_identity = report["identical"] or report["meta"]["dtype"] != "float32"  # bf16: reported, explained
    return 0 if report["all_as_expected"] and exact_identity else 1


def verdict_dict(v) -> dict:
    return {**asdict(v), "min_p": v.min_p, "rejected": v.rejected, "as_expected": v.as_expected}


def outcome(v: dict) -> str:
    if v["as_expected"]:
        return "rejected (as it must be)" if v["rejected"] else "passed"
    if v["expect_pass"]:
        return "REJECTED: not the target's distribution"
    return "NOT DETECTED: too few samples to see this control's error (raise --control-samples)"


def rows(report: dict) -> list[list[str]]:
    out = []
    for r in report["runs"]:
        for v in r["verdicts"]:
            tv = " ".join(f"{p['tv']:.3f}/{p['tv_noise']:.3f}" for p in v["positions"])
            out.append([r["draft_quant"], r["drafter"], r["adaptive"], v["name"], str(v["samples"]),
                        f"{v['ks_p']:.3g}", f"{v['min_p']:.3g}", tv,
                        str(v["extra"].get("drafts_after_clean_sweep", "")), outcome(v)])
    return out


HEADER = ["quant", "drafter", "adaptive", "sampler", "n", "path KS p", "min p", "TV/chance per position",
          "after sweep", "verdict"]


def format_table(report: dict) -> str:
    table = [HEADER] + rows(report)
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    m = report["meta"]
    lines.insert(0, f"{m['draft']} -> {m['target']} ({m['dtype']}), {m['samples']} paths x {m['length']} tokens per "
                    f"sampler, {m['sampling']}; alpha {m['alpha']:g} per sampler (Bonferroni over its tests)")
    for r in report["identity"]:
        if not r["identical"]:
            lines.append(f"greedy identity: {r['drafter']} {r['adaptive']} K={r['k']} ({r['draft_quant']}) differs "
                         f"from transformers at token {r['first_difference']} (target top-2 gap {r['top2_gap']})")
    if report["identity"]:
        same = sum(r["identical"] for r in report["identity"])
        lines.append(f"greedy identity against transformers' generate(): {same}/{len(report['identity'])} identical")
    lines.append("all as expected" if report["all_as_expected"] else "SOME SAMPLERS NOT AS EXPECTED")
    return "\n".join(lines)


def report_html(report: dict) -> str:
    """One self-contained page: the summary, the verdict table and the greedy identity matrix."""
    def table(header, body):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in body)
        return f"<table><tr>{head}</tr>{cells}</table>"

    ident = [[r["draft_quant"], r["drafter"], r["adaptive"], r["k"], r["tokens"],
              "identical" if r["identical"] else f"differs at {r['first_difference']} (gap {r['top2_gap']})"]
             for r in report["identity"]]
    summary = format_table(report).splitlines()
    return (f"<!doctype html><meta charset='utf-8'><title>specviz prove</title><style>body{{font-family:sans-serif;"
            f"margin:2em}}td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}}</style>"
            f"<h1>specviz prove</h1><p>{html.escape(summary[0])}</p><p><b>{html.escape(summary[-1])}</b></p>"
            f"<p>Prompt: <code>{html.escape(report['meta']['prompt'])}</code>. Per position: total variation between "
            f"the observed tokens and the exact conditionals, beside the chance level of as many exact draws.</p>"
            + table(HEADER, rows(report))
            + ("<h2>Greedy: token-identical to transformers' generate(do_sample=False)</h2>"
               + table(["quant", "drafter", "adaptive", "K", "tokens", "result"], ident) if ident else "")
            + f"<pre>{html.escape(json.dumps(report['meta'], indent=1))}</pre>")

