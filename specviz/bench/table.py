"""The bench report as text: the reported runs side by side, every method, the tuning grid and the summary.

A pure function of the report dict `report.build_report` makes (the JSON `--json` writes), so what is
printed and what is saved cannot disagree.
"""

from __future__ import annotations


def _fmt(x, spec: str = ".2f", none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return format(x, spec)


def _ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "[no interval: under 3 prompts]"


def format_table(report: dict) -> str:
    """The reported runs side by side, then every method, the tuning grid and the summary."""
    return "\n".join([*runs_lines(report), "", *methods_lines(report), "", *settings_lines(report), "",
                      *summary_lines(report), *tree_lines(report.get("tree")),
                      *untuned_lines(report.get("untuned")), *cost_lines(report["costs"]),
                      *anchor_lines(report.get("anchors"), report.get("llamacpp")),
                      *predictor_lines(report.get("acceptance_model"))])


def identical_cell(r: dict) -> str:
    """yes, or NO with where the run first parted from the AR lane and the target's top-2 gap there."""
    d = r["first_divergence"]
    return _fmt(r["identical_to_ar"]) if d is None else f"NO@{d['position']} gap {_fmt(d['target_top2_gap'], '.3f')}"


def runs_lines(report: dict) -> list[str]:
    """One row per reported prompt and repetition, columns aligned."""
    same = report["summary"]["hf_same_draft_setting"]
    header = ("prompt", "kind", "rep", "AR tok/s", "HF AR tok/s", "spec tok/s", "HF same tok/s", "speedup",
              "prefill s AR/spec", "decode x", "pred", "accept", "tok/round", "identical")
    rows = [(r["id"], r["kind"], str(r["rep"]), _fmt(r["ar_tokens_per_s"]), _fmt(r["ar_hf_tokens_per_s"]),
             _fmt(r["spec_tokens_per_s"]), _fmt(r["hf_tokens_per_s"].get(same)), _fmt(r["speedup"]) + "x",
             f"{_fmt(r['prefill_s']['ar'])}/{_fmt(r['prefill_s']['spec'])}", _fmt(r["decode_speedup"]) + "x",
             _fmt(r["predicted_speedup"]), _fmt(r["acceptance_rate"]), _fmt(r["mean_accepted_tokens"]),
             identical_cell(r))
            for r in report["runs"]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [header, *rows]]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def methods_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = [f"methods on the {len(s['reported_on'])} reported prompts (ratios of totals over {s['baseline']}, "
             f"95% bootstrap CI over those prompts):"]
    for name, m in report["methods"].items():
        lines.append(f"  {name:<24} {_fmt(m['tokens_per_s'])} tok/s  {_fmt(m['speedup'])}x  "
                     f"{_ci(m['speedup_ci95']) if m['speedup_ci95'] else ''}  "
                     f"identical to AR {_fmt(m['identical_fraction'])}"
                     + (f"  acceptance {_fmt(m['acceptance_rate'])}" if m.get("acceptance_rate") is not None else ""))
    return lines


def settings_lines(report: dict) -> list[str]:
    s = report["summary"]
    tuned = f"tuned on {', '.join(s['tuned_on'])}" if s["tuned_on"] else "one setting: no tuning"
    lines = [f"settings ({tuned}):"]
    for name, t in report["settings"].items():
        mark = "  <- chosen" if name == s["setting"] else ""
        lines.append(f"  {name:<12} {_fmt(t['spec_tokens_per_s'])} tok/s, acceptance {_fmt(t['acceptance_rate'])}, "
                     f"{_fmt(t['mean_accepted_tokens'])} tok/round, round ms {t['round_ms']}{mark}")
    return lines


def summary_lines(report: dict) -> list[str]:
    """The chosen setting's speedups (scaled where the baseline check failed, and said so), acceptance,
    prediction and how calm the machine was."""
    s, c = report["summary"], report["costs"]
    vs_hf = "   ".join(f"{label} draft ({s[f'hf_{label}_draft_setting']}) {_fmt(s[key])}x {_ci(s[key + '_ci95'])}"
                       for label, key in (("same", "vs_hf"), ("other", "vs_hf_other_draft"))
                       if s[f"hf_{label}_draft_setting"])
    return [f"summary ({s['setting']}, reported on {len(s['reported_on'])} prompt(s) x {s['reps']} rep(s), "
            f"{s['device']}, {s['dtype']}):",
            *([f"  ⚠ the baseline check failed ({c['baseline_check']['sentence']}): the speedup below is scaled "
               f"by the lowest T(n)/T1 (as measured: {_fmt(s['speedup_as_measured'])}x)"]
              if s.get("baseline_check_ok") is False and s.get("speedup_as_measured") != s["speedup"] else []),
            f"  speedup over the target alone {_fmt(s['speedup'])}x {_ci(s['speedup_ci95'])} "
            f"(baseline: {s['baseline']}; AR {_fmt(s['ar_tokens_per_s'])} tok/s, "
            f"transformers {_fmt(s['ar_hf_tokens_per_s'])} tok/s; decode alone over the AR lane "
            f"{_fmt(s['decode_speedup'])}x)",
            f"  by kind {s['speedup_by_kind']}",
            "  vs HF: " + (vs_hf or "not run (--compare-hf)"),
            f"  acceptance {_fmt(s['acceptance_rate'])}   identical to AR {_fmt(s['identical_fraction'])}",
            f"  predicted {_fmt(s['predicted_speedup'])}x   efficiency {_fmt(s['efficiency'])} end to end, "
            f"{_fmt(s.get('decode_efficiency'))} decoding   "
            f"event overhead {_fmt(s['event_overhead'], '.3f')}   best K predicted {s['best_k_predicted']}",
            *([f"  reading the prompt: {_fmt(share['spec'], '.0%')} of the speculative lane's time (both models), "
               f"{_fmt(share['ar'], '.0%')} of the AR lane's: not sped up, and not in the cost model"]
              if (share := s.get("prompt_share")) else []),
            f"  CPU contention: worst call kept stalled {_fmt(s['max_cpu_stall'], '.1%')} of its time; "
            f"{s['remeasured']} repetition(s) measured again"
            + (f"; ⚠ torch compiled inside {s['compiles_in_timed_runs']} kept call(s): those are no measure of "
               "speed" if s.get("compiles_in_timed_runs") else "; nothing compiled inside a timed call")]


def tree_lines(t: dict | None) -> list[str]:
    """The best tree beside the chain: speedups, tokens per round, acceptance by depth and by sibling rank."""
    if not t:
        return []
    def rates(rows: list[dict]) -> str:
        return ", ".join(f"{row['rate']:.2f} ({row['accepted']}/{row['tried']})" for row in rows)

    return [f"  tree ({t['setting']}, tuned like the chain): {_fmt(t['speedup'])}x {_ci(t['speedup_ci95'])}; "
            f"over the chain {_fmt(t['vs_chain'])}x {_ci(t['vs_chain_ci95'])}, by kind {t['vs_chain_by_kind']}",
            f"    tokens per round: tree {_fmt(t['tokens_per_round']['tree'])} with "
            f"{_fmt(t['nodes_per_round'], '.1f')} nodes vs chain {_fmt(t['tokens_per_round']['chain'])}",
            f"    accepted at depth 1, 2, ...: {rates(t['by_depth'])}",
            f"    accepted by sibling rank 1, 2, ...: {rates(t['by_rank'])}"]


def untuned_lines(u: dict | None) -> list[str]:
    """Tuned kernels over the kernels as loaded, per lane, and the untuned cost curve."""
    if not u:
        return []
    lines = ["  tuned kernels over the kernels as loaded (same settings and prompts): "
             + "; ".join(f"{name} {_fmt(g['tuned_over_untuned'])}x {_ci(g['ci95'])} "
                         f"({_fmt(g['untuned_tokens_per_s'])} tok/s untuned), by kind {g['by_kind']}"
                         for name, g in (("target alone", u["ar"]), ("chain", u["chain"]), ("tree", u["tree"])) if g)]
    if u["costs"]:
        lines.append(f"    untuned: target step {u['costs']['target_step_ms']} ms, draft step "
                     f"{u['costs']['draft_step_ms']} ms (c = {u['costs']['c']}), verify/T1 for n=1..: "
                     f"{u['costs']['verify_ratio']}")
    return lines


def cost_lines(c: dict | None) -> list[str]:
    """The cost model's measured steps and verify curve, and whether the target alone ran its fastest step."""
    if not c:
        return []
    check = c["baseline_check"]
    return [f"  costs: target step {c['target_step_ms']} ms, draft step {c['draft_step_ms']} ms "
            f"(c = {c['c']}), verify/T1 for n=1..: {c['verify_ratio']}",
            f"  baseline check: lowest T(n)/T1 {_fmt(check['min_ratio'])} (floor {check['floor']}): "
            + ("the target alone runs its fastest one-token step" if check["ok"] else check["sentence"])]


def predictor_lines(a: dict | None) -> list[str]:
    """The acceptance predictor judged on prompts it was not fitted on."""
    if not a:
        return []
    table = ", ".join(f"{b['bin']}: {b['observed']:.2f} of {b['n']}" for b in a["reliability"])
    return [f"  acceptance predictor: Brier {a['brier']} (base rate alone {a['brier_base_rate']}) on "
            f"{a['tested_on_tokens']} drafted tokens of prompts it was not fitted on; observed by predicted bin: "
            f"{table}"]


def anchor_lines(anchors: dict | None, llamacpp: dict | None) -> list[str]:
    """The bandwidth bound under each model's step, and llama.cpp on the same files and prompts."""
    lines = []
    if anchors:
        steps = "; ".join(f"{role} step {a['step_ms']} ms, bound {a['bound_ms']} ms ({a['weight_bytes'] / 1e9:.2f} GB "
                          f"of weights), {_fmt(a['fraction_of_bound'])} of the bound"
                          for role in ("target", "draft") if (a := anchors.get(role)))
        lines.append(f"  memory bandwidth (triad) {anchors['bandwidth_gb_s']} GB/s" + (f": {steps}" if steps else ""))
    if llamacpp:
        lines.append(f"  llama.cpp ({llamacpp['build']}, {llamacpp['threads']} threads, the same GGUF files): "
                     f"target alone {_fmt(llamacpp['target_tokens_per_s'])} tok/s, draft alone "
                     f"{_fmt(llamacpp['draft_tokens_per_s'])} tok/s (c = {_fmt(llamacpp['c'])}); speculative "
                     f"(K = {llamacpp['k']}) {_fmt(llamacpp['spec_tokens_per_s'])} tok/s = "
                     f"{_fmt(llamacpp['spec_over_target'])}x its own target alone, acceptance "
                     f"{_fmt(llamacpp['acceptance'])} on {llamacpp['prompts']} prompt(s)")
    return lines
