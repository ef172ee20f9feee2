"""A real browser (Debian's headless Chromium via Playwright) drives the app on the tiny pair.

One browser page serves the module (starting Chromium is the slow part); each test reloads it, which opens
a fresh Gradio session, and types its own prompt, so any test runs alone or in any order."""

from __future__ import annotations

import re
import shutil
import time

import pytest
from helpers import NO_WAIT, warm_up_while_a_visitor_waits

from specviz.models import PairSpec
from specviz.models.tiny import tiny_pair
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.server import build_server, launch
from specviz.ui.handlers import Options

pytestmark = pytest.mark.browser
PROMPT = "the man said that it was good and"  # the tiny pair's full 64 tokens, 44 rounds: lanes that scroll, timers
# A run where its length proves nothing (the presenter's view, "still serving", a visitor's own run in the room):
# <eos> after 7 tokens in 4 rounds (accepted, rejected and corrected drafts), 13 target forwards to PROMPT's 110
# (on the room's slowed target PROMPT's run took 9 s, this one 1 s); not the export's or the presenter's prompt.
SHORT = "it said that it was so"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@pytest.fixture(scope="module")
def app_url():
    # its own pair, switching allowed: the load test replaces it
    session = Session(tiny_pair(), PairSpec("tiny", "tiny"), allow_switch=True)
    demo = build_server(session, Limits(), Options(Pace(0.05, 0.0, NO_WAIT)))
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    try:
        yield url
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser_page():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (scripts/setup.sh test installs it)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


@pytest.fixture
def page(browser_page, app_url):
    """The app freshly loaded: a new Gradio session, with no run, step or export left by another test."""
    browser_page.goto(app_url)
    browser_page.wait_for_selector("#sv-run", timeout=60_000)
    return browser_page


def run_to_the_end(page, prompt: str) -> None:
    """The speculative lane alone, in the Decode tab."""
    page.fill("#sv-prompt textarea", prompt)
    page.click("#sv-rounds-run")
    page.wait_for_selector("#sv-tokens .sv-tok.sv-accepted", timeout=60_000)
    page.wait_for_function("document.querySelector('#sv-caption')?.innerText.includes('finished (')", timeout=60_000)


def test_run_shows_coloured_tokens_and_the_pq_plot(page):
    run_to_the_end(page, PROMPT)
    classes = page.eval_on_selector_all("#sv-tokens .sv-tok", "els => els.map(e => e.className)")
    kinds = {c.split()[1] for c in classes}
    assert "sv-accepted" in kinds and kinds & {"sv-correction", "sv-bonus"}
    colour = page.eval_on_selector("#sv-tokens .sv-tok.sv-accepted", "e => getComputedStyle(e).backgroundColor")
    assert colour.startswith("rgba(22, 163, 74")  # the CSS reached the page: accepted is green
    title = page.get_attribute("#sv-tokens .sv-tok.sv-accepted", "title")
    assert "min(1, p/q)" in title and "u: none drawn (greedy" in title  # the app opens greedy
    page.wait_for_selector("#sv-pq .js-plotly-plot .bars", timeout=30_000)
    assert page.locator("#sv-drill .js-plotly-plot").count() == 1


def test_step_mode_adds_one_round_per_click(page):
    page.fill("#sv-prompt textarea", PROMPT)
    for n in (1, 2):
        page.click("#sv-step")
        page.wait_for_function(f"document.querySelectorAll('#sv-tokens .sv-round').length === {n} && "
                               "document.querySelector('#sv-caption')?.innerText.includes('Net:')", timeout=60_000)
    assert "Round 2 (" in page.inner_text("#sv-caption")


def test_export_downloads_the_run_as_a_trace(page):
    prompt = "she said that it was the one"  # not the other tests' prompt: the trace is of this run
    run_to_the_end(page, prompt)
    page.click("#sv-export-btn")
    link = page.wait_for_selector("#sv-export a[href]", timeout=30_000)
    data = page.request.get(link.get_attribute("href")).json()
    assert data["format"] == "specviz-trace" and data["rounds"]
    assert data["meta"]["prompt"] == prompt


