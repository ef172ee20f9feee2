"""A minimal causal language model for the statistical proofs, which need ~75,000 forwards.

One attention layer and an MLP with learned positions, called the way the engine calls any model
(`model(ids, past_key_values=cache, use_cache=True, logits_to_keep=n).logits`) and keeping its keys and
values in transformers' `DynamicCache`, so the round loop's cache cropping is exercised: a stale or
missing entry changes what the model predicts. What it lacks is an HF model's per-call machinery (mask
builders, config lookups, output classes): a forward costs ~0.15 ms where a one-layer HF Qwen2 costs
~1.1 ms. HF models run through the same loop in the rest of the suite and on the real pair.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig


class CausalLM(nn.Module):
    def __init__(self, vocab_size: int, hidden: int = 32, heads: int = 4, positions: int = 64, seed: int = 0,
                 scale: float = 1.0):
        super().__init__()
        self.config = PretrainedConfig(vocab_size=vocab_size)
        self.heads = heads
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab_size, hidden)
        self.position = nn.Embedding(positions, hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.head = nn.Linear(hidden, vocab_size)
        with torch.no_grad():  # `scale` sets how peaked the next-token distributions are
            self.head.weight.mul_(scale)
        self.eval()

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = False,
                logits_to_keep: int = 0, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> SimpleNamespace:
        """`attention_mask` (additive, 4D) and `position_ids`: a token tree's, as the tree drafter and verify pass."""
        batch, n = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        positions = torch.arange(past, past + n, device=input_ids.device) if position_ids is None else position_ids
        x = self.embed(input_ids) + self.position(positions)
        q, k, v = self.qkv(F.layer_norm(x, x.shape[-1:])).view(batch, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, 0)
        causal = torch.ones(n, past + n, dtype=torch.bool, device=x.device).tril(past)  # new token i sees <= past+i
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=causal if attention_mask is None else attention_mask)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, n, -1))
        x = x + self.mlp(F.layer_norm(x, x.shape[-1:]))
        return SimpleNamespace(logits=self.head(x[:, -logits_to_keep:]))  # 0 keeps all, as in transformers

