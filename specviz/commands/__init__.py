"""The `specviz` commands, one module per subcommand (`specviz X` lives in `commands/X.py`), each with a
`register(subparsers)` that adds its parser and sets the function it runs. `specviz/cli.py` builds the parser from
them and turns what they raise into one line and an exit code."""


def run_alone(register) -> int:
    """One command without the rest of the app (`python -m specviz.commands.X X ...` where the app's packages are
    missing, as on a lent GPU): its parser alone, its errors as they come."""
    import argparse

    parser = argparse.ArgumentParser(prog="specviz")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    return parsed.func(parsed)
