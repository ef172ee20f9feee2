"""The static KV cache a compiled step runs on: preallocated buffers in a few sizes, borrowed from a pool (a graph
is specialised to its buffers' addresses), used by the engine as it uses a DynamicCache (`get_seq_length`, a host
int; `crop(-n)`), and the masks a verify over it needs (a static cache attends over its whole length)."""

from __future__ import annotations

import weakref

import torch

MAX_LEN = 4096  # tokens a static cache holds: the server's longest prompt and reply, with room for a round
# A static cache attends over its whole length at every step (the positions past the run's are masked), so a run
# starts in the smallest size and moves up only when it needs to: each size is one more compiled graph per model.
SIZES = (512, 2048, MAX_LEN)


class StaticKV:
    """One run's static KV cache, used like a DynamicCache: `get_seq_length()` (a host int: no sync) and
    `crop(-n)`. Its buffers come from, and go back to, the compiled model's pool (`StaticPool`)."""

    def __init__(self, pool: StaticPool, size: int | None = None):
        self.pool, self.length = pool, 0
        self.hf = pool.take(size or pool.sizes[0])
        self.release = weakref.finalize(self, pool.give_back, self.hf)  # a run's cache is dropped, never closed

    def get_seq_length(self, layer: int = 0) -> int:
        return self.length

    @property
    def size(self) -> int:
        return self.hf.layers[0].max_cache_len

    @torch.inference_mode()  # the buffers are inference tensors (made and used in the engine's inference mode)
    def crop(self, n: int) -> None:
        """transformers 5's convention: crop(-n) removes the last n tokens."""
        if n >= 0:
            raise ValueError("a static cache is cropped by a negative count: crop(-n) removes n tokens")
        n = min(-n, self.length)
        # the write positions move back (stale entries are masked, then overwritten), all layers' in one launch: on
        # a GPU, one small kernel per layer cost 28 launches a crop for a 7B shape, two or three crops a round
        torch._foreach_sub_(positions(self.hf), n)
        self.length -= n

    @torch.inference_mode()
    def keep_slots(self, start: int, path: list[int]) -> None:
        """A tree's accepted path kept (`engine.tree.keep_path`): the first `start` tokens, then the entries at
        `start + i` for the nodes i of `path`, moved down in place (the buffers keep their addresses)."""
        index = torch.tensor([start + i for i in path], dtype=torch.long, device=self.pool.device)
        for layer in self.hf.layers:
            layer.keys[:, :, start:start + len(path)] = layer.keys.index_select(2, index)
            layer.values[:, :, start:start + len(path)] = layer.values.index_select(2, index)
            layer.cumulative_length.fill_(start + len(path))
        self.length = start + len(path)

    @torch.inference_mode()
    def reserve(self, n: int) -> None:
        """Room for n more tokens: the tokens held move to the next size's buffers where these are too short."""
        if self.length + n <= self.size:
            return
        bigger = self.pool.take(self.pool.size_for(self.length + n))
        copy_tokens(self.hf, bigger, self.length)
        self.release()  # these buffers back to the pool now
        self.hf, self.release = bigger, weakref.finalize(self, self.pool.give_back, bigger)

    @torch.inference_mode()
    def __deepcopy__(self, memo) -> StaticKV:
        """A copy holding the same tokens in buffers of its own (a prompt read once, handed out per run)."""
        twin = StaticKV(self.pool, self.size)
        copy_tokens(self.hf, twin.hf, self.length)
        twin.length = self.length
        return twin


def positions(cache) -> list[torch.Tensor]:
    """Each layer's write position (a device tensor: a graph advances it itself)."""
    return [layer.cumulative_length for layer in cache.layers]


def copy_tokens(source, target, length: int) -> None:
    """The first `length` tokens' keys and values, and the write position, from one static cache to another."""
    for mine, theirs in zip(source.layers, target.layers):
        theirs.keys[:, :, :length].copy_(mine.keys[:, :, :length])
        theirs.values[:, :, :length].copy_(mine.values[:, :, :length])
        theirs.cumulative_length.copy_(mine.cumulative_length)


class StaticPool:
    """The static caches of one compiled model, by size, reused: a compiled graph is specialised to its buffers'
    addresses (CUDA graphs copy any other tensor in at every replay), so runs borrow buffers instead of
    allocating new ones, and only a few sets ever exist."""

    def __init__(self, config, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.config, self.sizes, self.dtype, self.device = config, sizes, dtype, device
        self.free: dict[int, list] = {size: [] for size in sizes}

    def size_for(self, tokens: int) -> int:
        fits = [size for size in self.sizes if size >= tokens]
        if not fits:
            raise ValueError(f"this run needs more than the {self.sizes[-1]} tokens the compiled step's static cache "
                             "holds: use a shorter prompt or fewer new tokens, or --step eager.")
        return fits[0]

    @torch.inference_mode()  # the buffers are inference tensors: a run may start outside inference mode
    def take(self, size: int):
        from transformers import StaticCache

        if self.free[size]:
            cache = self.free[size].pop()
        else:
            text = self.config.get_text_config()
            cache = StaticCache(config=text, max_cache_len=size)
            head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            cache.early_initialization(1, text.num_key_value_heads, head_dim, self.dtype, self.device)
        torch._foreach_zero_(positions(cache))
        return cache

    def give_back(self, cache) -> None:
        self.free[cache.layers[0].max_cache_len].append(cache)


def chain_mask(past: int, rows: int, size: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The causal mask of a forward over `rows` tokens after `past` on a static cache of `size` slots:
    [1, 1, rows, size], row r seeing slots 0 .. past + r (the slots past them masked: stale, then overwritten)."""
    slots = torch.arange(size, device=device)
    seen = slots[None] <= past + torch.arange(rows, device=device)[:, None]
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)[None, None]


def static_mask(mask: torch.Tensor, past: int, rows: int, size: int) -> torch.Tensor:
    """A mask over the dynamic layout (a tree's, `engine.tree.tree_mask`: [1, 1, n, past + n]) as a static cache
    needs it, padded to `rows`: [1, 1, rows, size]. A padding row sees the committed tokens and itself, never
    nothing: an all-masked row computes NaN, and its NaN keys would reach later rows through masked slots
    (0 weight times NaN is NaN)."""
    n = mask.shape[2]
    out = torch.full((1, 1, rows, size), torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
    out[..., :n, :past + n] = mask
    pad = torch.arange(n, rows, device=mask.device)
    out[0, 0, n:, :past] = 0
    out[0, 0, pad, past + pad] = 0
    return out
