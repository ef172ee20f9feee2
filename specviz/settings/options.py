"""Command-line options generated from a settings spec (argparse, no hand-written flags).

Each setting becomes `--its-name` (or the flag its metadata names), with its help, choices, range and
default in `--help`. Values stay raw here: `settings.spec.validate` checks them, so a bad flag gets the same
sentence as a bad value in the app or the API.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from specviz.settings.spec import Setting, fields_of, number_text


def options_of(spec: type, limits=None) -> list[tuple[Setting, str, str]]:
    """(setting, flag, dest) for each setting of `spec`; a field's metadata may name its own flag."""
    out = []
    for s in fields_of(spec, limits):
        extra = spec.__pydantic_fields__[s.path[0]].json_schema_extra if len(s.path) == 1 else None
        option = (extra or {}).get("flag") or "--" + s.name.replace("_", "-")
        out.append((s, option, option.removeprefix("--").replace("-", "_")))
    return out


def help_text(s: Setting, several: bool = False) -> str:
    parts = []
    if s.choices is None and s.kind in (int, float):
        parts.append(s.must_text if s.must and not s.limit else
                     f"{number_text(s.lo)}..{number_text(s.hi)}" if s.hi is not None else f">= {number_text(s.lo)}")
    if s.optional:
        parts.append("'none' for none")
    if several:
        parts.append(f"one or more of {', '.join(map(str, s.choices))}, comma-separated" if s.choices
                     else "several, comma-separated, e.g. 4,8")
    if s.kind is not bool:
        parts.append(f"default: {s.default}")
    text = f"{s.help} ({'; '.join(parts)})" if parts else s.help
    return text.replace("%", "%%")  # argparse formats help with %


def add_options(parser, spec: type, limits=None, *, skip: tuple[str, ...] = (), several: tuple[str, ...] = (),
                defaults: dict | None = None):
    """One option per setting of `spec` (but `skip`); `several`: settings that take a comma-separated list;
    `defaults`: a command's own defaults for some settings (by name), in place of the spec's."""
    for s, option, dest in options_of(spec, limits):
        if s.name in skip:
            continue
        if defaults and s.name in defaults:
            s = replace(s, default=defaults[s.name])
        if s.kind is bool:
            action = argparse.BooleanOptionalAction if s.default else "store_true"  # on by default: --no-x
            parser.add_argument(option, dest=dest, action=action, default=s.default, help=help_text(s))
        else:
            many = s.name in several  # a list: its choices are checked by `validate`, one value at a time
            parser.add_argument(option, dest=dest, default=s.default, choices=None if many else s.choices,
                                metavar=None if s.choices and not many else dest.upper(), help=help_text(s, many))


def values_of(args: argparse.Namespace, spec: type) -> dict:
    """The values of `spec`'s settings among parsed arguments (for `settings.spec.validate`)."""
    return {s.name: getattr(args, dest) for s, _, dest in options_of(spec) if hasattr(args, dest)}


def several_values(text) -> list:
    """A comma-separated flag value as a list (a default arrives as a plain value)."""
    return [part.strip() for part in text.split(",") if part.strip()] if isinstance(text, str) else [text]
