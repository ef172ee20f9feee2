"""Share a run: the exported page holds every token of the run as a span with its numbers, escapes
everything that came from the run, fetches nothing from anywhere, stays small, and opens offline in
a real browser."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from html import escape
from html.parser import HTMLParser

import pytest

from specviz.analysis.stats import run_stats
from specviz.engine import DecodeConfig, SamplingParams
from specviz.models import encode_prompt
from specviz.runs import trace as traces
from specviz.runs.race import race_decoders, replay_race
from specviz.runs.replay import open_trace
from specviz.runs.trace import RunMeta
from specviz.ui import render
from specviz.ui.share import share_html

SHIPPED = "trace_embedded_code.json"
EVIL = "she said <script>alert(1)</script> that it was"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
WHEN = datetime(2025, 3, 4, 5, 6, tzinfo=timezone.utc)

# ---------------------------------------------------------------- reading the page back

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
UNRENDER = {"·": " ", "↵": "", "→": "", "␍": "\r"}  # render.visible's marks: ↵ and → are followed by the real \n, \t
LOADS = {"src", "srcset", "href", "action", "formaction", "poster", "data", "background", "manifest", "ping",
         "xlink:href", "codebase", "longdesc"}
FETCHING_TAGS = {"link", "img", "iframe", "frame", "object", "embed", "audio", "video", "source", "base"}
URLISH = re.compile(r"https?:|//|@import|url\s*\(|\bsrc\s*=|\bhref\s*=", re.IGNORECASE)
COMMITTED = {"accepted", "correction", "bonus"}


@dataclass
class Tok:
    status: str  # accepted | rejected | not_verified | correction | bonus | target
    lane: str | None  # "spec" | "ar" | None (the legend)
    title: str
    text: str = ""
    inner_tags: list[str] = field(default_factory=list)


class Page(HTMLParser):
    """The page as a test sees it: its token spans, every attribute, its CSS/JS text, its tags."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, list[str], str | None]] = []
        self.tokens: list[Tok] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.code: list[str] = []  # <style>/<script> text and style="" attributes
        self.tags: list[str] = []
        self.token: Tok | None = None
        self.feed(html)
        self.close()

    def lane(self) -> str | None:
        return next((i.removeprefix("sv-lane-") for _, _, i in reversed(self.stack) if i and i.startswith("sv-lane-")),
                    None)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in a.items()]
        self.code += [a["style"]] if "style" in a else []
        classes = a.get("class", "").split()
        if self.token is not None:
            self.token.inner_tags.append(tag)
        if tag in VOID:
            return
        if "sv-tok" in classes:
            self.token = Tok(classes[1].removeprefix("sv-"), self.lane(), a.get("title", ""))
            self.tokens.append(self.token)
        self.stack.append((tag, classes, a.get("id")))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        open_tag, classes, _ = self.stack.pop()
        assert open_tag == tag, f"</{tag}> closes <{open_tag}>"
        if "sv-tok" in classes:
            self.token = None

    def handle_data(self, data):
        if self.stack and self.stack[-1][0] in ("style", "script"):
            self.code.append(data)
        if self.token is not None:
            ws = "sv-ws" in self.stack[-1][1]
            self.token.text += "".join(UNRENDER.get(c, c) for c in data) if ws else data

    def lane_tokens(self, lane: str) -> list[Tok]:
        return [t for t in self.tokens if t.lane == lane]


def external_urls(html: str) -> list[str]:
    """Everything in the page that could make a browser fetch something. Titles are exempt: they are
    tooltips holding token texts (a token may well be "//" or "http"), shown on hover and never fetched."""
    page = Page(html)
    found = [f"<{tag} {name}={value!r}>" for tag, name, value in page.attrs
             if (name in LOADS and not value.startswith("#")) or (name != "title" and URLISH.search(value))]
    found += [f"CSS/JS: {m.group(0)!r}" for code in page.code for m in URLISH.finditer(code)]
    return found + [f"<{tag}>" for tag in page.tags if tag in FETCHING_TAGS]


def numbers(html: str) -> dict[str, str]:
    """The big numbers, label -> value."""
    cells = re.findall(r'<div class="sv-num"[^>]*><b>(.*?)</b><span>(.*?)</span>', html)
    return {label: value for value, label in cells}


# ---------------------------------------------------------------- traces


@pytest.fixture(scope="module")
def shipped():
    return open_trace(None, SHIPPED)  # a real race of the embedded pair (greedy, bf16)


@pytest.fixture(scope="module")
def plain(tiny):
    """A plain Run (no target alone), sampled: every outcome occurs (seed 5), and the prompt holds a script."""
    config = DecodeConfig(k=3, max_new_tokens=24, sampling=SamplingParams(0.8), seed=5, adaptive="fixed")
    return traces.record(tiny, EVIL, config)


