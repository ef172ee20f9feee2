"""Rank the embedded pair's vocabulary by how often each token occurs in a corpus every Python install has.

The draft's head can be cut to the N most frequent tokens (FR-Spec; `--draft-vocab N`): its q is then a
distribution over those N, exactly zero elsewhere, and the rule stays exact. Which tokens are frequent is read
from a corpus chosen apart from the bench's prompts (ranking on them would tune the draft on the report): the
Python standard library's sources, code with English docstrings and comments, and its help topics (English prose,
`pydoc_data/topics.py`). The special tokens (end of turn, end of text) come first: the draft must be able to stop.
Tokens the corpus never shows are not listed: a cut past the ranking takes them in id order (BPE merge order:
roughly the tokenizer's own frequency order; `models/draft/vocab.ranked_ids`).

    .venv/bin/python scripts/rank_draft_vocab.py          # writes specviz/data/draft_vocab.json
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

from specviz.models.draft.vocab import RANKING, tokenizer_digest
from specviz.models.embedded import DRAFT, converted_dir
from specviz.runs.outputs import write_atomic

# left out: test suites, codec tables, the IDE and 2to3's grammar fixtures (their strings are noise, not language)
LEFT_OUT = {"test", "tests", "site-packages", "encodings", "idlelib", "lib2to3", "__pycache__"}


def corpus_files(stdlib: Path) -> list[Path]:
    """The standard library's sources (about 10 MB), in path order."""
    return sorted(p for p in stdlib.rglob("*.py") if not LEFT_OUT & set(p.parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, default=converted_dir(DRAFT) / "tokenizer.json")
    parser.add_argument("--out", default=str(RANKING))
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = corpus_files(stdlib)
    texts = [path.read_text(errors="replace") for path in files]
    size = sum(map(len, texts))
    counts = collections.Counter(t for enc in tokenizer.encode_batch(texts, add_special_tokens=False) for t in enc.ids)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    special = sorted(tokenizer.get_added_tokens_decoder())
    seen = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t not in special]
    report = {
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "corpus": f"Python {sysconfig.get_python_version()} standard library sources ({len(files)} files; left out: "
                  f"{', '.join(sorted(LEFT_OUT))}): {size:,} characters, {sum(counts.values()):,} tokens, "
                  f"{len(counts):,} distinct",
        "corpus_sha256": hashlib.sha256("".join(texts).encode()).hexdigest(),
        "special": len(special),
        "seen": len(seen),
        "vocab": vocab,
        "ranked": special + seen,
    }
    write_atomic(args.out, json.dumps(report, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {report['corpus']}; {len(special)} special tokens first, then {len(seen):,} seen")


if __name__ == "__main__":
    main()
