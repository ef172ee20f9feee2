"""Take the README's screenshots of the real app in headless Chromium.

    flock /tmp/specviz-real.lock .venv/bin/python scripts/screenshots.py            # embedded pair, --dtype auto
    .venv/bin/python scripts/screenshots.py --pair tiny --out /tmp/shots           # a quick layout check
    flock /tmp/specviz-real.lock .venv/bin/python scripts/screenshots.py --other-family   # other_family.png only
    flock /tmp/specviz-real.lock .venv/bin/python scripts/screenshots.py --tree 16   # tree.png, tree_round.png only
    .venv/bin/python scripts/screenshots.py --atlas atlas.html   # atlas.png, atlas_disagreements.png: a report's page
    .venv/bin/python scripts/screenshots.py --engines SPEC_URL PLAIN_URL   # engines.png: two running engines raced
    flock /tmp/specviz-real.lock .venv/bin/python scripts/screenshots.py --follow   # follow.png: a room's visitor
    flock /tmp/specviz-real.lock .venv/bin/python scripts/screenshots.py --live   # live.png, live.json: the hero

The hero's race runs in `specviz serve` in a process of its own, as a user starts it (scripts/served.py).

Writes live.png (the first screen at 1366x768), live_long_prompt.png, presenter.png, race.png, main_running.png,
main_finished.png, drilldown.png, step.png, distribution.png, formulas.png and replay.png into --out (default
assets/screenshots), and prints what the Live view measured and the time from each click to its first round.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright
from served import served

from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.settings.limits import Limits
from specviz.bench.machine import run_meta
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.server import build_server, launch
from specviz.ui.examples import EXAMPLES
from specviz.ui.handlers import Options

ASSETS = Path(__file__).resolve().parents[1] / "assets"

CODE, STORY, LONG = (dict(EXAMPLES)[name] for name in ("Code (high acceptance)", "Story (low acceptance)",
                                                         "Long prompt (prefill apart)"))
FRUIT = "Pick a random number between 1 and 10. Answer with the number only."
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def clip(page, top: str, bottom: str, pad: int = 8) -> dict:
    """The page region from the top of one element to the bottom of another (page coordinates)."""
    a, b = page.locator(top).first.bounding_box(), page.locator(bottom).first.bounding_box()
    scroll = page.evaluate("[window.scrollX, window.scrollY]")
    x = min(a["x"], b["x"]) - pad
    return {"x": max(0, x + scroll[0]), "y": max(0, a["y"] - pad + scroll[1]),
            "width": max(a["x"] + a["width"], b["x"] + b["width"]) - x + pad,
            "height": b["y"] + b["height"] - a["y"] + 2 * pad}


FINISHED = "document.querySelector('#sv-caption')?.innerText.includes('finished (')"
LIVE_DONE = ("/[0-9]× (faster|slower)$/.test(document.querySelector('#sv-live-speed .sv-live-x')?.firstChild"
             "?.textContent)")  # the race over: no placeholder, not "so far" (a caveat may show before)
# the time from the click to the first coloured round in the Live view, measured in the page
CLICK_TO_FIRST_ROUND = """() => new Promise(done => {
  const t0 = performance.now(); let blank = false;
  const seen = () => {
    const round = document.querySelector('#sv-live-spec .sv-round');
    blank = blank || !round;
    if (blank && round) { observer.disconnect(); done(performance.now() - t0); }
  };
  const observer = new MutationObserver(seen);
  observer.observe(document.body, {subtree: true, childList: true, characterData: true});
  document.querySelector('#sv-run').click();
})"""


def shot(page, out: Path, name: str, top: str, bottom: str) -> None:
    page.screenshot(path=str(out / name), clip=clip(page, top, bottom), full_page=True)
    print("wrote", out / name, flush=True)


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def live_run(page, prompt: str, long: int) -> float:
    """Run both lanes from the Live view; the seconds from the click to the first coloured round."""
    page.fill("#sv-prompt textarea", prompt)
    page.locator("#sv-prompt textarea").dispatch_event("input")
    time.sleep(1.0)
    first = page.evaluate(CLICK_TO_FIRST_ROUND) / 1000
    page.wait_for_function(LIVE_DONE, polling=500, timeout=long)  # (every frame: the page's own load)
    time.sleep(1.5)
    print(f"click -> first round {first:.2f} s | " + page.inner_text("#sv-live-speed").replace("\n", " | "), flush=True)
    return first


HERO_TRIES = 4
STRAY = "is not a measure"  # the app's own label on a race whose lanes ran slower than their steps after the load


def caption(speed: str, path: Path, attempts: int = 1) -> None:
    """What the hero screenshot shows, for its caption (the README's `_shot.md`): the machine, the date, the example,
    and that one race's numbers as the Live view printed them (one run: the bench's table holds the measured ones)."""
    ratio = re.search(r"(\d+\.\d+)× (faster|slower)", speed)
    rates = [float(x) for x in re.findall(r"(\d+\.\d+) tok/s", speed)]
    meta = run_meta() | {"command": " ".join(["python scripts/screenshots.py", *sys.argv[1:]])}
    path.write_text(json.dumps({"meta": meta, "example": "Code (high acceptance)", "speed": speed, "attempts": attempts,
                                "measure": STRAY not in speed,
                                "speedup": float(ratio.group(1)) if ratio else None, "tokens_per_s": rates}, indent=1))
    print("wrote", path, flush=True)


def engines_shot(page, urls: list[str], out: Path, long: int) -> None:
    """engines.png: the Engines tab racing two running engines (e.g. `specviz engines llamacpp`: the target alone
    on one port, with its draft on the next) on the Code example; engines.json: its caption's record (the
    machine, the date, the URLs and the summary as the tab printed it: one race)."""
    page.set_viewport_size({"width": 1366, "height": 1100})
    page.fill("#sv-prompt textarea", CODE)
    page.get_by_role("tab", name="Engines").click()
    page.click("#sv-engines-run")
    page.wait_for_function("document.querySelector('#sv-engines-summary')?.innerText.includes('Measured')",
                           timeout=long)
    time.sleep(1.5)
    shot(page, out, "engines.png", "#sv-engines-spec", "#sv-engines-positions")
    summary = page.inner_text("#sv-engines-summary")
    meta = run_meta() | {"command": " ".join(["python scripts/screenshots.py", *sys.argv[1:]])}
    (out / "engines.json").write_text(json.dumps({"meta": meta, "example": "Code (high acceptance)",
                                                  "with_speculation": urls[0], "target_alone": urls[1],
                                                  "summary": summary}, indent=1))
    print("wrote", out / "engines.png", "and", out / "engines.json", flush=True)


FOLLOW_KEY = "screenshot-room"  # a room of this script's own, on a loopback port


def follow_shot(browser, url: str, out: Path, long: int) -> None:
    """follow.png: a visitor's Live view following the presenter's run of the Code example, from the link the
    presenter's page shows (two browser contexts: two people)."""
    presenter, visitor = (browser.new_context(viewport={"width": 1366, "height": 768}).new_page() for _ in range(2))
    presenter.goto(url)
    presenter.wait_for_selector("#sv-run", timeout=long)
    presenter.get_by_text("Present to the room").click()
    presenter.fill("#sv-present-key input", FOLLOW_KEY)
    presenter.click("#sv-present")
    presenter.wait_for_selector("#sv-follow-link a", timeout=long)
    visitor.goto(presenter.get_attribute("#sv-follow-link a", "href"))
    visitor.wait_for_function("document.querySelector('#sv-live-speed')?.innerText.includes('Following')",
                              polling=250, timeout=long)
    presenter.fill("#sv-prompt textarea", CODE)
    presenter.click("#sv-run")
    visitor.wait_for_function(LIVE_DONE, polling=250, timeout=long)
    time.sleep(1.5)
    visitor.screenshot(path=str(out / "follow.png"))
    print("wrote", out / "follow.png", flush=True)


