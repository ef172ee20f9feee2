"""Values templates read from the package itself rather than from a report: the limits `specviz serve` takes, and
the cost model's prediction at an acceptance (specviz is imported when a template calls one, not before)."""

from __future__ import annotations


def limit_options() -> list[tuple[str, object, str]]:
    """(flag, default, help) of every limit `specviz serve` takes, from the `Limits` spec."""
    from specviz.settings.limits import Limits
    from specviz.settings.options import options_of

    return [(flag, s.default, s.help) for s, flag, _ in options_of(Limits)]


def predicted_at(step: dict, acceptance: float) -> dict:
    """The cost model's best K and speedup at one acceptance, from a `specviz costs` step report."""
    from specviz.bench.shape_costs import cost_of, predictions

    return predictions(cost_of(step), (acceptance,))[0]
