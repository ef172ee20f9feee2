"""A room on one machine (issue 31), on the tiny pair: recorded answers, the honest queue, the presenter's
broadcast, the room's flags. The load test with a workshop's mix is in test_loadtest.py, two browsers
following a presenter in test_ui_browser.py.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest
from helpers import warm_up_while_a_visitor_waits
from gradio_client.utils import Status

from specviz.api import messages
from specviz.cli import main
from specviz.models import PairSpec
from specviz.models.tiny import tiny_pair
from specviz.runs import decode as decoding
from specviz.runs import race as racing
from specviz.runs.broadcast import Broadcast
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits
from specviz.serving.recorded import Recording, RecordingKey, Recordings, recording
from specviz.runs.room import ROOM_LIMITS, WARM_UP, is_presenter, record_examples
from specviz.serving.session import Session
from specviz.serving.turns import Owner, Replaced, Turns, Waiting
from specviz.ui.teach import queue_line
from specviz.server import build_server
from specviz.ui import follow
from specviz.ui.decode import waiting_main
from specviz.ui.live import live_updates, live_view
from specviz.ui.race import race_view

PROMPT = "the man said that it was good and"
SETTINGS = {"k": 4, "max_new_tokens": 24, "adaptive": "fixed"}
KEY = "projector-7421"


def recording_session(max_bytes: int = 2**24, **kw) -> Session:
    return Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), recordings=Recordings(max_bytes), **kw)


def counting(session: Session) -> list:
    """Counts the target's forwards: a recorded answer makes none."""
    calls, forward = [], session.pair.target.forward
    session.pair.target.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    return calls


def final(stream):
    *_, last = stream
    return last


def lanes(state) -> tuple:
    return (state.ar.token_ids, state.spec.token_ids, state.ar.text, state.spec.text,
            [r.new_token_ids for r in state.spec.events], state.ar.clock, state.spec.clock, state.speedup)


# ------------------------------------------------------------------ recorded answers


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.8, "seed": 3}], ids=["greedy", "sampled-with-a-seed"])
def test_a_recorded_race_equals_the_live_one_token_for_token_and_is_labelled(extra):
    session = recording_session()
    calls = counting(session)
    live = final(racing.race(session, Limits(), PROMPT, SETTINGS | extra))
    assert live.recorded_at is None and len(session.recordings) == 1 and calls
    n = len(calls)
    states = racing.race(session, Limits(), PROMPT, SETTINGS | extra)
    first = next(states)
    assert first.ar.tokens == first.spec.tokens == 0  # at once: the label, before the first event's seconds
    again = final(states)
    assert len(calls) == n  # no model ran
    assert lanes(again) == lanes(live)  # the same tokens, and the numbers that real run measured
    assert [type(e) for e in again.spec.events] == [type(e) for e in live.spec.events]
    assert again.spec.events[3].drafted[0].q_top == live.spec.events[3].drafted[0].q_top  # hovers and drill-down
    assert again.recorded_at is not None and not again.recorded  # timed live then, not a trace replay
    label = f"Recorded at {time.strftime('%H:%M', time.localtime(again.recorded_at))} on this server"
    assert label in live_view(again).speed and label in race_view(again).result
    assert label not in live_view(live).speed
    assert messages.race_dict(again)["recorded_at"].startswith(time.strftime("%Y-%m-%dT"))
    assert messages.race_dict(live)["recorded_at"] is None


def test_a_recorded_run_equals_the_live_one_and_says_when_it_ran():
    session = recording_session()
    calls = counting(session)
    live = final(decoding.decode(session, Limits(), PROMPT, SETTINGS))
    n = len(calls)
    again = final(decoding.decode(session, Limits(), PROMPT, SETTINGS))
    assert len(calls) == n
    assert [r.to_dict() for r in again.rounds] == [r.to_dict() for r in live.rounds]
    assert again.recorded_at is not None and "recorded at" in again.source
    summary, live_summary = messages.run_summary(again), messages.run_summary(live)
    assert summary["recorded_at"] and live_summary["recorded_at"] is None
    assert {k: v for k, v in summary.items() if k != "recorded_at"} == \
           {k: v for k, v in live_summary.items() if k != "recorded_at"}


