"""The docs site: its generated pages are what scripts/docs.py makes, the reference pages follow the settings specs
and the endpoints, and every number on a benchmark page is a value of a JSON report the page read.

(`make test` also builds the site with `mkdocs build --strict`: broken links, missing pages and anchors fail there.)
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the generator's parts, as scripts/docs.py imports them when run
from docsgen import about, api_reference, architecture, cli_reference, generated, machines, render  # noqa: E402
from docsgen.paths import TEMPLATES  # noqa: E402
from docsgen.reports import REPORTS  # noqa: E402

# the templates whose every number must come from a report (other templates mix in constants of the method, such as
# a test's sample counts; their measured numbers come from reports all the same)
PAGES = ("benchmarks.md",)  # the benchmark page: many numbers
GUIDES = ("teach.md", "demo.md", "your-prompts.md")  # prose, with formulas as code and numbered steps
STRICT = (*PAGES, "_headline.md", "_shot.md", *GUIDES)
FRONT = ("_headline.md", "_shot.md", *GUIDES)  # what the README and the guides render
MACROS = ("_costs_table.md",)  # tables other templates fill: no number typed in them either


@pytest.fixture(scope="module")
def parser():
    return cli_reference.build_parser()


@pytest.fixture(scope="module")
def endpoints():
    return api_reference.served_endpoints()


# ---- numbers on a page, and where they may come from --------------------------------------------------------------

DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")
RUN = re.compile(r"\d[\d,.]*\d|\d")


def numbers(text: str) -> list[tuple[str, str]]:
    """(number, unit) for every number a reader would take as one: not digits inside a word (bf16, T1, top-2,
    cpu2_zen4, Qwen2.5), not inside a link's target; dates and versions are returned whole (unit "text")."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets: file names
    out = [(m, "text") for m in DATE.findall(text) + VERSION.findall(text)]
    text = VERSION.sub(" ", DATE.sub(" ", text))
    for m in RUN.finditer(text):
        before, after = text[m.start() - 2:m.start()], text[m.end():m.end() + 4]
        if re.search(r"\w$", before) or re.match(r"\w", after) or re.fullmatch(r"\w[-−]", before):
            continue  # part of a word
        run = m.group()
        unit = next((u for u in ("%", " %", " ms", " GB", " min") if after.startswith(u)), "").strip()
        parts = [run.replace(",", "")] if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", run) else run.split(",")
        out += [(p, unit) for p in parts if p and p != "."]
    return out


def prose_numbers(text: str) -> list[tuple[str, str]]:
    """`numbers` of a page's prose: not in code (commands, formulas written as code) and not a list's ordinals."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"^(\s*)\d+\. ", r"\1", text, flags=re.M)
    return numbers(text)


def report_values(paths: list[Path]) -> tuple[list[float], set[str]]:
    """Every number in these reports: numeric values, lengths of lists, and the numbers written inside strings and
    keys (a command's flags, a setting's name such as `k=8 c=0.4`, a version)."""
    values, texts = [], set()

    def walk(x):
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, (int, float)):
            values.append(float(x))
        elif isinstance(x, str):
            texts.update(re.findall(r"\d+(?:\.\d+)*", x))
            texts.update(DATE.findall(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(str(k))
                walk(v)
        elif isinstance(x, list):
            values.append(float(len(x)))
            for v in x:
                walk(v)

    for path in paths:
        report = json.loads(path.read_text(encoding="utf-8"))
        walk(report)
        walk(derived(report))
    return values, texts


def derived(report) -> list[float]:
    """The figures a claim computes from a report's own (`docsgen.claims`: its decoding rates, a kind's median, a
    ratio of two rates), which a page may show beside the report's values."""
    from docsgen import claims

    if not isinstance(report, dict) or "runs" not in report or "methods" not in report:
        return []
    rates = claims.rates(report)
    kinds = [claims.by_example(report, name) for name in claims.EXAMPLE_KINDS]
    return [*rates.values(), *(k["median"] for k in kinds if k),
            *(a / b for a in rates.values() for b in rates.values() if b)]


