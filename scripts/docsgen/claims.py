"""The claims: each comparison the pages make, chosen once from the newest report of its kind, with the words that say
which way it goes derived from its figures.

A page never picks a report for a comparison itself: it includes the comparison's block (`docs/templates/_claim_*.md`),
which reads `claim(NAME)`, the newest report that `KINDS[NAME]` admits (by its date, then its time; a report without a
time counts from the start of its day). A new report of a kind replaces the old one on every page at the next
`make docs`, and `tests/test_claims.py` fails on a page that still renders an older one alone.

Which way a comparison goes (`verdict`) is read from its ratio and interval: above 1 at the interval's low end "pays"
and is "faster", below 1 at its high end "loses" and is "slower", otherwise "even"; a ratio with no interval (one
engine's reading beside another's) counts as even within `BAND` of 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from docsgen.reports import KIND_ARGS, REPORTS, Report, load_report

BAND = 0.05  # a ratio without an interval is "about as fast" within 5% of 1: the spread of llama-bench's repetitions


@functools.cache
def bench_defaults() -> dict:
    """`specviz bench`'s defaults, from its parser (what "every default" means today)."""
    from docsgen.cli_reference import build_parser, subcommands

    bench = dict((n, p) for n, _, p in subcommands(build_parser()))["bench"]
    return {a.dest: a.default for a in bench._actions}


def at_defaults(report: dict, free: tuple[str, ...] = (), **want) -> bool:
    """A bench report run with every default that decides what it measured (`reports.KIND_ARGS`), except the flags in
    `free` (any value) and in `want` (these values). A flag an older report predates reads as its default."""
    if "summary" not in report or "args" not in report.get("meta", {}):
        return False
    args, defaults = report["meta"]["args"], bench_defaults()
    for name in KIND_ARGS:
        if name in free:
            continue
        default = want.get(name, defaults.get(name, KIND_ARGS[name]))
        if str(args.get(name, default)) != str(default):
            return False
    return True


def dtype(report: dict) -> str | None:
    return report.get("summary", {}).get("dtype")


def described(report: dict) -> str:
    return report.get("meta", {}).get("machine", {}).get("described") or ""


def below_avx512(report: dict) -> bool:
    return "run below AVX-512" in described(report) or "no AVX-512" in described(report)


def on_cpu(report: dict) -> bool:
    return report.get("summary", {}).get("device", "cpu") == "cpu" and not below_avx512(report)


@dataclass(frozen=True)
class Kind:
    folder: str  # a key of reports.REPORTS
    says: str  # the comparison, in words
    admits: Callable[[dict], bool]


KINDS = {
    "headline": Kind("bench", "speculative decoding over the target alone, every default, bf16 on a CPU",
                     lambda r: at_defaults(r) and dtype(r) == "bfloat16" and on_cpu(r)),
    "transformers": Kind("bench", "specviz's speculation over transformers' assisted generation with the same draft",
                         lambda r: at_defaults(r) and dtype(r) == "bfloat16" and on_cpu(r)
                         and r["summary"].get("vs_hf") is not None),
    "float32": Kind("bench", "speculative decoding over the target alone in float32 on a CPU",
                    lambda r: at_defaults(r, free=("k", "confidence")) and dtype(r) == "float32" and on_cpu(r)),
    "int4": Kind("bench", "speculative decoding over an int4 target alone (--target-quant int4) on a CPU",
                 lambda r: at_defaults(r, free=("k", "confidence"), target_quant="int4") and on_cpu(r)),
    "llamacpp": Kind("bench", "specviz beside llama.cpp on the same GGUF files and machine (a bench's "
                              "--compare-llamacpp)", lambda r: bool(r.get("llamacpp")) and on_cpu(r)),
    "below_avx512": Kind("bench", "speculative decoding on a CPU without AVX-512 (or held below it)",
                         lambda r: at_defaults(r, free=("k", "confidence")) and below_avx512(r)),
    "vllm": Kind("engines", "vLLM's own speculation over its target alone, as vLLM serves by default (compiled)",
                 lambda r: any(e.get("kind") == "vllm" for e in r.get("engines", {}).values())
                 and "--enforce-eager" not in described(r)),
    "gpu": Kind("gpu", "the cost model's prediction from a GPU's measured step costs",
                lambda r: r.get("meta", {}).get("device") == "cuda" and "compiled" in r.get("steps", {})),
    "room": Kind("room", "a room of visitors on one small server (`specviz loadtest --mix workshop`)",
                 lambda r: "wait_s" in r and "--mix workshop" in r.get("meta", {}).get("command", "")),
    "first_run": Kind("setup", "a fresh clone's set-up and first load", lambda r: "disk_bytes" in r),
}


def when(report: dict) -> tuple[str, str]:
    meta = report.get("meta", {})
    return meta.get("date", ""), meta.get("time", "")


@functools.cache
def added(path: Path) -> int:
    """When git first recorded the file (seconds), the order of two reports of one day without a time; a file git
    does not hold yet is the newest of all."""
    import subprocess

    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ct", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return int(out[-1]) if out else 2**62


def order(path: Path) -> tuple:
    """A report's place in time: its date, its time (a report without one counts from its day's start), then, for
    reports of one day without a time, when each was added."""
    date, time = when(load_report(path))
    return date, time, 0 if time else added(path), path.name


def admitted(name: str, folder: Path | None = None) -> list[Path]:
    """The reports of one kind, oldest first (`order`)."""
    kind = KINDS[name]
    folder = folder or REPORTS[kind.folder]
    return sorted((p for p in folder.glob("*.json") if kind.admits(load_report(p))), key=order)


