"""The lean draft's store of 4-bit codes (`models.draft.store`): the draft read from it is the one quantized from its
dense weights, bit for bit; the cache makes it once, without a dense copy on disk; the prepare command lists it."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from specviz.models.draft import DraftQuant
from specviz.models.draft import store
from specviz.models.draft.lean import LeanDraft, lean_draft, release_replaced
from specviz.models.tiny import tiny_model, tiny_tokenizer

INT4 = DraftQuant.named("int4")


def loaded(dtype: torch.dtype, folder, vocab: int = 64) -> nn.Module:
    """A tiny draft as a load in `dtype` gives it (its rotary table computed in float32, as the store's load does)."""
    from transformers import AutoModelForCausalLM

    tiny_model(0, vocab).save_pretrained(folder / "dense")
    return AutoModelForCausalLM.from_pretrained(folder / "dense", dtype=dtype).eval()


def stored_copy(model: nn.Module, folder) -> nn.Module:
    store.write(model, folder, store.GROUP)
    return store.load(folder, next(model.parameters()).dtype)


def same_buffers(a: nn.Module, b: nn.Module) -> bool:
    bufs_a, bufs_b = dict(a.named_buffers()), dict(b.named_buffers())
    return bufs_a.keys() == bufs_b.keys() and all(
        (bufs_a[k] is None and bufs_b[k] is None) or torch.equal(bufs_a[k], bufs_b[k]) for k in bufs_a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_ids", [None, torch.arange(0, 64, 2)])
def test_the_lean_draft_from_the_store_is_the_one_from_the_dense_weights_bit_for_bit(tmp_path, dtype, vocab_ids):
    dense = loaded(dtype, tmp_path)
    coded = stored_copy(dense, tmp_path)
    assert any(isinstance(m, store.CodedLinear) for m in coded.modules())
    a, b = lean_draft(coded, INT4, vocab_ids), lean_draft(dense, INT4, vocab_ids)
    assert isinstance(a, LeanDraft) and same_buffers(a, b)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for draft in (a, b):
        draft.cache = draft.new_cache()
    assert torch.equal(a(ids, cache=a.cache).logits, b(ids, cache=b.cache).logits)  # the prompt
    assert torch.equal(a(ids[:, :1], cache=a.cache).logits, b(ids[:, :1], cache=b.cache).logits)  # a step


def test_a_coded_linear_computes_with_the_weights_its_codes_stand_for_and_knows_its_group(tmp_path):
    linear = nn.Linear(64, 48)
    coded = store.CodedLinear.of(linear, 32)
    assert coded.codes.shape == (48, 32) and coded.codes.dtype == torch.uint8  # two codes a byte
    weights = coded.dense()
    assert (weights - linear.weight).abs().max() <= coded.scale.max() / 2 + 1e-6  # within half a step of the codes
    x = torch.randn(3, 64)
    assert torch.equal(coded(x), nn.functional.linear(x, weights, linear.bias))
    assert torch.equal(coded.rows(torch.tensor([5, 7])).dense(), weights[[5, 7]])
    with pytest.raises(ValueError, match="groups of 32, not 64"):
        coded.int4_codes(64)
    assert coded.release() > 0 and coded.codes.is_meta


def test_the_store_is_the_codes_not_a_dense_copy_and_a_mismatched_store_is_refused(tmp_path):
    dense = loaded(torch.bfloat16, tmp_path)
    store.write(dense, tmp_path, store.GROUP)
    linears = sum(m.weight.numel() for m in dense.modules() if isinstance(m, nn.Linear))
    others = sum(p.numel() for n, p in dense.named_parameters() if not isinstance(
        dense.get_submodule(n.rpartition(".")[0]), nn.Linear))
    # 4 bits a weight and two float32s a group of 32 (0.75 bytes a weight), the rest as it was (2 bytes)
    assert (tmp_path / store.WEIGHTS).stat().st_size < 0.8 * linears + 2 * others + 10_000
    tiny_model(0, 64, layers=3).config.save_pretrained(tmp_path)  # a config that does not describe the tensors
    with pytest.raises(ValueError, match="does not match its config"):
        store.load(tmp_path, torch.bfloat16)


def test_releasing_the_loaded_draft_frees_its_codes_and_the_lean_draft_still_runs(tmp_path):
    coded = stored_copy(loaded(torch.bfloat16, tmp_path), tmp_path)
    lean = lean_draft(coded, INT4)
    before = lean(torch.tensor([[1, 2]]), cache=lean.new_cache()).logits
    assert release_replaced(coded) > 0
    assert all(m.codes.is_meta for m in coded.modules() if isinstance(m, store.CodedLinear))
    assert torch.equal(lean(torch.tensor([[1, 2]]), cache=lean.new_cache()).logits, before)


def test_a_draft_read_as_codes_has_no_dense_step_to_compile(tmp_path):
    from specviz.models.pair import PairSpec
    from specviz.models.steps import compilable

    dense = tiny_model(0, 64)
    assert compilable(dense, PairSpec("tiny", "tiny"), "draft")
    assert not compilable(stored_copy(dense, tmp_path), PairSpec("tiny", "tiny"), "draft")


def test_the_cache_makes_the_store_once_from_the_gguf_without_a_dense_copy(tmp_path, monkeypatch):
    from specviz.commands import prepare
    from specviz.models import preparing
    from specviz.models.embedded import EmbeddedModel, converted_dir, is_converted

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("draft", "a test draft", (), "1", "m.gguf", 1, "f" * 64)
    conversions, lines = [], []

    def convert(*args, **kwargs):  # (float32, as the GGUF's values are read)
        conversions.append(args[0])
        return loaded(torch.float32, tmp_path), tiny_tokenizer()
    monkeypatch.setattr(preparing, "assemble", lambda m, progress=True: tmp_path / "m.gguf")
    monkeypatch.setattr(preparing, "from_pretrained", convert)
    # two at once make it once (threads: the lock is a file lock, as between processes)
    threads = [threading.Thread(target=lambda: preparing.prepare_store(model, torch.bfloat16, lines.append))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    folder = preparing.store_dir(model, torch.bfloat16)
    assert conversions == [str(tmp_path / "m.gguf")] and (folder / store.WEIGHTS).exists()
    assert not is_converted(model, torch.bfloat16) and not converted_dir(model, torch.bfloat16).exists()
    coded, tokenizer = preparing.stored_draft(model, torch.bfloat16, lines.append)
    assert sum("4-bit codes its draft step runs on (about" in line for line in lines) == 1
    assert len(conversions) == 1 and tokenizer.vocab_size > 0
    assert same_buffers(lean_draft(coded, INT4), lean_draft(loaded(torch.bfloat16, tmp_path), INT4))
    monkeypatch.setattr(prepare, "copies", lambda: [(model, torch.bfloat16, folder)])
    (listed,) = [line for line in prepare.status_lines(torch.bfloat16) if str(folder) in line]
    assert "4-bit codes" in listed


def test_a_draft_whose_linears_do_not_code_as_int4_has_no_store(tmp_path, monkeypatch):
    from specviz.models import preparing
    from specviz.models.embedded import EmbeddedModel

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("draft", "a test draft", (), "1", "m.gguf", 1, "f" * 64)
    monkeypatch.setattr(preparing, "assemble", lambda m, progress=True: tmp_path / "m.gguf")
    monkeypatch.setattr(preparing, "from_pretrained", lambda *a, **k: (tiny_model(0, 60), tiny_tokenizer()))
    assert preparing.stored_draft(model, torch.bfloat16, lambda line: None) is None  # (a head of 60 rows)
    assert not preparing.store_dir(model, torch.bfloat16).exists()


def test_a_store_that_cannot_be_read_is_one_sentence_naming_the_mend(tmp_path, monkeypatch):
    from specviz.models import preparing
    from specviz.models.converted import write_manifest
    from specviz.models.embedded import EmbeddedModel, EmbeddedModelError

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("draft", "a test draft", (), "1", "m.gguf", 1, "f" * 64)
    folder = preparing.store_dir(model, torch.bfloat16)
    folder.mkdir(parents=True)
    (folder / store.WEIGHTS).write_bytes(b"not a safetensors file")
    tiny_model(0, 64).config.save_pretrained(folder)
    write_manifest(folder, model.sha256)
    with pytest.raises(EmbeddedModelError, match=r"cannot be read .*specviz prepare --verify"):
        preparing.stored_draft(model, torch.bfloat16, lambda line: None)
