"""Memory: what a loaded pair holds, and whether a pair will fit before it loads.

`model_bytes` counts what a loaded model's tensors occupy; the app shows it per model, so what
self-speculation saves (no draft model at all) reads as a number.

Will a pair fit? Its weights' memory, estimated from the models' configs before any weight is read.

A server that starts loading a pair too big for the machine gets killed by the OS, for every visitor.
The estimate is parameters x bytes per parameter in the dtype it will run in, for both models, with
the parameters counted on the meta device (the real architecture, no memory, no weights read). KV caches
and activations come on top; at specviz's limits they are small beside the weights.
"""

from __future__ import annotations

import itertools

import torch

from specviz.models.converted import complete
from specviz.models.embedded import converted_dir, embedded_model
from specviz.models.preparing import store_dir
from specviz.models.sources import locate
from specviz.models.synthetic import is_synthetic, shape_of
from specviz.models.pair import TINY, ModelLoadError, ModelPair, PairSpec, resolve_device, resolve_dtype

GB = 1e9


def model_bytes(model: torch.nn.Module) -> int:
    """The memory a loaded model's weights and buffers hold: each storage counted once, so tied
    embeddings (one tensor, two names) and views of one buffer count once, and a cheaper draft's or the packed
    verify's packed weights count beside the dense ones kept for the other inputs."""
    storages = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_mkldnn:  # oneDNN's packed weights (the packed verify): an opaque tensor without a storage
            storages[("mkldnn", id(t))] = t.numel() * t.element_size()
        elif t.device.type != "meta":  # no memory behind it
            storage = t.untyped_storage()
            storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def pair_bytes(pair: ModelPair | None) -> dict[str, int]:
    """Each loaded model's memory by role ("draft", "target"); a pair without draft has no "draft"."""
    models = {} if pair is None else {"draft": pair.draft, "target": pair.target}
    return {role: model_bytes(m) for role, m in models.items() if m is not None}


def parameter_count(source: str | None, role: str) -> int | None:
    """Parameters of the model `source` names, from its config alone; None when no config can be read
    without loading (a hub id not in the cache, a tiny pair, model code the server would not run)."""
    from transformers import AutoConfig

    if source in (None, TINY):
        return None
    if is_synthetic(source):  # a published shape: its config is known without any file
        try:
            return _count_on_meta(shape_of(source).config())
        except ModelLoadError:
            return None  # an unknown shape: the load names the known ones
    if (embedded := embedded_model(source, role)) is not None:
        folders = [f for f in [converted_dir(embedded, d) for d in (None, torch.bfloat16)] +
                   [store_dir(embedded, d) for d in (torch.float32, torch.bfloat16)] if complete(f, embedded.sha256)]
        if not folders:  # (any copy's config will do: every dtype has the same parameters)
            return None
        folder, kw = str(folders[0]), {}
    else:
        try:
            folder, kw = locate(source)
        except ModelLoadError:
            return None  # the load says what is wrong with the name, in its own words
    try:
        return _count_on_meta(AutoConfig.from_pretrained(folder, trust_remote_code=False, **kw))
    except Exception:  # noqa: BLE001 - no estimate; whatever is wrong, loading reports it properly
        return None


def _count_on_meta(config) -> int:
    """Parameters of the model `config` describes, built on the meta device (no memory, no weights). Built as a
    model is, so a tied head stays the embedding (accelerate's `init_empty_weights` unties them: a tied 0.5B
    model counted 630M)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def weights_bytes(spec: PairSpec) -> tuple[int, torch.dtype] | None:
    """Both models' weights in the dtype they will run in, or None when either cannot be estimated."""
    counts = [parameter_count(spec.target, "target")]
    if spec.draft is not None:
        counts.append(parameter_count(spec.draft, "draft"))
    if None in counts:
        return None
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    if spec.kernels == "tuned" and spec.target_quant == "none" and device.type == "cpu":
        counts.append(counts[0])  # oneDNN's packed copy of the target's weights, where tuning chooses it
    return sum(counts) * dtype.itemsize, dtype


def available_bytes(device: torch.device) -> int:
    """Memory a new pair may take on `device` now (the served pair, still loaded, already counted out)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def check_fits(spec: PairSpec, available=available_bytes, estimate=weights_bytes) -> None:
    """Refuse, in one sentence, a pair whose weights would not fit beside what the process holds now.
    Pairs spread over GPUs by a device map, and pairs with no estimate, are left to the load itself."""
    if spec.device_map is not None or (found := estimate(spec)) is None:
        return
    need, dtype = found
    device = resolve_device(spec.device)
    free = available(device)
    if need > free:
        raise ModelLoadError(
            f"{spec.label} needs about {need / GB:.1f} GB for its weights in {str(dtype).removeprefix('torch.')} "
            f"and {device} has {free / GB:.1f} GB free: pick a smaller pair or a lower-precision dtype.")


def resident(pair: ModelPair) -> dict:
    """What a loaded pair holds (`pair_bytes`) and this process's resident bytes now and at their peak so far (for a
    server: the load's): the server's start line and the bench's report."""
    import resource

    import psutil

    return {"weights_bytes": pair_bytes(pair), "rss_bytes": psutil.Process().memory_info().rss,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # (KiB on Linux)
