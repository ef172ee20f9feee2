"""Pure views of events: token HTML, plotly figures, captions, stats and the race loop (no models)."""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest

from specviz.engine.events import (
    ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, TARGET, Candidate, DraftedToken, EmittedToken, Round, Step,
)
from specviz.analysis.stats import run_stats
from specviz.engine import DecodeConfig, SamplingParams
from specviz.runs import race as racing
from specviz.runs.race import alternate, recorded_time, stopwatch
from specviz.runs.trace import RunMeta, Trace
from specviz.ui import figures, render, teach


def meta(greedy: bool = True) -> RunMeta:
    return RunMeta("d", "t", "cpu", "float32", "p", 3, DecodeConfig(sampling=SamplingParams(0.0 if greedy else 1.0)))


def replay_race(rounds, steps, greedy: bool):
    """A race over recorded events (the trace's own clocks)."""
    return racing.replay_race(Trace(meta(greedy), rounds, steps))


def drafted(text: str, status: str, p=0.3, q=0.5, u=0.4, tid=1) -> DraftedToken:
    return DraftedToken(id=tid, text=text, q=q, p=p, accept_prob=min(1.0, p / q), u=u, status=status,
                        q_soft=q, p_soft=p, target_top2_gap=0.5,
                        q_top=[Candidate(tid, text, q), Candidate(99, "z", 0.1)],
                        p_top=[Candidate(tid, text, p), Candidate(98, "y", 0.2)],
                        residual_top=[Candidate(98, "y", 0.6), Candidate(97, "w", 0.4)])


def emitted(text: str, kind: str, tid=98) -> EmittedToken:
    return EmittedToken(id=tid, text=text, kind=kind, p=0.6, p_soft=0.6, target_top2_gap=1.0,
                        p_top=[Candidate(tid, text, 0.6)])


def make_round(index: int, tokens: list[DraftedToken], emit: EmittedToken | None, position=0, text="",
               draft_time=0.04, verify_time=0.1, finished=None) -> Round:
    n = sum(t.status == ACCEPTED for t in tokens)
    new = [t.id for t in tokens if t.status == ACCEPTED] + ([emit.id] if emit else [])
    return Round(index=index, drafter="model", k=len(tokens), drafted=tokens, n_accepted=n, emitted=emit,
                 new_token_ids=new, position=position, text=text, draft_time=draft_time, verify_time=verify_time,
                 overhead_time=0.001, finished=finished)


def corrected_round(index=0) -> Round:
    return make_round(index, [drafted(" def", ACCEPTED, p=0.9, q=0.8, u=0.2, tid=1),
                              drafted(" foo", REJECTED, p=0.1, q=0.5, u=0.7, tid=2),
                              drafted("(", NOT_VERIFIED, tid=3)], emitted(" bar", CORRECTION))


def bonus_round(index=1) -> Round:
    return make_round(index, [drafted("x", ACCEPTED, tid=4), drafted("y", ACCEPTED, tid=5)], emitted("z", BONUS, 6),
                      position=2)


class Spans(HTMLParser):
    """Collect (classes, title, text) of every token span."""

    def __init__(self):
        super().__init__()
        self.spans, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        self.stack.append((classes, a.get("title")))
        if "sv-tok" in classes:
            self.spans.append([classes, a.get("title"), ""])

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        if any("sv-tok" in c for c, _ in self.stack) and self.spans:
            self.spans[-1][2] += data


def parse(html: str) -> list:
    p = Spans()
    p.feed(html)
    return p.spans


# ---------------------------------------------------------------- rendering


def test_each_status_gets_its_class_in_draft_order_then_the_correction():
    spans = parse(render.rounds_html([corrected_round(), bonus_round()], greedy=False))
    statuses = [next(c for c in classes if c.startswith("sv-") and c != "sv-tok") for classes, _, _ in spans]
    assert statuses == ["sv-accepted", "sv-rejected", "sv-not_verified", "sv-correction",
                        "sv-accepted", "sv-accepted", "sv-bonus"]
    assert [text for _, _, text in spans] == [" def", " foo", "(", " bar", "x", "y", "z"]


def test_one_box_per_round_and_the_last_is_highlighted():
    html = render.rounds_html([corrected_round(0), bonus_round(1)], greedy=False)
    assert html.count('class="sv-round"') == 1 and html.count('class="sv-round sv-last"') == 1
    assert 'data-round="1"' in html and 'data-round="2"' in html


