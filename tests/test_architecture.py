"""The house holds: layers that import one way (import-linter contracts, with a violation they catch),
and a package that carries its own data (a non-editable install serves the shipped trace and prompts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True)


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("engine/sneaky.py", "from specviz.settings import spec as settings\n", "Layers"),
    ("runs/sneaky.py", "import gradio\n", "No Gradio below the adapters"),
    ("models/sneaky.py", "from specviz.engine import speculative\n", "Models load weights"),
    ("runs/sneaky.py", "from specviz.engine import speculative\n", None),  # allowed: runs sit above the engine
    ("analysis/sneaky.py", "from specviz.models import pair\n", "Layers"),  # independent siblings
    ("serving/sneaky.py", "from specviz.runs import race\n", "Serving"),  # a session runs no run path
    ("settings/sneaky.py", "from specviz.serving import session\n", "Layers"),  # the spec knows no session
    ("remote/sneaky.py", "from specviz.bench import runner\n", "Remote engines"),
    ("remote/sneaky.py", "from specviz.commands import engines\n", "Remote engines"),  # the command is above
    ("bench/sneaky.py", "from specviz.commands import bench\n", "Layers"),  # measurement knows no command
    ("commands/sneaky.py", "from specviz.cli import main\n", "Layers"),  # cli builds on the commands, not back
    ("commands/sneaky.py", "from specviz.server import build_server\n", None),  # allowed: serve launches the app
    ("serving/sneaky.py", "from specviz.settings import errors\n", None),  # allowed: serving validates
])
def test_a_change_that_breaks_a_layer_fails_the_contracts(tmp_path, module, line, contract):
    """The negative control: the same contracts on a copy of the package with one upward import added."""
    shutil.copytree(ROOT / "specviz", tmp_path / "specviz", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "specviz" / module).write_text(line)
    result = lint(tmp_path)
    if contract is None:
        assert result.returncode == 0, result.stdout
    else:
        assert result.returncode != 0 and f"{contract}" in result.stdout and "BROKEN" in result.stdout, result.stdout


def test_a_non_editable_install_serves_the_shipped_trace_and_prompts(tmp_path):
    """Assets are package data, found with importlib.resources: no path relative to a source checkout."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    code = ("import specviz, json; from specviz.runs.replay import shipped_traces, open_trace; "
            "from specviz.bench.prompts import load_prompts; from specviz.engine.acceptance import shipped_model; "
            "names = shipped_traces(); print(json.dumps([specviz.__file__, names, "
            "[len(open_trace(None, n).rounds) for n in names], len(load_prompts()), len(shipped_model().weights)]))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    import json

    where, names, rounds, prompts, weights = json.loads(out)
    assert where.startswith(str(target))  # the installed copy, not the checkout
    assert names == ["trace_embedded_code.json", "trace_smollm2_code.json"] and min(rounds) > 0 and prompts >= 6
    assert weights == 6  # the acceptance predictor's fit ships too
