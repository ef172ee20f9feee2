"""Gradio controls generated from settings specs: label, help (info), range, step, choices, default.

A setting gets a slider when it has both bounds, a number box otherwise, radio buttons for choices,
a checkbox for a flag and a text box for text. Each control's elem_id is `<prefix><name>` (`sv-set-k`).
"""

from __future__ import annotations

import gradio as gr

from specviz.settings.spec import Setting, fields_of

SLIDER_STEPS = {int: 1, float: 0.01}


def control(s: Setting, value=None, prefix: str = "sv-set-") -> gr.components.Component:
    value = s.default if value is None else value
    common = dict(label=s.label, info=s.help, elem_id=f"{prefix}{s.name}")
    if s.choices is not None:
        return gr.Radio(list(s.choices), value=value, **common)
    if s.kind is bool:
        return gr.Checkbox(value=value, **common)
    if s.kind is str:
        return gr.Textbox(value=value or "", **common)
    step = s.step or SLIDER_STEPS[s.kind]
    lo = s.lo + step if s.lo_open else s.lo  # a slider cannot exclude its end
    if s.hi is not None and not s.optional and lo < s.hi:
        return gr.Slider(lo, s.hi, value=min(max(value, lo), s.hi), step=step, **common)
    if s.hi is not None and lo >= s.hi:  # the server's limit leaves one value (a room's 16 samples): shown, not chosen
        return gr.Number(s.hi, minimum=s.hi, maximum=s.hi, interactive=False, **common)
    return gr.Number(value, minimum=lo, maximum=s.hi, precision=0 if s.kind is int else None, **common)


def controls(spec: type, limits=None, values: dict | None = None, only: tuple[str, ...] | None = None,
             prefix: str = "sv-set-") -> dict[str, gr.components.Component]:
    """One control per setting of `spec` (or of `only`, in that order), by setting name."""
    settings = {s.name: s for s in fields_of(spec, limits)}
    return {name: control(settings[name], (values or {}).get(name), prefix) for name in (only or settings)}
