"""Settings specs, flattened into what every surface needs, and validated with one clear sentence.

A spec is a dataclass whose fields are pydantic `Field`s: `DecodeConfig` (the decoder's knobs,
engine), `PairSpec` (which models, models), `Limits` (what one request may ask, here) and
`DistributionSettings`. `fields_of` flattens one into `Setting`s (a nested spec such as
`SamplingParams` inline), each with its label, help, type, default and range or choices. The CLI
options (`settings.options`), the Gradio controls (`ui.controls`) and the API parameters
(`api.endpoints`) are generated from them, and `validate` checks raw values (a form, a request,
command-line flags) against them: the first bad one raises `InputError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass
from typing import Literal, Union, get_args, get_origin

import annotated_types as at

from specviz.settings.errors import InputError


@dataclass(frozen=True)
class Setting:
    name: str
    path: tuple[str, ...]  # where it lives in the spec, e.g. ("sampling", "temperature")
    label: str
    help: str
    kind: type  # int, float, str or bool
    default: object
    lo: float | None = None
    hi: float | None = None  # from a server limit when `limit` names one
    lo_open: bool = False  # lo itself is excluded (top-p > 0)
    choices: tuple | None = None
    optional: bool = False  # None (empty) is a value: "none"
    step: float | None = None
    min_nonzero: float | None = None  # values in (0, min_nonzero) are refused (temperature)
    must: str | None = None  # how the valid values read, where "between lo and hi" would not say it
    limit: str | None = None

    @property
    def must_text(self) -> str:
        if self.must and not self.limit:
            return self.must
        if self.lo is not None and self.hi is not None:
            return f"between {number_text(self.lo)} and {number_text(self.hi)}"
        if self.lo_open:
            return f"above {number_text(self.lo)}"
        if self.kind is int:
            return f"a whole number of at least {number_text(self.lo)}"
        return f"at least {number_text(self.lo)}"


INT64 = 2**63  # a whole number a setting takes fits in 64 bits: JSON's encoders (Gradio's orjson) refuse any larger


def number_text(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def short(value, n: int = 40) -> str:
    """A bad value, quoted for a message without echoing megabytes back."""
    if isinstance(value, float):
        return number_text(value)
    text = repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"


def fields_of(spec: type, limits=None) -> list[Setting]:
    """The settings of `spec` in declaration order; `limits` (an object with the named limits) sets
    the upper bound of fields capped by one."""
    out: list[Setting] = []
    for name, info in spec.__pydantic_fields__.items():
        if dataclasses.is_dataclass(info.annotation):  # a nested spec: its fields inline
            out += [dataclasses.replace(s, path=(name, *s.path)) for s in fields_of(info.annotation, limits)]
        else:
            out.append(_setting(name, info, limits))
    return out


def _setting(name: str, info, limits) -> Setting:
    kind, optional, choices = info.annotation, False, None
    if get_origin(kind) in (Union, types.UnionType):
        kind, optional = next(a for a in get_args(kind) if a is not type(None)), True
    if get_origin(kind) is Literal:
        choices, kind = get_args(kind), str
    bounds = {}
    for m in info.metadata:
        for attr in ("ge", "gt", "le"):
            if isinstance(m, (at.Ge, at.Gt, at.Le)) and hasattr(m, attr):
                bounds[attr] = getattr(m, attr)
    extra = info.json_schema_extra or {}
    limit = extra.get("limit")
    hi = getattr(limits, limit) if limit and limits is not None else bounds.get("le")
    default = info.get_default(call_default_factory=True)
    if limit and limits is not None:
        default = offered(default, hi)
    return Setting(name=name, path=(name,), label=info.title or name, help=info.description or "", kind=kind,
                   default=default, lo=bounds.get("ge", bounds.get("gt")),
                   hi=hi, lo_open="gt" in bounds, choices=choices, optional=optional, step=extra.get("step"),
                   min_nonzero=extra.get("min_nonzero"), must=extra.get("must"), limit=limit)


def offered(value, limit):
    """A default as a server offers it: a server with a lower limit than the default (a room, `--max-k`) offers its
    limit, so that a request leaving the setting out is not refused."""
    return min(value, limit) if isinstance(value, (int, float)) and not isinstance(value, bool) and limit is not None \
        else value


def as_number(label: str, value, kind: type = float):
    """`value` as an int or float, or an InputError saying why it is not one."""
    if isinstance(value, bool):
        raise InputError(f"{label} must be a number, got {value!r}.")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
        raise InputError(f"{label} must be a number, got {short(value)}.") from None
    if not math.isfinite(x):
        raise InputError(f"{label} must be a finite number, got {short(value)}.")
    if kind is int:
        if x != int(x):
            raise InputError(f"{label} must be a whole number, got {short(value)}.")
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():  # (a float has rounded a long one)
            return int(value)
        return value if isinstance(value, int) else int(x)
    return x


def check(s: Setting, value):
    """One raw value, checked and converted, or an InputError naming the setting."""
    if s.optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))):
        return None
    if s.choices is not None:
        if value not in s.choices:
            raise InputError(f"{s.label} must be one of {', '.join(map(str, s.choices))}, got {short(value)}.")
        return value
    if s.kind is bool:
        if not isinstance(value, bool):
            raise InputError(f"{s.label} must be true or false, got {short(value)}.")
        return value
    if s.kind is str:
        if not isinstance(value, str):
            raise InputError(f"{s.label} must be text, got {short(value)}.")
        return value
    x = as_number(s.label, value, s.kind)
    below = s.lo is not None and (x <= s.lo if s.lo_open else x < s.lo)
    above = s.hi is not None and x > s.hi
    if below or above or (s.min_nonzero is not None and 0 < x < s.min_nonzero):
        raise InputError(f"{s.label} must be {s.must_text}, got {number_text(x)}.")
    if s.kind is int and not -INT64 <= x < INT64:  # (unbounded) refused here, or an answer echoing it cannot be sent
        raise InputError(f"{s.label} must be {s.must_text}; {short(value)} does not fit in 64 bits.")
    return x


def checked_values(spec: type, values: dict, limits=None) -> dict:
    """`values` (by flat setting name) checked, converted and nested as `spec` takes them."""
    settings = fields_of(spec, limits)
    unknown = sorted(set(values) - {s.name for s in settings})
    if unknown:
        raise InputError(f"{unknown[0]!r} is not a setting; the settings are {', '.join(s.name for s in settings)}.")
    nested: dict = {}
    for s in settings:
        if s.name in values:
            *outer, leaf = s.path
            node = nested
            for part in outer:
                node = node.setdefault(part, {})
            node[leaf] = check(s, values[s.name])
    return nested


def validate(spec: type, values: dict, limits=None):
    """An instance of `spec` from raw values; missing ones take their defaults."""
    return spec(**checked_values(spec, values, limits))  # a nested spec's dict becomes that spec


def flat_values(instance) -> dict:
    """The flat setting values of a spec instance (the inverse of `validate`)."""
    out = {}
    for s in fields_of(type(instance)):
        value = instance
        for part in s.path:
            value = getattr(value, part)
        out[s.name] = value
    return out