@pytest.fixture(scope="module")
def race256(tiny):
    """A greedy race of 256 tokens on the tiny pair (this prompt does not reach <eos> before 256)."""
    prompt = "the man said that it was good and"
    ids, config = encode_prompt(tiny.tokenizer, prompt), DecodeConfig(k=4, max_new_tokens=256, adaptive="fixed")
    for state in race_decoders(tiny, ids, config, RunMeta.of(tiny, prompt, ids, config)):
        pass
    return state.trace()


def finished(trace):
    return list(replay_race(trace))[-1]


def round_spans(rounds) -> list[tuple[str, str]]:
    """(status, text) of every token the rounds show, in order: each round's drafts, then its correction/bonus."""
    out = []
    for r in rounds:
        out += [(t.status, t.text) for t in r.drafted]
        out += [(r.emitted.kind, r.emitted.text)] if r.emitted is not None else []
    return out


# ---------------------------------------------------------------- 1. every token, with its numbers


@pytest.mark.parametrize("name", ["shipped", "race256", "plain"])
def test_every_drafted_and_emitted_token_is_a_span_with_its_numbers(name, request):
    trace = request.getfixturevalue(name)
    page = Page(share_html(trace))
    spec = page.lane_tokens("spec")
    assert len(spec) == sum(len(r.drafted) + (r.emitted is not None) for r in trace.rounds)
    assert [(t.status, t.text) for t in spec] == round_spans(trace.rounds)
    drafted = [d for r in trace.rounds for d in r.drafted]
    for span, d in zip([t for t in spec if t.status not in ("correction", "bonus")], drafted, strict=True):
        u = "u: none drawn (greedy" if trace.meta.greedy else f"u = {d.u:.4f}"
        assert f"min(1, p/q) = {d.accept_prob:.4f}" in span.title and u in span.title
        assert (f"p (softmax, T=1) = {d.p_soft:.4f}" if trace.meta.greedy else f"p(x) = {d.p:.4f}") in span.title
        assert (f"q (softmax, T=1) = {d.q_soft:.4f}" if trace.meta.greedy else f"q(x) = {d.q:.4f}") in span.title
    committed, text = [t.text for t in spec if t.status in COMMITTED], trace.rounds[-1].text
    if name == "shipped":  # byte-level BPE: token texts carry their own spaces and newlines
        assert "".join(committed) == text
    else:  # the tiny word-level tokenizer joins words with spaces, and its texts skip special tokens
        special = set(request.getfixturevalue("tiny").tokenizer.all_special_tokens)  # <eos>, and "the" (unk)
        assert re.sub(r"\s", "", "".join(t for t in committed if t not in special)) == re.sub(r"\s", "", text)
    ar = page.lane_tokens("ar")
    assert [t.text for t in ar] == [s.token.text for s in trace.ar_steps]
    if trace.ar_steps and name == "shipped":
        assert "".join(t.text for t in ar) == trace.ar_steps[-1].text
    assert {t.status for t in page.tokens if t.lane is None} == COMMITTED | {"rejected", "not_verified"}  # legend


def test_the_plain_run_covers_every_outcome(plain):
    """The fixture's premise, so the test above checks every kind of span."""
    assert {s for s, _ in round_spans(plain.rounds)} == COMMITTED | {"rejected", "not_verified"}


# ---------------------------------------------------------------- numbers, settings, names, prompt


def test_a_race_shows_the_replayed_numbers_settings_and_names(shipped):
    html = share_html(shipped, exported=WHEN)
    state, m = finished(shipped), shipped.meta
    stats = state.stats().spec
    assert numbers(html) == {
        "speedup over the target alone": f"{state.speedup:.2f}×",
        "tokens/s, speculative": f"{state.spec.tokens_per_s:.1f}", "tokens/s, target alone": f"{state.ar.tokens_per_s:.1f}",
        "of drafted tokens accepted": f"{stats.acceptance_rate:.0%}",
        "tokens per round (per target forward)": f"{stats.mean_accepted_tokens:.2f}",
        "rounds": str(stats.rounds), "tokens generated": str(stats.tokens)}
    assert state.speedup > 1 and stats.rounds == len(shipped.rounds)
    assert f"both lanes emitted the same {len(shipped.ar_steps)} tokens" in html
    for shown in (m.draft, m.target, m.prompt, m.dtype, m.device):
        assert escape(shown) in html
    assert "<dt>K (drafted per round)</dt><dd>4</dd>" in html and "<dt>temperature</dt><dd>0 (greedy)</dd>" in html
    assert "Exported by specviz on 2025-03-04 05:06 UTC" in html


def test_a_greedy_race_whose_lanes_differ_says_where_and_outlines_it(shipped):
    steps = list(shipped.ar_steps)
    steps[10] = replace(steps[10], token=replace(steps[10].token, id=-1))  # as if the target alone picked another
    html = share_html(traces.Trace(shipped.meta, shipped.rounds, steps))
    assert "the lanes first differ at token 11 (target top-2 logit gap" in html and "same 64 tokens" not in html
    assert html.count("sv-diverge") == 1 + render.CSS.count("sv-diverge")  # one outlined token, in the AR lane
    assert re.search(r'<span class="sv-tok sv-target sv-diverge"[^>]*>' + re.escape(render.visible(steps[10].token.text)), html)