LIVE_PARTS = ("sv-live-spec", "sv-live-ar", "sv-live-pq", "sv-live-speed")
FINISHED_LIVE = ("document.querySelector('#sv-live-speed')?.innerText.match(/Faster|Slower|About even/) && "
                 "document.querySelectorAll('.sv-live-lane .sv-done, .sv-live-lane h4').length > 0")


def live_run(page, prompt: str = PROMPT) -> None:
    page.fill("#sv-prompt textarea", prompt)
    page.click("#sv-run")
    page.wait_for_function(FINISHED_LIVE, timeout=120_000)


def test_live_view_shows_the_four_parts_on_one_laptop_screen(page, app_url):
    page.set_viewport_size({"width": 1366, "height": 768})
    try:
        page.goto(app_url)
        page.wait_for_selector("#sv-run", timeout=60_000)
        live_run(page)
        for part in (*LIVE_PARTS, "sv-live-legend"):  # inside the first screen: no scrolling needed
            box = page.locator(f"#{part}").bounding_box()
            assert box and box["x"] >= 0 and box["y"] >= 0, part
            assert box["x"] + box["width"] <= 1366 and box["y"] + box["height"] <= 768, (part, box)
        assert page.locator("#sv-live-legend .sv-tok.sv-correction").count() == 1  # the colours named on Live too
        for lane in ("sv-live-spec", "sv-live-ar"):  # each lane shows its last token (it scrolls; the end in view)
            inner, last = page.locator(f"#{lane} .sv-scroll").bounding_box(), \
                page.locator(f"#{lane} .sv-tok").last.bounding_box()
            assert inner["y"] <= last["y"] and last["y"] + last["height"] <= inner["y"] + inner["height"] + 1, lane
        whole = page.eval_on_selector("#sv-examples input", "e => e.scrollWidth <= e.clientWidth")
        assert whole, "the example menu's label is cut"
        speed = page.inner_text("#sv-live-speed")
        assert re.search(r"\d+\.\d\d× (faster|slower)", speed) and "tok/s" in speed and "prefill" in speed
        assert page.locator("#sv-live-spec .sv-tok.sv-accepted").count() > 0
        tip = page.get_attribute("#sv-live-spec .sv-tok.sv-accepted", "title")
        assert "min(1, p/q)" in tip and "β = Σ min(p, q) = 1.0000" in tip  # greedy: the argmaxes agreed
        assert page.locator("#sv-live-ar .sv-tok.sv-target").count() > 0
        page.wait_for_selector("#sv-live-pq .js-plotly-plot .bars", timeout=30_000)
        # the latest round's bars mark β at each position, and the title its expected accepted length
        assert "β = Σ min(p, q)" in page.text_content("#sv-live-pq .legend")
        assert "expected" in page.text_content("#sv-live-pq .gtitle")
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


# counts, under the page's own scripts, the frames asked for from Gradio's status trackers (their elapsed-time counters)
COUNT_FRAMES = """window.__frames = 0; const native = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = tick => { if (/statustracker/.test(new Error().stack || "")) window.__frames++;
  return native(tick); };"""


def test_the_hidden_status_counters_tick_once_a_second_not_every_frame(browser_page, app_url):
    """`live.HEAD` must run before Gradio's modules (they keep the requestAnimationFrame they found): served first in
    the <head> (`ui.early_head`). Given as launch(head=...) it ran after them and let ~60 ticks a second through,
    on the cores a race is timed on."""
    page = browser_page.context.browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        page.add_init_script(COUNT_FRAMES)
        page.goto(app_url)
        page.wait_for_selector("#sv-run", timeout=60_000)
        page.fill("#sv-prompt textarea", PROMPT)
        start = time.monotonic()
        page.click("#sv-run")
        page.wait_for_function(FINISHED_LIVE, timeout=120_000)
        page.wait_for_timeout(2000)
        seconds = time.monotonic() - start
        assert page.evaluate("window.__frames") <= 4 * seconds  # a tick a second for each of the run's outputs
    finally:
        page.close()


