"""LocalTransport: subprocess on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator.errors import CommandTimeout
from orchestrator.transport.local import LocalTransport

local = LocalTransport()


def test_run_stdin_env_and_exit_codes() -> None:
    res = local.run(
        ["sh", "-c", 'cat; echo "$ORCH_T" >&2; exit 4'], stdin=b"in", env={"ORCH_T": "$x y"}
    )
    assert (res.exit_status, res.stdout, res.stderr) == (4, b"in", b"$x y\n")
    assert local.run(["sh", "-c", "kill -9 $$"]).exit_status == 137
    assert local.run(["/nonexistent/orch-prog"]).exit_status == 127


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        local.run(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.3)
    assert time.monotonic() - started < 5


def test_stream_lines_exit_and_timeout() -> None:
    with local.stream(["sh", "-c", "echo a; printf b; echo e >&2; exit 2"]) as stream:
        assert list(stream) == ["a", "b"]
    assert stream.exit_status == 2
    with local.stream(["sleep", "30"]) as slow, pytest.raises(CommandTimeout):
        slow.readline(timeout=0.2)


def test_put_atomic_with_mode(tmp_path: Path) -> None:
    target = tmp_path / "f.sh"
    local.put(b"#!/bin/sh\necho ok\n", str(target), mode=0o700)
    assert os.stat(target).st_mode & 0o777 == 0o700
    assert local.run([str(target)]).out == "ok\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.sh"]
