"""`specviz serve` (being built: see issue 5)."""


def register(sub) -> None:
    """Add the `serve` subcommand; filled in by the app work."""
