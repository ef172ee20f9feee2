"""A tiny random-weight pair built in-process: fast, deterministic, no download.

Used by the engine's proofs and the UI's handler tests, and as `--draft tiny --target tiny` for a quick look.
The draft is the target with noise added to its weights, so the two agree often but not always:
every branch of the accept/reject rule gets exercised.
"""

from __future__ import annotations

import copy

import torch

from specviz.models.pair import ModelPair, resolve_device

WORDS = ["<eos>"] + [w for w in "the a of to and in is it that on was for with as be at by this had not are but from or have an they which one you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world".split()][:95]
EOS_ID = 0


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="the")


def tiny_model(seed: int, vocab_size: int, layers: int = 2, hidden: int = 64):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, eos_token_id=EOS_ID, tie_word_embeddings=False,
                         initializer_range=0.2)  # the usual 0.02 gives one token forever
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """The model with Gaussian noise on every weight (`noise` times the weight's std): a draft that agrees
    with it often but not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * param.std() * torch.randn(param.shape, generator=gen))
    return draft


def tiny_pair(seed: int = 0, noise: float = 0.03, device: str = "cpu", dtype=torch.float32,
              draft_vocab: int | None = None) -> ModelPair:
    tokenizer = tiny_tokenizer()
    vocab = len(WORDS)
    target = tiny_model(seed, vocab)
    if draft_vocab is None:
        draft = noisy_copy(target, noise, seed + 1)
    else:
        draft = tiny_model(seed + 1, draft_vocab)
    dev = resolve_device(device)
    return ModelPair(draft=draft.to(dev, dtype), target=target.to(dev, dtype), tokenizer=tokenizer,
                     device=dev, dtype=dtype, draft_name="tiny-draft", target_name="tiny-target",
                     eos_token_ids=frozenset({EOS_ID}))
