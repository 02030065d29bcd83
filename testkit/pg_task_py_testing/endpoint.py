"""The launcher's HTTP endpoint (`--metrics`), as a test or a probe reads it."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a GET of `path` on the launcher's endpoint; (0, "") while it does not
    listen yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.read().decode()
    except OSError:
        return 0, ""
