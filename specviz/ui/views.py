"""Moved (issue 48): each view lives in its tab's module (decode.py, race.py, live.py, distribution.py).

Kept for tests/test_serving.py, which imports `main_view` and `race_view` from here; remove once it imports them
from `specviz.ui.decode` and `specviz.ui.race`.
"""

from specviz.ui.decode import main_view
from specviz.ui.race import race_view

__all__ = ["main_view", "race_view"]