@pytest.mark.parametrize("change", [{"k": 3}, {"max_new_tokens": 23}, {"seed": 4, "temperature": 0.8},
                                    {"adaptive": "confidence"}, {"top_n": 5}], ids=str)
def test_a_changed_setting_or_seed_misses_the_recording(change):
    session = recording_session()
    base = SETTINGS | ({"temperature": 0.8, "seed": 3} if "seed" in change else {})
    final(racing.race(session, Limits(), PROMPT, base))
    calls = counting(session)
    other = final(racing.race(session, Limits(), PROMPT, base | change))
    assert calls and other.recorded_at is None  # it ran
    calls.clear()
    final(racing.race(session, Limits(), PROMPT + " too", base))  # another prompt misses too
    assert calls


def test_a_fresh_seed_each_run_is_never_recorded_nor_is_a_run_cut_short(monkeypatch):
    session = recording_session()
    final(racing.race(session, Limits(), PROMPT, SETTINGS | {"temperature": 0.8, "seed": None}))
    assert len(session.recordings) == 0  # sampled without a seed: the next one would differ
    states = racing.race(session, Limits(), PROMPT, SETTINGS)
    next(states)
    next(states)
    states.close()  # Stop
    assert len(session.recordings) == 0
    monkeypatch.setattr(racing, "budget", lambda seconds: lambda: "budget")  # the time budget, reached at once
    cut = final(racing.race(session, Limits(), PROMPT, SETTINGS))
    assert cut.spec.finished == "budget" and len(session.recordings) == 0


def test_recordings_stay_within_their_memory_bound_least_recently_used_out():
    sizes = []
    store = Recordings(max_bytes=10_000)
    blob = lambda n: Recording(bytes(n), 0.0)  # noqa: E731
    keys = [RecordingKey("race", str(i), None, ()) for i in range(6)]
    for key in keys[:4]:
        store.put(key, blob(3_000))
        sizes.append(store.size)
    assert sizes == [3_000, 6_000, 9_000, 9_000] and len(store) == 3  # the first went for the fourth
    assert store.get(keys[0]) is None and store.get(keys[1]) is not None  # keys[1] now the most recent
    store.put(keys[4], blob(3_000))
    assert store.get(keys[2]) is None and store.get(keys[1]) is not None  # the least recently used went
    assert store.put(keys[5], blob(20_000)) is False and store.size <= 10_000  # larger than the bound: not kept
    # real races: whatever number of different requests, the bytes stay within the bound
    session = recording_session(max_bytes=40_000)
    one = recording([[1]]).size
    for i in range(8):
        final(racing.race(session, Limits(), f"{PROMPT} {i}", SETTINGS))
        assert session.recordings.size <= 40_000
    assert 0 < len(session.recordings) < 8 and one < 100


# ------------------------------------------------------------------ the honest queue


def test_the_queue_gives_each_waiting_job_its_place_and_an_estimate_from_the_jobs_ahead():
    now = [0.0]
    turns = Turns(clock=lambda: now[0])
    for seconds in (10.0, 14.0, 12.0):  # three races of 48 tokens measured: a median of 12 s
        t = turns.join("race", 48, None)
        next(turns.wait(t), None)
        now[0] += seconds
        turns.leave(t, timed=True)
    running = turns.join("race", 48, "a")
    assert next(turns.wait(running), None) is None  # nobody ahead: its turn at once
    now[0] += 4.0
    second, third = turns.join("race", 24, "b"), turns.join("distribution", 16, "c")
    assert next(turns.wait(second)) == Waiting(position=1, ahead=1, estimate_s=8.0)  # 12 s less the 4 s done
    w = next(turns.wait(third))
    assert (w.position, w.ahead) == (2, 2) and w.estimate_s == pytest.approx(8.0 + 6.0)  # + a 24-token race
    now[0] += 30.0  # the running job is past its estimate: at least a second of it is still counted
    assert next(turns.wait(second)).estimate_s == 1.0


