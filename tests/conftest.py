"""Shared fixtures. The real embedded pair is loaded once per test session (seconds from `make app`'s bfloat16 copy)."""

from __future__ import annotations

import os

# Before gradio, transformers or huggingface_hub are imported (they read these once, at import):
# the suite never calls home and never waits on the model hub; CI has no network.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the Triton kernels (specviz/kernels/triton_rows.py) run on CPU tensors in Triton's interpreter, a
# switch Triton reads once, when it is imported (by specviz's modules, below)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specviz.models.tiny import tiny_pair  # noqa: E402

ALL_THREADS = torch.get_num_threads()
# Under pytest-xdist (`make test` runs one worker per core) every worker keeps to one thread: the cores
# are already all busy, and spinning OpenMP threads of two processes on two cores slow both down.
IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ
# Run first, so the longest work starts while the other worker takes the many short tests.
SLOW_FIRST = ("test_statistical.py", "test_embedded_e2e.py", "test_ui_api.py")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Tiny models gain nothing from intra-op threads; with other processes on the machine, spinning
    OpenMP workers made the tiny-model files 20x slower. The real pair keeps all threads (when it runs
    alone). Set here, before any fixture of the test is created, so module- and session-scoped setups
    follow the same rule."""
    torch.set_num_threads(ALL_THREADS if item.get_closest_marker("embedded") and not IN_WORKER else 1)


def pytest_collection_modifyitems(config, items):
    """Slow files first, so the longest work starts while the other worker takes the many short tests."""
    items.sort(key=lambda item: item.path.name not in SLOW_FIRST)  # stable: the order within stays


SHARED = {"test_embedded_e2e.py": "embedded", "test_ui_api.py": "embedded", "test_atlas_embedded.py": "embedded",
          "test_ui_browser.py": "browser", "test_engines.py": "llama.cpp", "test_engines_ui.py": "llama.cpp",
          "test_costs.py": "costs"}


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (`make test`): tests that share an expensive session fixture go to one worker as a
    unit (the real pair is loaded once, the browser and the llama.cpp servers started once, `specviz costs`' report
    measured once); every other test is scheduled alone."""
    from xdist.scheduler import LoadScopeScheduling

    class Shared(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED.get(nodeid.split("::")[0].rsplit("/", 1)[-1], nodeid)

    return Shared(config, log)


@pytest.fixture(autouse=True)
def quiet_machine(request, monkeypatch):
    """A measurement kept in the cache is kept only if the machine was quiet while it was taken (other processes'
    CPU, `kernel_table.others_cpu_seconds`). Under pytest-xdist the other worker is always busy: every test but those
    of that rule itself (test_measuring.py) sees a quiet machine, so what it checks does not depend on the load."""
    if request.path.name != "test_measuring.py":
        monkeypatch.setattr("specviz.models.kernel_table.others_cpu_seconds", lambda: 0.0)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random-weight pair: fast and deterministic; float32 on the CPU unless the suite runs elsewhere
    (`helpers.TEST_DEVICE`)."""
    from helpers import on_test_device

    return on_test_device(tiny_pair())


@pytest.fixture(scope="session")
def embedded_pair():
    """The real Qwen2.5-Coder 0.5B -> 1.5B pair as loaded (torch's own kernels), in bfloat16: what `--dtype auto`
    runs on a CPU with AVX512-BF16 or AMX, read from the copy `make app` made. Not float32: its copies would add
    9 GB to the cache for the tests alone, and exactness to float32's rounding is proven on the tiny pairs."""
    from specviz.models import load_pair

    return load_pair("embedded", "embedded", device="cpu", dtype="bfloat16", progress=False)


@pytest.fixture(scope="session")
def served_pair(embedded_pair):
    """The real pair as `specviz serve` runs it on a CPU: the draft's step in int4, every linear of the target on the
    kernel this machine's table chose for its row count and its verify's rows computed as its one-token steps
    (`kernels.rows`: greedy speculation is then the target alone's text bit for bit), the weights shared with
    `embedded_pair`, not loaded again. Eager steps: a compiled step's choice is not what these tests prove. Planned on
    `make app`'s kernel table (all threads) where it is kept: a worker's own (one thread) took minutes to measure, and
    which plan is fastest is not what these tests prove either."""
    from helpers import tables_kept_at
    from specviz.models import PairSpec
    from specviz.models.loading import with_speedups

    with tables_kept_at(ALL_THREADS):
        pair = with_speedups(embedded_pair, PairSpec(dtype="bfloat16", step="eager"))
    assert pair.target_name.endswith("[tuned kernels]") and pair.draft_name.endswith("[int4 draft step]")
    assert pair.not_invariant is None, pair.not_invariant
    return pair


@pytest.fixture(scope="session")
def llamacpp_pair():
    """(speculative URL, plain URL, "real" or "replay"): the real llama-server pair where this machine has llama.cpp's
    build and the embedded GGUF files, else the replay (`test_engines.pair_for_this_machine`). Started once per pytest
    process (the real pair takes seconds) for test_engines.py's race and test_engines_ui.py's browser race; every
    request to it is one at a time and each test reads the counters' difference around its own requests, so what ran
    on it before does not enter a test's figures."""
    from test_engines import pair_for_this_machine

    with pair_for_this_machine() as urls:
        yield urls


@pytest.fixture(scope="module")
def open_client():
    """`open_client(url)`: a gradio_client.Client, a session of its own like a separate browser or script (the load
    test's `connect`: over plain HTTP it skips loading the CA certificates on every request, half of a short request's
    time here). Every client opened is closed (its heartbeat thread stopped) when the module's tests are done."""
    from specviz.bench.loadtest import connect

    clients = []

    def open_(url):
        clients.append(connect(url))
        return clients[-1]

    yield open_
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def serve(open_client):
    """Launch apps in-process on loopback (Gradio picks a free port): `demo, client = serve(session, limits)`.
    Every app started is closed when the module's tests are done."""
    from helpers import NO_WAIT
    from specviz.serving.pacing import Pace
    from specviz.server import build_server, launch
    from specviz.ui.handlers import Options

    demos = []

    def start(session, limits):
        demo = build_server(session, limits, Options(Pace(0.0, 0.0, NO_WAIT)))
        _, url, _ = launch(demo, host="127.0.0.1", port=None, prevent_thread_lock=True, quiet=True)
        demos.append(demo)
        return demo, open_client(url)

    yield start
    for demo in demos:
        demo.close()


@pytest.fixture(scope="module")
def server_session():
    """The session `server` serves: the tiny pair. A module overrides this fixture to serve another."""
    from specviz.models import PairSpec
    from specviz.serving.session import Session

    # the pair as it is served, switching allowed (`specviz serve --allow-pair-switch`): the tests load pairs
    return Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), allow_switch=True)


@pytest.fixture(scope="module")
def server_limits():
    """The limits `server` enforces. A module overrides this fixture to enforce others."""
    from specviz.settings.limits import Limits

    return Limits()


@pytest.fixture(scope="module")
def server(serve, server_session, server_limits):
    """One app per module: `server.session`, `server.demo`, `server.client`."""
    demo, client = serve(server_session, server_limits)
    return SimpleNamespace(session=server_session, demo=demo, client=client)
