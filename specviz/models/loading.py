"""Load a draft/target pair from the embedded weights, hub ids, local folders or GGUF files.

Every failure a user can cause ends in a `ModelLoadError` with one sentence saying what to do.
"""

from __future__ import annotations

import gc
import logging
import shutil
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch

from specviz.engine.plumbing import model_vocab
from specviz.models.embedded import (
    DRAFT,
    TARGET,
    EmbeddedModel,
    EmbeddedModelError,
    assemble,
    cache_dir,
)

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
TINY = "tiny"  # the in-process random pair (specviz.models.tiny): no files, for quick looks and tests
Status = Callable[[str], None]


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message tells the user what to do about it."""


OUT_OF_MEMORY = (torch.OutOfMemoryError, MemoryError)


def release_memory(error: BaseException | None = None) -> None:
    """Give memory back after a failure: an exception's traceback keeps every frame it passed through
    alive, with their tensors (weights half-loaded, KV caches, activations), for as long as anyone holds
    the exception, so clear those frames first, then collect and return the CUDA cache to the device."""
    if error is not None:
        for e in (error, error.__cause__, error.__context__):
            if e is not None and e.__traceback__ is not None:
                traceback.clear_frames(e.__traceback__)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class ModelPair:
    """A draft and a target that share one tokenizer, on one device, in one dtype."""

    draft: torch.nn.Module | None
    target: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    draft_name: str = "draft"
    target_name: str = "target"
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def vocab_size(self) -> int:
        """Draft and target may pad their embedding tables differently; we work in the larger."""
        return max(model_vocab(m) for m in (self.target, self.draft) if m is not None)

    def release(self) -> None:
        """Drop the weights now, so loading another pair does not hold two in memory."""
        self.draft = None
        self.target = None
        release_memory()


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for, but no CUDA GPU is visible to torch.")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """bf16 everywhere by default: on GPUs for the usual reasons, and on this CPU because it measured
    faster (target step 194 ms vs 214 ms, and a flat verify cost up to 9 tokens where fp32 steps up).
    float32 is the dtype in which exactness against plain decoding is proven."""
    if dtype == "auto":
        return torch.bfloat16
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the hub's host. Offline, the hub client retries each file for ~20 s before
    it gives up; asking once first turns that into a prompt answer (and a cache-only load)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def _hub_source(source: str) -> dict:
    """Check that a source that is no local file is at least a hub id; say whether the hub is reachable."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise ModelLoadError(
            f"{source!r} is neither an existing model folder or .gguf file nor a hub model id (owner/name)."
        ) from None
    return {"local_files_only": not hub_reachable()}


