"""The paragraph under a table that names the run behind it: machine, date, command and settings, every word from
the report's own metadata (`about(report)` in templates)."""

from __future__ import annotations

import functools
from pathlib import Path

from docsgen import machines
from docsgen.cli_reference import build_parser, subcommands


def command_of(meta: dict) -> str | None:
    """The command that made a report: recorded as text, or rebuilt from the flags it recorded (`args`)."""
    if meta.get("command"):
        return meta["command"]
    if not meta.get("args"):
        return None
    name = meta["args"].get("command", "bench")  # (bench reports before others recorded their command's name)
    parser = dict((n, p) for n, _, p in subcommands(build_parser()))[name]
    words = ["specviz", name]
    for action in parser._actions:
        if not action.option_strings or action.dest not in meta["args"]:
            continue
        value = meta["args"][action.dest]
        if value == action.default:
            continue
        if action.nargs == 0:
            words.append(action.option_strings[0] if value else f"--no-{action.option_strings[0][2:]}")
        else:
            words += [action.option_strings[0], str(value)]
    return " ".join(words)


def retired(command: str) -> list[str]:
    """The flags of a recorded `specviz` command that today's parser no longer has (a report keeps the command as it
    ran; the page says which of its flags are gone)."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return []
    if len(words) < 2 or words[0] != "specviz":
        return []
    table = flags_by_command()
    if words[1] not in table:
        return [words[1]]
    return [w for w in words[2:] if w.startswith("--") and w.split("=")[0] not in table[words[1]]]


@functools.cache
def flags_by_command() -> dict[str, frozenset[str]]:
    return {n: frozenset(o for a in p._actions for o in a.option_strings) for n, _, p in subcommands(build_parser())}


def sampling_text(s: dict) -> str:
    if not s["temperature"]:
        return "greedy"
    warps = [f"T = {s['temperature']}"] + [f"top-k {s['top_k']}"] * bool(s["top_k"]) + \
            [f"top-p {s['top_p']}"] * (s["top_p"] < 1)
    return "sampled, " + ", ".join(warps)


def hardware_text(machine: dict) -> str:
    """The machine as a person recognises it (`machines.name`: maker, generation, cores, the units that decide the
    kernels, a GPU), then the library versions; the CPUID stays in the report the paragraph links."""
    return ", ".join([machines.name(machine),
                      *([f"torch {machine['torch']}"] if "torch" in machine else []),
                      *([f"transformers {machine['transformers']}"] if "transformers" in machine else [])])


def settings_text(report: dict) -> str:
    """The settings of a run, told apart by the keys its kind of report has."""
    meta = report["meta"]
    if "seconds" in report and "disk_bytes" in report:
        return "a fresh clone set up from nothing (`scripts/setup.sh app`), then its first load of the pair"
    if "wait_s" in report:
        return (f"{report['users']} simulated visitors against `{meta['server']['command']}`, "
                f"{report['seconds']:.0f} s")
    if "ways" in report:  # `specviz rows`
        return (f"{meta['pair']} in {meta['dtype']}; a verify of {len(report['ways'][0]['rows']['tokens'])} rows after "
                f"the prompt \"{report['prompt']}\", each way's greedy texts over {meta['tokens']} tokens")
    if "example" in report:
        return f"one race of the shipped example \"{report['example']}\" in the app, as the screenshot shows it"
    if "same_texts" in report:  # scripts/draft_acceptance.py
        w = report["w4a8"]
        return (f"{w['draft']}, every default (K = {w['k']}, confidence cut {w['confidence']}), greedy, on "
                f"{len(w['per_prompt'])} prompts, on its int4 x int8 kernel and on torch's int4 kernel")
    if "engines" in report:
        return engines_settings(report)
    if "steps" in report:
        return costs_settings(report)
    if "summary" in report:
        return bench_settings(report)
    if "runs" in report and "samples" in meta:
        return proof_settings(meta)
    return atlas_settings(report)


def about(report: dict, path_hint: str = "") -> str:
    """One paragraph naming the run behind a table, every word of it from the report's own metadata: the machine,
    the date, the command, and the settings (a bench's, a proof's or an atlas's)."""
    meta = report["meta"]
    hardware, settings = hardware_text(meta.get("machine", {})), settings_text(report)
    command = command_of(meta)
    lines = [f"*Run*: {meta.get('date', 'date not recorded')}, {hardware}. {settings}.",
             (f"*Command*: `{command}` (as run then: today's `specviz` has no {', '.join(f'`{w}`' for w in gone)})."
              if command and (gone := retired(command)) else
              f"*Command*: `{command}`." if command else "*Command*: not recorded."),
             f"*Report*: [`{path_hint}`]({path_hint})." if path_hint else ""]
    return " ".join(line for line in lines if line)


def costs_settings(report: dict) -> str:
    meta, args = report["meta"], report["meta"]["args"]
    return "; ".join([f"{args['draft']} → {args['target']}", f"{meta['dtype']} on {meta['device']}",
                      f"steps {' and '.join(report['steps'])}", f"a context of {args['prompt_tokens']} tokens",
                      f"the verify curve to {args['max_verify']} tokens, medians of {args['reps']} repetitions",
                      f"the loop at full acceptance at K = {args['forced_k']}, {args['forced_tokens']} new tokens"])


def engines_settings(report: dict) -> str:
    meta, engines = report["meta"], report["engines"]
    lanes = "; ".join(f"{lane}: {e['kind']} serving `{Path(e['model'] or '?').name}`"
                      + (f" with K = {e['k']}" if e.get("k") else "") for lane, e in engines.items())
    return (f"{lanes}; {sampling_text(meta['decoding'])}, {meta['decoding']['max_new_tokens']} new tokens, "
            f"{report['summary']['prompts']} prompts × {meta['repeats']} repetitions in a shuffled order")


def bench_settings(report: dict) -> str:
    meta, summary, config = report["meta"], report["summary"], report["config"]
    setting = summary.get("setting") or f"K = {summary['k']}"
    parts = [f"{meta['draft']} → {meta['target']}", f"{summary['dtype']} on {summary['device']}"]
    if meta.get("draft_quant", {}).get("applied"):
        parts.append(f"int{meta['draft_quant']['bits']} draft step")
    parts += [f"setting `{setting}` ({config['adaptive']})",
              f"{sampling_text(config['sampling'])}, {config['max_new_tokens']} new tokens"]
    if summary.get("reported_on"):
        tuned = len(summary.get("tuned_on") or [])
        parts.append(f"reported on {len(summary['reported_on'])} prompts"
                     + (f" (tuned on {tuned} others)" if tuned else "")
                     + (f", {summary['reps']} repetition(s)" if "reps" in summary else ""))
    return "; ".join(parts)


def proof_settings(meta: dict) -> str:
    return "; ".join([f"{meta['draft']} → {meta['target']}", f"{meta['dtype']} on {meta['device']}",
                      f"{sampling_text(meta['sampling'])}, {meta['length']} tokens per path",
                      f"{meta['samples']:,} speculative paths, {meta['control_samples']:,} for the target alone and "
                      f"each control", f"α = {meta['alpha']} per sampler", f"prompt “{meta['prompt']}”"])


def atlas_settings(report: dict) -> str:
    pair, s = report["pair"], report["settings"]
    sampling = {k: s[k] for k in ("temperature", "top_k", "top_p")}
    return "; ".join([f"{pair['draft']} → {pair['target']}", f"{pair['dtype']} on {pair['device']}",
                      f"drafter {s['drafter']}, K = {s['k']}, {s['adaptive']} cut {s['confidence']}",
                      f"{sampling_text(sampling)}, {s['max_new_tokens']} new tokens",
                      f"{report['input']['ran']} prompts"])
