"""`specviz serve` in a process of its own, as a user starts it, for scripts that drive it from outside.

A browser driven from the server's own process shares its interpreter (and GIL) with the model's thread: its races
are slower than a visitor's.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path


@contextmanager
def served(flags: list[str], timeout: float = 1200.0) -> Iterator[str]:
    """`specviz serve` with `flags` on a free local port; its URL once it answers; stopped on the way out."""
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(Path(sys.executable).with_name("specviz")), "serve", "--port", str(port), *flags]
    server = subprocess.Popen(cmd)
    url, start = f"http://127.0.0.1:{port}/", time.monotonic()
    try:
        while not answers(url):
            if server.poll() is not None or time.monotonic() - start > timeout:
                raise SystemExit(f"specviz serve did not come up: {' '.join(cmd)}")
            time.sleep(2)
        yield url
    finally:
        server.terminate()
        server.wait(60)


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
        return True
    except OSError:
        return False
