"""Values templates read from the package itself rather than from a report: the limits `specviz serve` takes
(specviz is imported when a template calls it, not before)."""

from __future__ import annotations


def limit_options() -> list[tuple[str, object, str]]:
    """(flag, default, help) of every limit `specviz serve` takes, from the `Limits` spec."""
    from specviz.settings.limits import Limits
    from specviz.settings.options import options_of

    return [(flag, s.default, s.help) for s, flag, _ in options_of(Limits)]

