"""The exactness proof on any pair (`runs.proof`) for every drafter x adaptive mode x draft quantisation asked for,
and its report as a table and one HTML page (the command is `specviz.commands.prove`).

The proof passes only when every sampler came out as expected (speculative decoding and the target alone pass,
every negative control fails) and, in float32, greedy output equals transformers' generate().
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from specviz.engine import DecodeConfig
from specviz.models.cut_head import draft_vocab_ids
from specviz.models.draft import DraftQuant, with_cheaper_draft
from specviz.runs.proof import ProofSettings, identity, prove, samplers

PROMPT = "Write a haiku about the sea."
IDENTITY_KS = (1, 2, 4, 8)


@dataclass(frozen=True)
class ProofPlan:
    """What the proof runs on a loaded pair: each sampler setting (drafter x adaptive mode), the test's sizes, each
    draft quantisation, and the greedy identity matrix (empty: not asked for)."""

    configs: tuple[DecodeConfig, ...]
    settings: ProofSettings
    quants: tuple[str, ...] = ("none",)
    identity: tuple[DecodeConfig, ...] = ()
    draft_vocab: int = 0  # the cheaper draft's cut head (`PairSpec.draft_vocab`)


def paths(base, plan: ProofPlan) -> int:
    """Sampled paths and identity runs for one quantisation: a progress bar's share of it."""
    def per_setting(calibrate: bool) -> int:
        controls = len(samplers(base, plan.settings, calibrate)) - 1
        return plan.settings.samples + plan.settings.control_samples * controls

    return per_setting(True) + (len(plan.configs) - 1) * per_setting(False) + len(plan.identity)


def quantised(base, quant: str, draft_vocab: int):
    """The pair with its draft quantised as named (and its head cut as the spec asks); as loaded for "none"."""
    if quant == "none" or base.draft is None:
        return base
    return with_cheaper_draft(base, DraftQuant.named(quant), vocab_ids=draft_vocab_ids(base, draft_vocab))


def verdicts(pair, ids: list[int], config: DecodeConfig, settings: ProofSettings, calibrate: bool,
             tick: Callable[[int], None]) -> list[dict]:
    """One setting's samplers scored; `tick(n)` after each n more paths."""
    last = 0
    for progress in prove(pair, ids, config, settings, calibrate=calibrate):
        tick(progress.done - last)
        last = progress.done
    return [verdict_dict(v) for v in progress.verdicts]


def prove_all(base, ids: list[int], plan: ProofPlan, tick: Callable[[int], None]) -> tuple[list[dict], list[dict]]:
    """(runs, identity): every quantisation x setting's verdicts, and each quantisation's greedy identity rows."""
    runs, rows = [], []
    for q in plan.quants:
        pair = quantised(base, q, plan.draft_vocab)
        for i, config in enumerate(plan.configs):
            # the target alone and the draft alone run once per quantisation: no drafter changes their paths
            runs.append({"draft_quant": q, "drafter": config.drafter, "adaptive": config.adaptive, "k": config.k,
                         "verdicts": verdicts(pair, ids, config, plan.settings, i == 0, tick)})
        for row in identity(pair, ids, list(plan.identity)):
            rows.append({"draft_quant": q, **asdict(row)})
            tick(1)
    return runs, rows


def proof_report(meta: dict, runs: list[dict], rows: list[dict]) -> dict:
    """The report: the run's account, every setting's verdicts, the greedy identity rows, and both summed up."""
    return {"meta": meta, "runs": runs, "identity": rows,
            "all_as_expected": all(v["as_expected"] for r in runs for v in r["verdicts"]),
            "identical": all(r["identical"] for r in rows)}


def passed(report: dict) -> bool:
    """Every sampler as expected, and greedy identical to transformers in float32 (in bf16 a difference is reported
    and explained, not failed)."""
    return report["all_as_expected"] and (report["identical"] or report["meta"]["dtype"] != "float32")


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

