"""Will the target accept this drafted token? A small logistic model fitted on recorded rounds.

Each verified drafted token is one example: its features are what the draft knew when it proposed the
token (`specviz.engine.acceptance`: how sure it was, where in the round the token stands, which drafter
made it), its label whether the target accepted it. Tokens after a rejection were never tested and are left out. The fit is plain maximum likelihood with a small L2
penalty (scipy's L-BFGS); calibration is reported as the Brier score and a reliability table, on rounds
the model was not fitted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from specviz.engine.acceptance import FEATURES, AcceptanceModel, token_features
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, Round


def examples(rounds: Iterable[Round]) -> tuple[np.ndarray, np.ndarray]:
    """(X [n, features], y [n]) over every drafted token the target tested."""
    x, y = [], []
    for r in rounds:
        for i, t in enumerate(r.drafted):
            if t.status != NOT_VERIFIED:
                x.append(token_features(t, i, r.drafter))
                y.append(float(t.status == ACCEPTED))
    return np.array(x, dtype=float).reshape(-1, len(FEATURES)), np.array(y)


def predict_all(model: AcceptanceModel, x: np.ndarray) -> np.ndarray:
    """The model's prediction for every row of X at once."""
    return expit(model.bias + np.asarray(x, dtype=float) @ np.array(model.weights))


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-5) -> AcceptanceModel:
    """Maximum likelihood. A tiny L2 penalty on the weights (not the bias) pins a feature that is constant in
    the data (collinear with the bias) instead of letting it drift; a feature always 0 keeps weight 0."""
    if len(y) == 0:
        raise ValueError("no verified drafted tokens to fit on")

    def loss(w):
        z = w[0] + x @ w[1:]
        # log(1 + e^z) - y z, the logistic log-loss, averaged; np.logaddexp keeps it finite for large |z|
        value = np.mean(np.logaddexp(0.0, z) - y * z) + l2 * w[1:] @ w[1:]
        grad_z = (expit(z) - y) / len(y)
        return value, np.concatenate([[grad_z.sum()], x.T @ grad_z + 2 * l2 * w[1:]])

    w = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B").x
    return AcceptanceModel(float(w[0]), tuple(float(v) for v in w[1:]))


def brier(predicted: Sequence[float], outcomes: Sequence[float]) -> float:
    """Mean squared error of the predicted probabilities (0 is perfect; always guessing the base rate b
    scores b(1 - b))."""
    p, y = np.asarray(predicted, dtype=float), np.asarray(outcomes, dtype=float)
    return float(np.mean((p - y) ** 2))


@dataclass(frozen=True)
class ReliabilityBin:
    low: float
    high: float
    n: int
    predicted: float  # mean predicted probability in the bin
    observed: float  # fraction accepted in the bin


def reliability(predicted: Sequence[float], outcomes: Sequence[float], bins: int = 5) -> list[ReliabilityBin]:
    """Predictions grouped into equal-width bins: a calibrated model's bins have predicted ≈ observed."""
    p, y = np.asarray(predicted, dtype=float), np.asarray(outcomes, dtype=float)
    which = np.minimum((p * bins).astype(int), bins - 1)
    return [ReliabilityBin(b / bins, (b + 1) / bins, int(m.sum()), float(p[m].mean()), float(y[m].mean()))
            for b in range(bins) if (m := which == b).any()]


def calibration(fit_rounds: Sequence[Round], test_rounds: Sequence[Round], bins: int = 5) -> dict | None:
    """Fit on some rounds, judge on others (never the same): the Brier score beside the base rate's, and
    the reliability table. None when either side has no verified drafted token."""
    x, y = examples(fit_rounds)
    xt, yt = examples(test_rounds)
    if len(y) == 0 or len(yt) == 0:
        return None
    model = fit(x, y)
    predicted = predict_all(model, xt)
    base = float(y.mean())  # the rate seen when fitting: what a model without features would predict
    return {"fitted_on_tokens": len(y), "tested_on_tokens": len(yt), "brier": round(brier(predicted, yt), 4),
            "brier_base_rate": round(brier(np.full(len(yt), base), yt), 4),
            "model": {"bias": round(model.bias, 4), **{f: round(w, 4) for f, w in zip(FEATURES, model.weights)}},
            "reliability": [{"bin": f"{b.low:.1f}-{b.high:.1f}", "n": b.n, "predicted": round(b.predicted, 3),
                             "observed": round(b.observed, 3)} for b in reliability(predicted, yt, bins)]}