COUNT_ALL_FRAMES = """window.__all = 0; const all = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = tick => { window.__all++; return all(tick); };"""


FRAMES_IN_A_SECOND = "new Promise(done => { const n = window.__all; setTimeout(() => done(window.__all - n), 1000); })"


def test_an_idle_page_asks_for_about_a_frame_a_second(browser_page, app_url):
    """A status tracker's loading animation, started at page load, keeps Svelte's shared animation loop asking for
    frames from its own code: `live.HEAD` slows those too (19 frames a second on an idle page before, counted here
    under `HEAD`, which passes on only the frames it lets through)."""
    page = browser_page.context.browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        page.add_init_script(COUNT_ALL_FRAMES)
        page.goto(app_url)
        page.wait_for_selector("#sv-run", timeout=60_000)
        # the page's own start-up over: its load events answered (under pytest-xdist's other worker the server can
        # take seconds, while each of their outputs' trackers ticks once a second), at most 30 s
        for _ in range(30):
            if page.evaluate(FRAMES_IN_A_SECOND) <= 1:
                break  # a hook passing every frame on never gets here (about 60 frames every second)
        before = page.evaluate("window.__all")
        page.wait_for_timeout(5000)
        assert page.evaluate("window.__all") - before <= 15
    finally:
        page.close()


def test_presenter_mode_keeps_only_the_four_parts_in_larger_type(page):
    live_run(page, SHORT)
    normal = page.eval_on_selector(".sv-live-x", "e => parseFloat(getComputedStyle(e).fontSize)")
    page.click("#sv-presenter-btn")
    page.wait_for_function("document.body.classList.contains('sv-presenter')")
    assert not page.locator("#sv-side").is_visible() and not page.locator("#sv-step").is_visible()
    assert all(page.locator(f"#{part}").is_visible() for part in LIVE_PARTS)
    assert page.eval_on_selector(".sv-live-x", "e => parseFloat(getComputedStyle(e).fontSize)") > normal
    page.click("#sv-presenter-btn")  # and back
    page.wait_for_function("!document.body.classList.contains('sv-presenter')")
    assert page.locator("#sv-side").is_visible()


def test_race_shows_both_timers_running_to_the_end(page, tmp_path):
    live_run(page)  # the Live run fills the Race tab once both lanes are done
    page.get_by_role("tab", name="Race").click()
    page.wait_for_selector("#sv-lane-ar .sv-done", timeout=120_000)
    page.wait_for_selector("#sv-lane-spec .sv-done", timeout=120_000)
    for lane in ("ar", "spec"):
        elapsed = float(page.inner_text(f"#sv-lane-{lane} .sv-elapsed"))
        rate = float(page.inner_text(f"#sv-lane-{lane} .sv-rate"))
        assert elapsed > 0 and rate > 0
    assert "Speculative decoding:" in page.inner_text("#sv-race-result")
    page.wait_for_selector("#sv-race-plot .js-plotly-plot .scatterlayer", timeout=30_000)
    screenshot = tmp_path / "race.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_loading_a_preset_streams_status_and_updates_the_header(page):
    page.get_by_text("Model pair", exact=True).click()
    page.get_by_label("Preset").click()
    page.get_by_role("option", name="Tiny random pair (instant; to try the UI, not the models)").click()
    page.wait_for_function("document.querySelector('#sv-set-draft textarea, #sv-set-draft input')?.value === 'tiny'",
                           timeout=30_000)  # the preset fills in the draft and target fields
    page.click("#sv-load")
    page.wait_for_function("document.querySelector('#sv-load-log')?.innerText.includes('Loaded')", timeout=60_000)
    assert "tiny-draft" in page.inner_text("#sv-pair")


# ---------------------------------------------------------------- the Atlas (issue 30)

