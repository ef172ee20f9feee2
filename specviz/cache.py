"""Where specviz keeps what it makes once per machine: assembled and converted weights, kernel timing tables."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """~/.cache/specviz (the platform's user cache folder); SPECVIZ_CACHE overrides."""
    if env := os.environ.get("SPECVIZ_CACHE"):
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz"))
