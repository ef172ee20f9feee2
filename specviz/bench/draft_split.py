"""Where the draft's one-token step goes: its products, its attention and the rest (norms, rotary embedding, the
cache, residuals, the calls between them: the glue).

The products are timed alone: every linear the step calls, one row each, one after another (so their weights come
from memory as in a step). Attention is timed alone where the step's is a function of its own (the lean draft's
`decode_attention`, once per layer over a cache of the step's context). The rest is the step minus both. A draft
whose step runs in one call (`kernels.w4a8.LeanStep`) does all of it in C++ (`"fused": True`): its attention is
not the function timed apart, so attention and glue are one remainder, and its products timed alone carry a
Python call each that the fused step does not make (the remainder reads 0 where they cost more than the step).
Medians of interleaved repetitions.
"""

from __future__ import annotations

import statistics
import time

import torch

from specviz.models.step_timing import forward_times


def linears_of(model) -> list:
    """The linear-like modules a step calls: the tuned ones (each wraps its module), else the modules themselves."""
    from specviz.models.draft.quantized import QuantLinear
    from specviz.models.kernels import TunedLinear

    tuned = [m for m in model.modules() if isinstance(m, TunedLinear)]
    return tuned or [m for m in model.modules() if isinstance(m, (torch.nn.Linear, QuantLinear))]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def draft_split(draft, context: int = 128, reps: int = 9) -> dict:
    """{"step_ms", "products_ms", "attention_ms" (None: not a function of its own, or fused), "rest_ms", "fused"}
    for `draft`'s one-token step after `context` tokens."""
    from specviz.models.draft.lean import LeanDraft, decode_attention

    linears = linears_of(draft)
    dtype = next(draft.parameters()).dtype
    rows = [torch.randn(1, 1, m.in_features, dtype=dtype) for m in linears]

    def products():
        for m, x in zip(linears, rows):
            m(x)

    attention, fused = None, isinstance(draft, LeanDraft) and draft.fused() is not None
    if isinstance(draft, LeanDraft) and not fused:
        layer = draft.layers[0]
        heads, kv_heads = layer.q_size // layer.head_dim, layer.kv_size // layer.head_dim
        q = torch.randn(1, heads, 1, layer.head_dim, dtype=dtype)
        k, v = (torch.randn(1, kv_heads, context, layer.head_dim, dtype=dtype) for _ in range(2))

        def attention():
            for _ in draft.layers:
                decode_attention(q, k, v, layer.scaling)
    vocab = draft.config.get_text_config().vocab_size
    ids = [(7 + 31 * i) % vocab for i in range(context)]
    step_s, products_s, attention_s = [], [], []
    for _ in range(3):  # interleaved: a slow spell of the machine falls on each part
        step_s.append(statistics.median(forward_times(draft, ids, reps=reps, warmup=2)))
        products_s.append(timed(products, reps))
        attention_s.append(timed(attention, reps) if attention else 0.0)
    step, prod = statistics.median(step_s), statistics.median(products_s)
    attn = statistics.median(attention_s) if attention else None
    return {"step_ms": round(1e3 * step, 3), "products_ms": round(1e3 * prod, 3),
            "attention_ms": None if attn is None else round(1e3 * attn, 3),
            "rest_ms": round(1e3 * max(0.0, step - prod - (attn or 0.0)), 3), "fused": fused}