ATLAS_PROMPTS = ('{"prompt": "the man said that it was good and", "kind": "story"}\n'
                 '{"prompt": "she said that it was the one", "kind": "story", "id": "she"}\n'
                 '{"prompt": "it was the one that it was", "kind": "other"}')


def test_the_atlas_tab_runs_three_prompts_and_opens_one_in_decode(page):
    page.get_by_role("tab", name="Atlas").click()
    page.fill("#sv-atlas-paste textarea", ATLAS_PROMPTS)
    page.click("#sv-atlas-run")
    page.wait_for_function("document.querySelector('#sv-atlas-progress')?.innerText.includes('3 of 3 prompts ran')",
                           timeout=120_000)
    rows = "#sv-atlas-table [role=row]"  # the header and one row per prompt
    page.wait_for_function(f"document.querySelectorAll('{rows}').length === 4", timeout=30_000)
    first = page.locator(rows).nth(1).inner_text()
    assert re.search(r"\d+ / \d+", first)  # every rate with its count
    items = page.locator("#sv-atlas-disagreements li")
    assert items.count() > 0 and "tokens lost" in items.first.inner_text()
    assert items.first.locator(".sv-rejected").count() == 1 and items.first.locator(".sv-correction").count() == 1
    assert "accepted (" in page.inner_text("#sv-atlas-summary")
    page.wait_for_selector("#sv-atlas-files a[href]", timeout=30_000)  # the report, JSON and rejections
    page.get_by_label("Open a prompt's run").click()
    page.get_by_role("option", name=re.compile(r"^she · ")).click()
    page.click("#sv-atlas-open")
    page.wait_for_selector("#sv-tokens .sv-tok.sv-accepted", timeout=30_000)
    assert "Atlas: she" in page.inner_text("#sv-stats")


def test_a_bad_atlas_input_is_one_sentence_and_the_app_keeps_serving(page):
    page.get_by_role("tab", name="Atlas").click()
    page.fill("#sv-atlas-paste textarea", "   ")
    page.click("#sv-atlas-run")
    toast = page.wait_for_selector(".toast-body", timeout=30_000)
    assert "upload a file of prompts" in toast.inner_text()
    run_to_the_end(page, SHORT)  # still serving


def test_the_atlas_report_opens_offline_with_every_section(browser_page, tmp_path):
    from specviz.runs import atlas as atlases
    from specviz.runs.atlas_input import read_prompts
    from specviz.ui.atlas_report import atlas_html

    session = Session(tiny_pair(), PairSpec("tiny", "tiny"))
    prompts = read_prompts(ATLAS_PROMPTS, "p.jsonl", Limits())
    *_, state = atlases.run_atlas(session, Limits(), prompts, {"max_new_tokens": 24})
    path = tmp_path / "atlas.html"
    path.write_text(atlas_html(atlases.report(state)), encoding="utf-8")
    context = browser_page.context.browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
    try:
        page = context.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        for section in ("summary", "prompts", "where", "disagreements", "classes", "advice", "settings"):
            assert page.locator(f"#sv-atlas-{section}").is_visible(), section
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=30_000)
        rates = lambda: [float(v) for v in page.eval_on_selector_all(  # noqa: E731
            "#sv-atlas-prompts tbody tr td:nth-child(4)", "tds => tds.map(td => td.dataset.v)")]
        assert len(rates()) == 3 and rates() == sorted(rates())  # worst first
        page.click("#sv-atlas-prompts th:nth-child(4)")
        page.click("#sv-atlas-prompts th:nth-child(4)")  # a second click sorts the other way
        assert rates() == sorted(rates(), reverse=True)
        assert page.locator("#sv-atlas-disagreements li").count() > 0
        assert "ceiling" in page.inner_text("#sv-atlas-advice")
        assert requests == [path.as_uri()]
    finally:
        context.close()


# ---------------------------------------------------------------- a room (issue 31)