def test_the_running_job_s_rest_is_projected_from_its_own_pace_once_it_has_done_a_quarter():
    now = [0.0]
    turns = Turns(clock=lambda: now[0])
    done = turns.join("race", 48, None)
    next(turns.wait(done), None)
    now[0] += 12.0  # a race of 48 tokens measured at 12 s (before a room's load came)
    turns.leave(done, timed=True)
    running, waiting = turns.join("race", 48, "a"), turns.join("race", 48, "b")
    next(turns.wait(running), None)
    now[0] += 5.0
    turns.advance(running, 0.2)  # too little done to judge its pace by (the prompt's reading comes first)
    assert next(turns.wait(waiting)).estimate_s == pytest.approx(12.0 - 5.0)
    now[0] += 7.0
    turns.advance(running, 0.5)  # half done in 12 s: 12 s more, not the measured duration's none
    assert next(turns.wait(waiting)).estimate_s == pytest.approx(12.0)
    behind = turns.join("race", 48, "c")
    assert next(turns.wait(behind)).estimate_s == pytest.approx(12.0 + 12.0)  # those waiting: as measured
    turns.advance(running)  # an event that does not say keeps the share last said
    assert next(turns.wait(behind)).estimate_s == pytest.approx(12.0 + 12.0)
    now[0] += 6.0
    turns.advance(running, 0.75)
    assert next(turns.wait(waiting)).estimate_s == pytest.approx(6.0)


def test_a_race_s_share_done_is_both_lanes_tokens_a_finished_lane_all_done():
    from specviz.runs.race import race_done

    state = SimpleNamespace(lanes=[SimpleNamespace(tokens=12, finished=None), SimpleNamespace(tokens=30, finished=None)])
    assert race_done(state, 48) == pytest.approx((12 / 48 + 30 / 48) / 2)
    state.lanes[1].finished = "eos"  # the speculative lane ended early: it has nothing left to do
    assert race_done(state, 48) == pytest.approx((12 / 48 + 1) / 2)


def test_the_estimate_counts_the_measured_hand_off_before_each_job_yet_to_start():
    now = [0.0]
    turns = Turns(clock=lambda: now[0])
    holder = turns.join("race", 10, None)
    next(turns.wait(holder), None)
    after = turns.join("race", 10, None)  # waits while the first holds the model
    now[0] += 5.0
    turns.leave(holder, timed=True)  # 0.5 s a token
    now[0] += 2.0  # its thread wakes 2 s after the model was freed (a busy server)
    assert next(turns.wait(after), None) is None
    assert turns.durations.handoff() == 2.0
    now[0] += 5.0
    turns.leave(after, timed=True)
    now[0] += 60.0  # nobody waited: idle time is no hand-off
    late = turns.join("race", 10, None)
    assert next(turns.wait(late), None) is None and turns.durations.handoff() == pytest.approx(1.0)  # (2 + 0) / 2
    waiting = turns.join("race", 4, None)
    # the running job's 5 s left, then a hand-off to this one: 5 + 1
    assert next(turns.wait(waiting)).estimate_s == pytest.approx(5.0 + 1.0)
    behind = turns.join("race", 4, None)
    assert next(turns.wait(behind)).estimate_s == pytest.approx(5.0 + 1.0 + 2.0 + 1.0)  # + that one's 2 s and hand-off


