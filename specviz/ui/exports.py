"""Export and Share, in the side panel: the last run as a trace (JSON, replayable) or as one page to share (HTML).

Every visitor's exports (and the Atlas's reports) land in one folder (`folder`), swept of files older than an
hour; a visitor's own go when their browser session ends (`remove_files`, the State's delete callback).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from specviz.runs import trace as tracefile
from specviz.runs.trace import Trace
from specviz.ui.handlers import Options
from specviz.ui.share import share_html

EXPORT_MAX_AGE = 3600.0  # seconds an exported file stays in the shared folder (Gradio serves its own copy)


def sweep(folder: Path, max_age: float = EXPORT_MAX_AGE, now: float | None = None) -> None:
    """Remove exports older than max_age: every visitor's exports land in one folder, which must not grow forever."""
    now = time.time() if now is None else now
    for f in folder.glob("specviz-*"):
        try:
            if now - f.stat().st_mtime > max_age:
                f.unlink()
        except OSError:  # another request removed it first
            pass


def folder(options: Options) -> Path:
    """The shared folder, made if need be and swept."""
    where = options.trace_dir or Path(tempfile.gettempdir()) / "specviz-traces"
    where.mkdir(parents=True, exist_ok=True)
    sweep(where)
    return where


def remove_files(paths: list[str] | None) -> None:
    """A visitor's exports, when their browser session ends (Gradio's State delete callback)."""
    for path in paths or []:
        Path(path).unlink(missing_ok=True)


def export(record: Trace | None, options: Options = Options(), html: bool = False) -> str:
    """The last run as a trace (JSON, replayable) or, with `html`, as one self-contained page to share."""
    if record is None or not record.rounds:
        raise gr.Error("nothing to export yet: press Run, Rounds only or Step first.", print_exception=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # the folder is shared by every user of the server: a unique name, never one derived from the time alone
    fd, path = tempfile.mkstemp(prefix=f"specviz-{record.source.lower().replace(' ', '-')}-{stamp}-",
                                suffix=".html" if html else ".json", dir=folder(options))
    os.close(fd)
    if html:
        Path(path).write_text(share_html(record), encoding="utf-8")
        return path
    return str(tracefile.save(record, path))


@dataclass(frozen=True)
class ExportPanel:
    export: gr.Button
    share: gr.Button
    file: gr.File  # the last file written, to download
    files: gr.State  # every file this visitor's session wrote (the Atlas's too): removed when it ends


def export_panel() -> ExportPanel:
    with gr.Row():
        export_btn = gr.Button("Export trace (JSON)", elem_id="sv-export-btn", min_width=100)
        share_btn = gr.Button("Share as HTML", elem_id="sv-share-btn", min_width=100)
    file = gr.File(label="last run", interactive=False, visible=False, elem_id="sv-export")
    return ExportPanel(export_btn, share_btn, file, gr.State([], delete_callback=remove_files))


def wire(panel: ExportPanel, record: gr.State, options: Options) -> None:
    def written(rec, paths, html: bool) -> dict:
        path = export(rec, options, html)
        return {panel.file: gr.File(path, visible=True), panel.files: [*paths, path]}

    for button, html in ((panel.export, False), (panel.share, True)):
        button.click(lambda rec, paths, html=html: written(rec, paths, html), [record, panel.files],
                     [panel.file, panel.files], api_visibility="private")
