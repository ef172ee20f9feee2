"""Each claim once: every comparison the pages make is read from the newest report of its kind
(`scripts/docsgen/claims.py`), its direction words come from its figures, and no page types a measured figure by
hand. Each check has a planted negative control that it must catch."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the generator's parts, as scripts/docs.py imports them when run
from docsgen import claims, render  # noqa: E402
from docsgen.paths import DOCS, TEMPLATES  # noqa: E402
from docsgen.reports import REPORTS  # noqa: E402

CLAIMS = sorted(p.name for p in TEMPLATES.glob("_claim_*.md"))

# ---- a measured figure typed by hand ------------------------------------------------------------------------------

# a number with the unit of something measured: a speedup, a rate, a time, a size, a share
MEASURED = re.compile(r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?\s?(?:×|x\b|tok/s|ms\b|s\b|min\b|GB\b|GiB\b|MB\b|kB\b|%|"
                      r"TB/s|GB/s)")
EXPRESSION = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
# pages that still type measured figures by hand, with how many: none now; a count may only fall, never be added
DEBT: dict[str, int] = {}


def hand_typed(text: str) -> list[str]:
    """The measured figures in a page's own words: outside generated regions, template expressions, code blocks and
    link targets."""
    text = render.REGION.sub("", text)
    text = EXPRESSION.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return [m.group(0) for m in MEASURED.finditer(text)]


def hand_written() -> dict[str, str]:
    """Every page's own text: the templates, and the docs pages (and README) that no template makes."""
    made = {p.name for p in TEMPLATES.glob("*.md")}
    pages = {p.name: p.read_text(encoding="utf-8") for p in TEMPLATES.glob("*.md")}
    pages |= {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md") if p.name not in made}
    pages["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    return pages


def test_no_page_types_a_measured_figure_by_hand():
    typed = {name: figures for name, text in hand_written().items() if (figures := hand_typed(text))}
    over = {name: f for name, f in typed.items() if len(f) > DEBT.get(name, 0)}
    assert not over, f"measured figures typed by hand (render them from a report: scripts/docsgen/claims.py): {over}"


def test_the_hand_typed_check_catches_a_planted_figure():
    """The negative control: a figure typed into a page's prose (or a template's words) is caught; the same figure
    printed by an expression, or inside a generated region or a code block, is not."""
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert hand_typed(page) == []
    planted = page.replace("## Running", "On our Xeon speculation ran at 1.31x, 19.66 tok/s.\n\n## Running")
    assert hand_typed(planted) == ["1.31x", "19.66 tok/s"]
    assert hand_typed("It ran {{ r.summary.speedup | x }} here.") == []
    assert hand_typed("```bash\nspecviz bench  # 1.87x\n```\n<!-- docs.py: _x.md -->\n2.0x\n<!-- /docs.py -->\n") == []
    assert hand_typed("bf16 at T1, top-2, Qwen2.5 1.5B, K = 12") == []


# ---- the newest report of each kind -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(claims.KINDS))
def test_each_claim_reads_the_newest_report_of_its_kind(name):
    kind = claims.KINDS[name]
    admitted = claims.admitted(name)
    for path in admitted:
        assert claims.order(path) <= claims.order(admitted[-1])
    partial = f"_claim_{name}.md"
    if partial in CLAIMS:
        used = render.render(partial, docs="").reports
        mine = [p for p in used if p.parent == REPORTS[kind.folder] and kind.admits(json.loads(p.read_text()))]
        assert not admitted or admitted[-1] in mine, f"{partial} does not read {admitted[-1].name}"


def cited() -> dict[str, list[Path]]:
    """Every page's reports: the templates' and the generated regions' of hand-written pages and the README."""
    pages = {t: render.rendered_page(t).reports for t in render.template_pages()}
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        if path.name in pages:
            continue
        text = path.read_text(encoding="utf-8")
        pages[path.name] = [p for m in render.REGION.finditer(text)
                            for p in render.render(m.group("partial"), docs="").reports]
    return pages


# the record of runs: it shows older runs of a kind beside their newest (a before and after)
RECORD = ("benchmarks.md",)


def test_no_page_renders_an_older_report_than_the_newest_of_its_kind():
    older = {page: o for page, used in cited().items()
             if page not in RECORD and (o := claims.older_than_newest(used))}
    assert not older, f"pages quoting a report older than the newest of its kind: {older}"


def test_the_record_pages_show_the_newest_beside_any_older_run():
    """benchmarks.md may show older runs, but only beside the newest of their kind."""
    older = {page: o for page, used in cited().items() if page == "benchmarks.md" and (o := claims.older_than_newest(used))}
    assert not older, older


def test_a_newer_report_replaces_the_older_on_every_claim(tmp_path, monkeypatch):
    """The negative control: plant a copy of the headline's report dated later; the claim now reads it, and a page
    that still reads the original alone is caught (beside the newer one, it is a before and after)."""
    original = claims.newest("headline")
    report = json.loads(original.read_text())
    for p in REPORTS["bench"].glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    planted = tmp_path / "zz_planted.json"
    report["meta"] = {**report["meta"], "date": "2099-01-01"}
    report["summary"] = {**report["summary"], "speedup": 9.87}
    planted.write_text(json.dumps(report))
    assert claims.newest("headline", tmp_path) == planted
    copy = tmp_path / original.name
    assert claims.older_than_newest([copy], {"bench": tmp_path}) == [
        f"{original.name} (headline: newer zz_planted.json)", f"{original.name} (transformers: newer zz_planted.json)"]
    assert claims.older_than_newest([copy, planted], {"bench": tmp_path}) == []
    # and the page renders the planted one
    monkeypatch.setattr(claims, "REPORTS", {**REPORTS, "bench": tmp_path})
    assert "**9.87×**" in render.render("_claim_headline.md", docs="").text


def test_a_report_of_another_kind_does_not_replace_the_claim(tmp_path):
    original = claims.newest("headline")
    report = json.loads(original.read_text())
    shutil.copy(original, tmp_path / original.name)
    other = {**report, "meta": {**report["meta"], "date": "2099-01-01", "args": {**report["meta"]["args"], "k": 4}}}
    (tmp_path / "later_k4.json").write_text(json.dumps(other))
    assert claims.newest("headline", tmp_path) == tmp_path / original.name


# ---- which way a comparison goes ----------------------------------------------------------------------------------

def test_direction_words_come_from_the_figure_and_its_interval():
    assert claims.verdict(1.35, [1.18, 1.57]).pays == "pays" and claims.verdict(1.35, [1.18, 1.57]).faster == "faster"
    assert claims.verdict(0.8, [0.7, 0.9]).pays == "loses" and claims.verdict(0.8, [0.7, 0.9]).beat == "lost to"
    assert claims.verdict(1.1, [0.95, 1.3]).sign == 0  # the interval holds 1: neither
    assert claims.verdict(1.04).faster_than == "about as fast as"  # no interval: within the band of 1
    assert claims.verdict(0.81).paid == "lost" and claims.verdict(1.58).faster_than == "faster than"


DIRECTION = re.compile(r"\b(pays|paid|loses|lost|faster|slower|beat|wins|fastest)\b")


def typed_directions(template: str) -> list[str]:
    """Direction words a claim block types outside its expressions ("the faster of" two baselines is a definition)."""
    words = EXPRESSION.sub(" ", template).replace("the faster of", "")
    return DIRECTION.findall(words)


@pytest.mark.parametrize("partial", CLAIMS)
def test_a_claim_block_types_no_direction_word(partial):
    assert typed_directions((TEMPLATES / partial).read_text(encoding="utf-8")) == []


def test_the_direction_check_catches_a_typed_verdict():
    """The negative control: a block saying "speculation loses there" in its own words is caught."""
    block = (TEMPLATES / "_claim_int4.md").read_text(encoding="utf-8")
    assert typed_directions(block + "\nOn llama.cpp speculation loses there.\n") == ["loses"]


def test_machines_are_named_as_a_person_knows_them():
    from docsgen import machines

    assert machines.name({"described": "Intel(R) Xeon(R) Processor (family 6 model 207; AVX-512, AVX512-BF16, AMX), "
                                       "2 cores, 24 GiB", "cpu_count": 2}) == "Intel Xeon (Emerald Rapids, 2 cores, AMX)"
    assert machines.name({"described": "AMD EPYC (family 25 model 17; AVX-512, AVX512-BF16, no AMX), 2 cores, 24 GiB"}
                         ) == "AMD EPYC (Zen 4, 2 cores, AVX512-BF16, no AMX)"
    assert machines.name({"described": "an AMD EPYC Zen 4 (AVX-512 with AVX512-BF16, no AMX), 24 GiB, no GPU",
                          "cpu_count": 2}) == "AMD EPYC (Zen 4, 2 cores, AVX512-BF16, no AMX)"  # an older report's words
    assert machines.name({"described": "AMD EPYC Zen 5 (family 26 model 2; AVX-512, AVX512-BF16, no AMX), 2 cores"}
                         ) == "AMD EPYC (Zen 5, 2 cores, AVX512-BF16, no AMX)"
    assert "without AVX-512" in machines.name({"described": "AMD EPYC (family 25 model 17; AVX-512, AVX512-BF16, no "
                                                            "AMX), 2 cores, 24 GiB, run below AVX-512 (x=avx2)"})
