"""A streamed result's edits (`api.diffs`): applied by gradio_client in order they give the new result, where Gradio's
own edits break on a list shortening inside a list that shortens (a round's drafted tokens and their candidates)."""

from __future__ import annotations

import pytest
from gradio_client.utils import apply_diff
from hypothesis import given, settings, strategies as st

from specviz.api import diffs

# two rounds as /rounds streams them, cut down: fewer drafted tokens, and the residual candidates moved from the
# rejected token of the first round to another of the second
FIRST = {"event": "round", "round": {"k": 4, "drafted": [
    {"id": 1, "residual_top": [{"id": 7, "p": 1.0}]}, {"id": 2, "residual_top": []},
    {"id": 3, "residual_top": [{"id": 8, "p": 0.5}, {"id": 9, "p": 0.5}]}, {"id": 4, "residual_top": []}]}}
SECOND = {"event": "round", "round": {"k": 2, "drafted": [
    {"id": 5, "residual_top": []}, {"id": 6, "residual_top": [{"id": 9, "p": 1.0}]}]}}


def test_two_rounds_edits_give_the_second_round():
    assert apply_diff(FIRST, diffs.diff(FIRST, SECOND)) == SECOND
    assert apply_diff(SECOND, diffs.diff(SECOND, FIRST)) == FIRST


def test_control_gradios_own_edits_break_there():
    try:
        assert apply_diff(FIRST, diffs.GRADIO(FIRST, SECOND)) != SECOND
    except IndexError:
        pass  # (what the API's clients saw)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "a", "ab", "b"]),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3), max_leaves=12)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(json_values, json_values)
def test_any_two_results_edits_give_the_second(old, new):
    assert apply_diff(old, diffs.diff(old, new)) == new


@pytest.mark.parametrize("old,new", [([1, [1, 2]], [1, [1]]), ({"a": [1, 2, 3]}, {"a": [3]}), ("ab", "abc")])
def test_simple_cases_are_gradios_own_edits(old, new):
    """Where no list shortens inside another that does, the edits are Gradio's, as its clients have always read."""
    assert diffs.diff(old, new) == diffs.GRADIO(old, new)