def test_css_colours_match_the_legend_meaning():
    expected = {ACCEPTED: "#16a34a", REJECTED: "#dc2626", CORRECTION: "#2563eb", BONUS: "#9333ea",
                NOT_VERIFIED: "#9ca3af"}
    for status, colour in expected.items():
        assert render.COLORS[status] == colour
        rule = re.search(r"\.sv-" + status + r" \{([^}]*)\}", render.CSS).group(1)
        assert colour in rule or status == NOT_VERIFIED and colour in rule
    assert "line-through" in re.search(r"\.sv-rejected \{([^}]*)\}", render.CSS).group(1)
    legend = render.legend_html()
    for status in (ACCEPTED, REJECTED, NOT_VERIFIED, CORRECTION, BONUS):
        assert f"sv-{status}" in legend


def test_hover_title_carries_p_q_threshold_and_u():
    spans = parse(render.rounds_html([corrected_round()], greedy=False))
    title = spans[1][1]  # the rejected " foo": p=0.1, q=0.5, u=0.7
    assert "p(x) = 0.1000" in title and "q(x) = 0.5000" in title
    assert "min(1, p/q) = 0.2000" in title and "u = 0.7000" in title
    greedy_title = parse(render.rounds_html([corrected_round()], greedy=True))[1][1]
    assert "argmax" in greedy_title and "softmax" in greedy_title
    assert "predicted" not in title  # a trace recorded before predictions has none to show


def test_hover_shows_the_predicted_acceptance_beside_the_outcome():
    r = corrected_round()
    r.drafted[0].predicted, r.drafted[1].predicted = 0.91, 0.35
    spans = parse(render.rounds_html([r], greedy=False))
    assert "predicted acceptance = 0.91 (fitted model, from q alone); really: accepted" in spans[0][1]
    assert "predicted acceptance = 0.35 (fitted model, from q alone); really: rejected" in spans[1][1]


def test_a_token_the_draft_could_not_propose_is_dotted_and_says_why():
    r = corrected_round()
    r.emitted.draftable = False
    html = render.rounds_html([r], greedy=False) + render.spec_lane_html([r], greedy=False)
    marked = [(cls, title) for cls, title, _ in parse(html) if "sv-undraftable" in cls]
    assert len(marked) == 2 and all("not in the draft model's vocabulary" in title for _, title in marked)
    assert "sv-undraftable" not in render.rounds_html([corrected_round()], greedy=False)
    assert ".sv-undraftable" in render.CSS


def test_token_text_is_escaped_and_whitespace_visible():
    tokens = [drafted("<script>alert(1)</script>", ACCEPTED), drafted("\n", ACCEPTED), drafted("   ", ACCEPTED),
              drafted('a"b', REJECTED)]
    html = render.rounds_html([make_round(0, tokens, emitted("\t", CORRECTION))], greedy=False)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "↵" in html and "→" in html and "···" in html
    assert 'a&quot;b' in html
    assert parse(html)[0][2] == "<script>alert(1)</script>"  # the parser unescapes: the text survives intact


def test_hiding_rejected_drafts_is_a_class_on_the_container():
    html = render.rounds_html([corrected_round()], greedy=False, show_rejected=False)
    assert "sv-hide-rejected" in html and ".sv-hide-rejected .sv-rejected" in render.CSS


def test_draft_stage_shows_the_proposal_without_a_verdict():
    spans = parse(render.rounds_html([corrected_round()], greedy=False, stage="draft"))
    assert all("sv-drafted" in classes for classes, _, _ in spans)
    assert len(spans) == 3  # the correction is not shown before the verdict


def test_race_lanes_outline_the_first_divergent_token():
    steps = [Step(index=i, token=emitted(t, TARGET, tid=i), text="", time=0.1) for i, t in enumerate("abc")]
    ar = parse(render.steps_html(steps, diverge_at=1))
    assert ["sv-diverge" in c for c, _, _ in ar] == [False, True, False]
    spec = parse(render.spec_lane_html([corrected_round()], greedy=False, diverge_at=0))
    assert [t for _, _, t in spec] == [" def", " bar"]  # only committed tokens
    assert "sv-diverge" in spec[0][0]


# ---------------------------------------------------------------- figures


