"""The Atlas (issue 30): the aggregation on hand-made rounds with known answers, the token classes, the lookup
replay against a live lookup run, bad input (one sentence each, the valid prompts still run), the budget and
a stop keeping what was made, and the CLI on the tiny pair writing HTML, JSON, rejections and traces."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import slow_target

from specviz import cli
from specviz.analysis.atlas import ClassRow, count, findings
from specviz.analysis.atlas_advice import Setting, advice
from specviz.analysis.lookup_replay import replay_hybrid, replay_lookup, summarise
from specviz.analysis.predict import CostModel
from specviz.analysis.rejections import PromptRun, record, rejections
from specviz.analysis.token_classes import token_class
from specviz.engine import DecodeConfig, speculative_generate
from specviz.engine.events import (
    ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, DraftedToken, EmittedToken, Round, round_from_dict,
)
from specviz.models import PairSpec, encode_prompt
from specviz.runs import atlas as atlases
from specviz.runs.atlas_input import read_prompts
from specviz.runs.atlas_json import report_dict
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits
from specviz.serving.session import Session

# ---------------------------------------------------------------- hand-made rounds with known answers


def tok(tid: int, text: str, status: str, q_soft: float = 0.9, entropy: float | None = 0.05) -> DraftedToken:
    return DraftedToken(id=tid, text=text, q=1.0, p=float(status == ACCEPTED), accept_prob=float(status == ACCEPTED),
                        u=0.0, status=status, q_soft=q_soft, p_soft=0.5, target_top2_gap=1.0, q_entropy=entropy)


def emit(tid: int, text: str, kind: str = CORRECTION, draftable: bool = True) -> EmittedToken:
    return EmittedToken(tid, text, kind, 1.0, 1.0, 1.0, draftable=draftable)


def rnd(index: int, position: int, drafted: list[DraftedToken], emitted: EmittedToken | None, text: str = "") -> Round:
    n = sum(t.status == ACCEPTED for t in drafted)
    new = [t.id for t in drafted[:n]] + ([emitted.id] if emitted else [])
    return Round(index=index, drafter="model", k=len(drafted), drafted=drafted, n_accepted=n, emitted=emitted,
                 new_token_ids=new, position=position, text=text, draft_time=0.0, verify_time=0.0, overhead_time=0.0)


A, R, N = ACCEPTED, REJECTED, NOT_VERIFIED
CODE = PromptRun("a", "code", "write code", (1, 2, 3), (
    rnd(0, 0, [tok(10, "def", A), tok(11, " (", A, entropy=0.3), tok(12, " 1", R, 0.3, 1.5), tok(13, "x", N)],
        emit(20, "_x"), "def (_x"),
    rnd(1, 3, [tok(14, " the", A), tok(15, "\n", A), tok(16, " 42", A, entropy=0.6), tok(17, "<|im_end|>", A)],
        emit(21, " y", BONUS), "def (_x the\n 42 y"),
    rnd(2, 8, [tok(12, " 1", R, 0.2, 3.0), tok(18, "a", N), tok(19, "b", N), tok(22, "c", N)], emit(20, "_x"),
        "def (_x the\n 42 y_x"),
))
PROSE = PromptRun("b", "prose", "write prose", (4, 5), (
    rnd(0, 0, [tok(30, " la", R, 0.5, 0.7), tok(31, "d", N)], emit(40, " café", draftable=False), " café"),
))
CONFIG = DecodeConfig(k=4, max_new_tokens=9, adaptive="fixed")
COST = CostModel(target_step_s=1.0, draft_step_s=0.5, verify_s=(1.0,) * 9)


def test_counts_tokens_lost_and_the_order_of_the_prompts():
    f = findings([CODE, PROSE], COST)
    assert (f.totals.rounds, f.totals.tokens, f.totals.acceptance) == (4, 10, count(14, 6))
    assert [row.id for row in f.prompts] == ["b", "a"]  # worst (0 of 2 accepted) first
    a = f.prompts[1]
    assert a.acceptance == count(12, 6) and a.tokens_per_round == 3.0
    assert a.predicted_speedup == pytest.approx(9 / (3 * (4 * 0.5 + 1.0)))  # 9 tokens in 3 rounds of K = 4
    assert f.kinds == {"code": count(12, 6), "prose": count(2, 0)}
    # the rejected draft plus the never-verified drafts after it: 2 + 4 in the code run, 2 in the prose one
    assert [rej.lost for rej in rejections([CODE, PROSE])] == [2, 4, 2]


def test_where_in_the_round():
    w = findings([CODE, PROSE], COST).where
    assert w.by_position == (count(4, 2), count(2, 2), count(2, 1), count(1, 1))
    assert [(b.low, b.acceptance) for b in w.by_confidence] == [
        (pytest.approx(0.2), count(1, 0)), (pytest.approx(0.3), count(1, 0)), (pytest.approx(0.5), count(1, 0)),
        (pytest.approx(0.9), count(6, 6))]
    assert [(b.low, b.high, b.acceptance) for b in w.by_entropy] == [
        (0.0, 0.1, count(4, 4)), (0.1, 0.5, count(1, 1)), (0.5, 1.0, count(2, 1)), (1.0, 2.0, count(1, 0)),
        (2.0, 4.0, count(1, 0))]


def test_disagreements_are_ranked_by_tokens_lost_with_their_contexts():
    first, second = findings([CODE, PROSE], COST).disagreements
    assert (first.drafted.text, first.wanted.text, first.count, first.tokens_lost) == (" 1", "_x", 2, 6)
    assert [(e.prompt_id, e.round, e.context) for e in first.examples] == [
        ("a", 0, "def ("), ("a", 2, "def (_x the\n 42 y")]
    assert (second.drafted.id, second.wanted.id, second.count, second.tokens_lost) == (30, 40, 1, 2)


def test_token_classes_of_the_targets_tokens():
    f = findings([CODE, PROSE], COST)
    rows = {r.name: r for r in f.classes}
    assert rows["code"] == ClassRow("code", count(3, 1), 2, 6)  # "def" accepted, "_x" wanted twice
    assert rows["word"] == ClassRow("word", count(2, 1), 1, 2)  # " the" accepted, " café" wanted
    for name in ("punctuation", "whitespace", "number", "special"):
        assert rows[name] == ClassRow(name, count(1, 1), 0, 0), name
    assert f.undraftable == ClassRow("cannot propose", count(1, 0), 1, 2)


@pytest.mark.parametrize("text, expected", [
    ("    ", "whitespace"), ("\n\t", "whitespace"), (" 42", "number"), ("3.14", "number"), (" (", "punctuation"),
    ("):", "punctuation"), (" ->", "punctuation"), ("_intervals", "code"), (" self", "code"), ("isEmpty", "code"),
    (".split", "code"), (" the", "word"), ("ing", "word"), (" café", "word"), (" return", "word"),
    ("<|im_end|>", "special"), ("</s>", "special"), ("\x00", "special"),
])
def test_token_class(text, expected):
    assert token_class(text) == expected


def test_a_token_the_tokenizer_calls_special_is_special():
    assert token_class("hello", special=True) == "special"


def test_best_k_and_cut_per_kind_and_the_ceiling():
    a = advice([CODE, PROSE], CONFIG, COST)
    code, prose = a.kinds
    assert code.current == Setting(4, 0.0, pytest.approx(1.0))  # 9 tokens over 3 x (4 x 0.5 + 1)
    # a cut at 0.4 stops round 1 after its third draft and round 3 after its first: 9 tokens in 7 target steps
    assert code.best == Setting(4, 0.4, pytest.approx(9 / 7))
    assert code.whatif_best_k == 1  # a = 0.5, c = 0.5: E(K) / (K c + 1) falls from K = 1 on
    assert prose.best == Setting(1, 0.0, pytest.approx(1 / 1.5))
    assert (a.ceiling.k, a.ceiling.tokens_per_round) == (4, 5.0)
    assert a.ceiling.predicted_speedup == pytest.approx(5 / 3)


def test_hybrid_replay_uses_the_drafts_the_run_recorded():
    rounds = replay_hybrid(CODE.prompt_ids, CODE.rounds, CONFIG)
    assert [(r.k, r.n_accepted, r.new_token_ids) for r in rounds] == [
        (4, 2, (10, 11, 20)), (4, 4, (14, 15, 16, 17, 21)), (0, 0, (20,))]
    # at K = 2 a round reaches position 7, where the target added a bonus: the draft's proposal is unknown there
    rounds = replay_hybrid(CODE.prompt_ids, CODE.rounds, DecodeConfig(k=2, max_new_tokens=9, adaptive="fixed"))
    assert [(r.k, r.n_accepted, r.unknown) for r in rounds] == [(2, 2, False), (2, 2, False), (1, 1, True),
                                                                (0, 0, False)]
    assert summarise(rounds).unknown == 1


def test_lookup_replay_on_a_repeated_context():
    prompt, tokens = (1, 2, 3, 1, 2, 3), [1, 2, 3, 9, 5]
    run = rnd(0, 0, [tok(t, str(t), A) for t in tokens[:4]], emit(5, "5", BONUS))
    rounds = replay_lookup(prompt, [run], DecodeConfig(k=4, max_new_tokens=5, adaptive="fixed"))
    assert [(r.k, r.n_accepted, r.new_token_ids) for r in rounds] == [(3, 3, (1, 2, 3, 9)), (0, 0, (5,))]


@pytest.mark.parametrize("adaptive", ["fixed", "acceptance"])
def test_lookup_replay_equals_a_live_lookup_run(tiny, adaptive):
    ids = encode_prompt(tiny.tokenizer, "the man said that it was good and the man said that it was good")
    model = DecodeConfig(k=4, max_new_tokens=48, adaptive=adaptive)
    lookup = DecodeConfig(k=4, max_new_tokens=48, adaptive=adaptive, drafter="lookup")
    recorded = list(speculative_generate(tiny, ids, model))
    live = list(speculative_generate(tiny, ids, lookup))
    replayed = replay_lookup(ids, recorded, lookup)
    assert [(r.k, r.n_accepted, list(r.new_token_ids)) for r in replayed] == [
        (r.k, r.n_accepted, r.new_token_ids) for r in live]
    assert summarise(replayed).accepted > 0  # the prompt repeats itself: lookup has something to offer


def test_rejection_records_carry_the_context_and_both_top_lists():
    rej = rejections([CODE])[1]  # round 3: the context is the prompt and the 8 tokens emitted before it
    line = record(rej)
    assert line["context_ids"] == [1, 2, 3, 10, 11, 20, 14, 15, 16, 17, 21]
    assert (line["drafted"], line["emitted"], line["tokens_lost"]) == ({"id": 12, "text": " 1"},
                                                                      {"id": 20, "text": "_x"}, 4)
    assert record(rejections([CODE])[0])["context_ids"] == [1, 2, 3, 10, 11]  # after the round's accepted drafts


# ---------------------------------------------------------------- the entropy in the events


def test_the_entropy_is_the_drafts_own_at_temperature_one(tiny):
    ids = encode_prompt(tiny.tokenizer, "the man said that it was")
    r = next(speculative_generate(tiny, ids, DecodeConfig(k=3, max_new_tokens=8, adaptive="fixed")))
    with torch.no_grad():
        logits = tiny.draft(torch.tensor([ids])).logits[0, -1].float()
    expected = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum().item()
    assert r.drafted[0].q_entropy == pytest.approx(expected, rel=1e-4)
    assert all(0 <= t.q_entropy <= math.log(tiny.vocab_size) + 1e-4 for t in r.drafted)
    looked = list(speculative_generate(tiny, ids * 2, DecodeConfig(k=3, max_new_tokens=8, drafter="lookup")))
    assert all(t.q_entropy == 0 for r in looked for t in r.drafted)  # a point mass is sure


def test_an_older_round_without_the_entropy_still_parses():
    d = CODE.rounds[0].to_dict()
    for t in d["drafted"]:
        del t["q_entropy"]
    assert round_from_dict(d).drafted[0].q_entropy is None


# ---------------------------------------------------------------- input: one sentence per problem


LIMITS = Limits(max_prompt_chars=200, max_atlas_prompts=3)


@pytest.mark.parametrize("data, name, message", [
    (b"", "p.jsonl", "p.jsonl is empty"),
    (b"  \n\n", "p.txt", "p.txt is empty"),
    (b"\x89PNG\r\n\x1a\n\0\0\0", "p.csv", "p.csv is a binary file"),
    ("caf\xe9\n".encode("latin-1"), "p.txt", "p.txt is not UTF-8 text"),
    (b"text,kind\nhello,code\n", "p.csv", "p.csv has no `prompt` column (its columns: text, kind)."),
    (b"not json\n", "p.jsonl", "p.jsonl has no prompt to run: line 1 skipped: it is not JSON"),
    (b"hello", "p.pdf", "p.pdf is not a .jsonl, .txt or .csv file."),
])
def test_a_file_that_cannot_run_is_one_sentence(data, name, message):
    with pytest.raises(InputError) as e:
        read_prompts(data, name, LIMITS)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_bad_prompts_are_skipped_in_one_sentence_each_and_the_rest_run():
    lines = ['{"prompt": "one", "kind": "code"}', "oops", '{"kind": "code"}', '{"prompt": "   "}',
             '{"prompt": "%s"}' % ("x" * 300), '{"prompt": "two", "id": "t"}', '{"prompt": "dup", "id": "t"}',
             '{"prompt": "three"}', '{"prompt": "four"}']
    ps = read_prompts("\n".join(lines), "p.jsonl", LIMITS)
    assert [(p.id, p.prompt, p.kind) for p in ps.prompts] == [("line-1", "one", "code"), ("t", "two", "other"),
                                                              ("line-8", "three", "other")]
    assert list(ps.problems) == [
        "line 2 skipped: it is not JSON (Expecting value).",
        "line 3 skipped: it needs a \"prompt\" field holding text.",
        "line 4 skipped: the prompt is empty: type something for the models to continue.",
        "line 5 skipped: the prompt has 300 characters; the limit is 200.",
        "line 7 skipped: it repeats the id 't'.",
        "4 prompts given; the limit is 3: the first 3 run.",
    ]


def test_txt_and_csv_files():
    txt = read_prompts("first\nprompt\n\n  \nsecond\n", "p.txt", LIMITS)
    assert [p.prompt for p in txt.prompts] == ["first\nprompt", "second"]
    csv = read_prompts('\ufeffid,Prompt,kind\nx,"a, b",code\ny,,prose\n', "p.csv", LIMITS)
    assert [(p.id, p.prompt, p.kind) for p in csv.prompts] == [("x", "a, b", "code")]
    assert csv.problems == ("row 3 skipped: the prompt is empty: type something for the models to continue.",)


def test_a_prompt_over_the_context_is_skipped_and_the_others_run(tiny):
    session = Session(tiny, PairSpec("tiny", "tiny"))
    ps = read_prompts("the man said\n\n" + "the " * 100 + "\n\nshe said", "p.txt", Limits())
    states = list(atlases.run_atlas(session, Limits(max_prompt_tokens=50), ps, {"max_new_tokens": 4}))
    last = states[-1]
    assert [run.prompt.id for run in last.runs] == ["prompt-1", "prompt-3"]
    assert last.problems == ["prompt-2 skipped: the prompt is 100 tokens long; the limit is 50."]
    assert last.finished == "done" and last.progress_line() == "2 of 2 prompts ran (done)."


def test_over_the_budget_it_keeps_what_it_made(tiny, monkeypatch):
    session = Session(tiny, PairSpec("tiny", "tiny"))
    # a fake clock a target forward moves: the second ends mid-prompt on any machine (on the wall clock, a prompt's
    # last round now and then crossed it, and the next prompt's check ended the atlas with that prompt whole)
    slow_target(session, monkeypatch, atlases, 1 / 150)
    ps = read_prompts("\n\n".join(f"the man said {i}" for i in range(40)), "p.txt", Limits())
    last = None
    for last in atlases.run_atlas(session, Limits(max_seconds=1), ps, {"max_new_tokens": 200, "k": 2}):
        pass
    assert last.finished == "budget" and last.runs and last.not_run > 0
    assert last.runs[-1].finished == "budget"  # the prompt running then ended at its next round, kept
    assert atlases.report(last).finished == "budget"


def test_stopped_midway_the_prompt_cut_short_is_kept(tiny):
    session = Session(tiny, PairSpec("tiny", "tiny"))
    ps = read_prompts("the man said\n\nshe said", "p.txt", Limits())
    stream = atlases.run_atlas(session, Limits(), ps, {"max_new_tokens": 30, "k": 2, "adaptive": "fixed"})
    for state in stream:
        if state.runs and state.current is not None and len(state.current.trace.rounds) == 2:
            break
    stream.close()  # Stop: the pair is released
    state.close("stopped")
    assert session.lock.acquire(blocking=False)
    session.lock.release()
    assert [(run.prompt.id, run.finished, len(run.trace.rounds)) for run in state.runs][1] == ("prompt-2", "stopped", 2)
    assert report_dict(atlases.report(state))["finished"] == "stopped"


# ---------------------------------------------------------------- the CLI on the tiny pair


def test_cli_writes_the_report_the_rejections_and_the_traces(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the man said that it was good and", "kind": "story", "id": "s1"}\n'
                       'broken\n{"prompt": "she said that it was the one", "kind": "story"}\n'
                       '{"prompt": "it was the one that it was", "kind": "other"}\n')
    out = tmp_path / "out"
    code = cli.main(["atlas", "--draft", "tiny", "--target", "tiny", "--prompts", str(prompts), "--max-new-tokens",
                     "16", "--race", "--json", str(tmp_path / "a.json"), "--html", str(out / "a.html"),
                     "--export-rejections", str(tmp_path / "r.jsonl"), "--traces", str(out / "traces")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "line 2 skipped: it is not JSON" in captured.err
    assert "3 of 3 prompts ran (done)" in captured.out
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["format"] == "specviz-atlas" and report["finished"] == "done" and report["race"]
    assert report["input"] == {"valid": 3, "ran": 3, "problems": ["line 2 skipped: it is not JSON (Expecting value)."]}
    assert {"totals", "prompts", "where", "disagreements", "classes", "undraftable", "kinds", "advice",
            "cost", "settings", "pair"} <= set(report)
    rows = report["prompts"]
    assert [r["acceptance"]["rate"] for r in rows] == sorted(r["acceptance"]["rate"] for r in rows)
    assert all(r["measured_speedup"] and r["trace"].startswith("traces/") for r in rows)
    assert sum(r["acceptance"]["n"] for r in rows) == report["totals"]["acceptance"]["n"]
    assert [k["kind"] for k in report["advice"]["kinds"]] == ["other", "story"]
    assert [a["name"] for a in report["advice"]["alternatives"]] == ["lookup", "hybrid"]
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(lines) == sum(c["rejections"] for c in report["classes"]) > 0
    assert all(line["drafted"]["id"] != line["emitted"]["id"] and line["draft_top"] and line["target_top"]
               and len(line["context_ids"]) == line["prompt_tokens"] + line["position"] for line in lines)
    trace = json.loads((out / rows[0]["trace"]).read_text())
    assert trace["format"] == "specviz-trace" and trace["ar_steps"]
    html = (out / "a.html").read_text()
    assert all(f'id="sv-atlas-{s}"' in html for s in ("summary", "prompts", "where", "disagreements", "classes",
                                                      "advice", "settings"))
    assert 'href="traces/' in html


def test_cli_a_file_that_cannot_run_is_one_sentence(tmp_path, capsys):
    prompts = tmp_path / "p.csv"
    prompts.write_text("text\nhello\n")
    assert cli.main(["atlas", "--draft", "tiny", "--target", "tiny", "--prompts", str(prompts)]) == 2
    assert capsys.readouterr().err.strip() == "specviz atlas: p.csv has no `prompt` column (its columns: text)."


def test_tree_rounds_are_counted_but_not_read_as_chains(tiny):
    session = Session(tiny, PairSpec("tiny", "tiny"))
    ps = read_prompts("the man said that it was", "p.txt", Limits())
    *_, state = atlases.run_atlas(session, Limits(), ps, {"max_new_tokens": 12, "drafter": "tree"})
    report = atlases.report(state)
    f = report.findings
    assert f.totals.tokens == 12 and f.totals.predicted_speedup is None and f.prompts[0].predicted_speedup is None
    assert f.where.by_position == () and not f.disagreements and report.advice.kinds == ()
    json.dumps(report_dict(report))  # and the report still writes
