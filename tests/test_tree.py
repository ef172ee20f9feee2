"""A draft tree read in one forward (transformers 5: a custom 4D mask with a DynamicCache, explicit position ids):
every node's logits are what the model computes for the path to that node read alone, and after `keep_path` the
cache continues exactly like one that read only the accepted path. Checked on tiny Qwen2 and Llama models."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specviz.compat import forward
from specviz.engine.tree import depths, keep_path, path_to, tree_mask, tree_positions

V = 40
PROMPT = [3, 7, 1, 9, 4]
#          0   1   2  3  4  5  6   (node)
PARENTS = [-1, -1, 0, 0, 1, 2, 5]
TOKENS = [11, 12, 13, 14, 15, 16, 17]


def model(kind: str):
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
    torch.manual_seed(0)
    return (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**common))).eval()


def test_depths_and_paths():
    assert depths(PARENTS) == [1, 1, 2, 2, 2, 3, 4]
    assert path_to(PARENTS, 6) == [0, 2, 5, 6] and path_to(PARENTS, 1) == [1]


def test_the_mask_lets_a_node_see_only_its_ancestors():
    mask = tree_mask(PARENTS, pending=1, past=2, dtype=torch.float32)[0, 0]
    visible = mask == 0
    assert mask.shape == (8, 10) and visible[:, :2].all()  # the cache: seen by all
    node = lambda i: 2 + 1 + i  # column of node i (after the cache and the pending token)
    assert visible[1 + 6].tolist() == [True] * 3 + [i in (0, 2, 5, 6) for i in range(7)]
    assert not visible[0, node(0)] and mask[0, node(0)] == torch.finfo(torch.float32).min
    assert tree_positions(PARENTS, 1, 2).tolist() == [[2, 3, 3, 4, 4, 4, 5, 6]]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@torch.inference_mode()
def test_one_forward_reads_the_tree_as_each_path_alone_and_keep_path_continues_it(kind):
    m = model(kind)
    past = len(PROMPT) - 1
    cache = DynamicCache()
    forward(m, torch.tensor([PROMPT[:-1]]), cache, 0)
    feed = torch.tensor([[PROMPT[-1], *TOKENS]])
    out = forward(m, feed, cache, 0, attention_mask=tree_mask(PARENTS, 1, past, torch.float32),
                  position_ids=tree_positions(PARENTS, 1, past)).logits[0]
    assert cache.get_seq_length() == past + 1 + len(TOKENS)
    torch.testing.assert_close(out[0], m(torch.tensor([PROMPT])).logits[0, -1], atol=1e-5, rtol=1e-4)
    for i in range(len(TOKENS)):
        alone = PROMPT + [TOKENS[j] for j in path_to(PARENTS, i)]
        torch.testing.assert_close(out[1 + i], m(torch.tensor([alone])).logits[0, -1], atol=1e-5, rtol=1e-4)

    path = path_to(PARENTS, 5)  # nodes 0, 2, 5: not the first slots
    keep_path(cache, past + 1, path)
    assert cache.get_seq_length() == past + 1 + len(path)
    accepted = PROMPT + [TOKENS[j] for j in path]
    after = forward(m, torch.tensor([[21]]), cache, 0).logits[0, -1]
    torch.testing.assert_close(after, m(torch.tensor([accepted + [21]])).logits[0, -1], atol=1e-5, rtol=1e-4)


def test_sliding_window_caches_are_refused():
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                     sliding_window=4, max_window_layers=0)).eval()
    cache = DynamicCache(config=m.config)
    with torch.inference_mode():
        forward(m, torch.tensor([PROMPT]), cache, 0)
    with pytest.raises(ValueError, match="sliding-window"):
        keep_path(cache, 2, [0])
