"""q/k/v and gate/up fused for the compiled step on a GPU (`models/fused.py`): the same logits, fewer products,
the weights held once. Run here on a CPU, where the fusion itself is device-agnostic (the compiled step applies
it on CUDA only)."""

import copy

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from specviz.compat import forward
from specviz.models.compiled import with_compiled_step
from specviz.models.fused import fuse_projections
from specviz.models.resident import step_bytes
from specviz.models.synthetic import synthetic_pair


class CountProducts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # (in inference mode linear reaches a dispatch mode whole; outside it, as addmm or mm)
        self.products += func.overloadpacket in (torch.ops.aten.linear, torch.ops.aten.mm, torch.ops.aten.addmm)
        return func(*args, **(kwargs or {}))


def target():
    torch.manual_seed(0)
    return synthetic_pair("synthetic:mini-draft", "synthetic:mini-target", device="cpu", dtype=torch.float32).target


def products(model, ids) -> int:
    with CountProducts() as counter:
        model(ids)
    return counter.products


@torch.inference_mode()
def test_a_fused_copy_computes_the_same_logits_with_four_products_a_layer_and_holds_the_weights_once():
    loaded = target()
    ids = torch.randint(1, 1000, (1, 12))
    expected, before = loaded(ids).logits, products(loaded, ids)
    fast = copy.deepcopy(loaded, memo={id(t): t for t in loaded.parameters()})
    layers = len(loaded.model.layers)
    assert fuse_projections(fast) == 2 * layers
    torch.testing.assert_close(fast(ids).logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(loaded(ids).logits, expected, rtol=0, atol=0)  # the loaded model: views, same values
    # the linears: 7 -> 4 a layer
    assert before - products(fast, ids) == 3 * layers
    attn, mlp = fast.model.layers[0].self_attn, fast.model.layers[0].mlp
    kept = loaded.model.layers[0]
    assert kept.self_attn.v_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    assert kept.mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_up_weight.untyped_storage().data_ptr()
    assert step_bytes(fast) == step_bytes(loaded)  # what a step reads: the same bytes, counted once
    again = copy.deepcopy(loaded, memo={id(t): t for t in loaded.parameters()})
    fuse_projections(again)  # a second compiled copy shares the first's fused weights, no new copy
    assert again.model.layers[1].self_attn.qkv_weight.data_ptr() == fast.model.layers[1].self_attn.qkv_weight.data_ptr()


@torch.inference_mode()
def test_the_compiled_step_on_fused_layers_gives_the_loaded_models_next_token_logits():
    loaded = target()
    ids = torch.randint(1, 1000, (1, 10))
    expected = loaded(ids).logits[0, -1]
    fast = with_compiled_step(loaded, sizes=(512,))
    fuse_projections(fast)
    cache = fast.new_cache(32)
    forward(fast, ids[:, :-1], cache, 1)
    step = forward(fast, ids[:, -1:], cache, 1).logits[0, -1]
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-4)
    assert all(given.value is None for given in (fast.model.layers[0].self_attn.q_proj,))  # nothing held past a step


def test_layers_of_another_shape_are_left_alone():
    class Odd(nn.Module):  # projections with a bias on some and not others: not one product with one bias
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = nn.Linear(4, 4), nn.Linear(4, 2, bias=False), nn.Linear(4, 2)

    class Lone(nn.Module):  # no gate/up pair
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(4, 4)

    model = nn.Sequential(Odd(), Lone())
    assert fuse_projections(model) == 0
    assert isinstance(model[0].k_proj, nn.Linear)
