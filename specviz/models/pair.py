"""A loaded draft/target pair, where it comes from (`PairSpec`), and the device and dtype it runs in."""

from __future__ import annotations

import dataclasses
import gc
import traceback
from dataclasses import field
from typing import Literal, get_args

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass

EMBEDDED = "embedded"
TINY = "tiny"  # the in-process random pair (specviz.models.tiny): no files, for quick looks and tests
SMOLLM2 = "smollm2"  # the embedded draft of another family (SmolLM2-135M-Instruct), for any target
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
DraftQuantName = Literal["int4", "int8", "none"]
TargetKernel = Literal["packed", "plain"]


@dataclass(frozen=True)
class PairSpec:
    """Where a pair comes from and how it runs. Like `DecodeConfig`, a settings spec: the CLI's model
    options and the app's model-pair controls are generated from these fields."""

    draft: str | None = Field(EMBEDDED, title="draft",
                              description="'embedded', 'smollm2' (another family, embedded), 'tiny', a hub id, "
                                          "a model folder or a .gguf file")
    target: str = Field(EMBEDDED, title="target", description="same choices as the draft")
    device: str = Field("auto", title="device", description="auto (cuda if available), cpu, cuda, cuda:1 ...")
    dtype: Dtype = Field("auto", title="dtype",
                         description="auto = bfloat16 on GPUs and on CPUs with bf16 matrix units (AMX, "
                                     "AVX512-BF16), else float32 (measured faster there); float32 is where "
                                     "exactness is proven")
    device_map: str | None = Field(None, title="device map",
                                   description="e.g. 'auto': spread a large target over GPUs (accelerate)")
    trust_remote_code: bool = Field(False, title="trust remote code",
                                    description="run model code shipped with a hub model (off by default)")
    draft_quant: DraftQuantName = Field("int4", title="draft quantisation",
                                        description="on CPU, run the draft's one-token step with int4/int8 weights "
                                                    "(about 3x cheaper; exact all the same, since q is what that "
                                                    "draft sampled from); the target's weights are never changed")
    target_kernel: TargetKernel = Field("packed", title="target kernel",
                                        description="on CPU in float32, the target multiplies verifies of 4+ tokens "
                                                    "on oneDNN-packed copies of its weights (9 tokens cost ~1.5x one "
                                                    "instead of ~3x; twice the target's memory); plain = as loaded")

    @property
    def label(self) -> str:
        return f"{self.draft or 'no draft'} → {self.target}"


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


@dataclasses.dataclass
class ModelPair:
    """A draft and a target on one device, in one dtype, sharing one tokenizer or mapped by `vocab_map`."""

    draft: torch.nn.Module | None
    target: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    draft_name: str = "draft"
    target_name: str = "target"
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    vocab_map: object | None = None  # a `families.VocabMap` when the draft has a tokenizer of its own

    @property
    def vocab_size(self) -> int:
        """Draft and target of one family may pad their embedding tables differently: we work in the larger.
        A draft of another family has its tokens mapped into the target's vocabulary: we work in that."""
        models = (self.target,) if self.vocab_map is not None else (self.target, self.draft)
        return max(model_vocab(m) for m in models if m is not None)

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


def cpu_has_bf16_matmul(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AMX or AVX512-BF16); Linux only, False elsewhere."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device, native_bf16=cpu_has_bf16_matmul) -> torch.dtype:
    """auto: bf16 on GPUs and on CPUs with bf16 matrix units, float32 on other CPUs. Measured on two 2-core
    VMs (embedded pair, K = 4): with AMX, bf16 steps were faster (194 vs 214 ms) and the verify flat up to
    9 tokens; without (AVX-512 only), bf16 is emulated: a 9-token verify cost 2.9 target steps vs 1.9 in
    float32, a prompt of 50 tokens 2.4 s vs 1.1 s, and speculative decoding gained 1.13x vs 1.53x.
    float32 is also the dtype in which exactness against plain decoding is proven."""
    if dtype == "auto":
        return torch.bfloat16 if device.type != "cpu" or native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(get_args(Dtype))}.")
    return DTYPES[dtype]


def model_vocab(model) -> int:
    return model.config.get_text_config().vocab_size
