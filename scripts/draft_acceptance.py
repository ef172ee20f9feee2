"""The draft's acceptance on its 4-bit x 8-bit kernel beside the old draft's (torch's int4 kernel, bf16 activations).

    .venv/bin/python scripts/draft_acceptance.py --json assets/acceptance/cpu2_<machine>_<date>.json

Issue 61 asks what rounding the draft's activations to 8 bits costs in acceptance. Both drafts are the same lean
int4 draft, loaded as `specviz bench` loads it with every default; the old one is kept off the 4-bit x 8-bit kernel
(its step-level check told that kernel is slower). Each runs speculative decoding, greedy, at the default K and
confidence cut, on the shipped prompts (`specviz/data/prompts.jsonl`). Acceptance depends on no timing, so this
measures it exactly; the texts are the target's either way (checked).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import specviz.models.target as target
from specviz.analysis.stats import spec_stats
from specviz.bench.machine import run_meta
from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.models import PairSpec, encode_prompt, load_spec
from specviz.models.resident import uses
from specviz.settings.spec import validate

PROMPTS = Path(__file__).parents[1] / "specviz" / "data" / "prompts.jsonl"


def run(old: bool, prompts: list[dict]) -> dict:
    """One draft's acceptance over the prompts: per prompt (accepted, drafted, tokens) and pooled."""
    tune_draft = target.with_tuned_draft
    if old:  # the step-level check told that the 4-bit x 8-bit kernel is slower: the plan on torch's int4 kernel
        target.with_tuned_draft = lambda pair, status=print, **kw: tune_draft(pair, status, step_timer=lambda a, b: (
            1.0, 0.0), **kw)
    try:
        pair = load_spec(validate(PairSpec, {}))
    finally:
        target.with_tuned_draft = tune_draft
    config = DecodeConfig(max_new_tokens=64, sampling=SamplingParams(0.0))
    rows, pooled = {}, []
    for p in prompts:
        rounds = list(speculative_generate(pair, encode_prompt(pair.tokenizer, p["prompt"]), config))
        pooled += rounds
        s = spec_stats(rounds)
        rows[p["id"]] = {"accepted": s.accepted, "drafted": s.drafted, "tokens": [t for r in rounds
                                                                                  for t in r.new_token_ids]}
    s = spec_stats(pooled)
    return {"w4a8": uses(pair.draft, "w4a8"), "draft": pair.draft_name, "k": config.k, "confidence": config.confidence,
            "acceptance": s.acceptance_rate, "accepted": s.accepted, "drafted": s.drafted,
            "tokens_per_round": s.mean_accepted_tokens, "per_prompt": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args()
    prompts = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    new, old = run(False, prompts), run(True, prompts)
    same = all(new["per_prompt"][i]["tokens"] == old["per_prompt"][i]["tokens"] for i in new["per_prompt"])
    for name, r in (("4-bit x 8-bit", new), ("torch's int4", old)):
        print(f"{name:>14}: acceptance {r['acceptance']:.4f} ({r['accepted']} of {r['drafted']} drafted), "
              f"{r['tokens_per_round']:.3f} tokens a round")
    print("texts: " + ("the same" if same else "DIFFERENT"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        meta = run_meta() | {"command": "python scripts/draft_acceptance.py " + shlex.join(sys.argv[1:])}
        Path(args.json).write_text(json.dumps({"meta": meta, "w4a8": new, "int4": old, "same_texts": same}, indent=1))


if __name__ == "__main__":
    main()
