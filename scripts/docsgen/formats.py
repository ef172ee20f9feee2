"""The number formats templates print with (`{{ r.summary.speedup | x }}`): one place decides how a value reads."""

from __future__ import annotations

from types import MappingProxyType


def f(x, digits: int = 2) -> str:
    return format(x, f",.{digits}f")


def times(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}×"


def interval(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(no interval: under three prompts)"


def percent(x, digits: int = 0) -> str:
    return f"{100 * x:.{digits}f}%"


def seq(xs, digits: int = 2) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in xs)


def by_kind(d: dict, fmt=times) -> str:
    return ", ".join(f"{kind} {fmt(v)}" for kind, v in d.items())


def pvalue(p) -> str:
    """A p-value: two decimals, three below 0.01, two significant figures in exponent form below 0.001."""
    if p is None:
        return "–"
    return ("0" if p == 0 else f"{p:.2f}" if p >= 0.01 else f"{p:.3f}" if p >= 1e-3
            else f"{p:.1e}".replace("e-0", "e-"))


def ms(s, digits: int = 0) -> str:
    return f"{1000 * s:.{digits}f} ms"


def gb(b) -> str:
    return f"{b / 1e9:.2f} GB"


def minutes(s) -> str:
    return f"{s / 60:.1f} min"


# the filters' names in templates
FILTERS = MappingProxyType({"f": f, "x": times, "ci": interval, "pct": percent, "seq": seq, "by_kind": by_kind,
                            "p": pvalue, "ms": ms, "gb": gb, "minutes": minutes})
