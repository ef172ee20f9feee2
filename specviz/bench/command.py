"""`specviz bench` (being built: see issue 4)."""


def register(sub) -> None:
    """Add the `bench` subcommand; filled in by the benchmark work."""