def test_a_second_request_from_the_same_session_takes_the_waiting_ones_place():
    turns = Turns()
    running = turns.join("race", 1, "someone")
    next(turns.wait(running), None)
    first = turns.join("race", 1, "me")
    waiting = turns.wait(first)
    assert next(waiting).position == 1
    turns.join("race", 1, "me")  # Run again, another prompt
    with pytest.raises(Replaced, match="newer request from the same browser session"):
        next(waiting)
    assert [t.owner for t in turns.queue] == ["someone", "me"]
    mine = turns.join("race", 1, "someone")  # a job already holding the model is never replaced
    assert turns.queue[0] is running and turns.queue[-1] is mine


def test_an_address_keeps_a_few_waiting_jobs_however_many_sessions_it_names():
    """The session id is the client's to choose; the address is what the server saw. A script that names a new
    session for every request is turned away at the cap, in one sentence; other addresses still join, and a job
    that ran frees a place."""
    turns = Turns(per_client=2)
    running = turns.join("race", 1, Owner("10.0.0.9", "a"))
    next(turns.wait(running), None)
    mine = [turns.join("race", 1, Owner("10.0.0.5", f"invented-{i}")) for i in range(2)]
    with pytest.raises(InputError, match="your address already has 2 requests waiting") as e:
        turns.join("race", 1, Owner("10.0.0.5", "invented-3"))
    assert str(e.value).count(". ") == 0  # one sentence
    turns.join("race", 1, Owner("10.0.0.5", "invented-1"))  # the same session again replaces its own job
    other = turns.join("race", 1, Owner("10.0.0.7", "b"))
    assert other in turns.queue and len(turns) == 4
    turns.leave(running)
    next(turns.wait(mine[0]), None)  # one of the address's jobs holds the model now: a place is free
    turns.join("race", 1, Owner("10.0.0.5", "invented-4"))
    assert Turns().per_client is None  # (a queue made without limits caps nothing: the CLI's)
    local = [turns.join("race", 1, Owner(host, f"load-{i}")) for i in range(3) for host in ("127.0.0.1", "::1")]
    assert all(t in turns.queue for t in local)  # loopback (the operator's load test) is not counted


def test_the_presenters_job_goes_ahead_of_the_waiting_ones_never_of_the_running_one():
    turns = Turns()
    running = turns.join("race", 1, "visitor-0")
    next(turns.wait(running), None)
    visitors = [turns.join("race", 1, f"visitor-{i}") for i in (1, 2)]
    presenter = turns.join("race", 1, "presenter", first=True)
    assert turns.queue == [running, presenter, *visitors]
    assert next(turns.wait(presenter)).position == 1 and next(turns.wait(visitors[0])).position == 2


def test_a_job_that_leaves_while_waiting_frees_its_place():
    session = recording_session()
    with session.turns.turn("race", owner="other") as holder:
        next(session.turns.wait(holder), None)
        states = racing.race(session, Limits(), PROMPT, SETTINGS, owner="me")
        assert isinstance(next(states), Waiting) and len(session.turns) == 2
        states.close()  # Stop (or the browser went away) while it waits
        assert len(session.turns) == 1
    assert len(session.turns) == 0


def test_the_same_request_recorded_while_another_waited_is_answered_from_the_recording():
    session = recording_session()
    with session.turns.turn("race", owner="holder") as t:
        next(session.turns.wait(t), None)
        first, second = (racing.race(session, Limits(), PROMPT, SETTINGS, owner=o) for o in ("a", "b"))
        assert isinstance(next(first), Waiting) and isinstance(next(second), Waiting)  # both wait behind
    live = final(first)  # its turn: it runs, and records
    calls = counting(session)
    again = final(second)
    assert not calls and again.recorded_at is not None and lanes(again) == lanes(live)
    assert len(session.turns.durations.rates["race"]) == 2  # the holder and the first: the second never ran


def gated(session: Session):
    """Hold the next model job inside a target forward until the gate opens."""
    gate, held, forward = threading.Event(), threading.Event(), session.pair.target.forward

    def held_forward(*args, **kwargs):
        held.set()
        gate.wait(60)
        return forward(*args, **kwargs)

    session.pair.target.forward = held_forward
    return gate, held, lambda: setattr(session.pair.target, "forward", forward)


