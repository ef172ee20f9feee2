"""The house's size rules, read from the code itself: no function over 60 lines and no parameter list over 8 in
`specviz/` and `scripts/` (a long function does several things; a long parameter list is a dataclass not yet
written), with a negative control that each rule catches a breach. A Triton kernel (`@jit`, `@triton.jit`) is held
to the lines only: its parameters are its launch's pointers, sizes and strides, which no dataclass can carry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_PARAMS = 60, 8


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter a caller can pass (positional, keyword-only, *args, **kwargs); a method's self/cls not."""
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    return len(names) - (bool(a.posonlyargs or a.args) and (a.posonlyargs or a.args)[0].arg in ("self", "cls"))


def kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Is `fn` a Triton kernel (decorated `jit` or `triton.jit`)?"""
    return any(ast.unparse(d).split("(")[0] in ("jit", "triton.jit") for d in fn.decorator_list)


def breaches(source: str, name: str) -> list[str]:
    """`name:line function (n lines / n parameters)` for each function of `source` over a limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines, params = node.end_lineno - node.lineno + 1, 0 if kernel(node) else parameters(node)
            if lines > MAX_LINES or params > MAX_PARAMS:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines, {params} parameters)")
    return found


def python_files() -> list[Path]:
    return sorted([*ROOT.glob("specviz/**/*.py"), *ROOT.glob("scripts/**/*.py"), ROOT / "app.py"])


def test_no_function_is_over_60_lines_or_8_parameters():
    files = python_files()
    assert len(files) > 100  # the tree was found
    found = [b for path in files for b in breaches(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source, breach", [
    ("def f():\n" + "    x = 1\n" * 60, "f (61 lines, 0 parameters)"),
    ("def g(a, b, c, d, e, f, g, h, *, i):\n    pass\n", "g (2 lines, 9 parameters)"),
    ("class C:\n    def m(self, a, b, c, d, e, f, g, h, *rest):\n        pass\n", "m (2 lines, 9 parameters)"),
    ("@jit\ndef k(a):\n" + "    x = 1\n" * 60, "k (61 lines, 0 parameters)"),  # a kernel: its lines still count
    ("@functools.cache\ndef c(a, b, c, d, e, f, g, h, i):\n    pass\n", "c (2 lines, 9 parameters)"),
])
def test_each_rule_catches_a_breach(source, breach):
    assert [b.split(" ", 1)[1] for b in breaches(source, "x.py")] == [breach]


@pytest.mark.parametrize("source", [
    "def f():\n" + "    x = 1\n" * 59,  # 60 lines: at the limit
    "class C:\n    def m(self, a, b, c, d, e, f, g, h):\n        pass\n",  # self is not a parameter a caller passes
    "@triton.jit\ndef k(a, b, c, d, e, f, g, h, i, j):\n    pass\n",  # a Triton kernel's launch arguments
    "@jit\ndef k(a, b, c, d, e, f, g, h, i, j):\n    pass\n",
])
def test_what_is_at_the_limit_passes(source):
    assert breaches(source, "x.py") == []


def test_every_kernel_source_ships_in_the_package():
    """A kernel's C++ source is built on the user's machine at first use: an install without it (a wheel, the Docker
    image) would fall back to torch's kernels in silence. Every source file under specviz/ is package data."""
    import fnmatch
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    sources = [p for ext in ("*.cpp", "*.h") for p in (ROOT / "specviz").rglob(ext)]
    assert sources
    for path in sources:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in data.get(package, [])), path
