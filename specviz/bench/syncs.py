"""Counting host reads: each time the host waits for a value the device computed.

On a GPU every such read (`.item()`, `.tolist()`, `.cpu()`, a tensor in an `if`) stops the host from queueing
work ahead of the device; a round loop that reads once a drafted token is launch-bound however fast its kernels
are. The engine aims at two reads a round (the round's statistics in one transfer, and what the rule decided) and
one per token of the target alone. This counts them, on any device, by spying on the reading methods of tensors on
the device for the duration of a block (a measurement tool: `specviz costs` only, never a served run).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")


@contextmanager
def counting_host_reads(device: torch.device) -> Iterator[list[int]]:
    """A one-item list counting reads of tensors on `device` to the host inside the block. A tensor `.cpu()`
    brought over (and its views) is on the host: reading it again costs nothing and is not counted (on a CPU,
    where `.cpu()` returns the tensor itself, so the one transfer a round makes counts once, as on a GPU)."""
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    # what `.cpu()` returned, by its storage (views share it; in inference mode they keep no `_base`), kept alive
    # so that no other tensor gets its address meanwhile
    host: dict[int, torch.Tensor] = {}

    def spy(name, original):
        def read(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            on_device = self.device.type == device.type and device.index in (None, self.device.index)
            if on_device and self.untyped_storage().data_ptr() not in host:
                count[0] += 1
            if name == "cpu":
                host[out.untyped_storage().data_ptr()] = out
            return out
        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, spy(name, original))
        yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