def found(number: str, unit: str, values: list[float], texts: set[str]) -> bool:
    if number in texts or number.lstrip("0") in texts:
        return True
    if unit == "text":
        return False
    shown = float(number)
    digits = len(number.split(".")[1]) if "." in number else 0
    scales = {"%": [100.0], "ms": [1.0, 1000.0], "GB": [1.0, 1e-9], "min": [1 / 60]}.get(unit, [1.0])
    for v in values:
        for scale in scales:
            x = abs(v) * scale
            if digits == 0 and not unit:
                if x == shown:  # a count or a setting is shown whole: no rounding
                    return True
            elif abs(round(x, digits) - shown) < 1e-9 or f"{x:.{digits}f}" == number:
                return True
    return False


# ---- the tests ----------------------------------------------------------------------------------------------------

def test_committed_pages_are_what_the_generator_makes(parser, endpoints):
    stale = generated.stale(generated.pages(parser, endpoints))
    assert not stale, (f"{', '.join(str(p.relative_to(ROOT)) for p in stale)}: not what scripts/docs.py makes; "
                       "run `make docs` (or .venv/bin/python scripts/docs.py) and commit the pages")


def test_the_cli_and_api_references_follow_a_spec_field(parser, endpoints, monkeypatch):
    """Change a settings spec's field (its help and its default) in place: both reference pages change with it."""
    from specviz.engine import DecodeConfig

    before_cli, before_api = cli_reference.cli_page(parser), api_reference.api_page(endpoints)
    assert f"| `--k` | `K` | `{DecodeConfig().k}` | tokens drafted per round" in before_cli
    field = DecodeConfig.__pydantic_fields__["top_n"]
    monkeypatch.setattr(field, "description", "candidates a test asked for")
    monkeypatch.setattr(field, "default", 7)
    after_cli = cli_reference.cli_page(cli_reference.build_parser())
    after_api = api_reference.api_page(api_reference.served_endpoints())
    assert after_cli != before_cli and after_api != before_api
    assert re.search(r"\| `--top-n` \| `TOP_N` \| `7` \| candidates a test asked for \(1\.\.50; default: 7\) \|",
                     after_cli)
    # (the API's defaults are the served app's, `register(defaults=...)`; its help is the spec's)
    assert re.search(r"\| `top_n` \| int \| `\d+` \| between 1 and 50: candidates a test asked for \|", after_api)
    changed = {line for line in after_cli.splitlines()} - set(before_cli.splitlines())
    assert changed and all("--top-n" in line for line in changed)  # every command that takes it, and nothing else


def test_every_command_and_flag_is_on_the_cli_page(parser):
    page = cli_reference.cli_page(parser)

    def walk(path, p):
        for action in p._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in page, f"{' '.join(path)} {option} is missing from the CLI reference"
        for name, _, sub in cli_reference.subcommands(p):
            assert f"## `{' '.join([*path, name])}`" in page or f"### `{' '.join([*path, name])}`" in page
            walk([*path, name], sub)

    walk([parser.prog], parser)


def test_every_endpoint_and_parameter_is_on_the_api_page(endpoints):
    import inspect

    page = api_reference.api_page(endpoints)
    assert {e.name for e in endpoints} >= {"generate", "race", "same_distribution", "load_pair", "replay", "info",
                                           "whatif", "share_html"}
    for e in endpoints:
        assert f"## `/{e.name}`" in page
        for name in inspect.signature(e.fn).parameters:
            if name != "request":
                assert f"| `{name}` |" in page, f"/{e.name}: {name} is missing"


@pytest.mark.parametrize("template", STRICT + MACROS)
def test_no_number_is_typed_into_a_benchmark_template(template):
    """In a benchmark template, every number is printed by an expression that reads a report: outside {{ }},
    {% %} and {# #} there is none (words with digits, such as bf16 or T1, are words)."""
    source = (TEMPLATES / template).read_text(encoding="utf-8")
    literal = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", source, flags=re.S)
    typed = [n for n, _ in (prose_numbers if template in GUIDES else numbers)(literal)]
    assert not typed, f"{template}: numbers typed by hand: {typed}"


