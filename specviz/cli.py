"""The `specviz` command: serve the app, record a trace, run benchmarks, prepare the embedded pair.

Every model, decoding and limit option is generated from the settings specs (`runs.options`) and
checked by the same validation as the app's controls; trace and bench use the CLI's own limits.

Serving's security defaults, in one place: loopback unless --host is given; never a Gradio share link;
the served pair is fixed unless --allow-pair-switch; remote model code only for the pair named on the
command line with --trust-remote-code; with switching on, visitors may load any model only when the
server is bound to loopback (or --allow-any-model says so), else only the presets.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from specviz.engine import DecodeConfig
from specviz.models import ModelLoadError, PairSpec, load_spec
from specviz.models.pair import OUT_OF_MEMORY
from specviz.settings.errors import INTERRUPTED, MACHINE_FAULT, InputError, os_fault, sigterm_as_interrupt
from specviz.serving.hosts import is_loopback
from specviz.settings.limits import CLI_LIMITS, Limits
from specviz.settings.options import add_options, values_of
from specviz.runs.outputs import output_problem, write_atomic
from specviz.settings.spec import validate


def cmd_trace(args) -> int:
    from specviz.analysis.stats import spec_stats
    from specviz.runs import trace

    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    pair = load_spec(validate(PairSpec, values_of(args, PairSpec)))
    t = trace.record(pair, args.prompt, config, with_ar=args.with_ar)
    trace.save(t, args.out)
    s = spec_stats(t.rounds)
    print(f"wrote {args.out}: {s.rounds} rounds, {s.tokens} tokens, acceptance {s.acceptance_rate:.2f}")
    if args.html:
        from specviz.ui.share import share_html

        write_atomic(args.html, share_html(t))
        print(f"wrote {args.html}: the run as one self-contained page")
    return 0


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


def cmd_atlas(args) -> int:
    from tqdm import tqdm

    from specviz.runs import atlas as atlases
    from specviz.runs import atlas_json
    from specviz.runs.atlas_input import read_file
    from specviz.remote.machine import run_meta
    from specviz.serving.session import Session
    from specviz.ui.atlas_report import atlas_html

    try:
        prompts = read_file(args.prompts, CLI_LIMITS)
    except InputError as e:  # the file, not a flag
        print(f"specviz atlas: {e}", file=sys.stderr)
        return 2
    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    spec = validate(PairSpec, values_of(args, PairSpec))
    session = Session(spec=spec)
    session.pair = session.worker.call(lambda: load_spec(spec))  # loaded (and compiled) where its runs will run
    stream = atlases.run_atlas(session, CLI_LIMITS, prompts, config, race=args.race)
    meta = run_meta()
    state = next(stream)  # validated: what will run, and each prompt skipped in one sentence
    for problem in state.problems:
        print(f"specviz atlas: {problem}", file=sys.stderr)
    try:
        with tqdm(total=state.total, unit="prompt", desc="atlas") as bar:
            for state in stream:
                if len(state.runs) > bar.n:
                    bar.update(len(state.runs) - bar.n)
                    if args.json:  # kept as it goes, whole: a killed atlas keeps the prompts it finished
                        atlas_json.write_json(atlases.report(state, advise=False), args.json, meta=meta)
    except KeyboardInterrupt:  # keep what was made: the prompt cut short too
        stream.close()
        print("specviz atlas: stopped; the report covers what ran.", file=sys.stderr)
    state.close("stopped")
    if not state.runs:
        print("specviz atlas: nothing ran, nothing written.", file=sys.stderr)
        return 1
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
    return 0


def add_atlas(sub) -> None:
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


def cmd_prepare(args) -> int:
    import torch

    dtypes = (torch.float32, torch.bfloat16)  # exactness's dtype, and the one a CPU with bf16 units or a GPU runs
    from specviz.models.embedded import EMBEDDED_MODELS, EmbeddedModelError, is_converted

    if args.requirements:  # setup.sh installs only these: a converted model's chunks are never read again
        for requirement in (r for m in EMBEDDED_MODELS if not is_converted(m) for r in m.requirements()):
            print(requirement)
        return 0
    from specviz.models.loading import prepare_embedded

    if args.verify:  # each converted file against its recorded sha256: a damaged folder is converted again below
        from specviz.models.converted import SOURCE, verify
        from specviz.models.embedded import converted_dir

        for folder, model in ((converted_dir(m, dtype), m) for m in EMBEDDED_MODELS for dtype in dtypes
                              if is_converted(m, dtype)):
            if bad := verify(folder, model.sha256):
                print(f"specviz prepare: {folder}: {', '.join(bad)} damaged (sha256 differs); converting it again.",
                      file=sys.stderr)
                (folder / SOURCE).unlink()
    for model in EMBEDDED_MODELS:
        try:
            for dtype in dtypes:
                print(f"{model.folder} ({str(dtype).removeprefix('torch.')}): "
                      f"{prepare_embedded(model, status=print, dtype=dtype)}")
        except EmbeddedModelError as e:  # a package missing or damaged: what to run is in the message
            print(f"specviz prepare: {e}", file=sys.stderr)
            return 2
    return 0


def allow_any_model(args: argparse.Namespace) -> bool:
    """--allow-any-model / --no-allow-any-model when given; otherwise only on a loopback address."""
    return is_loopback(args.host) if args.allow_any_model is None else args.allow_any_model


def cmd_serve(args: argparse.Namespace) -> int:
    from specviz.serving.recorded import Recordings
    from specviz.runs.room import Room, record_examples, room_defaults, room_limits, room_of
    from specviz.serving.session import Session
    from specviz.settings.spec import flat_values
    from specviz.server import build_server, launch  # gradio: only when serving
    from specviz.remote.policy import EngineError, EnginePolicy
    from specviz.ui.handlers import Options
    from specviz.ui.examples import EXAMPLES
    from specviz.models.memory import resident

    room = room_of(values_of(args, Room))
    engines = tuple(args.allow_engine or ())
    try:
        EnginePolicy(allowed=engines)  # a bad URL stops the start, in one sentence
    except EngineError as e:
        print(f"specviz: bad flag: --allow-engine: {e}", file=sys.stderr)
        return 2
    given = {k: v for k, v in values_of(args, Limits).items() if v is not None}  # the limits flags given
    limits = validate(Limits, room_limits(given, room))  # fail at start-up, not on the first click
    defaults = room_defaults(validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS), room, limits)
    defaults = validate(DecodeConfig, flat_values(defaults), limits)
    spec = validate(PairSpec, values_of(args, PairSpec))
    recordings = Recordings(room.recorded_mb * 2**20) if room.recorded else None
    session = Session(spec=spec, allow_switch=args.allow_pair_switch, allow_any_model=allow_any_model(args),
                      recordings=recordings)
    print(f"specviz: loading {spec.label}…", flush=True)
    session.load(spec.draft, spec.target, spec.dtype, status=lambda line: print(f"  {line}", flush=True))
    demo = build_server(session, limits, Options(engines=engines), defaults=defaults, presenter_key=room.presenter_key)
    if session.allow_switch:
        models = "any model" if session.allow_any_model else "the presets and the pair above only"
        switching = f"pair switching on: visitors may load {models}"
    else:
        switching = "pair switching off: the pair is fixed (--allow-pair-switch turns it on)"
    print(f"specviz: serving {session.name} on http://{args.host}:{args.port} ({switching}; each request may hold "
          f"the model {limits.max_seconds} s at most)", flush=True)
    held = resident(session.pair)
    weights = ", ".join(f"{role}'s weights {n / 1e9:.2f} GB" for role, n in held["weights_bytes"].items())
    print(f"specviz: memory: {weights} resident; the process {held['rss_bytes'] / 1e9:.2f} GB, "
          f"{held['peak_rss_bytes'] / 1e9:.2f} GB at its peak (the load)", flush=True)
    print(f"specviz: {'a room' if room.room else 'limits'}: {limits.max_new_tokens} new tokens, K up to "
          f"{limits.max_k}, {limits.max_samples} samples per side, {limits.max_seconds} s per request, "
          f"{limits.max_queue} requests waiting at most; the app opens at {defaults.max_new_tokens} new tokens; "
          + (f"recorded answers on ({room.recorded_mb} MB)" if recordings is not None else "recorded answers off")
          + ("; a presenter key is set" if room.presenter_key else "; nobody presents (--presenter-key)"), flush=True)
    if not is_loopback(args.host):
        print("specviz: bound beyond loopback: anyone who can reach this port can run the models.", flush=True)
    print("specviz: engines visitors may race: " + (", ".join(engines) if engines else "none (--allow-engine URL)"),
          flush=True)
    if recordings is not None:  # a warm-up that is also a recording: the first click on an example streams at once
        record_examples(session, limits, [prompt for _, prompt in EXAMPLES], flat_values(defaults),
                        log=lambda line: print(f"specviz: {line}", flush=True))
    launch(demo, host=args.host, port=args.port, limits=limits, state_session_capacity=limits.max_sessions)
    return 0


def add_serve(sub) -> None:
    from specviz.settings.options import options_of
    from specviz.runs.room import Room

    p = sub.add_parser("serve", help="serve the app (http://127.0.0.1:7860 by default)")
    # Gradio's and hosted Spaces' convention: the environment may choose the address; loopback stays the default
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to bind (default: $GRADIO_SERVER_NAME or 127.0.0.1); 0.0.0.0 exposes the app "
                        "to the network")
    p.add_argument("--port", type=int, default=os.environ.get("GRADIO_SERVER_PORT", "7860"),
                   help="default: $GRADIO_SERVER_PORT or 7860")
    p.add_argument("--allow-pair-switch", action="store_true",
                   help="let visitors change the served pair (the UI's model menu and /load_pair); off by default: "
                        "the pair given here is served until the server stops")
    p.add_argument("--allow-any-model", action=argparse.BooleanOptionalAction, default=None,
                   help="with --allow-pair-switch: let visitors load any hub id, folder or .gguf, not only the "
                        "presets and the pair served at start (default: on when --host is a loopback address, "
                        "off otherwise)")
    p.add_argument("--allow-engine", action="extend", nargs="+", metavar="URL",
                   help="an engine's base URL (llama.cpp's llama-server, vLLM, SGLang) visitors may race in the "
                        "Engines tab; nothing else is fetched (none by default; `specviz engines llamacpp` starts "
                        "a local pair)")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding (the app opens with these)"), DecodeConfig, Limits())
    add_options(p.add_argument_group("limits (per request)"), Limits)
    # a limit not given stays unset, so that --room can tell the flags given from the defaults
    p.set_defaults(**{dest: None for _, _, dest in options_of(Limits)})
    add_options(p.add_argument_group("a room (a workshop: recorded answers, a presenter to follow)"), Room)
    p.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    from specviz.bench import command as bench, load_command, prove, shape_costs, whatif
    from specviz.remote import command as engines

    parser = argparse.ArgumentParser(prog="specviz", description="See speculative decoding work.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="assemble, verify (sha256) and convert the embedded pair into the cache")
    p.add_argument("--requirements", action="store_true",
                   help="only print the pinned packages still needed (none once the cache holds the converted pair)")
    p.add_argument("--verify", action="store_true",
                   help="also check every converted file against its recorded sha256 (a minute), converting a "
                        "damaged one again (every start checks their sizes only)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("trace", help="run once and write the event stream as JSON")
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", default="trace.json")
    p.add_argument("--with-ar", action="store_true", help="also record the target alone (for replaying the race)")
    p.add_argument("--html", metavar="FILE", help="also write the run as one self-contained HTML page to share")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS)
    p.set_defaults(func=cmd_trace)

    add_serve(sub)
    add_atlas(sub)
    bench.register(sub)
    shape_costs.register(sub)
    prove.register(sub)
    whatif.register(sub)
    load_command.register(sub)
    engines.add_engines_parser(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if (problem := output_problem(args)) is not None:
        print(f"specviz {args.command}: cannot write {problem}; nothing was run.", file=sys.stderr)
        return MACHINE_FAULT
    try:
        with sigterm_as_interrupt():
            return args.func(args)
    except InputError as e:
        print(f"specviz: bad flag: {e}", file=sys.stderr)
        return 2
    except ModelLoadError as e:
        print(f"specviz: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specviz {args.command}: interrupted; nothing more was written.", file=sys.stderr)
        return INTERRUPTED
    except OUT_OF_MEMORY:
        print(f"specviz {args.command}: out of memory: pick a smaller pair, a lower-precision dtype or fewer new "
              "tokens.", file=sys.stderr)
        return MACHINE_FAULT
    except OSError as e:  # a full or read-only disk, a missing folder: the machine, not the flags
        print(f"specviz {args.command}: {os_fault(e)}.", file=sys.stderr)
        return MACHINE_FAULT


if __name__ == "__main__":
    sys.exit(main())
