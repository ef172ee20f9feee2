"""`specviz loadtest`: many users at once against a running app (the load in `bench/loadtest.py`, the workshop's mix
in `bench/workshop.py`, the printed summary in `bench/load_summary.py`)."""

from __future__ import annotations

import json
from dataclasses import asdict


def register(sub) -> None:
    p = sub.add_parser("loadtest", help="many users at once against a running app: throughput, waits, errors")
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--mix", choices=("test", "workshop"), default="test",
                   help="test: runs, races, replays, same distribution and bad inputs in turn (short runs); "
                        "workshop: a room's clicks (60%% examples at the app's defaults, 25%% own prompts, 10%% "
                        "replays and What if, 5%% same distribution) plus bad inputs")
    p.add_argument("--seconds", type=float, default=None, help="start no request after this (default: 30, "
                                                               "or none with --requests or the workshop mix)")
    p.add_argument("--requests", type=int, default=None, help="requests per user (the workshop mix: 2)")
    p.add_argument("--think", type=float, default=0.0,
                   help="seconds a user may pause (drawn 0..this, seeded) before each request after its first")
    p.add_argument("--disconnect", type=int, default=1, help="more users, each dropping a streaming run mid-way")
    p.add_argument("--max-new-tokens", type=int, default=16,
                   help="tokens per run of the test mix (short runs: a test, not a bench)")
    p.add_argument("--samples", type=int, default=16, help="samples per side of /same_distribution (test mix)")
    p.add_argument("--seed", type=int, default=0, help="shuffles the order of the request mix")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a request may take, its queue wait included, before it counts as an error")
    p.add_argument("--poll", type=float, default=0.05,
                   help="seconds between a user's looks at its request (the waits' resolution; each look costs the "
                        "load test's own CPU, which a 2-core server shares)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the summary and every request")
    p.add_argument("--pid", type=int, default=None, help="the server's process id: its RSS before and after")
    p.set_defaults(func=cmd_loadtest)


def load_of(args):
    """The flags as a `Load`: the workshop's mix is every user's share of one seeded plan, a few bad inputs among
    them; the test mix runs 30 s unless a count of requests is given."""
    from specviz.bench.loadtest import Load
    from specviz.bench.workshop import BAD, workshop_requests

    plan, requests = None, args.requests
    if args.mix == "workshop":
        requests = requests or 2
        bad = max(len(BAD), args.users // 5)
        plan = lambda info: workshop_requests(info, args.users * requests, args.seed, bad)  # noqa: E731
    seconds = 30.0 if args.seconds is None and requests is None else args.seconds
    return Load(args.users, seconds, requests, disconnect=args.disconnect, max_new_tokens=args.max_new_tokens,
                samples=args.samples, seed=args.seed, plan=plan, think=args.think)


def cmd_loadtest(args) -> int:
    from specviz.bench.load_summary import table
    from specviz.bench.loadtest import run_load
    from specviz.bench.meta import machine
    from specviz.bench.machine import run_meta
    from specviz.runs.outputs import write_atomic

    result = run_load(args.url, load_of(args), poll=args.poll, timeout=args.timeout, pid=args.pid)
    summary = result.summary()
    print(table(summary))
    if args.json:  # named like every report: when, how, on what, against which server
        meta = run_meta(machine()) | {"server": result.server}
        write_atomic(args.json, json.dumps({"meta": meta} | summary | {"records": [asdict(r) for r in result.records]},
                                           indent=1))
    return 1 if summary["errors"] else 0