def test_while_the_model_is_busy_a_recorded_answer_streams_at_once_and_a_new_request_shows_its_place(
        serve, open_client):
    session = recording_session()
    final(racing.race(session, Limits(), PROMPT, SETTINGS))  # an example, recorded
    _, busy = serve(session, Limits())
    visitor, example = open_client(busy.src), open_client(busy.src)  # sessions of their own
    gate, held, restore = gated(session)
    try:
        running = busy.submit(PROMPT + " one", 4, 24, api_name="/race")
        assert held.wait(30)
        waiting = visitor.submit(PROMPT + " two", 4, 24, api_name="/race")
        start = time.monotonic()
        done = example.submit(PROMPT, 4, 24, 0.0, 0, 1.0, 0, "model", "fixed", api_name="/race").result(timeout=30)
        assert time.monotonic() - start < 10 and done["recorded_at"] and done["event"] == "done"
        deadline = time.monotonic() + 30
        while not [m for m in waiting.outputs() if m["event"] == "queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        queued = [m for m in waiting.outputs() if m["event"] == "queued"]
        assert queued and queued[0]["position"] == 1 and queued[0]["ahead"] == 1
        assert waiting.status().code != Status.FINISHED and held.is_set()  # still waiting: the model is held
    finally:
        gate.set()
        restore()
    assert running.result(timeout=60)["event"] == "done" and waiting.result(timeout=60)["event"] == "done"


def test_the_live_view_and_the_decode_tab_show_the_place_in_the_queue():
    w = Waiting(position=2, ahead=3, estimate_s=41.0)
    update = next(live_updates(iter([(w, True)])))
    assert "number 2 in line, 3 ahead of you" in update.live.speed and "about 41 s" in update.live.speed
    assert update.race is None  # the lanes stay as they were
    assert "no estimate yet" in waiting_main(replace(w, estimate_s=None)).caption


# ------------------------------------------------------------------ the presenter


def test_the_broadcast_fans_out_copies_of_the_presenters_states_at_no_model_cost():
    session = recording_session()
    broadcast = Broadcast()
    assert broadcast.latest().state is None
    seen = []
    for state in broadcast.publishing(racing.race(session, Limits(), PROMPT, SETTINGS)):
        published = broadcast.latest()
        seen.append(published.version)
        assert published.state is not state and lanes(published.state) == lanes(state)  # a copy, as it stands
    assert seen == list(range(1, len(seen) + 1)) and broadcast.latest().run == 1
    before = broadcast.latest().state
    final(broadcast.publishing(racing.race(session, Limits(), PROMPT + " again", SETTINGS)))
    assert broadcast.latest().run == 2 and before.spec.tokens == 24  # an old copy never changes
    views = follow.FollowViews()
    first = views.update_for(broadcast.latest())
    assert views.update_for(broadcast.latest()) is first  # built once for every follower
    assert "Following the presenter" in first.live.speed and first.race is not None


def test_a_visitor_without_the_key_cannot_present():
    assert is_presenter(KEY, KEY) and is_presenter(KEY, f" {KEY} ")
    for given in ("", None, "projector-7422", KEY[:-1], 12345678):
        assert not is_presenter(KEY, given)
    assert not is_presenter(None, "anything")  # no key set: nobody presents
    demo = build_server(recording_session(), Limits(), presenter_key=KEY)
    names = {fn.name: fn for fn in demo.fns.values()}
    assert {"on_present", "on_follow", "on_restore"} <= set(names)
    with pytest.warns(UserWarning, match="^that is not this server's presenter key.$"):  # a toast, one sentence
        refused = names["on_present"].fn("guess", None)
    assert refused[-1] == "" and not [v for v in refused[:-1] if v is True]  # not presenting; the box emptied
    assert names["on_present"].fn(KEY, None)[0] is True
    api = {fn.api_name for fn in demo.fns.values() if fn.api_visibility != "private"}
    assert not [n for n in api if "present" in str(n) or "follow" in str(n)]  # no endpoint can present
    on_live = next(fn for fn in demo.fns.values() if fn.name == "on_live")
    presenting = on_live.inputs[0]
    assert isinstance(presenting, gr.State) and presenting.value is False  # set only by the key, server-side
    plain = build_server(recording_session(), Limits())
    assert not {"on_present", "on_follow"} & {fn.name for fn in plain.fns.values()}


# ------------------------------------------------------------------ the room's flags and its warm-up


def served(monkeypatch, argv) -> dict:
    from specviz import server as server_module

    seen = {}
    monkeypatch.setattr(server_module, "build_server", lambda session, limits, options=None, *, defaults, **room:
                        seen.update(session=session, limits=limits, defaults=defaults, room=room))
    monkeypatch.setattr(server_module, "launch", lambda demo, **kw: seen.update(launch=kw))
    monkeypatch.setattr("specviz.runs.room.record_examples", lambda *a, **k: seen.update(warm=a))
    assert main(["serve", "--draft", "tiny", "--target", "tiny", *argv]) == 0
    return seen


def test_serve_room_sets_tighter_limits_prints_them_and_a_flag_given_wins(monkeypatch, capsys):
    seen = served(monkeypatch, ["--room", "--presenter-key", KEY])
    limits = seen["limits"]
    assert (limits.max_new_tokens, limits.max_samples, limits.max_seconds) == tuple(ROOM_LIMITS.values())
    assert seen["defaults"].max_new_tokens == 24  # the app opens at the room's default
    assert seen["room"] == {"presenter_key": KEY} and seen["session"].recordings is not None
    assert [len(p) > 0 for p in seen["warm"][2]] == [True] * 5  # the app's examples, recorded after loading
    out = capsys.readouterr().out
    assert "a room: 48 new tokens" in out and "16 samples per side, 30 s per request" in out
    assert "recorded answers on (64 MB)" in out and "a presenter key is set" in out
    assert KEY not in out  # the key is never printed
    seen = served(monkeypatch, ["--room", "--max-seconds", "60", "--no-recorded", "--max-new-tokens", "40"])
    assert seen["limits"].max_seconds == 60 and seen["limits"].max_new_tokens == 48
    assert seen["defaults"].max_new_tokens == 40  # a decoding flag given wins too
    assert seen["session"].recordings is None and "warm" not in seen
    seen = served(monkeypatch, [])
    assert seen["limits"] == Limits() and seen["defaults"].max_new_tokens == 64


def test_a_short_presenter_key_is_refused_in_one_sentence(capsys):
    assert main(["serve", "--draft", "tiny", "--target", "tiny", "--presenter-key", "short"]) == 2
    assert "the presenter key must have at least 8 characters." in capsys.readouterr().err


def test_the_examples_are_recorded_in_the_background_and_a_click_meanwhile_is_served():
    session = recording_session()
    prompts = [f"{PROMPT} {i}" for i in range(3)]
    joined = []
    join = session.turns.join
    session.turns.join = lambda kind, work, owner, first: joined.append(owner) or join(kind, work, owner, first)
    thread = record_examples(session, Limits(), prompts, SETTINGS)
    visitor = final(racing.race(session, Limits(), "a visitor's own prompt", SETTINGS, owner="visitor"))
    thread.join(60)
    assert not thread.is_alive() and len(session.recordings) == 4
    # 3 races and the calibration, and again any race cut because the visitor was waiting
    assert joined.count(WARM_UP) >= 4 and "visitor" in joined and visitor.spec.finished == "length"
    assert len(session.turns.durations.rates["distribution"]) == 1  # timed once: the estimates know its cost
    calls = counting(session)
    assert final(racing.race(session, Limits(), prompts[1], SETTINGS)).recorded_at and not calls


def test_a_visitor_goes_ahead_of_the_apps_own_waiting_work_never_of_a_running_job():
    turns = Turns()
    running = turns.join("race", 1, WARM_UP)
    next(turns.wait(running), None)
    background = turns.join("race", 1, WARM_UP)
    assert not turns.visitor_waiting()
    visitor = turns.join("race", 1, Owner("10.0.0.5", "v"))
    assert turns.queue == [running, visitor, background] and turns.visitor_waiting()
    waiting = next(turns.wait(visitor))
    assert waiting.position == 1 and waiting.background  # only the app's own warm-up holds the model
    assert "the app is recording its examples in the background" in queue_line(waiting)
    later = turns.join("race", 1, "another visitor")
    assert turns.queue == [running, visitor, later, background]  # visitors in the order they came
    assert "number 2 in line" in queue_line(next(turns.wait(later)))


def test_a_warm_up_race_holding_the_model_yields_to_a_visitor_and_is_recorded_later():
    """The app records its examples in the background while a visitor clicks: the warm-up race holding the model
    stops at its next event (its forwards stop), the visitor's race runs next, and the cut example is raced
    again afterwards and recorded; the log counts recordings only. (Before: the visitor waited for every
    example queued ahead of it, 20 s on a 2-core Zen 4.)"""
    session = recording_session()
    forward, calls, started = session.pair.target.forward, [], threading.Event()

    def slow(*args, **kwargs):  # a warm-up of seconds, however fast the machine
        calls.append(warm_up_while_a_visitor_waits(session.turns))
        started.set()
        time.sleep(0.02)
        return forward(*args, **kwargs)
    session.pair.target.forward = slow
    prompts = [f"{PROMPT} {i}" for i in range(2)]
    lines = []
    settings = SETTINGS | {"max_new_tokens": 48}
    thread = record_examples(session, Limits(), prompts, settings, log=lines.append, calibrate=False)
    assert started.wait(30)
    clicked, at_click = time.monotonic(), len(calls)
    states = racing.race(session, Limits(), "a visitor's own prompt", settings, owner=Owner("10.0.0.5", "v"))
    first = next(s for s in states if not isinstance(s, Waiting))
    waited, forwards = time.monotonic() - clicked, sum(calls[at_click:])
    visitor = final(states)
    thread.join(120)
    assert not thread.is_alive() and visitor.spec.finished == "length"
    # counted in forwards, not seconds (a busy machine stretches seconds): while the visitor waited, the warm-up took
    # at most one event's worth of forwards (0 here; 69 without the yield)
    assert forwards <= 10, f"{forwards} warm-up forwards ({waited:.2f} s) before the visitor's first event"
    assert len(lines) == 1 and lines[0].startswith("recorded 2 of 2 examples in ")
    assert len(session.recordings) == 3  # both examples (one raced again after the cut) and the visitor's run


def test_an_input_error_comes_before_any_turn():
    session = recording_session()
    with session.turns.turn("race", owner="holder") as t:
        next(session.turns.wait(t), None)
        with pytest.raises(InputError, match="K must be"):
            racing.race(session, Limits(), PROMPT, SETTINGS | {"k": 0})  # refused at once, not in the queue
        assert len(session.turns) == 1


def test_serve_demo_opens_what_the_demo_script_uses_on_loopback_only(monkeypatch, capsys):
    from specviz.commands.serve import DEMO_ENGINES

    seen = served(monkeypatch, ["--demo"])
    assert seen["session"].allow_switch  # the int4 target, if the room asks
    out = capsys.readouterr().out
    assert "pair switching on" in out and "engines visitors may race: " + ", ".join(DEMO_ENGINES) in out
    seen = served(monkeypatch, [])
    assert not seen["session"].allow_switch and "engines visitors may race: none" in capsys.readouterr().out
    assert main(["serve", "--draft", "tiny", "--target", "tiny", "--demo", "--host", "0.0.0.0"]) == 2
    assert "--demo serves on this machine only" in capsys.readouterr().err
