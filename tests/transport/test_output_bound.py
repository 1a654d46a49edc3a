"""Output bounds (``run(max_output_bytes=)``, ``stream(max_line_bytes=)``) on this machine and
through a real sshd: a command that prints far more than the bound costs orch about the bound
in memory, ends (its side never blocks on a full pipe or window), and is reported as such."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.agent.procs import alive
from orchestrator.errors import OutputTooLarge
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LineBuffer, LineTooLong, LocalTransport
from tests.helpers import wait_for

MIB = 1 << 20
HUGE_MIB = 100


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    """LocalTransport, then SshTransport to the session's real sshd."""
    if request.param == "local":
        yield LocalTransport()
    else:
        yield request.getfixturevalue("ssh")


def flood(pid_file: Path, size_mib: int = HUGE_MIB, tail: str = "") -> list[str]:
    """argv: record the pid of the process that prints ``size_mib`` MiB of 'x' (one line)."""
    script = f"echo $$ > {pid_file}; head -c {size_mib * MIB} /dev/zero | tr '\\0' x{tail}"
    return ["sh", "-c", script]


def test_huge_answer_is_cut_at_the_bound_with_bounded_memory(
    transport: Transport, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    tracemalloc.start()
    started = time.monotonic()
    try:
        res = transport.run(flood(pid_file, tail="; sleep 30"), timeout=60, max_output_bytes=MIB)
        took_s = time.monotonic() - started
        peak_mib = tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()
    assert res.truncated and res.stdout == b"x" * MIB, (res.truncated, len(res.stdout))
    assert res.exit_status is None  # orch ended it: its own status is unknown
    assert peak_mib < 12, f"peak {peak_mib:.1f} MiB for a {HUGE_MIB} MiB answer"
    assert took_s < 10, took_s  # did not read (or wait for) the rest
    pid = int(pid_file.read_text())
    wait_for(lambda: not alive(pid), 10, what="the flooding command to end")
    assert transport.run(["echo", "ok"]).out == "ok\n"  # the connection (slot) is reusable


def test_output_at_the_bound_is_whole_with_its_status(transport: Transport) -> None:
    res = transport.run(["sh", "-c", "head -c 4096 /dev/zero; exit 3"], max_output_bytes=4096)
    assert (len(res.stdout), res.truncated, res.exit_status) == (4096, False, 3)
    res = transport.run(["sh", "-c", "head -c 4097 /dev/zero; exit 3"], max_output_bytes=4096)
    assert (len(res.stdout), res.truncated) == (4096, True)


def test_bound_with_stdin_ends_the_command(transport: Transport) -> None:
    """With stdin the command's stdin is the channel's (no lifeline): it must still end."""
    res = transport.run(["cat"], stdin=b"y" * (4 * MIB), timeout=30, max_output_bytes=MIB)
    assert res.truncated and res.stdout == b"y" * MIB
    res = transport.run(["cat"], stdin=b"z" * 70000, timeout=30, max_output_bytes=MIB)
    assert (res.stdout, res.truncated, res.exit_status) == (b"z" * 70000, False, 0)


def test_stderr_keeps_its_tail_under_the_bound(transport: Transport) -> None:
    script = "head -c 3000000 /dev/zero >&2; echo last-words >&2; echo out"
    res = transport.run(["sh", "-c", script], timeout=30, max_output_bytes=MIB)
    assert (res.out, res.ok, res.truncated) == ("out\n", True, False)
    assert len(res.stderr) == MIB and res.stderr.endswith(b"last-words\n")


def test_stream_drops_an_overlong_line_and_goes_on(transport: Transport, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    argv = flood(pid_file, size_mib=40)
    argv[2] = f"echo before; {argv[2]}; echo; echo after"
    tracemalloc.start()
    try:
        with transport.stream(argv, max_line_bytes=MIB) as stream:
            assert stream.readline(timeout=30) == "before"
            with pytest.raises(OutputTooLarge, match=f"exceeds {MIB} bytes"):
                stream.readline(timeout=30)
            assert stream.readline(timeout=30) == "after"
            assert stream.readline(timeout=10) is None
            assert stream.exit_status == 0
        peak_mib = tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()
    assert peak_mib < 12, f"peak {peak_mib:.1f} MiB for a 40 MiB line"


def test_stream_close_during_an_overlong_line_ends_the_command(
    transport: Transport, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    stream = transport.stream(flood(pid_file, tail="; sleep 30"), max_line_bytes=MIB)
    with pytest.raises(OutputTooLarge):
        stream.readline(timeout=30)
    stream.close()
    pid = int(pid_file.read_text())
    wait_for(lambda: not alive(pid), 10, what="the streaming command to end")


LINE = st.binary(max_size=12).filter(lambda b: b"\n" not in b and b"\r" not in b)


@given(
    lines=st.lists(LINE, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
    limit=st.integers(min_value=0, max_value=8),
)
def test_line_buffer_bound_matches_a_plain_split(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    """Whatever the chunking, each line comes out whole or (longer than the bound) as one
    LineTooLong in its place, in order; at most ``limit`` + one chunk is ever held."""
    data = b"".join(line + b"\n" for line in lines)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    buf = LineBuffer(max_line_bytes=limit)
    got: list[object] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        buf.feed(data[start:end])
        assert buf.buffered_bytes <= limit + (end - start)
        while True:
            try:
                line = buf.pop()
            except LineTooLong:
                got.append(LineTooLong)
                continue
            if line is None:
                break
            got.append(line)
    want = [LineTooLong if len(x) > limit else x.decode("utf-8", "replace") for x in lines]
    assert got == want
