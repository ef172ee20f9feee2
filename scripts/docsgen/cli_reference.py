"""docs/reference/cli.md: every command, flag, default and range, from the parsers `specviz.cli.build_parser`
builds (the settings specs' options among them), as `specviz COMMAND --help` shows them."""

from __future__ import annotations

import argparse
import os
import re

from docsgen.markdown import banner, cell


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser as a fresh shell would build it: defaults read from the environment take their own."""
    from specviz import cli

    saved = {k: os.environ.pop(k) for k in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT") if k in os.environ}
    try:
        return cli.build_parser()
    finally:
        os.environ.update(saved)


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            out += [(name, helps.get(name) or "", sub) for name, sub in action.choices.items()]
    return out


def flag_text(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return " / ".join(f"`{o}`" for o in action.option_strings)


def value_text(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "on / off" if isinstance(action, argparse.BooleanOptionalAction) else "(a switch)"
    if action.choices is not None:
        return " · ".join(f"`{c}`" for c in action.choices)
    return f"`{action.metavar or action.dest.upper()}`"


def default_text(action: argparse.Action) -> str:
    if action.required:
        return "required"
    d = action.default
    if d is None or d == argparse.SUPPRESS or d == "":
        return "–"
    if isinstance(d, bool):
        return "on" if d else "off"
    return f"`{d}`"


def help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as `--help` prints it (its %(default)s and %% expanded), its "default: X" the parser's own default
    where a command sets another than the spec's (prove's sampling temperature)."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    d = action.default
    m = re.search(r"default: (-?\d+(?:\.\d+)?)\)", text)
    if m and isinstance(d, (int, float)) and not isinstance(d, bool) and float(m.group(1)) != float(d):
        text = text[:m.start(1)] + str(d) + text[m.end(1):]
    return text


def anchor(*words: str) -> str:
    """The id Python-Markdown's toc gives a heading `` `specviz serve` ``."""
    return "-".join(words)


def command_section(path: list[str], summary: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    name = " ".join(path)
    lines = [f"{'#' * depth} `{name}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        title = {"options": "options", "optional arguments": "options"}.get(group.title, group.title)
        lines += [f"**{title}**", "", "| flag | value | default | what it does |", "|---|---|---|---|"]
        lines += [f"| {flag_text(a)} | {value_text(a)} | {default_text(a)} | {cell(help_of(parser, a))} |"
                  for a in actions]
        lines.append("")
    for sub_name, sub_help, sub in subcommands(parser):
        lines += command_section([*path, sub_name], sub_help, sub, depth + 1)
    return lines


def cli_page(parser: argparse.ArgumentParser) -> str:
    """Every command of `parser` with every flag: its value, default, range and help, in the parser's order."""
    lines = [banner("the parsers in specviz/cli.py (`build_parser`)").rstrip(), "", "# CLI reference", "",
             "Generated from the parsers `specviz --help` prints: every option a settings spec declares shows its "
             "range and default as the spec says, and a bad value gets the same one-sentence message as in the app "
             "(`specviz: bad flag: K must be between 1 and 256, got 0.`). The guide to the commands: "
             "[The CLI](../cli.md).", ""]
    top = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    lines += ["Global options, before the command: "
              + "; ".join(f"{flag_text(a)}: {help_of(parser, a) or a.dest}" for a in top) + ".", ""]
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{parser.prog} {name}`](#{anchor(parser.prog, name)}) | {cell(summary)} |"
              for name, summary, _ in subcommands(parser)]
    lines.append("")
    for name, summary, sub in subcommands(parser):
        lines += command_section([parser.prog, name], summary, sub, 2)
    return "\n".join(lines).rstrip() + "\n"
