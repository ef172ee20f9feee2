"""One model and its tokenizer read by transformers, with one sentence for whatever the library raises."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specviz.models.pair import OUT_OF_MEMORY, ModelLoadError, release_memory
from specviz.models.sources import locate


def load_failure(e: Exception, source: str, kw: dict) -> ModelLoadError:
    """One sentence for whatever the library raised while loading `source`."""
    if isinstance(e, OUT_OF_MEMORY):
        release_memory(e)
        return ModelLoadError(f"out of memory while loading {source}: pick a smaller model or a lower-precision dtype.")
    if (path := Path(source).expanduser()).is_file() and path.stat().st_size == 0:  # mmap's words otherwise
        return ModelLoadError(f"{source} is an empty file (0 bytes), not a model: give a .gguf file, a model folder "
                              "or a hub id.")
    if isinstance(e, ValueError) and "trust_remote_code" in str(e):
        return ModelLoadError(f"{source} ships its own model code; specviz runs it only if the server was started "
                              "with --trust-remote-code and this model as --draft/--target.")
    if isinstance(e, ValueError) and "does not recognize this architecture" in str(e):
        import transformers

        return ModelLoadError(f"{source} is a model type that transformers {transformers.__version__} does not "
                              "know; a newer transformers may (or, if the model ships its own code, see "
                              "--trust-remote-code).")
    if isinstance(e, ValueError):
        return ModelLoadError(f"could not load {source}: {e}")
    if isinstance(e, OSError):
        path = Path(source).expanduser()
        if path.exists():
            return ModelLoadError(f"could not read a model from {path}: {e}")
        if kw.get("local_files_only"):
            return ModelLoadError(f"the model hub is unreachable and {source!r} is not in the local hub cache. "
                                  "Offline, use 'embedded', a local folder or a .gguf file.")
        return ModelLoadError(f"the model hub has no model {source!r} that this machine may read (a typo, or a "
                              "gated model: accept its licence on the hub and log in with `hf auth login`).")
    # anything else a malformed model can raise (KeyError, RuntimeError, ...)
    return ModelLoadError(f"could not load {source}: {type(e).__name__}: {e}")


def from_pretrained(source: str, dtype: torch.dtype, trust_remote_code: bool, device_map=None,
                     progress: bool = True, **kw):
    """Load a model and its tokenizer, turning the library's many exceptions into one sentence."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, where = locate(source)
    kw = {**kw, **where}
    try:
        with progress_bars(progress):
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, **kw)
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, trust_remote_code=trust_remote_code, device_map=device_map, **kw
            )
    except (*OUT_OF_MEMORY, Exception) as e:
        raise load_failure(e, source, kw) from e
    return model, tokenizer


@contextmanager
def progress_bars(shown: bool) -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", one per model read; the hub's downloads) hidden for a
    load asked to show none (`progress=False`: `--no-progress`, a served load), with its own switch, and back on
    after: the switch is the whole process's. A load that shows progress leaves it as it is."""
    from transformers.utils import logging as hf_logging

    hide = not shown and hf_logging.is_progress_bar_enabled()
    if hide:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            hf_logging.enable_progress_bar()