def test_pq_figure_has_q_p_threshold_u_and_the_correction():
    fig = figures.pq_figure(corrected_round(), greedy=False)
    names = [t.name for t in fig.data]
    assert names[:4] == ["q(x) draft", "p(x) target", "min(1, p/q)", "u (accept iff u < min(1, p/q))"]
    assert names[4] == CORRECTION
    q, p, thr, u = fig.data[:4]
    assert list(q.y) == [0.8, 0.5, 0.5] and list(p.y) == [0.9, 0.1, 0.3]
    assert list(u.y) == [0.2, 0.7, 0.4]
    assert list(p.marker.color) == [render.COLORS[ACCEPTED], render.COLORS[REJECTED], render.COLORS[NOT_VERIFIED]]
    assert fig.data[4].marker.color == render.COLORS[CORRECTION]


def test_pq_figure_greedy_uses_the_soft_distributions_and_says_so():
    r = corrected_round()
    r.drafted[0].q_soft, r.drafted[0].p_soft = 0.11, 0.22
    fig = figures.pq_figure(r, greedy=True)
    assert fig.data[0].y[0] == 0.11 and fig.data[1].y[0] == 0.22
    assert "softmax at T=1" in fig.layout.title.text


def test_drilldown_shows_q_p_and_residual_for_a_draft_and_p_for_an_emitted_token():
    r = corrected_round()
    fig = figures.drilldown_figure(r.drafted[1], greedy=False, emitted_id=r.emitted.id)
    assert len(fig.data) == 3
    assert [a.text for a in fig.layout.annotations][2].startswith("residual")
    residual = fig.data[2]
    assert list(residual.x) == [0.4, 0.6]  # reversed: largest on top
    assert residual.marker.color[1] == render.COLORS[CORRECTION]  # the correction is highlighted
    assert len(figures.drilldown_figure(r.emitted, greedy=False).data) == 1


def test_stats_race_and_distribution_figures():
    s = run_stats([corrected_round(0), bonus_round(1)])
    fig = figures.stats_figure(s)
    assert [t.type for t in fig.data] == ["bar", "bar"]
    assert list(fig.data[1].y) == s.spec.accepted_lengths
    steps = [Step(index=i, token=emitted("a", TARGET), text="a", time=0.1, finished="length" if i == 1 else None)
             for i in range(2)]
    state = list(replay_race([make_round(0, [drafted("a", ACCEPTED)], emitted("b", BONUS), finished="length")],
                             steps, greedy=False))[-1]
    rf = figures.race_figure(state.lanes)
    assert [t.name for t in rf.data] == ["Target alone (autoregressive)", "Speculative decoding"]
    panel = (["'a'", "'b'"], [0.5, 0.5], [0.4, 0.6], [0.55, 0.45])
    df = figures.distribution_figure([panel] * 3, 10, 10, [((0.1, 0.12, 0.2), (0.05, 0.12, 0.2))] * 3)
    assert [t.name for t in df.data] == ["exact p (target)", "target alone (n=10)", "speculative (n=10)",
                                         "total variation", figures.CHANCE] * 3
    assert [t.showlegend for t in df.data][:5] == [True, True, True, False, True]  # one legend entry each
    assert not any(t.showlegend for t in df.data[5:])
    assert [a.text for a in df.layout.annotations][:1] == ["token 1"]
    assert df.layout.legend.y < 0  # below the panels: never over the title


def test_the_same_distribution_view_draws_the_tv_chance_reaches_at_each_samplers_n():
    """On a fake exact distribution: the chance marks drawn are the mean TV of n multinomial draws from it, computed
    here by Monte Carlo (20,000 draws of n), for each sampler's own n."""
    import numpy as np
    import torch

    from specviz.analysis.proof import PositionTally, Verdict, position_result
    from specviz.runs.distribution import DistributionResult, PositionComparison
    from specviz.ui.distribution import distribution_view

    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(20, 0.5))

    def tallied(n):
        t = PositionTally()
        t.add(torch.tensor(p).expand(n, 20), torch.tensor(rng.choice(20, n, p=p)), torch.Generator().manual_seed(0))
        return position_result(1, t)
    ar, spec = tallied(40), tallied(160)
    top = [int(i) for i in np.argsort(-p)[:5]]
    comparison = PositionComparison(1, top, [f"t{i}" for i in top], [float(p[i]) for i in top], [0.0] * 5, [0.0] * 5,
                                    stats_spec=spec, stats_ar=ar)
    verdict = [Verdict(name, True, n, [r], 0.5, 0.01) for name, n, r in (("ar", 40, ar), ("spec", 160, spec))]
    view = distribution_view(DistributionResult([comparison], verdict[1], verdict[0], "prompt", True))
    chance = next(t for t in view.fig.data if t.name == figures.CHANCE)
    for n, drawn, above in zip((40, 160), chance.y, chance.error_y.array):
        tvs = [0.5 * np.abs(rng.multinomial(n, p) / n - p).sum() for _ in range(20_000)]
        assert drawn == pytest.approx(np.mean(tvs), rel=0.02)
        assert drawn + above == pytest.approx(np.quantile(tvs, 0.95), rel=0.06)  # the whisker: 95 % of draws below
    tvs = next(t for t in view.fig.data if t.name == "total variation")
    assert list(tvs.y) == [ar.tv, spec.tv]  # each sampler's own TV beside its chance level


