"""The target's verify row-invariant on a GPU: kernels in Triton whose every row sums in one order at any row count.

On CUDA the loaded model runs on cuBLAS and SDPA, which choose their blocking (split-K, the number of key blocks)
from the shape, so a verify of K + 1 rows adds a row's terms in another order than a one-token step does, and a
bf16 near-tie flips a greedy token. These three kernels fix the order by construction (the method of
thinking-machines' batch_invariant_ops: one configuration for every row count, no split-K, a row reduced alone):

- `linear`: out = x W^T (+ bias). Each program owns a tile of `BLOCK_M` rows x `block_n` outputs and walks the
  inputs in steps of `BLOCK_K` from the first to the last, adding each step's `tl.dot` to one float32 tile; a row is
  alone in its tile row, padded with zero rows, so its sums run in the same order whether it came with 0 or 16
  others (the tiles depend on the weight's shape and the GPU, never on the row count);
- `rms_norm`: one program a row: its squares summed by one `tl.sum` over a block of the row's width;
- `attend`: one program a (head, query row): its keys in blocks of `KEYS` slots from slot 0, each block's scores
  and weighted values reduced by `tl.sum`, blocks folded in by the online softmax in slot order. A row whose seen
  keys are slots 0 .. p (a chain's verify, a one-token step) sums alike at every row count: it stops at the block
  holding slot p (however far the cache goes on), the blocks hold the same keys, and a block's slots past p are
  masked, adding exact zeros. A tree's node whose ancestors leave gaps in the slots is not promised so.

Sums are float32 (bf16 widened exactly; inside a tensor core's `mma` its own fixed way, the same for every row),
bf16 rounded once at the end. On CPU tensors the same kernels run in Triton's interpreter (numpy), which is how
their logic (tiles, loops, masks, order) is tested where no GPU is lent; there the linear's tile product is an
explicit sum, since the interpreter's `tl.dot` is numpy's matmul, so the tensor-core path is compiled for the
GPU's architecture (scripts/triton_compile.py) but runs only on a GPU.
"""

from __future__ import annotations

import functools

import torch

from specviz.kernels.rows import allowed_keys, attention_of, register_as  # (a mask read as on a CPU)

try:
    import triton
    import triton.language as tl
except ImportError:  # (the kernels are then unavailable, said by `missing`; annotations stay strings)
    triton = tl = None
jit = triton.jit if triton is not None else (lambda fn: fn)
# the interpreter (numpy, CPU tensors) or compiled kernels: fixed when Triton is imported (TRITON_INTERPRET), read once
# here so a compiled step's trace reads a constant
INTERPRETED = triton is not None and bool(triton.knobs.runtime.interpret)

# one configuration for every row count (the property): the tile's rows and inputs fixed, its outputs chosen per
# weight shape and GPU (`block_n`), never per row count
BLOCK_M = 16
BLOCK_K = {torch.bfloat16: 64, torch.float16: 64, torch.float32: 32}  # inputs a step (float32's 64 spilled on sm_90)
BLOCK_NS = (64, 32, 16)  # outputs a tile, widest first
WAVES = 2  # tiles of one product per streaming multiprocessor, at least, where a narrower tile gives them
KEYS = 64  # key slots per attention block
MAX_ROWS = 256  # the widest verify taken, as the CPU's `rows.MAX_ROWS`
ROWS = "specviz_triton_rows"  # the attention implementation's name in transformers' registry
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def missing(device: torch.device) -> str | None:
    """Why these kernels cannot run on `device` in this process (None: they can): on a GPU Triton compiles them; on
    CPU tensors only its interpreter runs them, a switch read when Triton is imported (TRITON_INTERPRET=1: tests)."""
    if triton is None:
        return "Triton is not installed (pip install 'specviz[gpu]')"
    if device.type not in ("cuda", "cpu"):
        return f"Triton's kernels run on CUDA GPUs, not {device.type}"
    if device.type == "cpu" and not interpreting():
        return "on a CPU Triton's kernels run only in its interpreter (TRITON_INTERPRET=1), a test's tool"
    return None


