"""Small generic test helpers shared by every test area."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# how test sandboxes isolate their containers: auto (LXC where it can run, as CI), lxc, process
SANDBOX_ISOLATION = os.environ.get("ORCH_TEST_ISOLATION", "auto")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Raises:
        AssertionError: after ``timeout_s`` seconds, naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (bind to 0, read it back, close)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
