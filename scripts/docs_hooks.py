"""MkDocs hooks (mkdocs.yml `hooks:`): serve the screenshots and the JSON reports under assets/ beside the pages,
at the same paths (`assets/screenshots/live.png`, `assets/bench/NAME.json`), without copying them into docs/.
Pages link to them as files of the site, so `mkdocs build --strict` checks every such link."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
# every report folder, so that a page may link any report (a list by hand missed a new folder once)
SERVED = ("assets/screenshots/*.png", "assets/proof/*.html", "assets/*/*.json", "assets/bench/before/*.json",
          "assets/gpu/*.log",
          "assets/charts/*.svg")


def on_files(files, config):
    for pattern in SERVED:
        for path in sorted(ROOT.glob(pattern)):
            files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    return files
