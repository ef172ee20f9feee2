"""Two local llama.cpp servers on the embedded GGUF pair, for a race: the target alone on `port`, the target with
its draft on `port + 1` (`-md DRAFT`, K as the most tokens drafted per round), and on request the draft alone on
`port + 2` (a race lane that measures the draft's cost for the cost model). This llama.cpp takes no
per-request speculative settings (`llamacpp.py`), hence two servers. Both bind 127.0.0.1, expose /metrics,
serve one request at a time (`-np 1`), and stop when the context manager exits (Ctrl-C included).

The binary comes from the build folder `scripts/build_llamacpp.sh` makes (in the cache, or --build DIR); the
GGUF files are the embedded pair's verified files (`models.embedded.assemble`). Flag names changed between
llama.cpp versions (`--draft-max` became `--spec-draft-n-max`, and a draft model drafts only with
`--spec-type draft-simple` in recent builds): they are read from the binary's --help.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from specviz.remote.policy import EngineError

VERSION = os.environ.get("LLAMACPP_PY_VERSION", "0.3.36")  # the llama-cpp-python sdist build_llamacpp.sh builds
HOST = "127.0.0.1"


def default_build() -> Path:
    from specviz.cache import cache_dir

    return cache_dir() / "llama.cpp" / f"build-{VERSION}"


def server_binary(build: str | Path | None = None) -> Path:
    folder = Path(build).expanduser() if build else default_build()
    for where in (folder / "bin" / "llama-server", folder / "llama-server"):
        if where.is_file() and os.access(where, os.X_OK):
            return where
    raise EngineError(f"{folder} has no llama-server (in it or in its bin/); scripts/build_llamacpp.sh builds it.")


def embedded_ggufs() -> tuple[Path, Path]:
    """(target, draft): the embedded pair's verified GGUF files."""
    from specviz.models.embedded import DRAFT, TARGET, EmbeddedModelError, assemble

    try:
        return assemble(TARGET, progress=False), assemble(DRAFT, progress=False)
    except EmbeddedModelError as e:
        raise EngineError(str(e)) from None


def has_flag(help_text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def flag_names(help_text: str, tool: str) -> dict:
    """The names this llama.cpp tool accepts for drafting: 2025 builds renamed --draft-max/--draft-min/--draft-p-min
    to --spec-draft-n-max/-n-min/-p-min (the old names now only say 'removed'), and need --spec-type draft-simple,
    without which a draft model is loaded but never drafts."""
    def pick(*names):
        return next((n for n in names if has_flag(help_text, n)), None)

    flags = {"n_max": pick("--spec-draft-n-max", "--draft-max"), "n_min": pick("--spec-draft-n-min", "--draft-min"),
             "p_min": pick("--spec-draft-p-min", "--draft-p-min"),
             "type": ["--spec-type", "draft-simple"] if has_flag(help_text, "--spec-type") and
             "draft-simple" in help_text else []}
    if flags["n_max"] is None:
        raise EngineError(f"this {tool} accepts neither --spec-draft-n-max nor --draft-max (per its --help), so "
                          "specviz cannot set K.")
    return flags


def draft_flags(help_text: str, k: int, p_min: float) -> list[str]:
    """This build's names for: draft with the model, at most K tokens per round, stop below p_min."""
    f = flag_names(help_text, "llama-server")
    return [*f["type"], f["n_max"], str(k), *([f["p_min"], f"{p_min:g}"] if f["p_min"] else [])]


@dataclass(frozen=True)
class LlamaSettings:
    """How the servers run: the first one's port, the drafting server's K and p_min, each server's threads and
    context, and whether the draft alone is served too."""

    port: int = 8081  # the target alone; the target with its draft on port + 1, the draft alone on port + 2
    k: int = 8  # the most tokens drafted per round
    p_min: float = 0.0  # stop drafting below this draft probability (0: draft all K)
    threads: int | None = None  # per server (None: all cores)
    ctx: int = 4096  # context size per server
    draft_alone: bool = False

    @property
    def ports(self) -> list[int]:
        return [self.port + i for i in range(3 if self.draft_alone else 2)]


def commands(binary: Path, target: Path, draft: Path, settings: LlamaSettings, help_text: str) -> list[list[str]]:
    """[target alone on `port`, target with its draft on `port + 1`, (the draft alone on `port + 2`)]."""
    threads = settings.threads or os.cpu_count() or 1

    def server(model: Path, at: int) -> list[str]:
        return [str(binary), "-m", str(model), "--host", HOST, "--port", str(at), "--metrics", "-np", "1",
                "-c", str(settings.ctx), "-t", str(threads),
                *(["--no-webui"] if has_flag(help_text, "--no-webui") else [])]

    port = settings.port
    return [server(target, port),
            [*server(target, port + 1), "-md", str(draft), *draft_flags(help_text, settings.k, settings.p_min)],
            *([server(draft, port + 2)] if settings.draft_alone else [])]


def port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise EngineError(f"port {port} on {HOST} is in use; choose another with --port.") from None


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].rstrip(".") if lines else "no output"


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, deadline: float, name: str = "llama-server") -> None:
    """Until GET /health answers 200 (llama-server answers 503 while it loads; vLLM listens only once loaded)."""
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            if proc.poll() is not None:
                raise EngineError(f"{name} on {url} exited (status {proc.returncode}): {last_line(log)}.")
            try:
                if client.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise EngineError(f"{name} on {url} did not become healthy in time: {last_line(log)}.")
            time.sleep(0.5)


@contextmanager
def started(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """One server process; stopped (SIGTERM, then SIGKILL after 10 s) on exit. Its own session: a Ctrl-C in the
    terminal reaches specviz, which then stops it, rather than killing it mid-request."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class LlamaServers:
    plain_url: str  # the target alone
    spec_url: str  # the target with its draft
    draft_url: str | None  # the draft alone, when asked for
    commands: tuple[str, ...]  # as run, shell-quoted
    logs: tuple[Path, ...]


@contextmanager
def llama_servers(settings: LlamaSettings = LlamaSettings(), build: str | Path | None = None,
                  target: Path | None = None, draft: Path | None = None, wait_s: float = 600.0,
                  log_dir: Path | None = None) -> Iterator[LlamaServers]:
    """Start the servers, wait until each answers /health, yield their URLs; stop them all on exit. `target` and
    `draft` default to the embedded pair's GGUF files, `build` to the build folder in the cache."""
    binary = server_binary(build)
    if target is None or draft is None:
        target, draft = embedded_ggufs()
    ports = settings.ports
    for p in ports:
        port_free(p)
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, errors="replace",
                               timeout=60).stdout
    cmds = commands(binary, target, draft, settings, help_text)
    with ExitStack() as stack:
        folder = Path(log_dir) if log_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llama-")))
        logs = tuple(folder / f"llama-server-{p}.log" for p in ports)
        procs = [stack.enter_context(started(cmd, log)) for cmd, log in zip(cmds, logs)]
        urls = [f"http://{HOST}:{p}" for p in ports]
        deadline = time.monotonic() + wait_s
        for url, proc, log in zip(urls, procs, logs):
            wait_healthy(url, proc, log, deadline)
        yield LlamaServers(urls[0], urls[1], urls[2] if settings.draft_alone else None, tuple(map(shlex.join, cmds)),
                           logs)