KEY = "projector-7421"
FOLLOWED = "document.querySelector('#sv-live-speed')?.innerText.includes('Following the presenter')"


@pytest.fixture(scope="module")
def room_url():
    """An app with a presenter key, its tiny target slowed so that a run lasts a few seconds: long enough to
    see its rounds arrive one after another in a follower's browser."""
    session = Session(tiny_pair(), PairSpec("tiny", "tiny"))
    forward = session.pair.target.forward

    def slow(*args, **kwargs):
        time.sleep(0.08)
        return forward(*args, **kwargs)

    session.pair.target.forward = slow
    demo = build_server(session, Limits(), Options(Pace(0.05, 0.0, NO_WAIT)), presenter_key=KEY)
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    try:
        yield url
    finally:
        demo.close()


# two pages at once: a wait polls on a timer, since the page not in front may get no animation frames (the
# default polling) in headless Chromium
SEEN_ROUNDS = """() => { window.svSeen = []; new MutationObserver(() => {
    const n = document.querySelectorAll('#sv-live-spec .sv-round').length;
    if (window.svSeen[window.svSeen.length - 1] !== n) window.svSeen.push(n); })
  .observe(document.querySelector('#sv-live-spec'), {childList: true, subtree: true}); }"""


def test_a_visitor_follows_the_presenters_run_and_sees_its_rounds_appear(browser_page, room_url):
    browser = browser_page.context.browser
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]  # two browsers
    try:
        presenter, visitor = (c.new_page() for c in contexts)
        presenter.goto(room_url)
        presenter.wait_for_selector("#sv-run", timeout=60_000)
        presenter.get_by_text("Present to the room").click()
        presenter.fill("#sv-present-key input", KEY)
        presenter.click("#sv-present")
        presenter.wait_for_selector("#sv-follow-link a", timeout=30_000)
        link = presenter.get_attribute("#sv-follow-link a", "href")
        assert link.endswith("/?follow=1") and KEY not in presenter.content()

        visitor.goto(link)  # the link the presenter's page shows: following at once
        visitor.wait_for_function(FOLLOWED, polling=250, timeout=60_000)
        assert visitor.is_checked("#sv-follow input")

        visitor.evaluate(SEEN_ROUNDS)  # the round counts the visitor's Live view goes through
        presenter.fill("#sv-prompt textarea", "she said that it was the one")
        presenter.click("#sv-run")
        presenter.wait_for_function(FINISHED_LIVE, polling=250, timeout=120_000)
        visitor.wait_for_function(FINISHED_LIVE, polling=250, timeout=60_000)
        seen = visitor.evaluate("window.svSeen")
        assert len([n for n in seen if n > 0]) >= 3, seen  # the rounds arrived one update after another
        assert visitor.inner_text("#sv-live-spec") == presenter.inner_text("#sv-live-spec")
        assert visitor.input_value("#sv-prompt textarea") == "she said that it was the one"
        assert "min(1, p/q)" in visitor.get_attribute("#sv-live-spec .sv-tok.sv-accepted", "title")  # hovers
        visitor.wait_for_selector("#sv-live-pq .js-plotly-plot .bars", timeout=30_000)  # p/q bars
        visitor.get_by_role("tab", name="Decode").click()
        visitor.wait_for_selector("#sv-drill .js-plotly-plot", timeout=30_000)  # the drill-down of that run

        visitor.get_by_role("tab", name="Live").click()
        visitor.fill("#sv-prompt textarea", SHORT)
        visitor.click("#sv-run")  # the visitor's own Run leaves follow mode
        visitor.wait_for_function("!document.querySelector('#sv-follow input').checked", polling=250, timeout=30_000)
        visitor.wait_for_function(FINISHED_LIVE + " && !(" + FOLLOWED + ")", polling=250, timeout=120_000)
    finally:
        for c in contexts:
            c.close()


