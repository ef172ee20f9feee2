"""The lean draft kept on disk in the form it runs: each linear's 4-bit codes with their group scales and lows.

The embedded draft's dense bf16 copy takes 1.27 GB; what its lean step reads is the codes `quantized.int4_codes`
makes from those weights. The store holds exactly those codes (two a byte, scales and lows in float32 as computed)
beside the tensors the step keeps as they are (embedding, norms, biases): 0.65 GB. A load builds the model on the
meta device and gives each linear its codes (`CodedLinear`), so the lean draft is the same bit for bit as one
quantized from the dense copy. Only runs that want the dense draft (`--draft-quant none` or int8, the bench's
lanes beside transformers) have its dense copy made, once, from the verified GGUF.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from specviz.models.draft.quantized import DraftQuant, int4_codes

WEIGHTS = "model.safetensors"
PARTS = ("codes", "scale", "low")
GROUP = DraftQuant().group_size  # the weights a scale and low cover in what `--draft-quant int4` runs


class CodedLinear(nn.Module):
    """A linear held as its int4 codes: `Int4Linear` packs them as they are (`int4_codes`); a dense forward (the
    load's cache check, a prompt read by a non-lean copy) computes with the weights they stand for."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = codes.shape[0], codes.shape[1] * 2
        self.register_buffer("codes", codes)  # [out, in / 2] uint8: even inputs in the low nibble
        self.register_buffer("scale", scale)  # [out, in / group, 1] float32
        self.register_buffer("low", low)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.weight = torch.empty(self.out_features, self.in_features, dtype=dtype, device="meta")  # shape, dtype

    @staticmethod
    def of(linear: nn.Linear, group_size: int) -> CodedLinear:
        q, scale, low = int4_codes(linear.weight, group_size)
        bias = None if linear.bias is None else linear.bias.detach()
        return CodedLinear((q[:, 0::2] | q[:, 1::2] << 4).to(torch.uint8), scale, low, bias, linear.weight.dtype)

    @staticmethod
    def cat(linears: list[CodedLinear]) -> CodedLinear:
        """One linear whose outputs are `linears`' outputs in turn (codes are per row: the same as coding the
        concatenated weights)."""
        first = linears[0]
        bias = None if all(lin.bias is None for lin in linears) else torch.cat(
            [lin.bias.detach() if lin.bias is not None else first.weight.new_zeros(lin.out_features, device="cpu")
             for lin in linears])
        return CodedLinear(*(torch.cat([getattr(lin, part) for lin in linears]) for part in PARTS), bias,
                           first.weight.dtype)

    def rows(self, ids: torch.Tensor) -> CodedLinear:
        """The linear of rows `ids` only (a cut head)."""
        bias = None if self.bias is None else self.bias.detach()[ids]
        return CodedLinear(*(getattr(self, part)[ids] for part in PARTS), bias, self.weight.dtype)

    def release(self) -> int:
        """Drop the codes (each a meta tensor of its shape; this linear must not run afterwards); their bytes."""
        parts = [getattr(self, part) for part in PARTS]
        for part, t in zip(PARTS, parts):
            setattr(self, part, torch.empty_like(t, device="meta"))
        return sum(t.numel() * t.element_size() for t in parts if t.device.type != "meta")

    def int4_codes(self, group_size: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes [out, in] int32, scale, low): what `int4_codes` gave for the dense weights."""
        if self.in_features != group_size * self.scale.shape[1]:
            raise ValueError(f"these codes have groups of {self.in_features // self.scale.shape[1]}, not {group_size}")
        q = torch.stack((self.codes & 15, self.codes >> 4), -1).reshape(self.out_features, self.in_features)
        return q.to(torch.int32), self.scale, self.low

    def dense(self) -> torch.Tensor:
        q, scale, low = self.int4_codes()
        groups = scale.shape[1]
        return (q.view(self.out_features, groups, -1) * scale + low).view_as(q).to(self.weight.dtype)

    def as_linear(self) -> nn.Linear:
        """A dense linear of the weights the codes stand for (what an int8 copy is made from)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = nn.Parameter(self.dense(), requires_grad=False)
        linear.bias = self.bias
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense(), self.bias)


def storable(model: nn.Module, group_size: int) -> bool:
    """Every linear of `model` codes as int4 (the lean draft's shape rule, `quantized.quantize_linear`)."""
    return all(m.in_features % group_size == 0 and m.out_features % 16 == 0 for m in model.modules()
               if isinstance(m, nn.Linear))


@torch.no_grad()
def write(model: nn.Module, folder: Path, group_size: int) -> None:
    """`model`'s store in `folder` (its config beside it; the caller adds the tokenizer and the manifest)."""
    from safetensors.torch import save_file

    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    tensors = {name: p.detach().contiguous() for name, p in model.state_dict().items()
               if name.rpartition(".")[0] not in linears}
    for name, linear in linears.items():
        coded = CodedLinear.of(linear, group_size)
        tensors |= {f"{name}.{part}": getattr(coded, part).contiguous() for part in PARTS}
        if coded.bias is not None:
            tensors[f"{name}.bias"] = coded.bias.detach().contiguous()
    save_file(tensors, str(folder / WEIGHTS), metadata={"group_size": str(group_size)})
    model.config.save_pretrained(folder)


@torch.no_grad()
def load(folder: Path, dtype: torch.dtype) -> nn.Module:
    """The model in `folder`'s store: built on the meta device, each stored linear a `CodedLinear`, every other
    tensor as stored."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    tensors = load_file(str(folder / WEIGHTS))
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"):  # (every weight is given below, in the dtype stored)
        model = AutoModelForCausalLM.from_config(config)
    coded = [k.removesuffix(".codes") for k in tensors if k.endswith(".codes")]
    for name in coded:
        parent, _, child = name.rpartition(".")
        parts = [tensors.pop(f"{name}.{part}") for part in PARTS]
        setattr(model.get_submodule(parent), child, CodedLinear(*parts, tensors.pop(f"{name}.bias", None), dtype))
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if unexpected or [k for k in missing if k.rpartition(".")[0] not in coded]:
        raise ValueError(f"{folder}: the store does not match its config ({(missing + unexpected)[:3]}…)")
    _computed_buffers(model)
    return model.eval()


def _computed_buffers(model: nn.Module) -> None:
    """The modules whose buffers the config computes (the rotary table's frequencies) made again off the meta
    device."""
    for name, module in list(model.named_modules()):
        if any(b.device.type == "meta" for b in module.buffers(recurse=False)):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, type(module)(config=module.config))
