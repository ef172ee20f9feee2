"""Shared fixtures. The real embedded pair is loaded once per test session (it takes a minute)."""

from __future__ import annotations

import pytest
import torch

from specviz.models.tiny import tiny_pair


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny models gain nothing from intra-op threads; with other processes on the machine, spinning
    OpenMP workers made the tiny-model files 20x slower. The real pair keeps all threads."""
    if request.node.get_closest_marker("embedded"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random-weight float32 pair: fast and deterministic."""
    return tiny_pair()


@pytest.fixture(scope="session")
def embedded_pair():
    """The real Qwen2.5-Coder 0.5B -> 1.5B pair in float32, where exactness is proven."""
    from specviz.models import load_pair

    return load_pair("embedded", "embedded", device="cpu", dtype="float32", progress=False)


@pytest.fixture(scope="module")
def serve():
    """Launch apps in-process on loopback (Gradio picks a free port): `demo, client = serve(session, limits)`.
    Every app started is closed when the module's tests are done."""
    from gradio_client import Client

    from specviz.ui import handlers as h
    from specviz.ui.app import ASSETS, build_app, launch

    demos = []

    def start(session, limits):
        demo = build_app(session, limits, h.Options(min_interval=0.0, stage_delay=0.0, assets_dir=ASSETS))
        _, url, _ = launch(demo, host="127.0.0.1", port=None, prevent_thread_lock=True, quiet=True)
        demos.append(demo)
        return demo, Client(url, verbose=False)

    yield start
    for demo in demos:
        demo.close()
