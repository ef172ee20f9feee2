"""The `specviz` command: the parser, built from `specviz.commands` (one module per subcommand), and what a command
raises, turned here, once, into one line on stderr and an exit code.

Every model, decoding and limit option is generated from the settings specs (`settings.options`) and checked by
the same validation as the app's controls; trace and bench use the CLI's own limits.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import re
import sys

from specviz.commands import atlas, bench, costs, engines, loadtest, prepare, prove, rows, serve, trace, whatif
from specviz.models import ModelLoadError
from specviz.models.pair import OUT_OF_MEMORY
from specviz.remote.policy import EngineError
from specviz.runs.outputs import output_problem
from specviz.settings.errors import INTERRUPTED, MACHINE_FAULT, InputError, os_fault, sigterm_as_interrupt
from specviz.settings.spec import short

COMMANDS = (prepare, trace, serve, atlas, bench, costs, prove, rows, whatif, loadtest, engines)  # `specviz --help`'s order
FAULTS = (InputError, EngineError, ModelLoadError, KeyboardInterrupt, *OUT_OF_MEMORY, OSError)


class Parser(argparse.ArgumentParser):
    """argparse, but a flag it refuses is one line naming it, as any other bad flag (not its usage block; its words for
    a value of the wrong type said as ours, the value shortened). Its subcommands' parsers are of this class too."""

    WORDS = ((r"argument (\S+): invalid int value: (.*)", "{0} must be a whole number, got {1}"),
             (r"argument (\S+): invalid float value: (.*)", "{0} must be a number, got {1}"),
             (r"argument (\S+): invalid choice: (.*) \(choose from (.*)\)", "{0} must be one of {2}, got {1}"),
             (r"argument (\S+): expected one argument()", "{0} needs a value"))

    def error(self, message: str):
        for pattern, said in self.WORDS:
            if m := re.fullmatch(pattern, message, re.S):
                flag, quoted, *rest = m.groups()  # the value as argparse quotes it (its repr)
                message = said.format(flag, short(quoted[1:-1]) if quoted[:1] in "'\"" else quoted, *rest)
                break
        else:
            message = message if len(message) < 200 else message[:199] + "…"
        self.exit(2, f"{self.prog}: bad flag: {message.rstrip('.')} (--help lists the flags).\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specviz", description="See speculative decoding work.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def fault(e: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    """The exit code and the one line for what a command raised (one of `FAULTS`): 2 for the input (a bad flag, a
    model that cannot load), 1 for an engine that failed, 3 for the machine (disk, memory), 130 when interrupted.
    A command may speak as itself (`speaks_as`: `specviz engines race`); otherwise a refused input is a bad flag."""
    name, speaker = f"specviz {args.command}", getattr(args, "speaks_as", None)  # (set by the engines' parsers only)
    if isinstance(e, InputError):
        return 2, f"{speaker or 'specviz: bad flag'}: {e}"
    if isinstance(e, EngineError):
        return 1, f"{speaker or name}: {e}"
    if isinstance(e, ModelLoadError):
        return 2, f"specviz: {e}"
    if isinstance(e, KeyboardInterrupt):
        return INTERRUPTED, f"{name}: interrupted; nothing more was written."
    if isinstance(e, OUT_OF_MEMORY):
        return MACHINE_FAULT, (f"{name}: out of memory: pick a smaller pair, a lower-precision dtype or fewer new "
                               "tokens.")
    return MACHINE_FAULT, f"{name}: {os_fault(e)}."  # a full or read-only disk, a missing folder: not the flags


def main(argv: list[str] | None = None) -> int:
    # the interpreter's last garbage collection walks every object of torch, transformers and gradio: skipped, the
    # memory goes back to the system anyway (on a 2-core Zen 4: exit after importing them 1.5 s -> 0.3 s; `specviz
    # serve` on the embedded pair, SIGTERM to exit 4.1 s -> 1.3 s). First, so every exit handler registered later
    # still runs before it; once, however often main is called in one process
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if (problem := output_problem(args)) is not None:
        print(f"specviz {args.command}: cannot write {problem}; nothing was run.", file=sys.stderr)
        return MACHINE_FAULT
    try:
        with sigterm_as_interrupt():
            return args.func(args)
    except FAULTS as e:
        code, line = fault(e, args)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
