"""The acceptance predictor on synthetic rounds where the answer is known, and its calibration measures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specviz.analysis.acceptance import brier, examples, fit, predict_all, reliability
from specviz.engine.acceptance import FEATURES, AcceptanceModel, entropy_of_top
from specviz.engine.acceptance import token_features as features
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, REJECTED, Candidate, DraftedToken, Round

# confident drafts pass; later positions a bit less; the drafter (one-hot after "model") plays no part
TRUE = AcceptanceModel(-3.0, (6.0, -0.5, -0.3, *[0.0] * (len(FEATURES) - 3)))


def token(top: float, status: str, rest: int = 3) -> DraftedToken:
    """A drafted token whose draft showed `top` on its first candidate and spread the rest evenly."""
    others = [Candidate(i + 2, "x", (1 - top) / rest) for i in range(rest)]
    return DraftedToken(1, "a", top, 0.5, 1.0, 0.1, status, top, 0.5, 1.0, q_top=[Candidate(1, "a", top), *others])


def synthetic_rounds(n: int, model: AcceptanceModel, seed: int = 0, k: int = 4) -> list[Round]:
    """Rounds whose acceptances are drawn from `model`, position by position, a round stopping at its first
    rejection (the later drafts never tested), as the rule does."""
    rng = np.random.default_rng(seed)
    rounds = []
    for index in range(n):
        drafted, rejected = [], False
        for i in range(k):
            # the rest spread over 1..9 tokens: the entropy varies apart from the top probability
            top, rest = float(rng.uniform(0.2, 1.0)), int(rng.integers(1, 10))
            if rejected:
                drafted.append(token(top, NOT_VERIFIED, rest))
                continue
            p = model.predict(features(token(top, ACCEPTED, rest), i, "model"))
            rejected = rng.uniform() >= p
            drafted.append(token(top, REJECTED if rejected else ACCEPTED, rest))
        accepted = sum(t.status == ACCEPTED for t in drafted)
        rounds.append(Round(index, "model", k, drafted, accepted, None, [], 0, "", 0.0, 0.0, 0.0))
    return rounds


def test_features_are_what_the_draft_showed():
    t = token(0.7, ACCEPTED)
    entropy = -(0.7 * math.log(0.7) + 3 * 0.1 * math.log(0.1))
    assert features(t, 2, "lookup") == [0.7, pytest.approx(entropy), 2.0, 1.0, 0.0, 0.0]
    assert features(t, 0, "self")[3:] == [0.0, 0.0, 1.0]
    lone = DraftedToken(1, "a", 1.0, 1.0, 1.0, 0.0, ACCEPTED, 1.0, 1.0, 1.0, q_top=[Candidate(1, "a", 0.6)])
    assert features(lone, 0, "model")[1] == pytest.approx(-(0.6 * math.log(0.6) + 0.4 * math.log(0.4)))  # one lump
    assert entropy_of_top([0.5, 0.5]) == pytest.approx(math.log(2)) and entropy_of_top([1.0]) == 0.0
    assert len(features(t, 0, "model")) == len(FEATURES)


def test_only_tested_drafts_are_examples():
    rounds = synthetic_rounds(50, TRUE)
    x, y = examples(rounds)
    tested = [t for r in rounds for t in r.drafted if t.status != NOT_VERIFIED]
    assert len(y) == len(tested) and y.sum() == sum(t.status == ACCEPTED for t in tested)
    assert set(x[:, 2]) <= {0.0, 1.0, 2.0, 3.0}


def test_the_fit_recovers_a_known_model_and_is_calibrated_on_rounds_it_did_not_see():
    x, y = examples(synthetic_rounds(3000, TRUE, seed=1))
    model = fit(x, y)
    assert model.bias == pytest.approx(TRUE.bias, abs=0.6)
    assert model.weights[0] == pytest.approx(TRUE.weights[0], abs=0.8)
    assert model.weights[1] == pytest.approx(TRUE.weights[1], abs=0.3)  # entropy  # top probability: the strong signal
    assert model.weights[2] == pytest.approx(TRUE.weights[2], abs=0.2)  # position
    assert set(model.weights[3:]) == {0.0}  # drafters never seen: no weight
    xt, yt = examples(synthetic_rounds(1000, TRUE, seed=2))
    predicted = predict_all(model, xt)
    assert brier(predicted, yt) == pytest.approx(brier(predict_all(TRUE, xt), yt), abs=0.005)  # as good as the truth
    base = yt.mean()
    assert brier(predicted, yt) < base * (1 - base) - 0.03  # and clearly better than guessing the base rate
    for b in reliability(predicted, yt):  # each bin's observed rate within 4 binomial standard errors
        assert abs(b.observed - b.predicted) <= 4 * math.sqrt(b.predicted * (1 - b.predicted) / b.n) + 1e-9, b


def test_features_without_signal_give_the_base_rate():
    rng = np.random.default_rng(3)
    x = rng.uniform(size=(4000, len(FEATURES)))
    y = (rng.uniform(size=4000) < 0.3).astype(float)
    predicted = predict_all(fit(x, y), x)
    assert predicted.mean() == pytest.approx(y.mean(), abs=1e-4)  # the bias's score equation: an exact property
    assert predicted.std() < 0.03  # noise features earn (almost) no weight


def test_brier_and_reliability_by_hand():
    assert brier([1, 0, 0.5], [1, 0, 1]) == pytest.approx(0.25 / 3)
    bins = reliability([0.1, 0.15, 0.9, 0.95, 1.0], [0, 1, 1, 1, 0], bins=5)
    assert [(b.low, b.n) for b in bins] == [(0.0, 2), (0.8, 3)]
    assert bins[0].predicted == pytest.approx(0.125) and bins[0].observed == 0.5
    assert bins[1].predicted == pytest.approx(0.95) and bins[1].observed == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no verified"):
        fit(np.zeros((0, len(FEATURES))), np.zeros(0))


def test_one_prediction_is_the_batched_one_and_survives_json():
    x = examples(synthetic_rounds(20, TRUE))[0]
    assert [TRUE.predict(row) for row in x] == pytest.approx(list(predict_all(TRUE, x)), abs=1e-12)
    assert AcceptanceModel.from_dict(json.loads(json.dumps(TRUE.to_dict()))) == TRUE
