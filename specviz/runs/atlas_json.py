"""The Atlas as JSON: the report (`--json`) and the rejections to distil the draft on (`--export-rejections`).

Report (format "specviz-atlas", version 1). Every rate is a Count {"n", "accepted", "rate"}: n counts drafted
tokens in `totals`, `prompts`, `kinds` and `advice.kinds[].acceptance` (the drafts after a rejection too: work
thrown away), tested ones (accepted or rejected) in `where` and `classes`.
    pair {draft, target, device, dtype}, settings {the flat decoding settings}, race, finished (done | budget |
    stopped), input {valid, ran, problems: [one sentence per prompt skipped]},
    cost {target_step_s, draft_step_s, c, verify_ratio, target_step_from} | null,
    totals {prompts, rounds, tokens, acceptance, tokens_per_round, predicted_speedup, measured_speedup},
    prompts [{id, kind, prompt_tokens, rounds, tokens, acceptance, tokens_per_round, predicted_speedup,
              measured_speedup, finished, trace}]  (worst first; trace: its file, when written),
    where {by_position [Count, position 1 first], by_confidence [{low, high, mean, acceptance}],
           by_entropy [{low, high (null: open), mean, acceptance}]},
    disagreements [{drafted {id, text}, wanted {id, text}, count, tokens_lost,
                    examples [{prompt_id, round, context}]}]  (most tokens lost first),
    classes [{name, acceptance, rejections, tokens_lost}], undraftable {the same, name "cannot propose"},
    kinds {kind: Count},
    advice {kinds [{kind, prompts, rounds, acceptance, current {k, cut, predicted_speedup}, best {k, cut,
                    predicted_speedup}, whatif_best_k, lookup REPLAY, hybrid REPLAY | null}],
            alternatives [{name: lookup | hybrid, replay REPLAY, predicted_speedup}],
            ceiling {k, tokens_per_round, predicted_speedup} | null}
    with REPLAY = {rounds, drafted, accepted, acceptance, tokens, tokens_per_round, model_drafted, unknown}.
Rejections: one `analysis.rejections.record` per line.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from specviz.analysis.rejections import record, rejections
from specviz.runs.atlas import AtlasReport
from specviz.settings.spec import flat_values
from specviz.runs.outputs import write_atomic

FORMAT, VERSION = "specviz-atlas", 1


def cost_dict(report: AtlasReport) -> dict | None:
    c, k = report.cost, report.config.k
    if c is None:
        return None
    return {"target_step_s": c.target_step_s, "draft_step_s": c.draft_step_s, "c": c.c,
            "verify_ratio": c.verify_time(k + 1) / c.target_step_s,
            "target_step_from": "the target alone's steps" if report.race else "the mean verify pass"}


def report_dict(report: AtlasReport, traces: dict[str, str] | None = None) -> dict:
    """`traces`: prompt id -> where its trace was written (each row names its own)."""
    found = asdict(report.findings)
    for row in found["prompts"]:
        row["trace"] = (traces or {}).get(row["id"])
    return {"format": FORMAT, "version": VERSION, "pair": report.pair, "settings": flat_values(report.config),
            "race": report.race, "finished": report.finished,
            "input": {"valid": report.given, "ran": len(report.runs), "problems": list(report.problems)},
            "cost": cost_dict(report), **found, "advice": asdict(report.advice)}


def write_json(report: AtlasReport, path: str | Path, traces: dict[str, str] | None = None,
               meta: dict | None = None) -> Path:
    """The report as JSON, written whole; `meta`: the run's own account of itself (machine, date, command)."""
    path = Path(path)
    write_atomic(path, json.dumps(report_dict(report, traces) | ({"meta": meta} if meta else {}), ensure_ascii=False,
                                  indent=1))
    return path


def write_rejections(report: AtlasReport, path: str | Path) -> int:
    """One JSON object per rejected draft; returns how many."""
    rows = [record(rej) for rej in rejections(report.runs)]
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return len(rows)
