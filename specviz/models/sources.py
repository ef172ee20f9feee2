"""Where a model's weights are read from: a .gguf file, a model folder, or a hub id (from the hub's cache only when
the hub cannot be reached: asked once, promptly, rather than retried file by file)."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlparse

from specviz.models.pair import ModelLoadError


def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the hub's host. Offline, the hub client retries each file for ~20 s before
    it gives up; asking once first turns that into a prompt answer (and a cache-only load)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def _hub_source(source: str) -> dict:
    """Check that a source that is no local file is at least a hub id; say whether the hub is reachable."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise ModelLoadError(
            f"{source!r} is neither an existing model folder or .gguf file nor a hub model id (owner/name)."
        ) from None
    return {"local_files_only": not hub_reachable()}


def locate(source: str) -> tuple[str, dict]:
    """The folder (or hub id) to load from and the extra loading arguments: a .gguf file, a model folder,
    or a hub id (cache only when the hub is unreachable)."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist.")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is not a model folder (no config.json); give a folder saved with "
                "save_pretrained, a .gguf file, a hub id, or 'embedded'."
            )
        return str(path), {}
    return source, _hub_source(source)