# ---------------------------------------------------------------- captions and stats


def test_caption_reports_the_rounds_numbers():
    text = teach.step_caption(corrected_round(), greedy=False)
    assert "drafted 3 tokens in 40 ms" in text and "one pass: 100 ms" in text
    assert "accepted 1 of 3" in text and "0.20 &lt; 1.00" not in text  # numbers are not HTML-escaped twice
    assert "u = 0.70 ≥ min(1, p/q) = 0.20" in text and "residual" in text
    assert "dropped unverified" in text
    bonus = teach.step_caption(bonus_round(), greedy=True)
    assert "Bonus" in bonus and "argmax" in bonus
    assert "next, the target checks" in teach.step_caption(corrected_round(), False, stage="draft")
    last = make_round(2, [], emitted("w", BONUS, 7), finished="length")  # nothing drafted: a plain target step
    assert "one token left" in teach.step_caption(last, greedy=True) and "plain target step" in teach.step_caption(last, True)
    missed = replace(last, drafter="lookup")
    assert "no match in the context" in teach.step_caption(missed, greedy=True)


def test_stats_pool_counts_from_the_rounds():
    stats = run_stats([corrected_round(0), bonus_round(1)])
    s = stats.to_dict()  # the flat numbers the API sends
    assert (s["drafted"], s["accepted"], s["tokens"], s["rounds"]) == (5, 3, 5, 2)
    assert s["acceptance_rate"] == pytest.approx(3 / 5)
    assert s["per_position"][:2] == [1.0, 0.5]  # position 1 tested twice and kept twice; position 2: 1 of 2
    assert s["per_position_n"] == [2, 2, 0]  # position 3 was drafted once, after a rejection: never tested
    assert s["accepted_lengths"] == [0, 1, 1, 0]  # one round with 1 accepted, one with 2 (histogram up to K=3)
    assert s["tokens_per_forward"] == pytest.approx(2.5)
    assert s["measured"] is None and s["c_hat"] is not None
    s = stats
    md = teach.stats_markdown(s, "Run")
    assert "0.60 (3 / 5)" in md and "Run race" in md
    raced = replace(run_stats([corrected_round(0), bonus_round(1)], fake_steps(4, 0.1)), speedup=1.5,
                    predicted_speedup=2.0)  # measured beside predicted: their ratio too
    assert "**1.50×**" in (md := teach.stats_markdown(raced, "Race")) and "0.75 of the prediction" in md


# ---------------------------------------------------------------- the race loop


def fake_steps(n: int, seconds: float) -> list[Step]:
    return [Step(index=i, token=emitted("a", TARGET, tid=7), text="a" * (i + 1), time=seconds,
                 finished="length" if i == n - 1 else None) for i in range(n)]


def fake_rounds(n: int, seconds: float) -> list[Round]:
    return [make_round(i, [drafted("a", ACCEPTED, tid=7)] * 2, emitted("a", BONUS, tid=7), position=3 * i,
                       draft_time=seconds / 2, verify_time=seconds / 2 - 0.001, finished="length" if i == n - 1 else None)
            for i in range(n)]