def probes(device: torch.device, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each kernel's configurations a target launches (with and without bias or a mask, heads of 64 and 128) on small
    inputs, beside torch's own result: name -> (the kernel's, torch's)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    x, w, b, g = rand(3, 96), rand(40, 96), rand(40), rand(96)
    found = {"linear": (linear(x, w), x.float() @ w.float().T),
             "linear with bias": (linear(x, w, b), x.float() @ w.float().T + b.float()),
             "rms_norm": (rms_norm(x, g, 1e-6), g.float() * x.float() * torch.rsqrt(
                 x.float().pow(2).mean(-1, keepdim=True) + 1e-6))}
    mask = torch.ones(3, 9, dtype=torch.bool, device=device).tril(6)
    for d in (64, 128):
        q, k, v = rand(1, 2, 3, d), rand(1, 2, 9, d), rand(1, 2, 9, d)
        expect = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.125,
                                                                  attn_mask=mask)
        found[f"attention ({d})"] = (attend(q, k, v, None, 0.125).transpose(1, 2), expect)
        found[f"attention ({d}, masked)"] = (attend(q, k, v, mask.to(torch.uint8), 0.125).transpose(1, 2), expect)
    return found


@functools.cache  # once per process, device and dtype
def failed(device: torch.device, dtype: torch.dtype) -> str | None:
    """The kernels run once (`probes`) against torch's own ops: why they cannot serve here (a compile that fails on
    this GPU or Triton, numbers off), or None."""
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    try:
        off = [name for name, (got, ref) in probes(device, dtype).items()
               if not torch.allclose(got.float(), ref, atol=tol, rtol=tol)]
    except Exception as e:  # (Triton's compile errors are of many types)
        return f"the Triton kernels failed to run here ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    return f"the Triton kernels' {', '.join(off)} disagreed with torch's here" if off else None


