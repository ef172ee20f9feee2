"""The served app: the Gradio UI and its JSON API on one queue, launched on loopback by default.

    demo = build_server(Session(pair, spec), Limits())
    launch(demo)                      # http://127.0.0.1:7860; `specviz serve` does both

The app is offline by default: no Gradio telemetry, no version check, never a share link.
"""

from __future__ import annotations

import gradio as gr
from starlette.middleware import Middleware

from specviz.api import diffs, endpoints
from specviz.engine import DecodeConfig
from specviz.settings.limits import Limits
from specviz.serving.session import Session
from specviz.ui import live
from specviz.ui.early_head import EarlyHead
from specviz.ui.app import APP_CSS, build_app
from specviz.ui.examples import EXAMPLES
from specviz.ui.handlers import Options
from specviz.ui.share import share_html

THREADS = 40  # Gradio's worker threads beside those of jobs waiting for the model (each waits in one)


def build_server(session: Session, limits: Limits = Limits(), options: Options = Options(),
                 defaults: DecodeConfig = DecodeConfig(), presenter_key: str | None = None) -> gr.Blocks:
    """The app and its JSON endpoints, with one queue: a full queue turns requests away. `presenter_key`: the
    browser it is entered in presents (its Live runs stream to followers)."""
    gr.utils.diff = diffs.diff  # Gradio's own shifts a nested list's deletions twice (`api.diffs`)
    demo = build_app(session, limits, options, defaults, presenter_key)
    with demo:
        names = endpoints.register(session, limits, options.pace, page=share_html, defaults=defaults,
                                   examples=EXAMPLES)
    endpoints.guarded(demo, names)
    demo.queue(default_concurrency_limit=1, max_size=limits.max_queue)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, limits: Limits = Limits(), **kwargs):
    """Serve on loopback by default; never share through Gradio's tunnel unless asked. Every model job waits for
    its turn in a worker thread of its own, so there are threads for a full queue and the rest of the app."""
    return demo.launch(server_name=host, server_port=port, share=False, css=APP_CSS, show_error=True,
                       max_file_size="20mb", theme=gr.themes.Soft(), max_threads=limits.max_queue + THREADS,
                       app_kwargs={"middleware": [Middleware(EarlyHead, html=live.HEAD)]}, **kwargs)
