"""The Live view's lanes against `specviz bench`'s on the same prompts: issue 59's measure, side by side.

    flock /tmp/specviz-real.lock .venv/bin/python scripts/page_vs_bench.py --rounds 3 --json /tmp/pvb.json

Each round runs `specviz bench` in a process of its own on the prompts (one repetition each, every default, as the
app's), then clicks each prompt in the Live view of `specviz serve` (its own
process, loaded once, its recorded answers off so that every click races, after one unmeasured warm-up race as the
bench warms its lanes), in headless Chromium (its own process). Prints each lane's tok/s and the speedup, page over
bench, per round and as medians.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright
from screenshots import ARGS, LIVE_DONE, set_slider
from served import served

# held out: in neither the shipped bench prompts nor the app's examples
PROMPTS = [
    {"id": "code-merge", "kind": "code", "prompt": "Write a Python function `merge_intervals(intervals)` that merges "
     "overlapping intervals and returns them sorted by start."},
    {"id": "prose-cache", "kind": "prose", "prompt": "Explain in one paragraph why a CPU cache makes a program "
     "faster, for a reader who has never programmed."},
    {"id": "creative-train", "kind": "creative", "prompt": "Write the opening of a short story about a night train "
     "that stops at a station no map shows."},
]
RATE = re.compile(r"(speculative|target alone) (\d+\.\d+) tok/s")


def busy_fraction(seconds: float) -> float:
    """The share of this machine's CPU time that was not idle over the next `seconds` (/proc/stat)."""
    def times() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    before = times()
    time.sleep(seconds)
    delta = [b - a for a, b in zip(before, times())]
    return 1 - (delta[3] + delta[4]) / sum(delta)  # idle + iowait


def wait_quiet(most: float = 0.05, seconds: float = 5.0) -> None:
    """Until the machine idles: the server records its examples in the background after it starts."""
    while busy_fraction(seconds) > most:
        pass


def bench_round(flags: list[str], prompts: Path) -> dict[str, dict[str, float]]:
    """`specviz bench` on the prompts in a process of its own: each prompt's lanes, tok/s end to end."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [str(Path(sys.executable).with_name("specviz")), "bench", "--prompts", str(prompts), "--reps", "1",
               "--json", str(out), "--no-progress", *flags]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        runs = json.loads(out.read_text())["runs"]
    return {r["id"]: {"target alone": r["ar_tokens_per_s"], "speculative": r["spec_tokens_per_s"]} for r in runs}


def page_race(page, prompt: str, timeout_ms: int) -> dict[str, float]:
    """One race clicked in the Live view: each lane's tok/s end to end, as the page prints it."""
    page.fill("#sv-prompt textarea", prompt)
    page.locator("#sv-prompt textarea").dispatch_event("input")
    time.sleep(1.0)
    page.click("#sv-run")
    time.sleep(1.0)
    page.wait_for_function(LIVE_DONE, polling=500, timeout=timeout_ms)
    text = page.inner_text("#sv-live-speed")
    return {lane: float(x) for lane, x in RATE.findall(text)}


def ratios(bench: dict, page: dict) -> dict[str, float]:
    lanes = {lane: page[lane] / bench[lane] for lane in ("target alone", "speculative")}
    speedup = (page["speculative"] / page["target alone"]) / (bench["speculative"] / bench["target alone"])
    return lanes | {"speedup": speedup}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    common = ["--max-new-tokens", str(args.max_new_tokens)]
    rows = []
    # recorded answers off: a later round's click would be answered from the first round's recording, not raced
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f, served([*common, "--no-recorded"]) as url, \
            sync_playwright() as p:
        f.write("".join(json.dumps(x) + "\n" for x in PROMPTS))
        f.flush()
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector("#sv-run")
        set_slider(page, "sv-set-max_new_tokens", args.max_new_tokens)
        wait_quiet()
        for n in range(args.rounds):
            bench = bench_round(common, Path(f.name))
            page_race(page, PROMPTS[-1]["prompt"], 600_000)  # warm-up, unmeasured
            for x in PROMPTS:
                seen = page_race(page, x["prompt"], 600_000)
                row = {"round": n, "id": x["id"], "bench": bench[x["id"]], "page": seen,
                       "page_over_bench": ratios(bench[x["id"]], seen)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        browser.close()
    print("\nmedians, page over bench (target alone / speculative / speedup):")
    for x in PROMPTS:
        mine = [r["page_over_bench"] for r in rows if r["id"] == x["id"]]
        med = {k: statistics.median(m[k] for m in mine) for k in mine[0]}
        print(f"  {x['id']:<15} {med['target alone']:.2f} / {med['speculative']:.2f} / {med['speedup']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
