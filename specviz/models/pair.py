"""A loaded draft/target pair, where it comes from (`PairSpec`), and the device and dtype it runs in."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import traceback
from dataclasses import field
from typing import TYPE_CHECKING, Literal, get_args

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.compat import model_vocab

if TYPE_CHECKING:
    from specviz.models.step_timing import StepReference

EMBEDDED = "embedded"
TINY = "tiny"  # the in-process random pair (specviz.models.tiny): no files, for quick looks and tests
SMOLLM2 = "smollm2"  # the embedded draft of another family (SmolLM2-135M-Instruct), for any target
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
DraftQuantName = Literal["int4", "int8", "none"]
Kernels = Literal["tuned", "plain"]
TargetQuant = Literal["none", "int8", "int4"]
Step = Literal["auto", "eager", "compiled"]


@dataclass(frozen=True)
class PairSpec:
    """Where a pair comes from and how it runs. Like `DecodeConfig`, a settings spec: the CLI's model
    options and the app's model-pair controls are generated from these fields."""

    draft: str | None = Field(EMBEDDED, title="draft",
                              description="'embedded', 'smollm2' (another family, embedded), 'tiny', "
                                          "'synthetic:qwen2.5-7b' (random weights in a real model's shape: costs, "
                                          "not acceptance), a hub id, a model folder or a .gguf file")
    target: str = Field(EMBEDDED, title="target", description="same choices as the draft")
    device: str = Field("auto", title="device", description="auto (cuda if available), cpu, cuda, cuda:1 ...")
    dtype: Dtype = Field("auto", title="dtype",
                         description="auto = bfloat16 on GPUs; on a CPU the dtype whose verify (the speculative "
                                     "lane's cost) was measured fastest on this machine (once, cached)")
    device_map: str | None = Field(None, title="device map",
                                   description="e.g. 'auto': spread a large target over GPUs (accelerate)")
    trust_remote_code: bool = Field(False, title="trust remote code",
                                    description="run model code shipped with a hub model (off by default)")
    draft_quant: DraftQuantName = Field("int4", title="draft quantisation",
                                        description="on CPU, run the draft's one-token step with int4/int8 weights "
                                                    "(about 3x cheaper; exact all the same, since q is what that "
                                                    "draft sampled from); the target's weights are never changed")
    draft_vocab: int = Field(0, ge=0, le=1_000_000, multiple_of=16, title="draft vocabulary",
                             description="on CPU, the draft's head over only the N most frequent tokens of a corpus "
                                         "(FR-Spec; the ranking shipped for the embedded pair's tokenizer): q is a "
                                         "distribution over them, zero elsewhere, so decoding stays exact; a "
                                         "cheaper draft step, at the acceptance the bench measures; 0 = the whole "
                                         "vocabulary")
    target_quant: TargetQuant = Field("none", title="target precision",
                                      description="on CPU, run the target with int8/int4 weights in both lanes (the "
                                                  "economics of CPU engines such as llama.cpp: the target gets "
                                                  "cheaper, the draft's relative cost c rises); exactness holds "
                                                  "against this quantized target")
    kernels: Kernels = Field("tuned", title="kernels",
                             description="on CPU, time every linear shape for every row count the engine uses on "
                                         "each kernel (as loaded, oneDNN off, oneDNN-packed, specviz's few-row "
                                         "kernel; padded to more rows) and send each to the fastest, for both "
                                         "lanes, keeping one copy of each weight (once per machine, cached); "
                                         "plain = as loaded")
    invariant: bool = Field(True, title="invariant verify",
                            description="on CPU, compute the target's verify a row at a time in one fixed order "
                                        "(specviz's few-row linear and row attention): each verified row's logits "
                                        "and K/V bit-identical to a one-token step's, so greedy speculation gives "
                                        "the target alone's text in bfloat16 too; --no-invariant lets every kernel "
                                        "compete")
    step: Step = Field("auto", title="one-token step",
                       description="compiled = each model's one-token step compiled (torch.compile, CUDA graphs on "
                                   "a GPU) on a static KV cache; eager = as the kernels above run it; auto = "
                                   "whichever was measured faster for each model on this machine (once, cached)")

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
    trim_heap()


def trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc keeps it for reuse otherwise: after the embedded pair's load the
    process held 8.9 GB resident where its tensors took 4.7). Elsewhere (another libc, another OS): nothing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    # the same pair on its eager one-token steps, where a step runs compiled (`steps.with_steps`): what a compiled
    # step that does not hold in use falls back to (its weights are shared: it costs no memory)
    eager_steps: ModelPair | None = None
    # each model's one-token step timed warm after the load (`step_timing.reference_steps`; None until then): what a
    # race's lanes are checked against
    reference: StepReference | None = None
    # why the target's verify rows may round unlike its one-token steps (None: they cannot: `target.with_target`)
    not_invariant: str | None = "it was not loaded with invariant kernels"

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
        if self.eager_steps is not None:
            self.eager_steps.release()
        self.eager_steps = None
        release_memory()


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for, but no CUDA GPU is visible to torch.")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def measured_cpu_dtype() -> torch.dtype:
    from specviz.models.auto_dtype import fastest_cpu_dtype  # torch kernels timed: only when asked for

    return fastest_cpu_dtype()


def resolve_dtype(dtype: str, device: torch.device, cpu_auto=measured_cpu_dtype) -> torch.dtype:
    """auto: bf16 on GPUs; on a CPU whichever of float32 and bfloat16 verifies faster here (the speculative lane's
    cost), measured once per machine (`auto_dtype.race_dtype`). No flag in /proc/cpuinfo says it: a CPU with
    AVX512-BF16 had one-row bf16 products slower than two-row ones, one without bf16 units emulates them."""
    if dtype == "auto":
        return torch.bfloat16 if device.type != "cpu" else cpu_auto()
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(get_args(Dtype))}.")
    return DTYPES[dtype]
