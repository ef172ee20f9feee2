"""A draft tree's plumbing: one forward reads a whole token tree, and the accepted path is kept in the cache.

A tree is a list of nodes, each a token with a parent (-1: a child of the root, the last committed token). One
forward reads the tokens not yet in the cache (the round's pending tokens: the last correction or bonus) and then
every node: each node attends to the cache, the pending tokens and its own ancestors, and sits at the position
its depth gives (EAGLE: a node's mask row is its parent's plus itself; position = past + depth). The logits row
of node i is then the model's next-token distribution after the path to i, exactly as if that path alone had been
read. Afterwards the cache holds every node; `keep_path` moves the accepted path's keys and values down into
contiguous slots (a crop alone cannot: the path's nodes need not be the first ones). A compiled target reads the
same tree on its static cache, the mask moved onto its slots (`models.static_cache.static_mask`).
"""

from __future__ import annotations

import torch


def depths(parents: list[int]) -> list[int]:
    """Each node's depth (1 for the root's children). Parents come before their children."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def path_to(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node`, in order."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def additive_mask(visible: torch.Tensor, past: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """`visible` [queries, keys after the cache] as an additive attention mask [1, 1, queries, past + keys] in the
    model's dtype: 0 where a query may look (the whole cache, and where `visible` says), the dtype's lowest value
    elsewhere."""
    full = torch.cat([torch.ones(visible.shape[0], past, dtype=torch.bool), visible], dim=1)
    mask = torch.zeros(full.shape, dtype=dtype).masked_fill(~full, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def tree_mask(parents: list[int], pending: int, past: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The mask for one forward over `pending` tokens and then the tree's nodes [1, 1, pending + n, past +
    pending + n]: the pending tokens are causal; a node sees the cache, every pending token, its ancestors and
    itself."""
    n = len(parents)
    size = pending + n
    visible = torch.zeros(size, size, dtype=torch.bool)
    visible[:pending, :pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
    visible[pending:, :pending] = True
    for i, parent in enumerate(parents):
        row = pending + i
        if parent >= 0:
            visible[row, pending:] = visible[pending + parent, pending:]
        visible[row, row] = True
    return additive_mask(visible, past, dtype, device)


def tree_positions(parents: list[int], pending: int, past: int, device=None) -> torch.Tensor:
    """Position ids [1, pending + n]: the pending tokens in order, then each node at past + pending - 1 + depth."""
    return torch.tensor([[*range(past, past + pending), *(past + pending - 1 + d for d in depths(parents))]],
                        device=device)


def keep_path(cache, start: int, path: list[int]) -> None:
    """Keep the cache's first `start` slots and then the slots `start + i` for the nodes i of `path`, in order,
    dropping every other node: the accepted path becomes contiguous, as if it alone had been read. Plain
    (full-attention) cache layers only: a sliding-window layer keeps a running length of its own. A compiled
    model's static cache moves the path down in place (`keep_slots`: its buffers keep their addresses)."""
    if (keep_slots := getattr(cache, "keep_slots", None)) is not None:
        return keep_slots(start, path)
    if any(hasattr(layer, "cumulative_length") for layer in cache.layers):
        raise ValueError("tree speculation needs full-attention cache layers; this model has sliding-window ones.")
    for layer in cache.layers:
        index = torch.tensor([*range(start), *(start + i for i in path)], device=layer.keys.device)
        layer.keys = layer.keys.index_select(2, index)
        layer.values = layer.values.index_select(2, index)