def _from_pretrained(source: str, dtype: torch.dtype, trust_remote_code: bool, device_map=None, **kw):
    """Load a model and its tokenizer, turning the library's many exceptions into one sentence."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist.")
        folder, kw = str(path.parent), {**kw, "gguf_file": path.name}
    elif path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is not a model folder (no config.json); give a folder saved with "
                "save_pretrained, a .gguf file, a hub id, or 'embedded'."
            )
        folder = str(path)
    else:
        folder, kw = source, {**kw, **_hub_source(source)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, **kw)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, trust_remote_code=trust_remote_code, device_map=device_map, **kw
        )
    except OUT_OF_MEMORY as e:
        release_memory(e)
        raise ModelLoadError(
            f"out of memory while loading {source}: pick a smaller model or a lower-precision dtype."
        ) from e
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(
                f"{source} ships its own model code; specviz runs it only if the server was started with "
                "--trust-remote-code and this model as --draft/--target."
            ) from e
        if "does not recognize this architecture" in str(e):
            import transformers

            raise ModelLoadError(
                f"{source} is a model type that transformers {transformers.__version__} does not know; a newer "
                "transformers may (or, if the model ships its own code, see --trust-remote-code)."
            ) from e
        raise ModelLoadError(f"could not load {source}: {e}") from e
    except OSError as e:
        if path.exists():
            raise ModelLoadError(f"could not read a model from {path}: {e}") from e
        if kw.get("local_files_only"):
            raise ModelLoadError(
                f"the model hub is unreachable and {source!r} is not in the local hub cache. "
                "Offline, use 'embedded', a local folder or a .gguf file."
            ) from e
        raise ModelLoadError(
            f"the model hub has no model {source!r} that this machine may read (a typo, or a gated model: "
            "accept its licence on the hub and log in with `hf auth login`)."
        ) from e
    except Exception as e:  # anything else a malformed model can raise (KeyError, RuntimeError, ...)
        raise ModelLoadError(f"could not load {source}: {type(e).__name__}: {e}") from e
    return model, tokenizer


def prepare_embedded(model: EmbeddedModel, status: Status = log.info, progress: bool = True) -> Path:
    """Assemble + verify the GGUF, then cache a float32 safetensors copy so later starts take seconds.

    float32 keeps the dequantized GGUF values exactly; any requested dtype is cast from it.
    Returns the folder of the converted copy.
    """
    converted = cache_dir() / "converted" / model.role
    stamp = converted / "SOURCE_SHA256"
    if stamp.is_file() and stamp.read_text() == model.sha256:
        return converted
    status(f"Assembling and verifying the embedded {model.role} ({model.name})…")
    gguf = assemble(model, progress=progress)
    status(f"Converting {model.name} from GGUF once (about a minute)…")
    m, tok = _from_pretrained(str(gguf), torch.float32, trust_remote_code=False)
    m.hf_quantizer = None  # the weights are plain float32 now; GGUF was only the container
    m.config.__dict__.pop("quantization_config", None)
    shutil.rmtree(converted, ignore_errors=True)
    m.save_pretrained(converted)
    tok.save_pretrained(converted)
    stamp.write_text(model.sha256)
    del m
    gc.collect()
    return converted


def load_model(source: str, role: str, dtype: torch.dtype, *, trust_remote_code=False, device_map=None,
               status: Status = log.info, progress: bool = True):
    if source == EMBEDDED:
        try:
            folder = prepare_embedded(DRAFT if role == "draft" else TARGET, status, progress)
        except EmbeddedModelError as e:
            raise ModelLoadError(str(e)) from e
        status(f"Loading the embedded {role}…")
        return _from_pretrained(str(folder), dtype, trust_remote_code=False)
    status(f"Loading {role} {source}…")
    return _from_pretrained(source, dtype, trust_remote_code, device_map=device_map)


def check_tokenizers(draft_tok, target_tok, draft_name: str, target_name: str) -> None:
    """Speculative decoding compares token ids, so both models must mean the same thing by each id."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if len(dv) != len(tv):
        raise ModelLoadError(
            f"draft {draft_name} and target {target_name} use different tokenizers "
            f"({len(dv)} vs {len(tv)} tokens); pick a draft from the target's model family."
        )
    differing = [t for t in list(dv)[:: max(1, len(dv) // 2000)] if tv.get(t) != dv[t]]
    if differing:
        raise ModelLoadError(
            f"draft {draft_name} and target {target_name} map tokens to different ids "
            f"(e.g. {differing[0]!r}); pick a draft from the target's model family."
        )


def eos_ids(model, tokenizer) -> frozenset[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def load_pair(draft: str | None = EMBEDDED, target: str = EMBEDDED, *, device: str = "auto",
              dtype: str = "auto", trust_remote_code: bool = False, device_map: str | None = None,
              status: Status = log.info, progress: bool = True) -> ModelPair:
    """Load both models. `draft=None` gives a target-only pair (for model-free drafters).

    `device_map="auto"` lets accelerate spread a target too big for one GPU over several.
    """
    if TINY in (draft, target):
        if (draft, target) != (TINY, TINY):
            raise ModelLoadError("'tiny' is a pair of its own: pass it as both --draft and --target.")
        from specviz.models.tiny import tiny_pair

        return tiny_pair(device=device, dtype=DTYPES.get(dtype, torch.float32))
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    try:
        t_model, t_tok = load_model(target, "target", dt, trust_remote_code=trust_remote_code,
                                    device_map=device_map, status=status, progress=progress)
        d_model = None
        if draft is not None:
            d_model, d_tok = load_model(draft, "draft", dt, trust_remote_code=trust_remote_code,
                                        status=status, progress=progress)
            check_tokenizers(d_tok, t_tok, draft, target)
            d_model.to(dev).eval()
        if device_map is None:
            t_model.to(dev)
        else:
            dev = next(t_model.parameters()).device  # inputs go where accelerate put the embeddings
    except OUT_OF_MEMORY as e:  # moving to the device: drop what was loaded before saying so
        t_model = d_model = None
        release_memory(e)
        raise ModelLoadError(f"out of memory while loading {_display(draft, 'draft')} → "
                             f"{_display(target, 'target')} on {dev}: pick a smaller pair or a lower-precision "
                             "dtype.") from e
    t_model.eval()
    status("Models ready.")
    return ModelPair(draft=d_model, target=t_model, tokenizer=t_tok, device=dev, dtype=dt,
                     draft_name=_display(draft, "draft"), target_name=_display(target, "target"),
                     eos_token_ids=eos_ids(t_model, t_tok))


def _display(source: str | None, role: str) -> str:
    if source is None:
        return "none"
    if source == EMBEDDED:
        return (DRAFT if role == "draft" else TARGET).name
    return source