def test_a_plain_run_shows_the_speculative_numbers_and_says_the_target_did_not_run(plain):
    html = share_html(plain)
    stats = run_stats(plain.rounds).spec
    shown = numbers(html)
    assert "speedup over the target alone" not in shown and 'id="sv-speedup"' not in html
    assert shown["tokens/s, speculative"] == f"{stats.tokens_per_s:.1f}"
    assert shown["of drafted tokens accepted"] == f"{stats.acceptance_rate:.0%}"
    assert shown["rounds"] == str(len(plain.rounds)) and shown["tokens generated"] == "24"
    assert "The target alone did not run" in html and "<dt>temperature</dt><dd>0.8</dd>" in html


# ---------------------------------------------------------------- 2. escaping


def test_prompt_names_and_token_texts_come_out_escaped(plain):
    rounds = [replace(r) for r in plain.rounds]
    rounds[0].drafted = [replace(rounds[0].drafted[0], text="<b>bold</b>"), *rounds[0].drafted[1:]]
    last = next(r for r in rounds if r.emitted is not None)
    last.emitted = replace(last.emitted, text="<script>alert(2)</script>")
    meta = replace(plain.meta, draft='<img src=x onerror="alert(3)">', target="<i>t</i>")
    html = share_html(traces.Trace(meta, rounds))
    assert "<script>" not in html and "<b>bold" not in html and "<img" not in html and "<i>t" not in html
    assert escape(EVIL) in html and escape("<b>bold</b>") in html
    page = Page(html)
    assert "script" not in page.tags and "img" not in page.tags and "i" not in page.tags
    spec = page.lane_tokens("spec")
    assert spec[0].text == "<b>bold</b>" and "'<b>bold</b>'" in spec[0].title  # shown as text, not markup
    assert "<script>alert(2)</script>" in [t.text for t in spec]
    assert all(set(t.inner_tags) <= {"span"} for t in spec)  # only render's whitespace marks inside tokens
    assert external_urls(html) == []


# ---------------------------------------------------------------- 1b. nothing external


@pytest.mark.parametrize("name", ["shipped", "race256", "plain"])
def test_the_page_refers_to_nothing_outside_itself(name, request):
    assert external_urls(share_html(request.getfixturevalue(name))) == []


@pytest.mark.parametrize("injected", [
    '<script src="https://cdn.example.com/x.js"></script>',
    '<link rel="stylesheet" href="https://cdn.example.com/x.css">',
    '<style>@import "x.css";</style>',
    '<div style="background: url(//img.example.com/a.png)"></div>',
    '<img src="x.png" alt="">',
    '<a href="http://example.com">a link</a>',
])
def test_the_checker_reports_an_injected_fetch(shipped, injected):
    """Negative control: the checker above would notice a page that fetched something."""
    html = share_html(shipped)
    assert external_urls(html.replace("</body>", injected + "</body>")) != []


# ---------------------------------------------------------------- 3. size


def test_a_256_token_race_exports_under_2_mb(race256):
    assert sum(r.tokens_emitted for r in race256.rounds) == 256 == len(race256.ar_steps)
    assert race256.finished == "length"
    size = len(share_html(race256).encode("utf-8"))
    print(f"\n256-token race ({len(race256.rounds)} rounds): {size:,} bytes ({size / 1e6:.2f} MB)")
    assert size < 2_000_000


# ---------------------------------------------------------------- 4. a real browser, offline


@pytest.mark.browser
def test_opens_offline_in_headless_chromium(race256, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (scripts/setup.sh test installs it)"
    from playwright.sync_api import sync_playwright

    path = tmp_path / "run.html"
    path.write_text(share_html(race256), encoding="utf-8")
    speedup = finished(race256).speedup
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
            page = context.new_page()
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            tokens = page.locator("#sv-lane-spec .sv-tok")
            assert tokens.count() == sum(len(r.drafted) + (r.emitted is not None) for r in race256.rounds)
            assert tokens.first.is_visible()
            assert page.locator("#sv-speedup b").inner_text() == f"{speedup:.2f}×"
            rejected = page.locator("#sv-lane-spec .sv-rejected").first
            assert rejected.is_visible()
            page.click("label[for=sv-committed]")  # the CSS-only toggle: only the committed text stays
            assert not rejected.is_visible() and page.locator("#sv-lane-spec .sv-accepted").first.is_visible()
            spec, ar = page.locator("#sv-lane-spec").bounding_box(), page.locator("#sv-lane-ar").bounding_box()
            assert spec["y"] == ar["y"] and ar["x"] > spec["x"]  # side by side on a wide screen
            page.set_viewport_size({"width": 600, "height": 900})
            spec, ar = page.locator("#sv-lane-spec").bounding_box(), page.locator("#sv-lane-ar").bounding_box()
            assert ar["y"] >= spec["y"] + spec["height"]  # stacked on a narrow one
            assert requests == [path.as_uri()]
        finally:
            browser.close()