@jit
def _linear(x, w, b, out, M, N, K, sxm, swn, som, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
            EXPLICIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)  # (a 256k x 8k head's offsets pass 2**31)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):  # the inputs in order, one tile step at a time: no split-K
        kk = k0 + rk
        a = tl.load(x + rm[:, None] * sxm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        wt = tl.load(w + rn[None, :] * swn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        if EXPLICIT:  # (the interpreter's tl.dot is numpy's matmul: its sums depend on a row's place in the tile)
            acc += tl.sum(a.to(tl.float32)[:, :, None] * wt.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = tl.dot(a, wt, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out + rm[:, None] * som + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@jit
def _rms_norm(x, w, out, N, sx, so, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + row * sx + cols, mask=cols < N, other=0.0).to(tl.float32)
    h = v * (1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps))
    # transformers' RMSNorm: the weight times the normalised row rounded to the input's dtype
    g = tl.load(w + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = g * h.to(x.dtype.element_ty).to(tl.float32)
    tl.store(out + row * so + cols, y.to(out.dtype.element_ty), mask=cols < N)


@jit
def _attend(q, k, v, allowed, ends, out, group, n, slots, scale, sqh, sqn, skh, sks, soh, son,
            HAS_MASK: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    head, row = tl.program_id(0), tl.program_id(1)
    kv = head // group
    d = tl.arange(0, D)
    query = tl.load(q + head * sqh + row * sqn + d).to(tl.float32)
    last = slots - n + row  # a causal row's last key
    if HAS_MASK:  # past the last key the row sees: a static cache's buffer is longer than what it holds
        hi = tl.load(ends + row)
    else:
        hi = last + 1
    m = tl.full((), -1.0e30, tl.float32)  # finite: a first block with no key seen must not make exp(nan)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for s0 in range(0, hi, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        if HAS_MASK:
            seen = tl.load(allowed + row * slots + s, mask=s < slots, other=0) != 0
        else:
            seen = s <= last
        keys = tl.load(k + kv * skh + s[:, None] * sks + d[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
        vals = tl.load(v + kv * skh + s[:, None] * sks + d[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
        scores = tl.where(seen, tl.sum(keys * query[None, :], axis=1) * scale, float("-inf"))
        top = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - top)
        p = tl.exp(scores - top)
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vals, axis=0)
        m = top
    tl.store(out + row * son + head * soh + d, (acc / total).to(out.dtype.element_ty))


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The GPU's streaming multiprocessors (1 on a CPU: the interpreter has no such thing)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def block_n(outputs: int, device: torch.device) -> int:
    """A weight's outputs a tile: the widest that still gives every multiprocessor `WAVES` tiles (a one-token step
    streams the weight from all of them: without split-K, a narrow weight needs narrow tiles to fill the GPU), else
    the narrowest. A function of the weight's shape and the GPU only, so every row count gets the same tiles."""
    fill = WAVES * multiprocessors(device)
    return next((b for b in BLOCK_NS if -(-outputs // b) >= fill), BLOCK_NS[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, tile: int | None = None
           ) -> torch.Tensor:
    """x [..., in] times weight [out, in] (nn.Linear's layout, read where it lies) plus bias: [..., out]; `tile`:
    the weight's `block_n`, given by a module that knows it (a compiled step's trace then reads a constant)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    (m, k), n = rows.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tile = tile or block_n(n, x.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, tile))
    _linear[grid](
        rows, weight, bias if bias is not None else weight, out, m, n, k, rows.stride(0), weight.stride(0),
        out.stride(0), HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        EXPLICIT=INTERPRETED, BM=BLOCK_M, BN=tile, BK=BLOCK_K[x.dtype])
    return out.view(*x.shape[:-1], n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (Llama, Qwen2): each row alone."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(rows)
    _rms_norm[(rows.shape[0],)](
        rows, weight, out, rows.shape[1], rows.stride(0), out.stride(0), eps,
        BLOCK=triton.next_power_of_2(rows.shape[1]))
    return out.view(x.shape)


def interpreting() -> bool:
    """Is Triton running kernels in its interpreter (numpy, CPU tensors) in this process?"""
    return INTERPRETED


def takes(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """Does `attend` serve this call (one sequence, a power-of-two head size, rows within `MAX_ROWS`, no soft cap
    or sliding window, a cache holding keys before the rows)? A prompt read into an empty dynamic cache is not taken
    (a static cache's buffer is longer than its prompt: there a prompt is, alike in both lanes)."""
    n, slots, d = query.shape[2], key.shape[2], query.shape[-1]
    return (query.shape[0] == 1 and d & (d - 1) == 0 and query.dtype in DTYPES and query.dtype == key.dtype
            and slots > n and n <= MAX_ROWS and kwargs.get("softcap") is None
            and kwargs.get("sliding_window") is None)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """query [1, heads, n, d], key/value [1, kv_heads, slots, d], allowed [n, slots] bytes or None (causal)
    -> [1, n, heads, d], as `rows.attend`."""
    _, heads, n, d = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    q, k, v = (t[0].contiguous() for t in (query, key, value))
    out = torch.empty(1, n, heads, d, dtype=query.dtype, device=query.device)
    ends = None if allowed is None else (slots - allowed.flip(-1).to(torch.int32).argmax(-1)).to(torch.int32)
    _attend[(heads, n)](
        q, k, v, allowed if allowed is not None else q, ends if ends is not None else q, out, heads // kv_heads, n,
        slots, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(2), out.stride(1),
        HAS_MASK=allowed is not None, D=d, BLOCK=KEYS)
    return out


def register() -> None:
    """`ROWS` in transformers' registries: `attend` for a verify or a step, SDPA for a prompt read into an empty
    cache and whatever `takes` refuses (`rows.attention_of`, as on a CPU)."""
    register_as(ROWS, attention_of(takes, attend))
