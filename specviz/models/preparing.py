"""The embedded models made ready in the cache, once: safetensors copies converted from the verified GGUF, and the
lean draft's store of codes (`models.draft.store`)."""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from filelock import FileLock

from specviz.models.converted import cast_folder, complete, replace_folder, write_manifest
from specviz.models.embedded import EmbeddedModel, EmbeddedModelError, assemble, converted_dir, is_converted
from specviz.models.reading import from_pretrained

log = logging.getLogger(__name__)

Status = Callable[[str], None]


def prepare_embedded(model: EmbeddedModel, status: Status = log.info, progress: bool = True,
                     dtype: torch.dtype = torch.float32) -> Path:
    """Assemble + verify the GGUF, then cache a safetensors copy in `dtype` (float32 for a dtype without a copy of
    its own) so later starts take seconds; returns its folder.

    float32 keeps the dequantized GGUF values exactly; a half dtype's copy holds those values cast (what a load in
    that dtype would compute; its load maps 3.5 GB instead of the float32 copy's 7 GB: the load's peak). The half
    copy is cast from the float32 one where that is cached, else converted straight from the GGUF: the float32
    copy, twice the bytes, is made only when a float32 run first asks for it.
    """
    half = dtype in (torch.bfloat16, torch.float16)
    dest = converted_dir(model, dtype if half else None)
    if is_converted(model, dtype if half else None):
        return dest
    if half and is_converted(model):
        with _staging(dest) as staging, FileLock(dest.parent / f".{dest.name}.lock"):
            if not is_converted(model, dtype):
                status(f"Writing a {str(dtype).removeprefix('torch.')} copy of {model.name} once…")
                cast_folder(converted_dir(model), staging, dtype)
                write_manifest(staging, model.sha256)
                replace_folder(staging, dest)
        return dest
    _convert(model, dest, status, progress, dtype if half else torch.float32)
    return dest


@contextmanager
def _staging(dest: Path):
    """A folder beside `dest` to write a copy into whole (renamed into place by the caller; removed if it was not)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _convert(model: EmbeddedModel, dest: Path, status: Status, progress: bool, dtype: torch.dtype) -> None:
    """The copy in `dest`, converted from the GGUF (dequantized in float32, then cast where `dtype` is a half one);
    two processes preparing at once: one converts, the other waits and then finds it converted."""
    half = dtype != torch.float32
    with _staging(dest) as staging, FileLock(dest.parent / f".{dest.name}.lock"):
        if is_converted(model, dtype if half else None):
            return
        m, tok = _from_gguf(model, dtype, status, progress, f"a {str(dtype).removeprefix('torch.')} copy")
        try:
            _write_whole(staging, dest, model, lambda folder: (m.save_pretrained(folder), tok.save_pretrained(folder)))
        finally:
            del m
            gc.collect()


def _from_gguf(model: EmbeddedModel, dtype: torch.dtype, status: Status, progress: bool, into: str) -> tuple:
    """(model, tokenizer) read from the verified GGUF: dequantized in float32, then cast to `dtype` (as a load in
    that dtype casts the float32 values, and `cast_folder` does)."""
    status(f"Assembling and verifying the embedded {model.role} ({model.name})…")
    gguf = assemble(model, progress=progress)
    status(f"Converting {model.name} from GGUF once into {into} (about a minute)…")
    m, tok = from_pretrained(str(gguf), torch.float32, trust_remote_code=False, progress=progress)
    m.hf_quantizer = None  # the weights are plain float32 now; GGUF was only the container
    m.config.__dict__.pop("quantization_config", None)
    return m.to(dtype), tok


def _write_whole(staging: Path, dest: Path, model: EmbeddedModel, write: Callable[[Path], object]) -> None:
    """`write` fills `staging`, which is then recorded file by file and renamed into place as `dest`, whole."""
    write(staging)
    write_manifest(staging, model.sha256)
    replace_folder(staging, dest)


CODES = "the 4-bit codes its draft step runs on"


def store_dir(model: EmbeddedModel, dtype: torch.dtype) -> Path:
    """The lean draft's store of codes made from `model`'s weights in `dtype` (`models.draft.store`)."""
    return converted_dir(model).with_name(f"{model.folder}-int4-{str(dtype).removeprefix('torch.')}")


def prepare_store(model: EmbeddedModel, dtype: torch.dtype, status: Status = log.info, progress: bool = True
                  ) -> Path | None:
    """The draft `model`'s store of codes in the cache, made once: from its dense copy in `dtype` where the cache
    holds one, else converted from the GGUF in memory (no dense copy written). None where its linears do not all
    code as int4 (`store.storable`): it then runs from a dense copy."""
    from specviz.models.draft import store
    from specviz.models.draft.lean import supported

    dest = store_dir(model, dtype)
    if complete(dest, model.sha256):
        return dest
    with _staging(dest) as staging, FileLock(dest.parent / f".{dest.name}.lock"):
        if complete(dest, model.sha256):
            return dest
        m, tok = from_pretrained(str(converted_dir(model, dtype)), dtype, trust_remote_code=False, progress=progress) \
            if is_converted(model, dtype) else _from_gguf(model, dtype, status, progress, CODES)
        try:
            if not (supported(m) and store.storable(m, store.GROUP)):
                return None
            _write_whole(staging, dest, model,
                         lambda folder: (store.write(m, folder, store.GROUP), tok.save_pretrained(folder)))
        finally:
            del m
            gc.collect()
    return dest


def stored_draft(model: EmbeddedModel, dtype: torch.dtype, status: Status = log.info, progress: bool = True):
    """(model, tokenizer) of the draft `model` from its store of codes (made first if need be), or None where it
    has none (`prepare_store`)."""
    from safetensors import SafetensorError
    from transformers import AutoTokenizer

    from specviz.models.draft import store

    folder = prepare_store(model, dtype, status, progress)
    if folder is None:
        return None
    status(f"Loading the embedded draft ({model.name}) as the 4-bit codes its step runs on…")
    try:
        return store.load(folder, dtype), AutoTokenizer.from_pretrained(folder)
    except (ValueError, OSError, SafetensorError) as e:
        raise EmbeddedModelError(f"the draft's store {folder} cannot be read ({e}): `specviz prepare --verify` "
                                 "makes it again.") from e