def test_a_visitor_without_the_key_cannot_present(browser_page, room_url):
    browser = browser_page.context.browser
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    try:
        visitor, watcher = (c.new_page() for c in contexts)
        for page in (visitor, watcher):
            page.goto(room_url)
            page.wait_for_selector("#sv-run", timeout=60_000)
        visitor.get_by_text("Present to the room").click()
        visitor.fill("#sv-present-key input", "projector-0000")
        visitor.click("#sv-present")
        toast = visitor.wait_for_selector(".toast-body", timeout=30_000)
        assert "that is not this server's presenter key." in toast.inner_text()
        assert not visitor.locator("#sv-follow-link a").count()  # no link to follow: not presenting
        watcher.check("#sv-follow input")
        watcher.wait_for_function(FOLLOWED, timeout=60_000)
        visitor.fill("#sv-prompt textarea", SHORT)
        visitor.click("#sv-run")
        visitor.wait_for_function(FINISHED_LIVE, timeout=120_000)
        time.sleep(1)  # several of the follower's looks at the broadcast
        # nothing of the visitor's run reached a follower (who sees the presenter's last run, if any)
        assert watcher.inner_text("#sv-live-spec") != visitor.inner_text("#sv-live-spec")
        assert watcher.input_value("#sv-prompt textarea") != SHORT
        assert watcher.is_checked("#sv-follow input") and watcher.evaluate(FOLLOWED)
    finally:
        for c in contexts:
            c.close()


# ---------------------------------------------------------------- the first click (issue 47)

def test_the_first_click_streams_while_the_app_records_its_examples(browser_page):
    """As `specviz serve` starts: the app records its examples in the background (here a tiny target slowed to
    100 ms a forward, so each example's race holds the model for many seconds), and a visitor's first Run, on the
    first example, clicked as soon as the page is there, shows a coloured round, the warm-up having taken at most
    one event's worth of forwards once the visitor's job joined the queue: the warm-up yields. Counted in forwards,
    not seconds: a busy machine stretches the browser's seconds (and the warm-up runs on until the click reaches the
    queue). (Before: the first round came 20.4 s after the click on a 2-core Zen 4, ~200 forwards.)"""
    from specviz.engine import DecodeConfig
    from specviz.serving.recorded import Recordings
    from specviz.runs.room import record_examples
    from specviz.settings.spec import flat_values
    from specviz.ui.examples import EXAMPLES

    session = Session(tiny_pair(), PairSpec("tiny", "tiny"), recordings=Recordings(2**24))
    forward, background = session.pair.target.forward, []

    def slow(*args, **kwargs):
        background.append(warm_up_while_a_visitor_waits(session.turns))
        time.sleep(0.1)
        return forward(*args, **kwargs)

    session.pair.target.forward = slow
    demo = build_server(session, Limits(), Options(Pace(0.05, 0.0, NO_WAIT)))
    _, url, _ = launch(demo, port=None, prevent_thread_lock=True, quiet=True)
    try:
        prompts = [prompt for _, prompt in EXAMPLES]
        thread = record_examples(session, Limits(), prompts, flat_values(DecodeConfig()), calibrate=False)
        page = browser_page
        page.goto(url)
        page.wait_for_selector("#sv-run", timeout=60_000)
        assert thread.is_alive() and session.lock.locked()  # the recording holds the model as the visitor arrives
        page.fill("#sv-prompt textarea", prompts[0])
        clicked, at_click = time.monotonic(), len(background)
        page.click("#sv-run")
        page.wait_for_selector("#sv-live-spec .sv-round", timeout=60_000)  # bounds a hang only
        seen, warm_up = time.monotonic() - clicked, sum(background[at_click:])
        print(f"first coloured round {seen:.2f} s after the click; {warm_up} warm-up forwards while the visitor waited")
        assert warm_up <= 10
    finally:
        # the page leaves first: closing the app waits (up to Gradio's 5 s) for an open stream, here the
        # visitor's run, still going on the slowed target
        browser_page.goto("about:blank")
        demo.close()
        thread.finish()  # the recording stopped at its next event: a thread killed mid-forward aborts the exit