@pytest.mark.parametrize("template", STRICT)
def test_every_number_on_a_benchmark_page_is_a_report_value(template):
    """Each number the page shows is a value of one of the reports it read, at the precision shown (or that value
    in % / ms / GB), or is written in one of their strings (a command, a setting's name, a date)."""
    rendered = render.render(template, docs="")
    assert rendered.reports, f"{template} read no report"
    values, texts = report_values(rendered.reports)
    shown = (prose_numbers if template in GUIDES else numbers)(rendered.text)
    assert len(shown) > (20 if template in PAGES + GUIDES else 3)
    missing = [f"{n}{u if u != 'text' else ''}" for n, u in shown if not found(n, u, values, texts)]
    assert not missing, f"{template}: numbers in no report it read: {missing}"


def test_the_number_check_catches_a_number_no_report_holds():
    rendered = render.render("_headline.md", docs="")
    values, texts = report_values(rendered.reports)
    from docsgen import claims

    fp32 = json.loads(claims.newest("float32").read_text())["summary"]["speedup"]
    assert found(f"{fp32:.2f}", "", values, texts) and found("68", "%", [0.6835], set())
    assert not found("1977.5", "", values, texts)
    assert numbers("bf16 at T1 on top-2, K = 8, 1,153 tokens, 68% of 3.09 GB") == [
        ("8", ""), ("1153", ""), ("68", "%"), ("3.09", "GB")]


def test_every_run_is_named_by_its_own_metadata():
    """The paragraph under a benchmark table takes the machine, the date, the command and the settings from the
    report itself."""
    for template in STRICT:
        for path in render.render(template, docs="").reports:
            if path.parent == REPORTS["data"]:
                continue  # the package's fitted predictor, read for its coefficients: not a run
            report = json.loads(path.read_text(encoding="utf-8"))
            meta = report["meta"]
            assert meta.get("date") and meta.get("machine", {}).get("cpu"), f"{path.name}: no date or machine"
            text = about.about(report, path.name)
            assert meta["date"] in text and machines.name(meta["machine"]) in text and path.name in text
            if meta.get("command"):
                assert meta["command"] in text


def test_the_front_door_and_the_guides_read_only_reports_that_name_their_own_run():
    """No report behind the README or a guide has its date, machine or command typed in afterwards."""
    for template in FRONT:
        for path in render.render(template, docs="").reports:
            text = path.read_text(encoding="utf-8")
            report = json.loads(text) if path.suffix == ".json" else {}
            meta = report.get("meta", {})
            assert "README" not in json.dumps(meta.get("provenance", report.get("provenance", ""))), path.name
            assert meta.get("date") and (meta.get("command") or meta.get("args")), f"{path.name}: no command of its own"


def test_the_readme_is_a_front_door_with_no_number_typed_outside_its_generated_regions():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120
    typed = [n for n, _ in prose_numbers(render.REGION.sub("", readme))]
    assert not typed, f"numbers typed into the README: {typed}"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for guide in ("teach.md", "demo.md", "your-prompts.md"):
        assert f": {guide}" in nav and f"(docs/{guide})" in readme, guide


def test_the_architecture_page_lists_every_module_as_its_docstring_describes_it():
    page = render.render("_modules.md", docs="").text
    for path in (ROOT / "specviz").rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc, f"{path}: no docstring to describe it"
        assert f"| `{path.name}` | {architecture.summary_line(doc)}" in page, path
    # every layer of the contract, on a line of its own (read here, not from the generator: a hand list went stale)
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    stack = next(c["layers"] for c in contracts if c["type"] == "layers")
    assert len(stack) >= 3  # the contract was found
    for layer in stack:
        assert f"\n{layer.replace('specviz.', '')}\n" in page, layer


def test_a_new_bench_report_names_its_command_from_the_flags_it_ran_with():
    meta = {"args": {"k": "6,8", "confidence": "0.3,0.4", "compare_hf": True, "reps": 1, "json": "out.json"}}
    assert about.command_of(meta) == "specviz bench --compare-hf --json out.json --k 6,8 --confidence 0.3,0.4"


