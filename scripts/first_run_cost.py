"""What a newcomer's first run costs on this machine, measured: a fresh clone set up from nothing (a new venv, an
empty specviz cache, the README's `make app` set-up), then the app's first load of the embedded pair (where the
kernels and steps are timed once), each phase timed, and what they put on disk counted. The README's first-run
line is rendered from the report this writes (scripts/docs.py, `_first_run.md`).

    .venv/bin/python scripts/first_run_cost.py --json assets/setup/first_run_zen5.json

It needs the machine to itself (the first load times kernels) and about 16 GB of free disk.
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


def timed(command: list[str], cwd: Path, env: dict) -> float:
    start = time.monotonic()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def model_package_bytes(python: Path, cwd: Path, env: dict) -> tuple[int, int]:
    """(count, bytes) of the embedded model packages the set-up installed: their files as their RECORDs list them,
    the bytes a first set-up fetches for the models."""
    code = ("import importlib.metadata as m\nfrom specviz.models.embedded import EMBEDDED_MODELS\n"
            "names = [r.split('==')[0] for x in EMBEDDED_MODELS for r in x.requirements()]\n"
            "print(len(names), sum(f.size or 0 for n in names for f in m.distribution(n).files or []))")
    out = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    count, size = out.stdout.split()
    return int(count), int(size)


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
        setup_s = timed(["bash", "scripts/setup.sh", "app"], clone, env)
        specviz = clone / ".venv" / "bin" / "specviz"
        first_load_s = timed([str(specviz), "trace", "--prompt", "Hello", "--max-new-tokens", "4", "--out",
                              str(Path(tmp) / "trace.json")], clone, env)
        count, models = model_package_bytes(clone / ".venv" / "bin" / "python", clone, env)
        report = {
            "meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(),
                     "command": f"python scripts/first_run_cost.py --json {args.json}"},
            "seconds": {"setup": round(setup_s, 1), "first_load": round(first_load_s, 1)},
            "model_packages": {"count": count, "bytes": models},
            "disk_bytes": {"venv": folder_bytes(clone / ".venv"), "cache": folder_bytes(cache)},
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
