"""The words: every term a newcomer meets (p, q, β, c, lane, AR, GGUF, row-invariant, ...) is defined in the
glossary, and each page links the glossary no later than the paragraph of the term's first use; machines are named as
a person knows them, the CPUID left to the reports. Each check with a planted control."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# a term, how a page writes it, and how the glossary defines it (a bold entry)
TERMS = {
    "p and q": (r"\bp\(x\)|\bp/q\b|\bp and q\b|\bp, q\b|\bp and its\b", r"\*\*p\*\* and \*\*q\*\*"),
    "β": (r"β", r"\*\*β\*\*"),
    "c": (r"(?<![\w.'’/-])c(?= =| is\b|, the draft|\))|\(c\b", r"\*\*c\*\*"),
    "lane": (r"\blanes?\b", r"\*\*Lane\*\*"),
    "AR": (r"\bAR\b", r"\*\*AR\*\*"),
    "GGUF": (r"\bGGUF\b", r"\*\*GGUF\*\*"),
    "row-invariant": (r"\b(?:row-)?invariant\b", r"\*\*Row-invariant verify\*\*"),
    "greedy": (r"\b[Gg]reedy\b", r"\*\*Greedy\*\*"),
    "TV": (r"\bTV\b", r"\*\*TV\*\*"),
    "near-tie": (r"\bnear-ties?\b", r"\*\*Near-tie\*\*"),
    "prefill": (r"\b[Pp]refill\b", r"\*\*Prefill\*\*"),
}
# the pages a newcomer reads (the generated references are tables of flags and endpoints; the glossary is the source)
PAGES = [ROOT / "README.md", *(p for p in sorted(DOCS.glob("*.md")) if p.name != "glossary.md")]
GLOSSARY_LINK = re.compile(r"\]\((?:docs/)?glossary\.md(?:#[^)]*)?\)")


def paragraphs(text: str) -> list[str]:
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def undefined_at_first_use(text: str) -> list[str]:
    """The terms a page uses before (in an earlier paragraph than) its first link to the glossary."""
    paras = paragraphs(text)
    link = next((i for i, p in enumerate(paras) if GLOSSARY_LINK.search(p)), len(paras))
    out = []
    for term, (used, _) in TERMS.items():
        first = next((i for i, p in enumerate(paras) if re.search(used, p)), None)
        if first is not None and first < link:
            out.append(f"{term} (paragraph {first + 1}: {paras[first].strip()[:80]!r})")
    return out


def test_the_glossary_defines_every_term():
    glossary = (DOCS / "glossary.md").read_text(encoding="utf-8")
    missing = [term for term, (_, defined) in TERMS.items() if not re.search(defined, glossary)]
    assert not missing, f"terms the glossary does not define: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_term_is_used_before_the_page_links_the_glossary(page):
    assert undefined_at_first_use(page.read_text(encoding="utf-8")) == []


def test_the_term_check_catches_a_term_used_before_the_link():
    """The negative control: β used in the first paragraph, the glossary linked only in the second."""
    text = "Each drafted token shows β.\n\nThe words: [Glossary](glossary.md).\n"
    assert [t.split(" ")[0] for t in undefined_at_first_use(text)] == ["β"]
    assert undefined_at_first_use("The words: [Glossary](glossary.md).\n\nEach drafted token shows β.\n") == []
    assert [t.split(" ")[0] for t in undefined_at_first_use("The target's p and q, then [the words](glossary.md).\n\n"
                                                             "x\n\nThe AR lane.\n")] == []
    assert "AR" in " ".join(undefined_at_first_use("The AR lane.\n\n[the words](glossary.md)\n"))


CPUID = re.compile(r"family \d+ model \d+")


@pytest.mark.parametrize("page", [*PAGES, DOCS / "glossary.md"], ids=lambda p: p.name)
def test_machines_are_named_as_a_person_knows_them_not_by_cpuid(page):
    text = re.sub(r"\]\([^)]*\)", "]", page.read_text(encoding="utf-8"))  # a link to a report may name it
    assert CPUID.findall(text) == [], f"{page.name} names a machine by its CPUID; machines.name() says it in words"


def test_the_cpuid_check_catches_one():
    assert CPUID.findall("*Run*: 2026-11-29, Intel(R) Xeon(R) Processor (family 6 model 207; AVX-512)") == [
        "family 6 model 207"]
