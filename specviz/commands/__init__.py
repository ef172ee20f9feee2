"""The `specviz` commands, one module per subcommand (`specviz X` lives in `commands/X.py`), each with a
`register(subparsers)` that adds its parser and sets the function it runs. `specviz/cli.py` builds the parser from
them and turns what they raise into one line and an exit code."""
