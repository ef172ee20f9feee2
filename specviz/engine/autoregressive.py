"""Plain autoregressive decoding of the target: the baseline every speedup is measured against.

It uses the same sampling functions as the speculative loop, one forward and one host transfer
per token, and yields a `Step` per token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from specviz.engine.config import DecodeConfig
from specviz.engine.events import TARGET, Finish, Step, end_of_run
from specviz.compat import forward
from specviz.engine.plumbing import Pieces, PromptCache, at, clock, pad_vocab, prefilled, to_host
from specviz.engine.sampling import draw, logits_to_probs, make_generator
from specviz.engine.tokens import emitted_token, target_stats


@torch.inference_mode()
def autoregressive_generate(pair, prompt_ids: list[int], config: DecodeConfig, *,
                            prompt_cache: PromptCache | None = None,
                            should_stop: Callable[[], Finish] = lambda: None) -> Iterator[Step]:
    device, vocab = pair.device, pair.vocab_size
    gen = make_generator(device, config.seed)
    pieces = Pieces(pair.tokenizer)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    generated: list[int] = []
    t0 = clock(device)
    cache = prefilled(pair.target, ids, prompt_cache, room=config.room)
    prefill_time = clock(device) - t0
    feed = ids[:, cache.get_seq_length():]  # the prompt's last token (the whole of a one-token prompt)
    for index in range(config.max_new_tokens):
        t0 = clock(device)
        logits = pad_vocab(forward(pair.target, feed, cache, 1).logits[0, -1:].float(), vocab)  # [1, V], as kept
        p = logits_to_probs(logits, config.sampling)
        token = draw(logits[0], p[0], config.sampling.greedy, gen)
        p_soft, stats = target_stats(logits, p, config.sampling.greedy, config.top_n)
        h = to_host(token=token, p=at(p[0], token), p_soft=at(p_soft[0], token), **stats)
        t1 = clock(device)
        tid = int(h["token"])
        generated.append(tid)
        feed = token.view(1, 1)
        finished = end_of_run([tid], len(generated), pair.eos_token_ids, config.max_new_tokens, should_stop)
        yield Step(index=index, token=emitted_token(h, 0, tid, TARGET, h["p"], h["p_soft"], pieces),
                   text=pieces.text(generated), time=t1 - t0, finished=finished, prefill_time=prefill_time)
        prefill_time = 0.0
        if finished:
            return
