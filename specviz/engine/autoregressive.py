"""Plain autoregressive decoding of the target: the baseline every speedup is measured against.

It uses the same sampling functions as the speculative loop, one forward and one host transfer
per token, and yields a `Step` per token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from transformers import DynamicCache

from specviz.engine.config import DecodeConfig
from specviz.engine.events import TARGET, EmittedToken, Step, end_of_run, top_candidates
from specviz.engine.plumbing import Pieces, at, clock, pad_vocab, to_host
from specviz.engine.sampling import logits_to_probs, make_generator, sample


@torch.inference_mode()
def autoregressive_generate(pair, prompt_ids: list[int], config: DecodeConfig, *,
                            should_stop: Callable[[], bool] = lambda: False) -> Iterator[Step]:
    device, vocab = pair.device, pair.vocab_size
    gen = make_generator(device, config.seed)
    pieces = Pieces(pair.tokenizer)
    cache = DynamicCache()
    feed = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    generated: list[int] = []
    for index in range(config.max_new_tokens):
        t0 = clock(device)
        logits = pad_vocab(pair.target(feed, past_key_values=cache, use_cache=True,
                                       logits_to_keep=1).logits[0, -1].float(), vocab)
        p = logits_to_probs(logits, config.sampling)
        # greedy: a draw from the point mass is its argmax; skipping torch.multinomial (~3 ms per
        # call over 152k ids on a CPU) keeps the baseline as fast as the speculative loop's draft
        token = logits.argmax() if config.sampling.greedy else sample(p, gen)
        p_soft = torch.softmax(logits, -1)
        top = (p_soft if config.sampling.greedy else p).topk(min(config.top_n, vocab))
        top2 = logits.topk(2).values
        h = to_host(token=token, p=at(p, token), p_soft=at(p_soft, token), gap=top2[0] - top2[1],
                    top_ids=top.indices, top_vals=top.values)
        t1 = clock(device)
        tid = int(h["token"])
        generated.append(tid)
        feed = token.view(1, 1)
        finished = end_of_run([tid], len(generated), pair.eos_token_ids, config.max_new_tokens, should_stop)
        top_list = top_candidates(h["top_ids"], h["top_vals"], pieces)
        token_event = EmittedToken(id=tid, text=pieces(tid), kind=TARGET, p=h["p"], p_soft=h["p_soft"],
                                   target_top2_gap=h["gap"], p_top=top_list)
        yield Step(index=index, token=token_event, text=pieces.text(generated), time=t1 - t0, finished=finished)
        if finished:
            return