def test_the_readme_headline_is_a_generated_region():
    """The README's small table (once the README has the markers) is the headline partial, rendered afresh: a stale
    copy between the markers is replaced."""
    text = "intro\n<!-- docs.py: _headline.md -->\n| stale | 123.45× |\n<!-- /docs.py -->\nafter\n"
    out = render.with_regions(text, docs="docs/")
    assert "123.45" not in out and out.startswith("intro\n<!-- docs.py: _headline.md -->\n")
    assert out.endswith("<!-- /docs.py -->\nafter\n")
    from docsgen import claims

    summary = json.loads(claims.newest("headline").read_text())["summary"]
    low, high = summary["speedup_ci95"]
    assert "(docs/benchmarks.md)" in out and f"**{summary['speedup']:.2f}×** [{low:.2f}, {high:.2f}]" in out
    assert "(assets/charts/headline.svg)" in out  # the chart, made from the same reports
    assert render.with_regions(out, docs="docs/") == out


def test_docs_py_runs_as_a_script():
    """`make docs` and `make test` run the file itself: docsgen/ beside it imports as a package."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--check" in out


def cited() -> dict[str, list[Path]]:
    """Every page's reports: the templates' and the README's generated regions'."""
    from docsgen.render import REGION

    pages = {t: render.rendered_page(t).reports for t in render.template_pages()}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages["README.md"] = [p for m in REGION.finditer(readme) for p in render.render(m.group("partial"), docs="").reports]
    return pages


def test_no_page_cites_a_bench_run_a_newer_one_of_its_kind_supersedes():
    """A page shows the newest run of each kind (machine, precision, what was measured), or an older one beside it."""
    from docsgen.reports import stale_citations

    stale = {page: s for page, used in cited().items() if (s := stale_citations(used))}
    assert not stale, f"pages citing superseded runs: {stale}"


def test_the_staleness_check_catches_a_page_citing_an_older_run_alone(tmp_path):
    """The negative control: a copy of a cited run dated later makes the original stale, cited alone; beside its
    newer one it is a before and after."""
    from docsgen.reports import REPORTS, stale_citations

    name = "cpu2_zen4_bf16_1128.json"
    report = json.loads((REPORTS["bench"] / name).read_text())
    (tmp_path / name).write_text(json.dumps(report))
    newer = tmp_path / "later.json"
    newer.write_text(json.dumps({**report, "meta": {**report["meta"], "date": "2099-01-01"}}))
    assert stale_citations([tmp_path / name], tmp_path) == [f"{name} (superseded by later.json)"]
    assert stale_citations([tmp_path / name, newer], tmp_path) == []
    other = {**report, "meta": {**report["meta"], "date": "2099-01-01", "args": {**report["meta"]["args"], "k": 4}}}
    newer.write_text(json.dumps(other))  # another kind (K = 4): not newer of the same
    assert stale_citations([tmp_path / name], tmp_path) == []


def test_every_page_labels_a_decode_only_figure_as_its_own_measure():
    """One measure per comparison: specviz's rates and speedups are end to end; a decode-only one (a report's
    decode… field, as vLLM's decode rate) is only shown where its paragraph or table says "decode"."""
    from docsgen.reports import unlike_measures

    unlike = {t.name: p for t in sorted(TEMPLATES.glob("*.md")) if (p := unlike_measures(t.read_text()))}
    assert not unlike, f"decode-only figures quoted with no label beside end-to-end ones: {unlike}"


def test_the_like_for_like_check_catches_a_decode_only_figure_passed_off_as_end_to_end():
    """The negative control: a decode-only speedup beside an end-to-end one with no label is caught, with the label it
    passes; and a table row that says "decoding" in its header passes, caught once the word is taken out."""
    from docsgen.reports import unlike_measures

    mixed = "specviz {{ b.summary.speedup | x }} and vLLM {{ v.summary.decode_speedup | x }} here.\n\nAnother paragraph."
    assert unlike_measures(mixed) == ["v.summary.decode_speedup | x"]
    assert unlike_measures(mixed.replace("vLLM", "vLLM's decode rate")) == []
    table = ("| lane | decoding tok/s | end to end tok/s |\n|---|---|---|\n"
             "| speculative | {{ l.decode_tokens_per_s | f }} | {{ l.end_to_end_tokens_per_s | f }} |\n")
    assert unlike_measures(table) == []
    assert unlike_measures(table.replace("decoding tok/s", "tok/s")) == ["l.decode_tokens_per_s | f"]
