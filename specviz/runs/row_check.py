"""The proof as a lesson: a verify's rows against the target alone's one-token steps at the same positions.

Greedy speculation gives the target alone's text exactly when every row a verify scores equals what a one-token
step at that position computes: the rule then accepts a draft exactly where the target alone would have written
it. `row_check` reads a prompt, lets the target write `width` tokens one step at a time (its own greedy text), then
scores the same tokens again in one forward over the same prompt, and compares row by row: the logits and the K/V
each row wrote. 0.0 everywhere is bit for bit; anything else is a different order of the same sums, and where the
step's two likeliest tokens were nearly tied (its top-2 logit gap), it can flip the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.compat import forward


@dataclass(frozen=True)
class RowCheck:
    """One verify of `len(tokens)` rows after a prompt of `position` tokens, against the one-token steps."""

    position: int  # the first row's position: the prompt's length
    tokens: list[int]  # the target alone's greedy tokens, scored both ways
    logits: list[float]  # per row: the largest |verify - step| over the vocabulary (0.0: bit-identical)
    kv: list[float]  # per row: the largest |difference| of the K and V it wrote, over every layer
    gaps: list[float]  # per row: the step's top-2 logit gap (a near-tie is where a difference can flip the text)
    flipped: list[bool]  # per row: the verify's argmax is not the step's

    @property
    def identical(self) -> bool:
        return not any(self.logits) and not any(self.kv)


def written(cache, start: int) -> list[torch.Tensor]:
    """Each layer's keys and values from slot `start` on, as [rows, everything else] in float32."""
    out = []
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            part = t[0, :, start:].float()  # [kv_heads, rows, head_dim]
            out.append(part.transpose(0, 1).reshape(part.shape[1], -1))
    return out


def top2_gap(logits: torch.Tensor) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def row_check(model, prompt_ids: list[int], width: int) -> RowCheck:
    """`width` one-token steps after the prompt, then the same tokens in one forward: row by row (see the module)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    prompt = torch.tensor([prompt_ids], device=device)
    stepped, scored = DynamicCache(), DynamicCache()
    nxt = forward(model, prompt, stepped, 1).logits[0, -1].argmax().view(1, 1)
    tokens, rows = [], []
    for _ in range(width):
        tokens.append(int(nxt))
        logits = forward(model, nxt, stepped, 1).logits[0, -1]
        rows.append(logits)
        nxt = logits.argmax().view(1, 1)
    forward(model, prompt, scored, 1)
    verified = forward(model, torch.tensor([tokens], device=device), scored, width).logits[0]
    p = len(prompt_ids)
    kv = [max(float((a[i] - b[i]).abs().max()) for a, b in zip(written(stepped, p), written(scored, p)))
          for i in range(width)]
    return RowCheck(p, tokens, [float((verified[i].float() - rows[i].float()).abs().max()) for i in range(width)], kv,
                    [top2_gap(r) for r in rows], [bool(verified[i].argmax() != rows[i].argmax()) for i in range(width)])
