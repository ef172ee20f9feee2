"""A compiled one-token step on a static KV cache: what a GPU needs before a small draft is cheap.

Eager PyTorch launches every small kernel of a forward from Python, hundreds per step. On a GPU a big
target's step is still bound by reading its weights, but a small draft's step is then bound by those
launches, and can cost most of a target step (c near 1, where speculation loses). `torch.compile` fuses
the step, and on CUDA replays it as one CUDA graph of our own (`CudaGraphs`); a graph needs every tensor
at a fixed address and a fixed shape, so the KV cache is preallocated (a static cache, in a few sizes: `SIZES`,
the size chosen up front for a run's prompt, new tokens and a round past them) and the compiled forwards are of
fixed widths: the one-token step (the draft's step, the target alone's, a draft's catch-up as a few steps) and,
where it pays, the target's verify padded to `VERIFY_WIDTHS`. The prompt runs eagerly on the same cache. Every
size, width and buffer set a race uses is compiled at load (`warm_sizes`), so none compiles inside a timed run
(`CompileCounts` tells if one did).

The engine uses a static cache as it uses a dynamic one (`engine.plumbing.new_cache` asks the model for
one; `get_seq_length`, `crop(-n)`): its length is kept on the host, so reading it costs no device sync, and
cropping only moves the write position back (entries past it are masked, then overwritten). A verify runs with
its mask and positions given (`static_cache.chain_mask`, or a tree's moved onto the static slots), so a chain's
and a tree's verify of one width are one graph; a tree's accepted path is moved down in place (`keep_slots`).

Whether compiling pays is measured, not assumed (`step_timing.measure_step`; `models.steps` chooses per model
and keeps the answer per machine): a compiled step computes the same logits up to rounding, and exactness holds against
the model as it runs, in both lanes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from specviz.models.copies import shared_copy
from specviz.models.fused import fuse_projections
from specviz.compat import cache_keyword
from specviz.models.static_cache import MAX_LEN, SIZES, StaticKV, StaticPool, chain_mask, static_mask  # noqa: F401

log = logging.getLogger(__name__)

class CudaGraphs:
    """The compiled forward recorded as CUDA graphs of our own, one per buffer set, width and rows kept: a replay is
    one launch, with no Python in between. torch's own (`mode="reduce-overhead"`) checks its guards and every graph
    input (a model's weights among them) at each replay: measured on an H100, 2.2 ms a step for the 0.5B shape
    whose weights read in 0.34 ms, and 8.2 ms for the 7B shape (bound 4.9 ms). A graph advances its cache's write
    position itself (`cumulative_length`, a device tensor), exactly as the compiled forward does."""

    def __init__(self, step, cache_arg: str):
        self.step, self.cache_arg = step, cache_arg
        self.pool = torch.cuda.graph_pool_handle()  # the graphs share one memory pool: they never run at once
        self.recorded: dict[tuple, tuple] = {}

    def __call__(self, ids: torch.Tensor, cache: StaticKV, keep: int, **inputs: torch.Tensor):
        key = (id(cache.hf), ids.shape[1], keep, *sorted(inputs))  # the pool's buffer sets live as long as the model
        if key not in self.recorded:
            self.recorded[key] = self.record(ids, cache, keep, inputs)
        graph, static, logits = self.recorded[key]
        for name, value in {"input_ids": ids, **inputs}.items():
            static[name].copy_(value)
        graph.replay()
        # copied out before the next replay overwrites them
        return CausalLMOutputWithPast(logits=logits.clone())  # (the logits alone: the cache is the caller's)

    def record(self, ids: torch.Tensor, cache: StaticKV, keep: int, inputs: dict) -> tuple:
        from torch._dynamo.utils import counters

        static = {name: value.clone() for name, value in {"input_ids": ids, **inputs}.items()}  # copied into
        marks = [layer.cumulative_length.clone() for layer in cache.hf.layers]

        def call():
            return self.step(**static, **{self.cache_arg: cache.hf}, use_cache=True, logits_to_keep=keep)

        def rewind():  # a warm-up's entries past the write position are masked, then overwritten
            for layer, mark in zip(cache.hf.layers, marks):
                layer.cumulative_length.copy_(mark)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiled at the first call, lazy state set up at the second: not in the graph
            for _ in range(2):
                call()
                rewind()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = call().logits
        counters["specviz"]["cuda_graphs"] += 1  # torch's counters: `CompileCounts` reads them with its own
        return graph, static, logits


# A verify over n tokens runs compiled padded to the first of these widths >= n (K + 1 for the default K = 8, and
# twice that): one graph per width and cache size, whatever K a round drafted.
VERIFY_WIDTHS = (9, 17)
CATCH_UP = 4  # a forward over at most this many tokens keeping one row (a draft catching up): that many steps


def with_compiled_step(model: nn.Module, sizes: tuple[int, ...] = SIZES, wide: nn.Module | None = None,
                       widths: tuple[int, ...] = ()) -> nn.Module:
    """A copy of a Hugging Face causal LM (its weights shared) whose one-token forwards on its own static caches
    run compiled; `new_cache()` hands out those caches, of the `sizes` given (tokens; a run moves up as it grows).
    A forward over a few tokens keeping one row of logits (a draft catching up after a full round) runs as that
    many compiled steps; a verify over n tokens, with `widths` (`verify_widths`, settable), compiled padded to the
    first width >= n (the padding rows' logits dropped, their cache entries cut). Any other call runs `wide`
    (default: the model's own forward): given the same model on tuned kernels, the prompt runs where it is
    fastest, not on the kernels as loaded."""
    param = next(model.parameters())
    fast = shared_copy(model)
    if param.device.type == "cuda":  # a GPU's step is bound by its count of kernels (`fused`); a CPU's tuned
        fuse_projections(fast)       # kernels serve each projection as loaded
    # each model's shape and cache size is a graph of its own: past torch's default of 8 per function (the draft
    # and the target share one, their class's forward) it would run the rest eagerly, and say so only in a log
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    pool = static_pool(model, sizes)
    forward = CompiledForward(fast, fast.forward if wide is None else wide.forward)  # wide's takes the static cache
    fast.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's
    fast.cache_keyword = "cache"  # (it takes either name: the engine passes the current one)
    fast.verify_widths = tuple(sorted(widths))
    # (a run's tokens are a hint: one longer than the largest size is refused only if it really grows past it)
    fast.new_cache = lambda tokens=0: StaticKV(pool, pool.size_for(min(tokens, pool.sizes[-1])))
    fast.static_pool = pool
    fast.cuda_graphs = forward.graphs  # (scripts/gpu_profile.py launches the same compiled code without them)
    fast.compiled_step = True
    return fast.eval()


def static_pool(model: nn.Module, sizes: tuple[int, ...]) -> StaticPool:
    """The static caches' pool for `model`, its sizes capped at the model's context."""
    param = next(model.parameters())
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None) or max(sizes)
    return StaticPool(model.config, tuple(sorted({min(size, limit) for size in sizes})), param.dtype, param.device)


class CompiledForward:
    """A compiled copy's forward (`with_compiled_step`). On one of its static caches: the compiled one-token step
    (a few steps for a draft catching up), the compiled verify padded to a width, or else the eager forward on the
    same cache; on any other cache, the eager forward."""

    def __init__(self, fast: nn.Module, eager):
        self.fast, self.eager = fast, eager
        param = next(fast.parameters())
        self.dtype, self.device = param.dtype, param.device
        # transformers renamed the cache argument (past_key_values -> cache); inside the graph, use the model's name
        self.cache_arg = cache_keyword(eager)
        self.step = torch.compile(fast.forward, dynamic=False)
        self.graphs = CudaGraphs(self.step, self.cache_arg) if self.device.type == "cuda" else None

    def __call__(self, input_ids=None, cache=None, use_cache=True, logits_to_keep=0, past_key_values=None, **kw):
        cache = cache if cache is not None else past_key_values
        if not isinstance(cache, StaticKV):
            return self.eager(input_ids, **{self.cache_arg: cache}, use_cache=use_cache,
                              logits_to_keep=logits_to_keep, **kw)
        n = input_ids.shape[1]
        # a tree's verify: its mask over the dynamic layout [1, 1, n, length + n], each node's position
        tree = kw.keys() == {"attention_mask", "position_ids"} and kw["attention_mask"].dim() == 4
        mask, positions = (kw.pop("attention_mask"), kw.pop("position_ids")) if tree else (None, None)
        if not kw and not tree and (n == 1 or (logits_to_keep == 1 and n <= CATCH_UP)):
            return self.steps(input_ids, cache, logits_to_keep)
        width = next((w for w in self.fast.verify_widths if w >= n), None)
        if not kw and width is not None and cache.length + width <= cache.pool.sizes[-1]:
            return self.padded(input_ids, cache, width, logits_to_keep, (mask, positions))
        cache.reserve(n)
        if tree or not kw:  # a static cache's mask and positions, as the compiled verify's (`padded`)
            kw |= self.verify_inputs(cache, n, n, mask, positions)
        out = self.eager(input_ids, **{self.cache_arg: cache.hf}, use_cache=True, logits_to_keep=logits_to_keep, **kw)
        cache.length += n
        return out

    def steps(self, ids: torch.Tensor, cache: StaticKV, keep: int):
        """One compiled step per token; the last step's logits are the forward's one row."""
        cache.reserve(ids.shape[1])
        for i in range(ids.shape[1]):
            out = self.compiled(ids[:, i:i + 1], cache, keep)
        return out

    def padded(self, ids: torch.Tensor, cache: StaticKV, width: int, keep: int, tree: tuple):
        """A verify over n tokens compiled at `width` >= n: the last token repeated; the padding rows' logits
        dropped, their entries cut off the length (masked, then overwritten). `tree`: its mask and positions, or
        (None, None) for a chain."""
        n = ids.shape[1]
        cache.reserve(width)
        keep = min(keep or n, n)
        padded = torch.cat([ids, ids[:, -1:].expand(1, width - n)], dim=1)
        out = self.compiled(padded, cache, width, **self.verify_inputs(cache, n, width, *tree))
        out.logits = out.logits[:, n - keep:n]
        if width > n:
            cache.crop(n - width)
        return out

    def compiled(self, ids: torch.Tensor, cache: StaticKV, keep: int, **inputs: torch.Tensor):
        """The compiled forward over `ids` (1 x width) on `cache` (replayed as a CUDA graph on a GPU); `inputs`:
        a verify's mask and positions."""
        if self.graphs is not None:
            out = self.graphs(ids, cache, keep, **inputs)
        else:
            # a fresh tensor: a slice of the ids would carry their row's stride, and each new stride would compile
            # the step again
            fresh = ids.new_empty(ids.shape).copy_(ids)
            out = self.step(fresh, **{self.cache_arg: cache.hf}, use_cache=True, logits_to_keep=keep, **inputs)
        cache.length += ids.shape[1]
        return out

    def verify_inputs(self, cache: StaticKV, n: int, rows: int, mask, positions) -> dict:
        """A verify's mask and positions over `rows` slots after the cache's tokens: a chain's causal ones, or a
        tree's (given over the dynamic layout, `engine.tree`) moved onto the static cache; padding rows repeat
        the last position."""
        past = cache.length
        if mask is None:
            mask = chain_mask(past, rows, cache.size, self.dtype, self.device)
            return {"attention_mask": mask, "position_ids": torch.arange(past, past + rows, device=self.device)[None]}
        positions = torch.cat([positions, positions[:, -1:].expand(1, rows - n)], dim=1)
        return {"attention_mask": static_mask(mask, past, rows, cache.size), "position_ids": positions}


def is_compiled(model) -> bool:
    return getattr(model, "compiled_step", False)


@torch.inference_mode()
def warm_sizes(model: nn.Module, sets: int = 1) -> None:
    """A compiled model's step and verify widths on every static size and on `sets` buffer sets of each, compiled
    now rather than inside a timed run: a graph is specialised to its cache's buffers (size and addresses), and a
    race holds two of the target's at once (one per lane). The sets stay in the pool, so runs borrow these."""
    if not is_compiled(model):
        return
    device = next(model.parameters()).device
    for size in model.static_pool.sizes:
        caches = [StaticKV(model.static_pool, size) for _ in range(sets)]
        for cache in caches:
            # the step and each verify width, twice: compiled (and on a GPU recorded) at the first call, replayed
            # at the second
            for n in (1, *(w for w in model.verify_widths if w <= size)) * 2:
                model(torch.zeros((1, n), dtype=torch.long, device=device), cache=cache, use_cache=True,
                      logits_to_keep=n)
                cache.crop(-n)


@dataclass(frozen=True)
class CompileCounts:
    """torch's process-wide compile counters: graphs compiled or recorded as CUDA graphs (a first compile or a
    recompile: a new cache size, a new buffer set) and graphs that CUDA graphs skipped (each then launch-bound again)."""

    graphs: int = 0
    cudagraph_skips: int = 0

    @staticmethod
    def now() -> CompileCounts:
        from torch._dynamo.utils import counters

        return CompileCounts(counters["stats"]["unique_graphs"] + counters["specviz"]["cuda_graphs"],
                             counters["inductor"]["cudagraph_skips"])

    def since(self, before: CompileCounts) -> CompileCounts:
        return CompileCounts(self.graphs - before.graphs, self.cudagraph_skips - before.cudagraph_skips)

    def sentence(self) -> str | None:
        """Why a run that saw these is no measure of speed (None: nothing compiled, nothing skipped)."""
        parts = [f"torch compiled or recorded {self.graphs} graph(s) during it (a cache size or a buffer set met for the "
                 "first time)"] if self.graphs else []
        parts += [f"{self.cudagraph_skips} graph(s) ran without CUDA graphs"] if self.cudagraph_skips else []
        return "; ".join(parts) or None
