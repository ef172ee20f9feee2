"""`specviz atlas`: where the draft fails on your prompts: run them all, report per prompt, per position, per token
class, and what to change; the run is `runs.atlas`, its page `ui.atlas_report`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specviz.engine import DecodeConfig
from specviz.models import PairSpec, load_spec
from specviz.runs.outputs import write_atomic
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, values_of
from specviz.settings.spec import validate


def register(sub) -> None:
    p = sub.add_parser("atlas", help="where the draft fails on your prompts: run them all, report per prompt, "
                                     "per position, per token class, and what to change")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help=".jsonl ({\"prompt\", \"kind\"?, \"id\"?} per line), .txt (prompts separated by blank lines) "
                        "or .csv (a `prompt` column)")
    p.add_argument("--json", metavar="FILE", default="atlas.json", help="the report as JSON (default: atlas.json)")
    p.add_argument("--html", metavar="FILE", help="also the report as one self-contained page (plotly inline)")
    p.add_argument("--race", action="store_true",
                   help="race each prompt against the target alone: measured speedups (twice the time)")
    p.add_argument("--export-rejections", metavar="FILE",
                   help="one JSON line per rejected draft: the context's token ids, the drafted and the emitted "
                        "token, both models' top-k (data to distil the draft on its failures)")
    p.add_argument("--traces", metavar="DIR", help="also every prompt's trace (opens in the app's Replay tab); the "
                                                  "HTML's rows link to them")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS)
    p.set_defaults(func=cmd_atlas)


def trace_files(state, folder: Path, page: Path | None) -> dict[str, str]:
    """Each prompt's trace as <folder>/<n>-<id>.json (opens in the app's Replay tab); prompt id -> its path,
    relative to the HTML page when there is one (the page's rows link to them)."""
    from specviz.runs import trace

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for n, run in enumerate(state.runs, start=1):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run.prompt.id)[:60]
        path = trace.save(run.trace, folder / f"{n:03d}-{safe}.json")
        paths[run.prompt.id] = os.path.relpath(path, page.parent) if page else str(path)
    return paths


def run_all(args, prompts, meta: dict):
    """Every prompt through the round loop, the JSON kept whole as it goes (a killed atlas keeps the prompts it
    finished); Ctrl-C stops it with what ran. The final state."""
    from tqdm import tqdm

    from specviz.runs import atlas as atlases
    from specviz.runs import atlas_json
    from specviz.serving.session import Session

    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    spec = validate(PairSpec, values_of(args, PairSpec))
    session = Session(spec=spec)
    session.pair = session.worker.call(lambda: load_spec(spec))  # loaded (and compiled) where its runs will run
    stream = atlases.run_atlas(session, CLI_LIMITS, prompts, config, race=args.race)
    state = next(stream)  # validated: what will run, and each prompt skipped in one sentence
    for problem in state.problems:
        print(f"specviz atlas: {problem}", file=sys.stderr)
    try:
        with tqdm(total=state.total, unit="prompt", desc="atlas") as bar:
            for state in stream:
                if len(state.runs) > bar.n:
                    bar.update(len(state.runs) - bar.n)
                    if args.json:
                        atlas_json.write_json(atlases.report(state, advise=False), args.json, meta=meta)
    except KeyboardInterrupt:  # keep what was made: the prompt cut short too
        stream.close()
        print("specviz atlas: stopped; the report covers what ran.", file=sys.stderr)
    state.close("stopped")
    return state


def write_reports(args, state, meta: dict) -> None:
    """The totals in one line, then the report as JSON, HTML, traces and rejected drafts, as asked."""
    from specviz.runs import atlas as atlases
    from specviz.runs import atlas_json
    from specviz.ui.atlas_report import atlas_html

    report = atlases.report(state)
    html = Path(args.html) if args.html else None
    traces = trace_files(state, Path(args.traces), html) if args.traces else None
    t = report.findings.totals
    print(f"{len(report.runs)} of {report.given} prompts ran ({report.finished}): acceptance {t.acceptance.rate:.0%} "
          f"({t.acceptance.accepted} of {t.acceptance.n} drafted), {t.tokens_per_round:.2f} tokens per round"
          + (f", predicted {t.predicted_speedup:.2f}x" if t.predicted_speedup else "")
          + (f", measured {t.measured_speedup:.2f}x" if t.measured_speedup else ""))
    if args.json:
        print(f"wrote {atlas_json.write_json(report, args.json, traces, meta)}: the report as JSON")
    if html:
        write_atomic(html, atlas_html(report, traces))
        print(f"wrote {html}: the report as one self-contained page")
    if args.export_rejections:
        n = atlas_json.write_rejections(report, args.export_rejections)
        print(f"wrote {args.export_rejections}: {n} rejected drafts with their contexts and both models' top-k")


def cmd_atlas(args) -> int:
    from specviz.bench.machine import run_meta
    from specviz.runs.atlas_input import read_file

    try:
        prompts = read_file(args.prompts, CLI_LIMITS)
    except InputError as e:  # the file, not a flag
        print(f"specviz atlas: {e}", file=sys.stderr)
        return 2
    meta = run_meta()  # one account of the run, in the JSON kept as it goes and in the last
    state = run_all(args, prompts, meta)
    if not state.runs:
        print("specviz atlas: nothing ran, nothing written.", file=sys.stderr)
        return 1
    write_reports(args, state, meta)
    return 0
