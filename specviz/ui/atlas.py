"""The Atlas tab (id atlas): upload or paste prompts, run them all, see where the draft fails on them.

`atlas_tab` lays it out and `wire` connects it; `run_atlas` (a plain generator, like every tab's handlers)
streams `AtlasView`s: a progress line after every round, the table and the disagreement list each time a prompt
finishes (at most every `TABLE_EVERY` seconds: they are recomputed over every run so far), and at the end the
whole report with its files (HTML, JSON, rejections). Each run opens in the Decode tab (`open_run`), like a
replayed trace.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gradio as gr

from specviz.runs import atlas as atlases
from specviz.runs import atlas_json
from specviz.runs.atlas_input import PromptSet, read_file, read_prompts
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits
from specviz.serving.session import Session
from specviz.runs.trace import Trace
from specviz.ui.atlas_report import (
    ATLAS_CSS, PROMPT_COLUMNS, advice_html, atlas_html, disagreements_html, prompt_values, summary_html,
)
from specviz.ui.decode import DecodeTab, main_view
from specviz.ui.exports import folder
from specviz.ui.handlers import Options, Page, outputs, shown, stream, user_errors

CSS = ATLAS_CSS
TABLE_EVERY = 2.0  # seconds between recomputing the table mid-run
PASTED = "the pasted text"
NOTE = ("Where does the draft fail on *your* prompts? Upload a `.jsonl` (`{\"prompt\", \"kind\"?, \"id\"?}` per "
        "line), a `.txt` (prompts separated by blank lines) or a `.csv` (a `prompt` column), or paste prompts "
        "below; each runs with the settings on the right, under this server's time budget. Rows are worst "
        "first; pick one to open its run in the Decode tab.")


@dataclass
class AtlasView:
    progress: str  # Markdown: one line
    summary: str  # HTML
    table: object  # rows for the Dataframe, or gr.skip()
    disagreements: str | object  # HTML, or gr.skip()
    pick: object  # gr.update of the run picker, or gr.skip()
    files: object  # gr.update of the downloads
    runs: dict | object  # prompt id -> Trace (the tab's State), or gr.skip()


def prompt_set(upload, pasted, limits: Limits) -> PromptSet:
    """An uploaded file wins over pasted text."""
    if upload:
        return read_file(upload if isinstance(upload, str) else getattr(upload, "name", upload), limits)
    if isinstance(pasted, str) and pasted.strip():
        return read_prompts(pasted, PASTED, limits)
    raise InputError("upload a file of prompts (.jsonl, .txt or .csv) or paste some prompts first.")


def choices(report: atlases.AtlasReport) -> list[tuple[str, str]]:
    return [(f"{row.id} · {row.acceptance.rate:.0%} accepted", row.id) for row in report.findings.prompts]


def traces(state: atlases.AtlasState) -> dict[str, Trace]:
    return {run.prompt.id: run.trace for run in state.runs}


def progress_markdown(state: atlases.AtlasState) -> str:
    skipped = f" {len(state.problems)} skipped (see below)." if state.problems else ""
    return state.progress_line() + skipped


def table_view(state: atlases.AtlasState, report: atlases.AtlasReport, files=None) -> AtlasView:
    advice = (f"<h4>What to change</h4>{advice_html(report.advice)}" if report.advice.kinds else "")
    return AtlasView(progress_markdown(state), scoped(summary_html(report) + advice),
                     [prompt_values(row) for row in report.findings.prompts],
                     scoped(disagreements_html(report.findings.disagreements)),
                     gr.update(choices=choices(report), value=None), files or gr.skip(), traces(state))


def scoped(html: str) -> str:
    return f'<div class="sv-atlas">{html}</div>'  # ATLAS_CSS applies inside


def line_view(state: atlases.AtlasState) -> AtlasView:
    skip = gr.skip()
    return AtlasView(progress_markdown(state), skip, skip, skip, skip, skip, skip)


def write_files(report: atlases.AtlasReport, options: Options) -> list[str]:
    """The report as HTML and JSON, and the rejections, in the folder exports share (swept like them)."""
    where = folder(options)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    paths = []
    for suffix in (".html", ".json", "-rejections.jsonl"):
        fd, path = tempfile.mkstemp(prefix=f"specviz-atlas-{stamp}-", suffix=suffix, dir=where)
        os.close(fd)
        paths.append(path)
    Path(paths[0]).write_text(atlas_html(report), encoding="utf-8")
    atlas_json.write_json(report, paths[1])
    atlas_json.write_rejections(report, paths[2])
    return paths


@user_errors
def run_atlas(session: Session, limits: Limits, upload, pasted, race: bool, settings: dict,
              options: Options = Options()) -> Iterator[AtlasView]:
    prompts = prompt_set(upload, pasted, limits)
    shown, last = 0, 0.0  # runs in the table, and when it was computed
    state = None
    with closing(options.pace.timed(atlases.run_atlas(session, limits, prompts, settings, race=bool(race)),
                                    session.turns.visitor_waiting, session.warmers)) as states:
        for state, show in states:
            if state.finished is not None:
                break
            if len(state.runs) > shown and time.monotonic() - last >= TABLE_EVERY:
                shown, last = len(state.runs), time.monotonic()
                yield table_view(state, atlases.report(state, advise=False))
            elif show:
                yield line_view(state)
    if state is not None and state.finished is not None and state.runs:
        report = atlases.report(state)
        paths = write_files(report, options)
        yield table_view(state, report, gr.update(value=paths, visible=True))
    elif state is not None:
        yield line_view(state)


def open_run(runs: dict | None, choice) -> Trace:
    trace = (runs or {}).get(choice)
    if trace is None:
        raise gr.Error("pick a prompt that ran first (run the Atlas, then choose a row).", print_exception=False)
    trace.source = f"Atlas: {choice}"
    return trace


@dataclass(frozen=True)
class AtlasTab:
    """The tab's inputs, its buttons, and the components named like AtlasView's fields."""

    upload: gr.File  # a prompts file wins over pasted text
    pasted: gr.Textbox
    race: gr.Checkbox
    run: gr.Button
    progress: gr.Markdown
    summary: gr.HTML
    table: gr.Dataframe  # one row per prompt
    pick: gr.Dropdown  # a prompt that ran, to open in the Decode tab
    open: gr.Button
    disagreements: gr.HTML
    files: gr.File
    runs: gr.State  # prompt id -> Trace, to open in the Decode tab


def atlas_tab() -> AtlasTab:
    with gr.Tab("Atlas", id="atlas", elem_id="sv-atlas"):
        gr.Markdown(NOTE, elem_classes="sv-note")
        with gr.Row():
            upload = gr.File(label="Prompts file (.jsonl, .txt, .csv)", file_types=[".jsonl", ".txt", ".csv"],
                             type="filepath", elem_id="sv-atlas-file")
            pasted = gr.Textbox(label="…or paste prompts (one JSON object per line, or separated by blank lines)",
                                lines=5, max_lines=12, elem_id="sv-atlas-paste")
        with gr.Row():
            race = gr.Checkbox(False, label="race each prompt against the target alone (measured speedups; twice "
                                            "the time)", elem_id="sv-atlas-race")
            run = gr.Button("Run the Atlas", variant="primary", elem_id="sv-atlas-run")
        progress = gr.Markdown(elem_id="sv-atlas-progress")
        summary = gr.HTML(elem_id="sv-atlas-summary")
        table = gr.Dataframe(headers=list(PROMPT_COLUMNS), interactive=False, wrap=True, elem_id="sv-atlas-table",
                             label="Per prompt, worst first (click a header to sort)")
        with gr.Row():
            pick = gr.Dropdown([], label="Open a prompt's run", elem_id="sv-atlas-pick", scale=3)
            open_btn = gr.Button("Open in Decode", elem_id="sv-atlas-open", scale=1)
        disagreements = gr.HTML(elem_id="sv-atlas-disagreements")
        files = gr.File(label="The report (HTML, JSON) and the rejections (JSONL)", file_count="multiple",
                        interactive=False, visible=False, elem_id="sv-atlas-files")
        runs = gr.State(None)
    return AtlasTab(upload, pasted, race, run, progress, summary, table, pick, open_btn, disagreements, files, runs)


def wire(page: Page, tab: AtlasTab, decode: DecodeTab, exports: gr.State):
    """Run the Atlas (the model's queue: it holds the pair for the whole request; its files join the visitor's
    `exports`, removed when the session ends); open a row's run in the Decode tab. Returns the event Stop
    cancels."""
    def with_files(paths: list, view: AtlasView) -> dict:
        files = view.files.get("value") if isinstance(view.files, dict) else None
        return {**shown(tab, view), exports: [*paths, *files] if files else gr.skip()}

    def on_atlas(upload, pasted, race, paths, *values):
        yield from stream(run_atlas(page.session, page.limits, upload, pasted, race, page.settings_of(values),
                                    page.options), partial(with_files, paths))

    def on_open(runs, choice):
        return {page.tabs: gr.Tabs(selected="decode"), **shown(decode, main_view(open_run(runs, choice)))}

    tab.open.click(on_open, [tab.runs, tab.pick], [page.tabs, *decode.outputs], api_visibility="private")
    return tab.run.click(on_atlas, [tab.upload, tab.pasted, tab.race, exports, *page.settings.values()],
                         [*outputs(tab, AtlasView), exports], api_visibility="private", **page.model_queue)