def test_race_always_advances_the_lane_that_is_behind():
    clocks, order = [(0.0, 0.0)], []
    for state in replay_race(fake_rounds(3, 0.3), fake_steps(9, 0.1), greedy=True):  # one state, updated
        before = clocks[-1]
        moved = "ar" if state.ar.clock != before[0] else "spec"
        if not (state.ar.finished and moved == "spec") and not (state.spec.finished and moved == "ar"):
            assert moved == ("ar" if before[0] < before[1] else "spec")  # the lane behind; the speculative on a tie
        order.append(moved)
        clocks.append((state.ar.clock, state.spec.clock))
    assert order.count("ar") == 9 and order.count("spec") == 3
    assert all(a1 >= a0 and s1 >= s0 for (a0, s0), (a1, s1) in zip(clocks, clocks[1:]))
    assert state.done and state.ar.tokens == 9 and state.spec.tokens == 9
    assert state.speedup == pytest.approx((9 / state.spec.clock) / (9 / state.ar.clock))
    assert state.divergence is None


def test_live_race_clocks_count_only_each_lanes_own_next():
    ticks = iter(range(1000))
    timer = lambda: float(next(ticks))  # noqa: E731  (each call advances one "second")

    def slow(n):
        for s in fake_steps(n, 0.0):
            yield s

    states = list(alternate(slow(4), iter(fake_rounds(2, 0.0)), meta(), stopwatch(timer)))
    final = states[-1]
    assert final.ar.clock == 4.0 and final.spec.clock == 2.0  # one tick per own next(), none for the other lane
    assert [p[0] for p in final.ar.points] == [1.0, 2.0, 3.0, 4.0]


def test_greedy_divergence_is_marked_with_both_gaps():
    steps = fake_steps(6, 0.1)
    steps[4].token = emitted("b", TARGET, tid=8)
    steps[4].token.target_top2_gap = 0.0625
    final = list(replay_race(fake_rounds(2, 0.3), steps, greedy=True))[-1]
    assert final.divergence is not None and final.divergence.position == 4
    assert final.divergence.target_top2_gap == 0.0625
    sampled = list(replay_race(fake_rounds(2, 0.3), steps, greedy=False))[-1]
    assert sampled.divergence is None  # sampled lanes are expected to differ


def test_recorded_times_are_the_events_own():
    r = fake_rounds(1, 0.3)[0]
    event, seconds = recorded_time(iter([r]))
    assert event is r and seconds == pytest.approx(r.draft_time + r.verify_time + r.overhead_time)
    assert recorded_time(iter([])) == (None, 0.0)


def test_a_slower_race_says_how_many_times_slower():
    from specviz.ui.race import race_result

    final = list(replay_race(fake_rounds(3, 0.6), fake_steps(9, 0.1), greedy=True))[-1]  # 9 tokens: 1.8 s vs 0.9 s
    assert final.speedup == pytest.approx(0.5)
    assert "2.00× slower" in race_result(final)


def test_a_target_alone_lane_that_ended_early_gives_valid_json_and_a_dash_for_its_gap():
    import json

    from specviz.api import messages as api
    from specviz.ui.race import race_result

    final = list(replay_race(fake_rounds(3, 0.3), fake_steps(5, 0.1), greedy=True))[-1]
    assert final.divergence.position == 5 and final.divergence.target_top2_gap is None
    out = json.loads(json.dumps(api.race_dict(final), allow_nan=False))  # bare NaN is not JSON
    assert out["divergence"]["target_top2_gap"] is None and out["identical"] is False
    assert "there is — (target alone)" in race_result(final)


def test_a_race_state_is_finished_once_both_lanes_are_and_the_pacer_shows_it():
    from specviz.serving.pacing import paced

    states = [(s.finished, s.done) for s in replay_race(fake_rounds(2, 0.3), fake_steps(6, 0.1), greedy=True)]
    assert [f is not None for f, _ in states] == [done for _, done in states] == [False] * 7 + [True]
    shown = [show for _, show in paced(replay_race(fake_rounds(2, 0.3), fake_steps(6, 0.1), True), 1e9)]
    assert shown == [True] + [False] * 6 + [True]  # the first, then the last however soon


def test_race_views_keep_the_decode_record_and_compute_stats_only_when_done(monkeypatch):
    from specviz.runs.race import RaceState
    from specviz.ui.race import race_view

    calls = []
    stats = RaceState.stats
    monkeypatch.setattr(RaceState, "stats", lambda state: calls.append(state) or stats(state))
    views = [(race_view(s), s.done) for s in replay_race(fake_rounds(2, 0.3), fake_steps(6, 0.1), True)]
    assert [isinstance(v.record, Trace) for v, _ in views] == [done for _, done in views]  # gr.skip() until done
    assert len(calls) == 1 and "tokens in" in views[-1][0].stats
