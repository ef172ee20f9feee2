"""The machine a measurement ran on, as the bench's reports name it: the machine (`bench.machine`) with torch's
threads and version, transformers' version and the GPU (None on a CPU)."""

from __future__ import annotations

from specviz.bench.machine import machine as base_machine


def machine() -> dict:
    import torch
    import transformers

    return base_machine() | {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                             "transformers": transformers.__version__,
                             "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
