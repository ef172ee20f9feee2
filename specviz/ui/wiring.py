"""Moved (issue 48): each tab wires its own events in its module; the queues' names are in handlers.py.

Kept for tests/test_concurrency.py, which imports `MODEL` from here; remove once it imports it from
`specviz.ui.handlers`.
"""

from specviz.ui.handlers import MODEL

__all__ = ["MODEL"]
