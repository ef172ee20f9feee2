"""Output files a command will write, checked before it runs: a bench that measured for fifteen minutes must not
find out at the end that its folder is missing or read-only."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

# every subcommand's file outputs (`--json` of whatif: a switch; an atlas's `--traces`: a folder it makes)
OUTPUT_FLAGS = ("json", "html", "out", "save_predictor", "export_rejections")


def unwritable(path: str) -> str | None:
    """Why `path` cannot be written, in a few words (None: it can be, folders and all). Tried for real, in the
    nearest folder that exists (permission bits do not stop root, a read-only mount does), and nothing is left
    behind: a command refused for another flag has made no folder (`write_atomic` makes them as it writes)."""
    target = Path(path)
    if target.is_dir():
        return "it is a folder"
    folder = target.parent
    nearest = next(p for p in (folder, *folder.parents) if p.exists())
    if not nearest.is_dir():
        return f"cannot make the folder {folder}: {nearest} is a file"
    try:
        with tempfile.NamedTemporaryFile(dir=nearest, prefix=".specviz-check-"):
            pass
    except OSError as e:
        return f"{e.strerror or e} in {nearest}"
    return None


def output_problem(args: argparse.Namespace) -> str | None:
    """The first output flag of a parsed command that cannot be written, said as `--flag PATH: why`."""
    for name in OUTPUT_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and (why := unwritable(value)) is not None:
            return f"--{name.replace('_', '-')} {value}: {why}"
    return None


def write_atomic(path: str | Path, text: str) -> None:
    """`text` into `path` whole: written to a temporary file beside it, then renamed over it, so a kill or a full disk
    mid-write leaves the file as it was before (or no file), never half of one; the temporary file is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
