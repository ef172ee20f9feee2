"""A model's copy that shares its weights: a tuned, compiled, quantized or row-invariant model is the loaded one with
some modules swapped, and its tensors stay those of the loaded model (held once)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn


def shared_copy(model: nn.Module) -> nn.Module:
    """`model` copied module by module, its parameters and buffers the same tensors (not copied)."""
    return copy.deepcopy(model, memo={id(t): t for t in [*model.parameters(), *model.buffers()]})


def swapped(model: nn.Module, swap: Callable[[nn.Module], nn.Module | None]) -> nn.Module:
    """A `shared_copy` of `model` with each module that `swap` returns a replacement for (None: kept) replaced."""
    fast = shared_copy(model)
    for parent in list(fast.modules()):
        for name, child in list(parent.named_children()):
            new = swap(child)
            if new is not None:
                setattr(parent, name, new)
    return fast
