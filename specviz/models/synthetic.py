"""Random-weight models of real shapes: what a GPU's step costs, without the weights.

`synthetic:qwen2.5-7b` builds a model with the published configuration of that model (layers, widths, heads,
KV heads, MLP, vocabulary, tied head or not) and random weights, on any device and dtype, with no file and no
download. Random weights make acceptance meaningless, so these pairs measure *costs*: the target's step, the
verify curve, the draft's step (`specviz costs`). A real pair's vocabularies differ by padding
(Qwen2.5-7B has 152,064 rows, the 0.5B 151,936; the tokenizer produces neither's extra ids): the synthetic
pair keeps that difference, so it takes the same path a real pair does (`ModelPair.vocab_size`, `pad_vocab`,
`fit_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.models.pair import ModelLoadError, ModelPair, resolve_device

PREFIX = "synthetic:"
QWEN25 = dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32_768)


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    tied: bool

    def config(self):
        from transformers import Qwen2Config

        return Qwen2Config(num_hidden_layers=self.layers, hidden_size=self.hidden, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, intermediate_size=self.mlp, vocab_size=self.vocab,
                           tie_word_embeddings=self.tied, eos_token_id=None, bos_token_id=None, **QWEN25)


# The published configurations (config.json of Qwen/Qwen2.5-*-Instruct); `mini-*` are the same family at a
# size a test runs in seconds, padded differently like the real pair.
SHAPES = {
    "qwen2.5-0.5b": Shape(24, 896, 14, 2, 4864, 151_936, True),
    "qwen2.5-1.5b": Shape(28, 1536, 12, 2, 8960, 151_936, True),
    "qwen2.5-7b": Shape(28, 3584, 28, 4, 18_944, 152_064, False),
    "mini-draft": Shape(2, 64, 4, 2, 128, 1000, True),
    "mini-target": Shape(4, 128, 4, 2, 256, 1024, False),
}


def is_synthetic(source: str | None) -> bool:
    return source is not None and source.startswith(PREFIX)


def shape_of(source: str) -> Shape:
    name = source.removeprefix(PREFIX)
    if name not in SHAPES:
        raise ModelLoadError(f"unknown synthetic shape {name!r}; choose one of {', '.join(sorted(SHAPES))}.")
    return SHAPES[name]


def synthetic_tokenizer(vocab: int):
    """One word per id (`t0`, `t1`, ...): any id a model of that vocabulary emits decodes, and any text of such
    words encodes. Ids past it (the larger model's padding rows) decode to nothing, as in a real pair."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0")


def synthetic_model(source: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """The model `source` names, its weights drawn on `device` in `dtype` (a 7B shape never exists in float32
    on the host). The initialisation is the family's (std 0.02), so logits have the spread a real model's
    step computes over; their values mean nothing."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(shape_of(source).config(), dtype=dtype)
    return model.eval()


def prompt_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    """A prompt of `n` ids the tokenizer knows, the same on every device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n,), generator=gen).tolist()


def synthetic_pair(draft: str | None, target: str, device: str = "auto", dtype: torch.dtype = torch.float32,
                   seed: int = 0) -> ModelPair:
    """The pair `draft` → `target` names (both `synthetic:...`, or no draft), with one tokenizer over the smaller
    vocabulary: what a real pair's tokenizer covers, so the larger model's padding rows are ids the tokenizer
    never produces and decodes to nothing, exactly as with Qwen2.5-0.5B → 7B."""
    if not is_synthetic(target) or (draft is not None and not is_synthetic(draft)):
        raise ModelLoadError("a synthetic model pairs only with another synthetic model (or no draft): pass "
                             "'synthetic:NAME' as both --draft and --target.")
    shapes = [shape_of(s) for s in (draft, target) if s is not None]
    dev = resolve_device(device)
    return ModelPair(
        draft=None if draft is None else synthetic_model(draft, dev, dtype, seed + 1),
        target=synthetic_model(target, dev, dtype, seed), tokenizer=synthetic_tokenizer(min(s.vocab for s in shapes)),
        device=dev, dtype=dtype, draft_name=draft or "none", target_name=target)