def atlas_shots(report: Path, out: Path) -> None:
    """An Atlas report as a reader opens it (offline: the page carries its scripts): the summary with the worst
    prompts, and the disagreements with what to change."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 1000}, device_scale_factor=1)
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("#sv-atlas-where .js-plotly-plot")
        time.sleep(1.0)
        shot(page, out, "atlas.png", "#sv-atlas-summary", "#sv-atlas-prompts")
        shot(page, out, "atlas_disagreements.png", "#sv-atlas-disagreements", "#sv-atlas-classes")
        browser.close()


def tree_shots(page, out: Path, long: int) -> None:
    """tree.png and tree_round.png: the latest tree round below the text (branches, the accepted path, struck
    siblings)."""
    page.set_viewport_size({"width": 1366, "height": 1200})
    live_run(page, STORY, long)
    page.screenshot(path=str(out / "tree.png"))
    page.locator("#sv-live-spec .sv-tree").first.screenshot(path=str(out / "tree_round.png"))
    print("wrote", out / "tree.png", "and", out / "tree_round.png", flush=True)


def other_family_shot(page, out: Path, long: int) -> None:
    """other_family.png: corrections the draft could not have proposed are dotted."""
    live_run(page, CODE, long)
    page.screenshot(path=str(out / "other_family.png"))
    print("wrote", out / "other_family.png", flush=True)


def hero_shot(page, out: Path, long: int) -> None:
    """live.png and its caption (live.json): a story, then the code prompt on screen."""
    live_run(page, STORY, long)
    for attempt in range(1, HERO_TRIES + 1):  # a race the app says is not a measure is run again, as it asks
        live_run(page, CODE, long)
        if STRAY not in page.inner_text("#sv-live-speed"):
            break
    page.screenshot(path=str(out / "live.png"))
    print("wrote", out / "live.png", flush=True)
    caption(page.inner_text("#sv-live-speed"), out / "live.json", attempt)


def live_and_race_shots(page, out: Path, long: int) -> None:
    """live.png (and its caption), presenter.png, race.png, then live_long_prompt.png back on the Live tab."""
    hero_shot(page, out, long)
    page.click("#sv-presenter-btn")
    time.sleep(1.0)
    page.screenshot(path=str(out / "presenter.png"))
    print("wrote", out / "presenter.png", flush=True)
    page.click("#sv-presenter-btn")
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.get_by_role("tab", name="Race").click()  # the finished race's detail
    time.sleep(1.5)
    shot(page, out, "race.png", "#sv-race-note", "#sv-race-plot")

    page.get_by_role("tab", name="Live").click()
    live_run(page, LONG, long)  # prefill apart: the end-to-end gain shrinks, decoding alone holds
    shot(page, out, "live_long_prompt.png", "#sv-live-speed", "#sv-live-speed")


def decode_shots(page, out: Path, long: int) -> None:
    """The speculative lane alone in Decode: main_running.png, main_finished.png, drilldown.png, step.png."""
    page.fill("#sv-prompt textarea", CODE)
    page.click("#sv-rounds-run")  # the speculative lane alone, in Decode: mid-run and finished
    page.wait_for_function("document.querySelectorAll('#sv-tokens .sv-round').length >= 4", timeout=long)
    shot(page, out, "main_running.png", "#sv-prompt", "#sv-pq")
    page.wait_for_function(FINISHED, timeout=long)
    time.sleep(2.0)
    shot(page, out, "main_finished.png", "#sv-prompt", "#sv-pq")
    page.evaluate("window.scrollTo(0, 0)")
    rejected = page.locator("#sv-tokens .sv-round:has(.sv-rejected)")
    if rejected.count():  # browse to a round with a rejection: the drill-down shows where the fix came from
        n = int(rejected.first.get_attribute("data-round"))
        set_slider(page, "sv-round", n)
        time.sleep(1.5)
    shot(page, out, "drilldown.png", "#sv-caption", "#sv-stats")

    for n in (1, 2, 3):  # step mode: three rounds, one click each; the view then holds exactly n rounds
        page.click("#sv-step")
        page.wait_for_function(f"document.querySelectorAll('#sv-tokens .sv-round').length === {n} && "
                               "document.querySelector('#sv-caption')?.innerText.includes('Net:')", timeout=long)
        time.sleep(0.5)
    shot(page, out, "step.png", "#sv-run", "#sv-pq")


def distribution_shot(page, out: Path, long: int, samples: int) -> None:
    """distribution.png: the Same distribution tab after a run of `samples` samples."""
    page.get_by_role("tab", name="Same distribution").click()
    page.fill("#sv-prompt textarea", FRUIT)
    set_slider(page, "sv-dist-samples", samples)
    page.click("#sv-dist-run")
    page.wait_for_function("!document.querySelector('#sv-dist-summary')?.innerText.includes('sampling')"
                           " && document.querySelector('#sv-dist-summary')?.innerText.includes('samples')",
                           timeout=long)
    time.sleep(1.5)
    shot(page, out, "distribution.png", "#sv-dist-run", "#sv-dist-summary")


def formulas_and_replay_shots(page, out: Path, long: int) -> None:
    """formulas.png (How it works), then replay.png (the recorded race, replayed)."""
    page.get_by_role("tab", name="How it works").click()
    time.sleep(1.0)
    shot(page, out, "formulas.png", "#sv-formulas", "#sv-formulas")

    page.get_by_role("tab", name="Replay").click()
    set_slider(page, "sv-speed", 0)
    page.click("#sv-replay-race")
    page.wait_for_selector("#sv-lane-spec .sv-done", timeout=long)
    page.wait_for_selector("#sv-lane-ar .sv-done", timeout=long)
    time.sleep(1.5)
    shot(page, out, "replay.png", "#sv-race-ar", "#sv-race-result")


def all_shots(page, out: Path, long: int, samples: int) -> None:
    """The README's and the docs' screenshots of the Live, Race, Decode, Same distribution, How it works and Replay
    views (see the module's doc), one tab after another in one page (each starts where the last left the app)."""
    live_and_race_shots(page, out, long)
    decode_shots(page, out, long)
    distribution_shot(page, out, long, samples)
    formulas_and_replay_shots(page, out, long)


def served_hero(args, out: Path, long: int) -> None:
    """live.png and live.json from the app `specviz serve` runs in its own process."""
    with served(["--dtype", args.dtype, "--draft-quant", args.draft_quant]) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector("#sv-run")
        set_slider(page, "sv-set-max_new_tokens", args.max_new_tokens)
        hero_shot(page, out, long)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="embedded", choices=["embedded", "tiny"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--draft-quant", default="int4", choices=["int4", "int8", "none"], help="as `specviz serve`")
    ap.add_argument("--out", default=str(ASSETS / "screenshots"))
    ap.add_argument("--samples", type=int, default=40)  # each sample reads the prompt again
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--other-family", action="store_true",
                    help="only other_family.png: the Live view with SmolLM2 drafting for the embedded target")
    ap.add_argument("--tree", type=int, default=0, metavar="BUDGET",
                    help="only tree.png and tree_round.png: the Live view with the tree drafter at this node budget")
    ap.add_argument("--engines", nargs=2, metavar=("SPEC_URL", "PLAIN_URL"),
                    help="only engines.png: the Engines tab racing these two running engines")
    ap.add_argument("--follow", action="store_true", help="only follow.png: a room's visitor following a run")
    ap.add_argument("--live", action="store_true", help="only live.png and its caption (live.json): the README's hero")
    ap.add_argument("--atlas", metavar="REPORT",
                    help="only atlas.png and atlas_disagreements.png: the page `specviz atlas --html` wrote")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.atlas:
        atlas_shots(Path(args.atlas), out)
        return
    if args.live and args.pair == "embedded":
        served_hero(args, out, 600_000)
        return

    draft, target = ("smollm2", "embedded") if args.other_family else (args.pair, args.pair)
    session = Session(spec=PairSpec(draft, target, dtype=args.dtype, device="cpu", draft_quant=args.draft_quant))
    session.load(draft, target, args.dtype, status=print)
    defaults = DecodeConfig(drafter="tree", tree_budget=args.tree) if args.tree else DecodeConfig()
    engines = tuple(args.engines or ())
    demo = build_server(session, Limits(), Options(Pace(stage_delay=0.0), engines=engines), defaults,  # served pace
                        presenter_key=FOLLOW_KEY if args.follow else None)
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    long = 600_000
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector("#sv-run")
        set_slider(page, "sv-set-max_new_tokens", args.max_new_tokens)
        shots = (lambda: follow_shot(browser, url, out, long)) if args.follow else \
            (lambda: engines_shot(page, list(engines), out, long)) if engines else \
            (lambda: tree_shots(page, out, long)) if args.tree else \
            (lambda: other_family_shot(page, out, long)) if args.other_family else \
            (lambda: hero_shot(page, out, long)) if args.live else \
            (lambda: all_shots(page, out, long, args.samples))
        shots()
        browser.close()
    demo.close()


if __name__ == "__main__":
    main()
