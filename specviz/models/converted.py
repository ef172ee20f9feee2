"""A converted model folder kept whole: written to a folder of its own, recorded file by file (size and sha256),
renamed into place in one step, and trusted only while every recorded file is there at its size (its hashes are
checked by `specviz prepare --verify`). A reader never sees half a folder, and a damaged one is converted again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from tqdm.auto import tqdm

MANIFEST = "MANIFEST.json"  # {file name: {"size": bytes, "sha256": hex}}, every file of the folder but the stamps
SOURCE = "SOURCE_SHA256"  # the sha256 of the file it was converted from: written last, so its presence means whole


def sha256_of(path: Path, progress: bool = True) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, desc=f"verify {path.name}", disable=not progress
    ) as bar:
        while block := f.read(1 << 22):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def write_manifest(folder: Path, source_sha256: str) -> None:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name not in (MANIFEST, SOURCE))
    manifest = {p.name: {"size": p.stat().st_size, "sha256": sha256_of(p, progress=False)} for p in files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (folder / SOURCE).write_text(source_sha256)


def recorded(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def complete(folder: Path, source_sha256: str) -> bool:
    """Converted from that source, every recorded file there at its recorded size (cheap: no hashing). A folder
    converted before files were recorded is trusted on its stamp, as it was then."""
    stamp = folder / SOURCE
    if not stamp.is_file() or stamp.read_text() != source_sha256:
        return False
    files = recorded(folder)
    if files is None:
        return not (folder / MANIFEST).exists()  # none recorded yet: trusted; a damaged record: not
    return all((folder / name).is_file() and (folder / name).stat().st_size == f["size"] for name, f in files.items())


def damaged(folder: Path) -> list[str]:
    """The recorded files whose sha256 is not the one recorded (a minute for a few GB)."""
    files = recorded(folder) or {}
    return [name for name, f in files.items()
            if not (folder / name).is_file() or sha256_of(folder / name, progress=False) != f["sha256"]]


def verify(folder: Path, source_sha256: str) -> list[str]:
    """`prepare --verify`: the files whose sha256 differs from the record; a folder converted before files were
    recorded has them recorded now (trusted, as it was)."""
    if recorded(folder) is None:
        write_manifest(folder, source_sha256)
        return []
    return damaged(folder)


def replace_folder(new: Path, dest: Path) -> None:
    """`new` in place of `dest` by renames (one for a reader: `dest` is the old folder or the new one, whole)."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(new, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, dest)
