"""Is a host the machine itself? The server's default bind, the engines an operator may name, the queue's count."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (bracketed or not) or "localhost"; a name is not loopback by its looks (it may resolve
    anywhere), nor is an unknown host."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
