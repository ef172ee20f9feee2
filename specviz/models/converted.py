"""A converted model folder kept whole: written to a folder of its own, recorded file by file (size and sha256),
renamed into place in one step, and trusted only while every recorded file is there at its size (its hashes are
checked by `specviz prepare --verify`). A reader never sees half a folder, and a damaged one is converted again."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
from pathlib import Path

from tqdm.auto import tqdm

MANIFEST = "MANIFEST.json"  # {file name: {"size": bytes, "sha256": hex}}, every file of the folder but the stamps
INDEX = "model.safetensors.index.json"  # which shard holds each tensor (transformers' name)
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


def cast_folder(source: Path, dest: Path, dtype, shard_bytes: int = 1 << 30) -> None:
    """Write into `dest` the model in `source` with every floating tensor cast to `dtype`, as a load in that dtype
    casts it (so both give the same weights), in shards of about `shard_bytes`. A load in a half dtype from the
    float32 copy maps the whole float32 file while it casts (its peak: 11 GB for the embedded pair, 3.5 GB from a
    bf16 copy, which a load then maps as it is); each shard here reads only its own tensors."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    for p in source.iterdir():
        if p.is_file() and p.suffix != ".safetensors" and p.name not in (MANIFEST, SOURCE, INDEX):
            shutil.copy2(p, dest / p.name)
    weight_map, shard, size = {}, [], 0
    itemsize = torch.empty((), dtype=dtype).element_size()

    def flush():  # one shard's tensors read (each file opened, read, closed), cast, written, dropped
        nonlocal shard, size
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        tensors = {}
        for file, keys in itertools.groupby(shard, key=lambda fk: fk[0]):
            with safe_open(file, "pt") as f:
                for _, key in keys:
                    t = f.get_tensor(key)
                    tensors[key] = t.to(dtype) if t.is_floating_point() else t
        save_file(tensors, dest / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        shard, size = [], 0

    entries = []  # (file, tensor name, its bytes in `dtype`, roughly)
    for file in sorted(source.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            entries += [(file, key, math.prod(f.get_slice(key).get_shape()) * itemsize) for key in f.keys()]
    for file, key, nbytes in entries:
        shard.append((file, key))
        size += nbytes
        if size >= shard_bytes:
            flush()
    if shard:
        flush()
    (dest / INDEX).write_text(json.dumps({"metadata": {"format": "pt"}, "weight_map": weight_map}, indent=1))


def replace_folder(new: Path, dest: Path) -> None:
    """`new` in place of `dest` by renames (one for a reader: `dest` is the old folder or the new one, whole)."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(new, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, dest)
