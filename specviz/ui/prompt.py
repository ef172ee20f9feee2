"""The prompt above the tabs and its row of buttons (Run, Rounds only, Step, Stop, the examples, Presenter).

Run races both lanes in the Live tab, Rounds only and Step run the Decode tab, Stop ends every run; Follow the
presenter is there only where someone can present. The buttons are laid out here and wired by the tabs they run
(live.py, decode.py); Stop by the app.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from specviz.ui.examples import EXAMPLES

# the presenter toggle runs in the browser: a class on <body> that the app's CSS keys on
# plotly sizes a figure to its box when drawn; a resize event makes the p/q plot follow the wider presenter layout
TOGGLE_PRESENTER = ("() => { document.body.classList.toggle('sv-presenter'); "
                    "setTimeout(() => window.dispatchEvent(new Event('resize')), 50); }")


@dataclass(frozen=True)
class PromptArea:
    prompt: gr.Textbox
    run: gr.Button  # both lanes, in the Live tab
    rounds: gr.Button  # the speculative lane alone, in the Decode tab
    step: gr.Button
    stop: gr.Button
    presenter: gr.Button
    follow: gr.Checkbox | None  # only where someone can present

    @property
    def leaving(self) -> list:
        """What a follower does that leaves follow mode: a run of its own, or Stop."""
        return [self.run.click, self.prompt.submit, self.rounds.click, self.step.click, self.stop.click]


def prompt_area(following: bool = False) -> PromptArea:
    prompt = gr.Textbox(label="Prompt", show_label=False, placeholder="Prompt", lines=2, max_lines=12,
                        value=EXAMPLES[0][1], elem_id="sv-prompt")
    with gr.Row(equal_height=True):
        run = gr.Button("Run", variant="primary", elem_id="sv-run", scale=2, min_width=90)
        rounds = gr.Button("Rounds only", elem_id="sv-rounds-run", scale=1, min_width=90)
        step = gr.Button("Step", elem_id="sv-step", scale=1, min_width=70)
        stop = gr.Button("Stop", variant="stop", elem_id="sv-stop", scale=1, min_width=70)
        # a dropdown, not gr.Examples: one line instead of three, so the Live view fits a laptop screen
        examples = gr.Dropdown([name for name, _ in EXAMPLES], value=EXAMPLES[0][0], show_label=False,
                               container=False, elem_id="sv-examples", scale=2, min_width=270, label="Examples")
        presenter = gr.Button("Presenter", elem_id="sv-presenter-btn", scale=1, min_width=90)
        # only where someone can present (the operator set a presenter key)
        # (its label on one line, the width it needs: at 1366 px a share of the row cut it to "Follow the present")
        follow = gr.Checkbox(False, label="Follow the presenter", elem_id="sv-follow", container=False, scale=0,
                             min_width=0) if following else None
    examples.input(lambda name: dict(EXAMPLES).get(name, gr.skip()), [examples], [prompt], api_visibility="private")
    return PromptArea(prompt, run, rounds, step, stop, presenter, follow)


def wire(area: PromptArea, tabs: gr.Tabs) -> None:
    """Presenter mode: the Live tab alone in larger type (a class on the page, toggled in the browser)."""
    area.presenter.click(lambda: gr.Tabs(selected="live"), None, [tabs], js=TOGGLE_PRESENTER,
                         api_visibility="private")
