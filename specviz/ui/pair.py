"""The Model pair panel (where the operator allows switching): a preset menu, the pair's fields, Load and its
status log, and the header that names the served pair.

`load_models` (a plain generator) streams the load's status lines; `pair_panel` lays the panel out and `wire`
connects the menu and Load.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from specviz.models import PairSpec
from specviz.models.memory import pair_bytes
from specviz.models.presets import PRESETS
from specviz.serving.session import Session
from specviz.ui.controls import controls
from specviz.ui.handlers import Page, user_errors
from specviz.ui.render import header_html


@user_errors
def load_models(session: Session, draft, target, dtype, target_quant=None) -> Iterator[str]:
    """Load in a worker thread and stream its status lines; errors end as gr.Error."""
    lines: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work():
        try:
            outcome["name"] = session.switch(draft, target, dtype or "auto", status=lines.put,
                                             target_quant=target_quant or None)
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e
        finally:
            lines.put(None)

    worker = threading.Thread(target=work, name="specviz-load", daemon=True)
    log: list[str] = []
    worker.start()
    while (line := lines.get()) is not None:
        log.append(f"- {line}")
        yield "\n".join(log)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]  # user_errors turns the user's mistakes into gr.Error
    yield "\n".join(log + [f"**Loaded:** {outcome['name']}"])


@dataclass(frozen=True)
class PairPanel:
    preset: gr.Dropdown
    draft: gr.components.Component
    target: gr.components.Component
    dtype: gr.components.Component
    target_quant: gr.components.Component
    load: gr.Button
    log: gr.Markdown


def pair_panel(session: Session) -> PairPanel:
    first = next(iter(PRESETS))
    with gr.Accordion("Model pair", open=False):
        preset = gr.Dropdown(list(PRESETS), value=first, label="Preset")
        draft, target = PRESETS[first]
        # the target's precision: race a GPU's economics (a bf16 target) against a CPU engine's (an int4 one)
        fields = controls(PairSpec, values=dict(draft=draft or "", target=target),
                          only=("draft", "target", "dtype", "target_quant"))
        load = gr.Button("Load", elem_id="sv-load")
        log = gr.Markdown(f"Serving **{session.name}**.", elem_id="sv-load-log")
    return PairPanel(preset, **fields, load=load, log=log)


def wire(page: Page, panel: PairPanel, header: gr.HTML):
    """A preset fills in the fields; Load (the model's queue) streams its log, then renames the header. Returns
    the event Stop cancels."""
    session = page.session

    def on_load(draft, target, dtype, target_quant):
        yield from load_models(session, draft, target, dtype, target_quant)

    def on_preset(name):
        draft, target = PRESETS[name]
        return {panel.draft: draft or "", panel.target: target}

    panel.preset.input(on_preset, [panel.preset], [panel.draft, panel.target], api_visibility="private")
    return panel.load.click(on_load, [panel.draft, panel.target, panel.dtype, panel.target_quant], [panel.log],
                            api_visibility="private", **page.model_queue).then(
        lambda: header_html(session.name, pair_bytes(session.pair)), None, [header], api_visibility="private")
