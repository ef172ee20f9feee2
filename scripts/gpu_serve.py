"""The served app on a lent GPU (issue 42, item 3): `specviz serve` on a synthetic pair on the device, then one race
asked through `gradio_client` from each of two threads, one after the other (Gradio resumes generators on worker
threads: CUDA graphs recorded on one and replayed on another is what this would catch). Writes the races' results
(trace left out) and the server's log; exits non-zero unless both lanes of both races ran to the end.

    python3 scripts/gpu_serve.py --json $OUT/serve.json --log $OUT/serve.log [--device cuda] [--draft ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

COMPLETE = {"length", "eos"}


def options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="synthetic:qwen2.5-0.5b")
    ap.add_argument("--target", default="synthetic:qwen2.5-7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--step", default="compiled")
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--ready-s", type=float, default=420.0, help="how long the server may take to start")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    return ap.parse_args()


def start(a: argparse.Namespace, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specviz.cli", "serve", "--port", str(a.port), "--draft", a.draft, "--target",
           a.target, "--device", a.device, "--dtype", a.dtype, "--step", a.step, "--no-recorded"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})


def wait_ready(url: str, server: subprocess.Popen, seconds: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}) before it was ready: see the log")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"the server was not ready in {seconds:.0f} s")


def race_on_a_thread(url: str, prompt: str, k: int, tokens: int) -> dict:
    """One race from a new thread with a client of its own, as a second visitor's browser would ask."""
    out: dict = {}

    def ask():
        from gradio_client import Client
        t0 = time.monotonic()
        try:
            final = Client(url, verbose=False).predict(prompt, k, tokens, api_name="/race")
            out.update({k: v for k, v in final.items() if k != "trace"}, wall_s=time.monotonic() - t0,
                       thread=threading.current_thread().name)
        except Exception as e:  # recorded, not raised: the other race still runs
            out.update(error=f"{type(e).__name__}: {e}", thread=threading.current_thread().name)

    t = threading.Thread(target=ask)
    t.start()
    t.join()
    return out


def main() -> int:
    a = options()
    url = f"http://127.0.0.1:{a.port}/"
    a.json.parent.mkdir(parents=True, exist_ok=True)
    with open(a.log, "w") as log:
        server = start(a, log)
        try:
            ready = wait_ready(url, server, a.ready_s)
            prompts = [" ".join(f"t{i}" for i in range(7, 7 + 40, 3)), " ".join(f"t{i}" for i in range(900, 960, 2))]
            races = [race_on_a_thread(url, p, 4, a.tokens) for p in prompts]
        finally:
            server.terminate()
            server.wait(30)
    ok = all("error" not in r and {r["ar"]["finished"], r["spec"]["finished"]} <= COMPLETE for r in races)
    result = {"ok": ok, "ready_s": ready, "settings": vars(a) | {"json": str(a.json), "log": str(a.log)},
              "races": races}
    a.json.write_text(json.dumps(result, indent=1, default=str))
    for r in races:
        print({k: r.get(k) for k in ("thread", "speedup", "identical", "timing_note", "error", "wall_s")})
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
