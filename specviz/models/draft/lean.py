"""A lean one-token decode step for Llama/Qwen2-style drafts: the same maths in a third of the ops.

On a CPU the draft's decode step is memory-bound in its matmuls (int4 weights cut those) and
Python/dispatch-bound in everything else: Hugging Face's generic forward runs ~75 tensor ops per
layer (masks, rotary tables, dtype casts, cache bookkeeping). This module keeps the draft's own
weights (int4-packed, with q/k/v and gate/up fused into one matmul each) and runs the layer as a
dozen ops. It keeps no dense copy of the layers or the head: forwards over many tokens (reading the prompt)
run on the int4 weights too. That costs about 1 ms a prompt token more than the dense weights on 2 Zen 5 cores
(32 tokens: 124 vs 98 ms, 200: 585 vs 273 ms) and saves the dense copy (about 1 GB for the embedded 0.5B draft);
the draft's KV cache then comes from the weights that draft every token.

Exactness does not depend on any of this: the drafter samples from the q this module returns and
the rule uses that q. Its outputs match the Hugging Face model up to rounding (tested), so the
draft's acceptance is unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from specviz.kernels import amx, w4a8
from specviz.kernels.w4a8 import LeanStep
from specviz.models.draft.quantized import DraftQuant, quantize_linear, supports
from specviz.models.draft.store import CodedLinear
from specviz.models.draft.vocab import quantize_head

SUPPORTED = ("qwen2", "llama")


def supported(model: nn.Module) -> bool:
    """Plain RoPE decoder layers (q/k/v/o, RMSNorm, SiLU-gated MLP), no sliding window."""
    config = model.config
    rope = getattr(config, "rope_scaling", None) or {}
    return (config.model_type in SUPPORTED and not getattr(config, "use_sliding_window", False)
            and rope.get("rope_type", rope.get("type", "default")) == "default"
            and getattr(config, "hidden_act", "silu") == "silu")


def _fused(linears: list[nn.Linear], bits: int, group_size: int) -> nn.Module:
    """One linear whose output is the concatenation of `linears`' outputs, then quantized."""
    if all(isinstance(lin, CodedLinear) for lin in linears):  # (loaded from the store: codes, no dense weights)
        return quantize_linear(CodedLinear.cat(linears), bits, group_size, keep_dense=False)
    first = linears[0]
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = any(lin.bias is not None for lin in linears)
    # made on the meta device, then given the concatenated tensors: no random init to throw away
    fused = nn.Linear(first.in_features, weight.shape[0], bias=has_bias, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if has_bias:
        fused.bias = nn.Parameter(torch.cat([lin.bias.detach() if lin.bias is not None
                                             else weight.new_zeros(lin.out_features) for lin in linears]),
                                  requires_grad=False)
    return quantize_linear(fused, bits, group_size, keep_dense=False)


class LeanLayer(nn.Module):
    def __init__(self, layer: nn.Module, bits: int, group_size: int, eps: float):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], bits, group_size)
        self.o = quantize_linear(attn.o_proj, bits, group_size, keep_dense=False)
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj], bits, group_size)
        self.down = quantize_linear(mlp.down_proj, bits, group_size, keep_dense=False)
        self.norm1, self.norm2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.head_dim = attn.head_dim
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.scaling = attn.scaling
        self.ffn = mlp.gate_proj.out_features
        self.eps, self.index = eps, attn.layer_idx

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, mask) -> torch.Tensor:
        t = h.shape[1]
        x = F.rms_norm(h, (h.shape[-1],), self.norm1, self.eps)
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(1, t, -1, self.head_dim).transpose(1, 2)
        k = k.view(1, t, -1, self.head_dim).transpose(1, 2)
        v = v.view(1, t, -1, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = cache.update(k, v, self.index)
        a = decode_attention(q, k, v, self.scaling) if t == 1 and mask is None else \
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        h = h + self.o(a.transpose(1, 2).reshape(1, t, -1))
        x = F.rms_norm(h, (h.shape[-1],), self.norm2, self.eps)
        gate, up = self.gate_up(x).split([self.ffn, self.ffn], dim=-1)
        return h + self.down(F.silu(gate) * up)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One new token's attention over the cache as two small matmuls, each query head beside the key/value head it
    shares (grouped-query attention). torch's fused CPU kernel took 4-5x as long for one query row over a few hundred
    positions (bf16, the embedded draft's heads on a 2-core Zen 4: 381 vs 82 us at 512; the same maths)."""
    batch, heads, _, dim = q.shape
    shared = q.view(batch, k.shape[1], heads // k.shape[1], dim)
    weights = torch.softmax((shared @ k.transpose(-1, -2)).float() * scale, -1).to(q.dtype)
    return (weights @ v).view(batch, heads, 1, dim)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LeanCache:
    """The lean draft's KV cache: each layer's keys and values in buffers sized up front ([1, kv_heads, capacity,
    head_dim], doubled when a run outgrows them), so that its fused step writes a token's K/V in place; read and cut as
    transformers' caches are (`update`, `get_seq_length`, `crop`)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype):
        self.keys = [torch.zeros(1, kv_heads, capacity, head_dim, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.lengths = [0] * layers

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def get_seq_length(self, layer: int = 0) -> int:
        return self.lengths[layer]

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` tokens (negative: drop that many), as DynamicCache.crop."""
        keep = max_length if max_length >= 0 else self.lengths[0] + max_length
        self.lengths = [min(n, keep) for n in self.lengths]

    def room(self, tokens: int) -> None:
        """At least `tokens` slots (a copy into buffers twice as large, where needed)."""
        if tokens > self.capacity:
            size = max(tokens, 2 * self.capacity)
            grow = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], size - t.shape[2], t.shape[3])], 2)  # noqa: E731
            self.keys, self.values = [grow(k) for k in self.keys], [grow(v) for v in self.values]

    def update(self, k: torch.Tensor, v: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.lengths[index]
        end = start + k.shape[2]
        self.room(end)
        self.keys[index][:, :, start:end], self.values[index][:, :, start:end] = k, v
        self.lengths[index] = end
        return self.keys[index][:, :, :end], self.values[index][:, :, :end]


class LeanDraft(nn.Module):
    """Callable like a Hugging Face causal LM for what the drafter uses:
    `model(ids, cache=cache, use_cache=True, logits_to_keep=1).logits` (or `past_key_values=`, the name before
    transformers 5.24)."""

    cache_keyword = "cache"  # what the engine passes it (`compat.cache_keyword`)
    CAPACITY = 256  # a new cache's slots unless told more (`new_cache`)
    # the most new tokens the fused step takes (a step's one, a round's last draft and its bonus, a prompt): its
    # attention runs a row at a time, so a long prompt's rows go through the layers. Reading the shipped prompts (2-core
    # Xeon 6/207, bf16) it took 68 / 107 / 216 ms for 47 / 74 / 142 tokens, the layers 85 / 132 / 248 ms
    FUSED_ROWS = 256

    def __init__(self, model: nn.Module, spec: DraftQuant, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        self.config = model.config  # the original itself is not kept: its dense weights are freed with it
        inner = model.model
        eps = model.config.rms_norm_eps
        self.layers = nn.ModuleList(LeanLayer(layer, spec.bits, spec.group_size, eps) for layer in inner.layers)
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm, self.eps = inner.norm.weight, eps
        self.lm_head = quantize_head(model.get_output_embeddings(), spec, vocab_ids)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, tokens: int = 0) -> LeanCache:
        """The cache the engine gives this draft (`plumbing.new_cache`): room for `tokens` up front."""
        attn = self.layers[0]
        return LeanCache(len(self.layers), attn.kv_size // attn.head_dim, attn.head_dim, max(tokens, self.CAPACITY),
                         self.dtype)

    def fused(self) -> LeanStep | None:
        """The whole step over new tokens (a step's, a prompt's up to `FUSED_ROWS`) in one call
        (`kernels.w4a8.LeanStep`), where every layer's products run on the 4-bit x 8-bit kernel for one row (the plan
        the dispatcher chose: `models.kernels.TunedLinear`); made at its first use, on the draft as tuned. None
        elsewhere: the layers run one op at a time."""
        if "_fused" not in self.__dict__:
            self.__dict__["_fused"] = fused_step(self)
        return self.__dict__["_fused"]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def forward(self, input_ids: torch.Tensor, cache=None, use_cache: bool = True,
                logits_to_keep: int = 1, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, **kwargs) -> SimpleNamespace:
        """`attention_mask` and `position_ids`, when given, are a tree's (`specviz.engine.tree`): an additive 4D
        mask over the cache and the new tokens, and each token's position."""
        if kwargs:
            raise TypeError(f"the lean draft step takes no {', '.join(kwargs)}")
        cache = cache if cache is not None else past_key_values
        if cache is None:  # a forward without a cache of its own (the proof's draft-as-target)
            from transformers import DynamicCache
            cache = DynamicCache()
        t = input_ids.shape[1]
        if t <= self.FUSED_ROWS and attention_mask is None and position_ids is None and isinstance(cache, LeanCache) \
                and (step := self.fused()) is not None:
            return self.fused_forward(step, input_ids, cache, logits_to_keep, use_cache)
        past = cache.get_seq_length()
        positions = position_ids if position_ids is not None else \
            torch.arange(past, past + t, device=input_ids.device)[None]
        h = self.embed(input_ids)
        cos, sin = (c[:, None] for c in self.rotary(h, positions))  # [1, 1, t, head_dim]
        # one new token sees everything; a few see the past and, causally, each other
        mask = attention_mask if attention_mask is not None else (
            None if t == 1 else torch.arange(past + t, device=h.device)[None] <= positions[0, :, None])
        for layer in self.layers:
            h = layer(h, cos, sin, cache, mask)
        h = F.rms_norm(h[:, -logits_to_keep:] if logits_to_keep else h, (h.shape[-1],), self.norm, self.eps)
        return SimpleNamespace(logits=self.lm_head(h), cache=cache if use_cache else None)


    def fused_forward(self, step: LeanStep, input_ids: torch.Tensor, cache: LeanCache, logits_to_keep: int,
                      use_cache: bool) -> SimpleNamespace:
        position, t = cache.get_seq_length(), input_ids.shape[1]
        cache.room(position + t)
        h = self.embed(input_ids)[0].float().contiguous()
        positions = torch.arange(position, position + t)[None]
        cos, sin = (c[0].float().contiguous() for c in self.rotary(h[None], positions))
        step(h, cache.keys, cache.values, position, cos, sin, cache.capacity)
        cache.lengths = [position + t] * len(cache.lengths)
        h = F.rms_norm((h[-logits_to_keep:] if logits_to_keep else h).to(self.dtype)[None], (h.shape[-1],), self.norm,
                       self.eps)
        return SimpleNamespace(logits=self.lm_head(h), cache=cache if use_cache else None)


def fused_step(draft: LeanDraft) -> LeanStep | None:
    """`LeanDraft.fused`'s step, or None where a layer's products do not all run on the 4-bit x 8-bit kernel."""
    from specviz.models.plans import lookup

    lib = w4a8.library()
    # a tuned linear (`kernels.TunedLinear`, read by its plan: the dispatcher builds on this module) whose one row the
    # plan puts on the kernel
    codes = lambda m: m.inner.w4a8_packed if getattr(m, "plan", None) and \
        lookup(m.plan, 1).kernel == "w4a8" else None  # noqa: E731
    flat = lambda t: None if t is None else t.detach().float().contiguous()  # noqa: E731
    layers = []
    for layer in draft.layers:
        products = [codes(m) for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if lib is None or any(p is None for p in products) or layer.o.bias is not None \
                or layer.gate_up.bias is not None:
            return None
        qkv, o, gate_up, down = products
        layers.append((flat(layer.norm1), qkv, flat(layer.qkv.bias), o, flat(layer.norm2), gate_up, down))
    first = draft.layers[0]
    if any(n % w4a8.GROUP for n in (draft.embed.weight.shape[1], first.q_size, first.ffn)) or first.head_dim % 16:
        return None  # (the step's vectors: 16 floats; its activations: blocks of 32)
    shape = w4a8.LayerShape(draft.embed.weight.shape[1], first.q_size // first.head_dim,
                            first.kv_size // first.head_dim, first.head_dim, first.ffn, first.eps, first.scaling)
    return LeanStep(layers, shape, lib, amx.w4_rows())


def release_replaced(model: nn.Module) -> int:
    """Free the dense linears of the draft `model` a LeanDraft was made from (it keeps packed copies of them; the
    embedding and norms it shares stay): `model` must not run afterwards. Each becomes a meta tensor of its shape.
    Returns the bytes released."""
    embedding = model.get_input_embeddings().weight.untyped_storage().data_ptr()
    released = 0
    for linear in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        weight = linear.weight
        if weight.device.type == "meta" or weight.untyped_storage().data_ptr() == embedding:  # (a tied head)
            continue
        released += weight.numel() * weight.element_size()
        linear.weight = nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)
    for coded in [m for m in model.modules() if isinstance(m, CodedLinear)]:  # (loaded from the store)
        released += coded.release()
    return released


def lean_draft(model: nn.Module, spec: DraftQuant, vocab_ids: torch.Tensor | None = None) -> nn.Module | None:
    """A LeanDraft of `model` (its head over `vocab_ids` only, where given), or None where this module does not
    apply (architecture, device)."""
    if not supported(model) or not supports(next(model.parameters()).device, spec.bits):
        return None
    return LeanDraft(model, spec, vocab_ids).eval()
