"""Load a draft/target pair from the embedded weights, hub ids, local folders or GGUF files.

Every failure a user can cause ends in a `ModelLoadError` with one sentence saying what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.compat import forward, model_vocab
from specviz.models.embedded import EmbeddedModelError, converted_dir, embedded_model
from specviz.models.families import same_tokenizer, vocab_map
from specviz.models.pair import (
    DTYPES, EMBEDDED, OUT_OF_MEMORY, TINY, ModelLoadError, ModelPair, PairSpec,
    release_memory, resolve_device, resolve_dtype,
)
from specviz.models.preparing import prepare_embedded, stored_draft
from specviz.models.reading import from_pretrained
from specviz.models.synthetic import is_synthetic, synthetic_pair
from specviz.models.tiny import tiny_pair

log = logging.getLogger(__name__)

Status = Callable[[str], None]


def load_model(source: str, role: str, dtype: torch.dtype, *, trust_remote_code=False, device_map=None,
               status: Status = log.info, progress: bool = True, coded: bool = False):
    """`source`'s model and tokenizer in `dtype`. `coded`: a draft that will run as the lean int4 step (CPU) may be
    read from its store of codes (`preparing.stored_draft`): the embedded draft is, with no dense copy on disk."""
    if (embedded := embedded_model(source, role)) is not None:
        try:
            if coded and (stored := stored_draft(embedded, dtype, status, progress)) is not None:
                return stored
            folder = prepare_embedded(embedded, status, progress, dtype)
        except EmbeddedModelError as e:
            raise ModelLoadError(str(e)) from e
        status(f"Loading the embedded {role} ({embedded.name})…")
        # a half dtype's copy is read shard by shard into memory rather than mapped: a mapped file's pages stay in the
        # process while any weight of it does, so the dense weights the tuned kernels release would stay too
        return from_pretrained(str(folder), dtype, trust_remote_code=False, progress=progress,
                                disable_mmap=folder != converted_dir(embedded))
    status(f"Loading {role} {source}…")
    return from_pretrained(source, dtype, trust_remote_code, device_map=device_map, progress=progress)


def eos_ids(model, tokenizer) -> frozenset[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def check_croppable(model, name: str, device: torch.device) -> None:
    """Refuse, at load, a model whose KV cache cannot be cut back to the accepted tokens.

    Each round drops the rejected drafts from both caches; a model that keeps a running state instead of
    per-token keys and values (recurrent or linear-attention layers) would fail mid-run, or silently go on
    from a state that saw the rejected tokens. Probed the way the round loop uses it: three tokens into a
    fresh DynamicCache, then one cut off. Not probed where the architecture is one the lean step knows (plain RoPE
    decoder layers, a per-token cache, no sliding window): a draft read as its codes would dequantize every weight
    for the probe (3.4 s of the embedded draft's start, AMD EPYC Zen 4, 2 cores)."""
    from transformers import DynamicCache

    from specviz.models.draft.lean import supported

    if hasattr(model, "config") and supported(model):
        return
    cache = DynamicCache()
    try:
        with torch.inference_mode():
            forward(model, torch.zeros(1, 3, dtype=torch.long, device=device), cache, 1)
            cache.crop(-1)  # transformers 5: crop(-n) removes the last n tokens
            cut = cache.get_seq_length() == 2
    except Exception:  # whatever the model's cache does with a crop, it is not what the round loop needs
        cut = False
    if not cut:
        raise ModelLoadError(f"{name} keeps a cache that cannot be cut back to the accepted tokens (recurrent or "
                             "linear-attention layers?): speculative decoding needs one that can.")


@dataclass(frozen=True)
class Reading:
    """How a pair's models are read: model code a model ships is run only when asked (`trust_remote_code`);
    accelerate's `device_map` ("auto" spreads a target too big for one GPU over several); `coded_draft`: the draft will
    run as the lean int4 step, so it may be read from its store of codes (`load_model`)."""

    trust_remote_code: bool = False
    device_map: str | None = None
    coded_draft: bool = False


def load_pair(draft: str | None = EMBEDDED, target: str = EMBEDDED, *, device: str = "auto",
              dtype: str = "auto", reading: Reading = Reading(), status: Status = log.info,
              progress: bool = True) -> ModelPair:
    """Load both models. `draft=None` gives a target-only pair (for model-free drafters)."""
    trust_remote_code, device_map = reading.trust_remote_code, reading.device_map
    if TINY in (draft, target):
        if (draft, target) != (TINY, TINY):
            raise ModelLoadError("'tiny' is a pair of its own: pass it as both --draft and --target.")
        return tiny_pair(device=device, dtype=DTYPES.get(dtype, torch.float32))
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if is_synthetic(target) or is_synthetic(draft):  # random weights of a real shape: costs, not acceptance
        status(f"Building {_display(draft, 'draft')} → {target} with random weights on {dev}…")
        return synthetic_pair(draft, target, device=str(dev), dtype=dt)
    if dtype == "auto" and dev.type == "cpu":
        from specviz.models.auto_dtype import race_dtype  # (read from the cache resolve_dtype just filled)

        status(race_dtype()[1])
    try:
        t_model, t_tok = load_model(target, "target", dt, trust_remote_code=trust_remote_code,
                                    device_map=device_map, status=status, progress=progress)
        d_model = None
        if draft is not None:
            d_model, d_tok = load_model(draft, "draft", dt, trust_remote_code=trust_remote_code,
                                        status=status, progress=progress,
                                        coded=reading.coded_draft and dev.type == "cpu")  # (the lean step's kernels)
            d_model.to(dev).eval()
        if device_map is None:
            t_model.to(dev)
        else:
            dev = next(t_model.parameters()).device  # inputs go where accelerate put the embeddings
    except OUT_OF_MEMORY as e:  # moving to the device: drop what was loaded before saying so
        t_model = d_model = None
        release_memory(e)
        raise ModelLoadError(f"out of memory while loading {_display(draft, 'draft')} → "
                             f"{_display(target, 'target')} on {dev}: pick a smaller pair or a lower-precision "
                             "dtype.") from e
    t_model.eval()
    for model, source, role in ((t_model, target, "target"), (d_model, draft, "draft")):
        if model is not None:
            check_croppable(model, _display(source, role), dev)
    mapping = None
    if d_model is not None and not same_tokenizer(d_tok, t_tok):  # another family: map its vocabulary
        status("The draft has a tokenizer of its own: mapping its vocabulary into the target's…")
        mapping = vocab_map(d_tok, t_tok, model_vocab(d_model), model_vocab(t_model), _display(draft, "draft"),
                            _display(target, "target"), dev)
    status("Models ready.")
    return ModelPair(draft=d_model, target=t_model, tokenizer=t_tok, device=dev, dtype=dt,
                     draft_name=_display(draft, "draft"), target_name=_display(target, "target"),
                     eos_token_ids=eos_ids(t_model, t_tok), vocab_map=mapping)


def _display(source: str | None, role: str) -> str:
    if source is None:
        return "none"
    embedded = embedded_model(source, role)
    return source if embedded is None else embedded.name


def load_spec(spec: PairSpec, *, loader: Callable[..., ModelPair] = load_pair, status: Status = log.info,
              progress: bool = True, fits: Callable[[PairSpec], None] | None = None) -> ModelPair:
    """The pair `spec` names, at the target precision (`spec.target_quant`), with the cheaper draft step
    (`spec.draft_quant`) and each linear on the kernel measured fastest here (`spec.kernels`), where they apply.
    Refused in one sentence before any weight is read where its estimate does not fit the memory free
    (`memory.check_fits`: a process the OS kills for memory says nothing)."""
    from specviz.models.memory import check_fits

    (fits or check_fits)(spec)
    pair = loader(spec.draft, spec.target, device=spec.device, dtype=spec.dtype, status=status, progress=progress,
                  reading=Reading(spec.trust_remote_code, spec.device_map, coded_draft=spec.draft_quant == "int4"))
    return lean(with_speedups(pair, spec, status, release=True), status)


def lean(pair: ModelPair, status: Status = log.info) -> ModelPair:
    """`pair` with one copy of each target weight: the dense ones its tuned kernels never use released (the pair as
    loaded, which shares them, is dropped by the caller). A compiled step runs on the loaded model's weights, so
    a pair with one keeps them."""
    from specviz.models.compiled import is_compiled
    from specviz.models.resident import release_unused_dense

    if is_compiled(pair.target) or pair.eager_steps is not None:
        return pair
    released = release_unused_dense(pair.target)
    release_memory()  # what the load read and cast, and any dense weights released, given back
    if released:
        status(f"The target keeps one copy of its weights: {released / 1e9:.1f} GB of dense weights its tuned kernels "
               "never use released.")
    return pair


def with_speedups(pair: ModelPair, spec: PairSpec, status: Status = log.info, release: bool = False) -> ModelPair:
    """`pair` with the target's precision, the kernels and the one-token steps `spec` asks for; the loaded models
    stay as they are, unless `release` (for a caller that drops `pair`): then the loaded draft's linears a lean draft
    step replaced are released before the target's packed copy is made (the load's peak)."""
    from specviz.models.draft import DraftQuant, with_cheaper_draft  # torch kernels: only when asked for
    from specviz.models.cut_head import draft_vocab_ids
    from specviz.models.draft.lean import LeanDraft, release_replaced
    from specviz.models.steps import with_steps
    from specviz.models.resident import release_unused_codes
    from specviz.models.target import with_target, with_tuned_draft

    loaded = pair
    if spec.draft_vocab and (spec.draft_quant == "none" or pair.device.type != "cpu"):
        raise ModelLoadError(f"--draft-vocab {spec.draft_vocab} cuts the head of the cheaper draft step: it needs "
                             "--draft-quant int4 or int8, on a CPU.")
    # the draft first, its step decided before the target is packed (so its dense linears may go first)
    if spec.draft_quant != "none" and pair.draft is not None and pair.device.type == "cpu":  # CPU kernels only
        status(f"Packing the draft's weights as {spec.draft_quant}…")
        pair = with_cheaper_draft(pair, DraftQuant.named(spec.draft_quant),
                                  vocab_ids=draft_vocab_ids(pair, spec.draft_vocab))
    pair = with_tuned_draft(pair, status) if spec.kernels == "tuned" else pair
    if pair.draft is not None and isinstance(pair.draft, torch.nn.Module):
        release_unused_codes(pair.draft)  # (kernels as loaded: torch's int4 packing only)
    pair = with_steps(loaded, pair, spec, status, roles=("draft",))
    if release and isinstance(pair.draft, LeanDraft):
        release_replaced(loaded.draft)
        release_memory()  # before the target's packed copy is made: the peak
    pair, _ = with_target(pair, spec.target_quant, spec.kernels, status, invariant=spec.invariant)
    return with_steps(loaded, pair, spec, status, roles=("target",))
