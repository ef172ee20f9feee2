"""Write the docs' generated pages, or check that the committed ones are what it makes.

    .venv/bin/python scripts/docs.py            # write them (`make docs` runs this, then `mkdocs build --strict`)
    .venv/bin/python scripts/docs.py --check    # exit 1 naming every page that differs (`make test`)

Nothing on these pages is typed by hand (the parts in scripts/docsgen/):
- `docs/reference/cli.md`: every command, flag, default and range, from the parsers `specviz.cli.build_parser`
  builds (the settings specs' options among them), as `specviz COMMAND --help` shows them (`cli_reference`);
- `docs/reference/api.md`: every JSON endpoint, from the functions `specviz.api.endpoints.register` adds to a
  Blocks (their signatures and descriptions, as `gradio_client`'s `view_api()` reads them) (`api_reference`);
- the pages rendered from `docs/templates/*.md` (Jinja, `render`): their numbers are values read from the JSON
  reports under `assets/` (`bench(name)`, `proof(name)`, `atlas(name)`: `reports`), and each run is described by
  its report's own metadata (`about(report)`: machine, date, command, settings); the architecture page's map of
  modules and layers comes from their docstrings and pyproject.toml (`architecture`);
- regions of hand-written files between `<!-- docs.py: _partial.md -->` and `<!-- /docs.py -->` (the README's
  headline table): the partial rendered there.
`tests/test_docs.py` checks that the committed pages are these, that the reference pages follow the specs,
and that every number on a benchmark page is a value of a report it read.
"""

from __future__ import annotations

import argparse
import sys

# (run as a script, this file's folder is on sys.path: docsgen/ beside it imports as a package)
from docsgen.generated import pages, stale
from docsgen.paths import ROOT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed page differs")
    args = ap.parse_args(argv)
    generated = pages()
    differ = stale(generated)
    if args.check:
        for p in differ:
            print(f"docs: {p.relative_to(ROOT)} is not what scripts/docs.py makes: run `make docs` and commit it",
                  file=sys.stderr)
        return 1 if differ else 0
    for p in differ:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(generated[p], encoding="utf-8")
        print(f"docs: wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