def newest(name: str, folder: Path | None = None) -> Path | None:
    paths = admitted(name, folder)
    return paths[-1] if paths else None


def session(name: str, folder: Path | None = None) -> list[Path]:
    """The newest report of a kind and the others of its day without a time of their own (repeats of one session,
    such as a load test's seeds), oldest first."""
    paths = admitted(name, folder)
    if not paths:
        return []
    latest = when(load_report(paths[-1]))
    return [p for p in paths if when(load_report(p)) == latest]


def kinds_of(path: Path) -> list[str]:
    """The claims a report is of the kind of."""
    report = load_report(path)
    return [n for n, k in KINDS.items() if path.parent == REPORTS[k.folder] and k.admits(report)]


def older_than_newest(used: list[Path], folders: dict[str, Path] | None = None) -> list[str]:
    """The reports in `used` that are of a claim's kind but not its newest, where the page does not read the newest
    too (an older run beside the newest is a before and after), each as "NAME (claim: newer NEWEST)"."""
    out = []
    for path in (p for p in used if p.suffix == ".json"):
        report = load_report(path)
        for name, kind in KINDS.items():
            folder = (folders or {}).get(kind.folder, REPORTS[kind.folder])
            if path.parent != folder or not kind.admits(report):
                continue
            latest = newest(name, folder)
            if latest is not None and when(report) != when(load_report(latest)) and latest != path \
                    and latest not in used:
                out.append(f"{path.name} ({name}: newer {latest.name})")
    return out


@dataclass(frozen=True)
class Verdict:
    """Which way a ratio goes: its words, from the ratio and its interval (or `BAND` without one)."""

    ratio: float
    ci: tuple[float, float] | None = None

    @property
    def sign(self) -> int:
        low, high = self.ci if self.ci else (self.ratio / (1 + BAND), self.ratio * (1 + BAND))
        return 1 if low > 1 else -1 if high < 1 else 0

    @property
    def pays(self) -> str:
        return {1: "pays", -1: "loses", 0: "neither pays nor loses clearly"}[self.sign]

    @property
    def paid(self) -> str:
        return {1: "paid", -1: "lost", 0: "neither paid nor lost clearly"}[self.sign]

    @property
    def faster(self) -> str:
        return {1: "faster", -1: "slower", 0: "about as fast"}[self.sign]

    @property
    def faster_than(self) -> str:
        return {1: "faster than", -1: "slower than", 0: "about as fast as"}[self.sign]

    @property
    def beat(self) -> str:
        return {1: "beat", -1: "lost to", 0: "matched"}[self.sign]


def verdict(ratio: float, ci=None) -> Verdict:
    return Verdict(ratio, tuple(ci) if ci else None)


def rates(report: dict) -> dict:
    """A bench report's tokens a second, end to end and decoding (Σ tokens / Σ (seconds − the prompt's reading)), of
    specviz's target alone (`ar`), its speculation (`spec`) and, where the run had them beside it, llama.cpp's target
    alone (`llama-bench`) and its speculation with the same draft (`llama-speculative-simple`), both decoding only
    (llama.cpp's own seconds leave the prompt out)."""
    s, runs = report["summary"], report["runs"]
    spec = next(m for m in report["methods"] if m.startswith("spec"))
    decoded = lambda lane, key: (sum(r["new_tokens"] for r in runs)  # noqa: E731
                                 / sum(r["seconds"][lane] - r["prefill_s"][key] for r in runs))
    out = {"ar": max(s["ar_tokens_per_s"], s.get("ar_hf_tokens_per_s") or 0.0), "spec": s["spec_tokens_per_s"],
           "ar_decode": decoded("ar", "ar"), "spec_decode": decoded(spec, "spec")}
    if l := report.get("llamacpp"):
        out["llamacpp_target_decode"] = l["target_tokens_per_s"]
        out["llamacpp_spec_decode"] = l["spec_tokens_per_s"]
    return out


def loadtest_run(report: dict) -> str:
    """A load test's run in words, from its command: "30 visitors, 2 clicks each, seed 0". A command without
    `--requests` (the mix's own count) is counted from the report: its completed requests per visitor."""
    import re

    cmd = report["meta"]["command"]
    flag = lambda name, default: (m.group(1) if (m := re.search(rf"--{name} (\S+)", cmd)) else default)  # noqa: E731
    from docsgen.cli_reference import build_parser, subcommands

    loadtest = dict((n, p) for n, _, p in subcommands(build_parser()))["loadtest"]
    defaults = {a.dest: a.default for a in loadtest._actions}
    clicks = flag("requests", defaults["requests"])
    if clicks is None:
        clicks = round(sum(v.get("ok", 0) for v in report["requests"].values()) / report["users"])
    return f"{report['users']} visitors, {clicks} click{'s' * (str(clicks) != '1')} each, seed {flag('seed', defaults['seed'])}"


# the app's shipped examples (specviz/ui/examples.py, by the first word of their name) -> the bench prompts' kind
EXAMPLE_KINDS = {"Code": "code", "JSON": "json", "Rewrite": "rewrite", "Story": "creative"}


def by_example(report: dict, example: str) -> dict | None:
    """The bench's figure for the kind of prompt an app example is: the median speedup of that kind's runs (and how
    many), or None where the bench has no prompt of that kind."""
    import statistics

    kind = EXAMPLE_KINDS.get(example.split()[0])
    speedups = [r["speedup"] for r in report["runs"] if r.get("kind") == kind]
    return {"kind": kind, "median": statistics.median(speedups), "runs": len(speedups)} if speedups else None
