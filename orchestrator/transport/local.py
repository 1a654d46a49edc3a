"""Transport for this machine: ``subprocess``, no shell (the ``local`` target and tests).

Also home of :class:`LineBuffer`, the byte-to-line splitter every LineStream uses.
"""

from __future__ import annotations

import contextlib
import io
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from orchestrator.errors import CommandTimeout, OutputTooLarge
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.wire.paths import atomic_write
from orchestrator.wire.quoting import command_line

STDERR_TAIL_BYTES = 64 * 1024
READ_CHUNK = 65536


class LineTooLong(ValueError):
    """:meth:`LineBuffer.pop`: the next line was longer than the buffer's ``max_line_bytes``."""


class LineBuffer:
    """Split a byte stream into decoded lines (newline removed, undecodable bytes replaced).

    With ``max_line_bytes``, a longer line is never held whole: as soon as it
    exceeds the bound it is dropped (and the rest of it discarded as it arrives),
    and :meth:`pop` raises :class:`LineTooLong` once in its place.

    >>> buf = LineBuffer()
    >>> buf.feed(b"a\\nb")
    >>> buf.pop(), buf.pop()
    ('a', None)
    >>> buf.feed(b"c\\r\\n")
    >>> buf.pop()
    'bc'
    >>> buf.feed(b"tail")
    >>> buf.pop(final=True), buf.pop(final=True)
    ('tail', None)
    >>> buf = LineBuffer(max_line_bytes=4)
    >>> for chunk in (b"ok\\nxxx", b"xxx", b"xxx", b"x\\nend\\n"):
    ...     buf.feed(chunk)
    >>> buf.pop(), buf.buffered_bytes
    ('ok', 4)
    >>> buf.pop()
    Traceback (most recent call last):
    ...
    orchestrator.transport.local.LineTooLong: line longer than 4 bytes
    >>> buf.pop(), buf.pop()
    ('end', None)
    """

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._data = bytearray()
        self._max = max_line_bytes
        self._complete = 0  # bytes at the start of _data that end with a newline
        self._cuts: list[int] = []  # offsets in _data where an overlong line was dropped
        self._skipping = False  # discarding the rest of an overlong line up to its newline

    @property
    def buffered_bytes(self) -> int:
        """Bytes held now (at most ``max_line_bytes`` + one chunk beyond complete lines)."""
        return len(self._data)

    @property
    def ready(self) -> bool:
        """True when :meth:`pop` has a complete line (or an overlong one) to report."""
        return self._complete > 0 or bool(self._cuts)

    def feed(self, chunk: bytes) -> None:
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return
            chunk, self._skipping = chunk[end + 1 :], False
        self._data += chunk
        last = chunk.rfind(b"\n")
        if last >= 0:
            self._complete = len(self._data) - len(chunk) + last + 1
        if self._max is not None and len(self._data) - self._complete > self._max:
            del self._data[self._complete :]
            self._cuts.append(self._complete)
            self._skipping = True

    def pop(self, *, final: bool = False) -> str | None:
        """The next complete line; with ``final``, also an unterminated last line.

        Raises:
            LineTooLong: the next line was longer than ``max_line_bytes`` (dropped).
        """
        if self._cuts and self._cuts[0] == 0:
            del self._cuts[0]
            raise LineTooLong(f"line longer than {self._max} bytes")
        end = self._data.find(b"\n")
        if end < 0:
            if not (final and self._data):
                return None
            end = len(self._data)
        taken = min(end + 1, len(self._data))
        raw = bytes(self._data[:end])
        del self._data[:taken]
        self._complete = max(0, self._complete - taken)
        self._cuts = [cut - taken for cut in self._cuts]
        if self._max is not None and len(raw) > self._max:
            raise LineTooLong(f"line longer than {self._max} bytes")
        return raw.rstrip(b"\r").decode("utf-8", "replace")


def pop_line(
    buf: LineBuffer, final: bool, name: str, command: str, limit: int | None
) -> str | None:
    """``buf.pop(final=...)`` with :class:`LineTooLong` as :class:`OutputTooLarge` (for streams)."""
    try:
        return buf.pop(final=final)
    except LineTooLong:
        raise OutputTooLarge(name, command, limit or 0) from None


def signal_status(returncode: int) -> int:
    """A subprocess return code as a shell reports it: killed by signal N -> 128+N.

    >>> signal_status(-9), signal_status(3)
    (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class LocalTransport(Transport):
    """Run argv on this machine, each command in its own process group.

    ``env`` overlays the current environment. A missing program gives exit
    status 127 (as a shell would), not an exception.
    """

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def _popen(
        self, argv: Sequence[str], env: Mapping[str, str] | None, stdin: bool
    ) -> subprocess.Popen[bytes]:
        command_line(argv)  # validates: non-empty, no NUL
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> Result:
        """Run ``argv`` to completion; ``CommandTimeout`` after ``timeout`` s (process group killed).

        Past ``max_output_bytes`` of stdout the process group is killed (SIGKILL) and
        the Result is ``truncated`` (see :meth:`Transport.run`).
        """
        try:
            proc = self._popen(argv, env, stdin is not None)
        except (FileNotFoundError, PermissionError) as exc:
            return Result(
                127 if isinstance(exc, FileNotFoundError) else 126, b"", f"{exc}\n".encode()
            )
        if max_output_bytes is not None:
            return self._run_bounded(proc, argv, timeout, stdin, max_output_bytes)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise CommandTimeout(self.name, command_line(argv), timeout) from None
        return Result(signal_status(proc.returncode), out, err)

    def _run_bounded(
        self,
        proc: subprocess.Popen[bytes],
        argv: Sequence[str],
        timeout: float,
        stdin: bytes | None,
        limit: int,
    ) -> Result:
        """``communicate`` that keeps at most ``limit`` bytes of stdout (and of stderr's tail)."""
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        pending = memoryview(stdin or b"")
        truncated = False
        assert proc.stdout is not None and proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            if proc.stdin is not None:
                if pending:
                    os.set_blocking(proc.stdin.fileno(), False)
                    sel.register(proc.stdin, selectors.EVENT_WRITE, None)
                else:
                    proc.stdin.close()
            try:
                while sel.get_map() and not truncated:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:  # the finally below kills the group
                        raise CommandTimeout(self.name, command_line(argv), timeout)
                    for key, _ in sel.select(remaining):
                        if key.data is None:  # stdin writable
                            try:
                                pending = pending[os.write(key.fd, pending[:READ_CHUNK]) :]
                            except BlockingIOError:
                                continue
                            except BrokenPipeError:
                                pending = pending[:0]
                            if not pending:
                                sel.unregister(key.fileobj)
                                key.fileobj.close()  # type: ignore[union-attr]
                            continue
                        chunk = os.read(key.fd, READ_CHUNK)
                        if not chunk:
                            sel.unregister(key.fileobj)
                        elif key.data is out:
                            room = limit - len(out)
                            out += chunk[:room]
                            truncated = len(chunk) > room
                        else:
                            err += chunk
                            del err[: max(0, len(err) - limit)]
                status = proc.poll()
                if not truncated and status is None:
                    try:  # output closed; the process may still be finishing
                        status = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        raise CommandTimeout(self.name, command_line(argv), timeout) from None
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
        exit_status = None if status is None else signal_status(status)
        return Result(exit_status, bytes(out), bytes(err), truncated)

    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        max_line_bytes: int | None = None,
    ) -> LineStream:
        """Start ``argv``; its stdout as lines, its stderr kept as a tail (``stderr_tail``)."""
        try:
            proc = self._popen(argv, env, False)
            return LocalLineStream(proc, self.name, command_line(argv), max_line_bytes)
        except (FileNotFoundError, PermissionError) as exc:
            return _FailedStream(127, str(exc))

    def put(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically (temp file in the same directory, then rename)."""
        atomic_write(path, data, mode, suffix=".orch-tmp", fsync=False)


class _FailedStream(LineStream):
    """A stream whose command could not start (exit 126/127 as a shell would say)."""

    def __init__(self, status: int, message: str) -> None:
        self.exit_status = status
        self.stderr_tail = message.encode()

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def readline(self, timeout: float) -> str | None:
        return None

    def close(self) -> None:
        pass


class LocalLineStream(LineStream):
    """stdout of a local process, line by line; stderr drained by a thread into ``stderr_tail``."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        name: str,
        command: str,
        max_line_bytes: int | None = None,
    ) -> None:
        self._proc, self._name, self._command = proc, name, command
        self._max_line_bytes = max_line_bytes
        self._buf = LineBuffer(max_line_bytes)
        self._eof = False
        self.stderr_tail = b""
        self._selector = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        self._selector.register(proc.stdout, selectors.EVENT_READ)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()

    def _drain_stderr(self) -> None:
        stderr = self._proc.stderr
        assert isinstance(stderr, io.BufferedReader)  # Popen(bufsize=-1) pipes are buffered
        with contextlib.suppress(OSError, ValueError):  # the pipe closed under us by close()
            for chunk in iter(lambda: stderr.read1(65536), b""):
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            line = pop_line(self._buf, self._eof, self._name, self._command, self._max_line_bytes)
            if line is not None or self._eof:
                if line is None:
                    self._finish()
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(self._name, self._command, timeout)
            if self._selector.select(min(remaining, 1.0)):
                assert self._proc.stdout is not None
                chunk = os.read(self._proc.stdout.fileno(), READ_CHUNK)
                if chunk:
                    self._buf.feed(chunk)
                else:
                    self._eof = True

    def _finish(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.exit_status = signal_status(self._proc.wait(timeout=5))
        self._err_thread.join(timeout=1)

    def __iter__(self) -> Iterator[str]:
        while (line := self.readline(timeout=365 * 86400.0)) is not None:
            yield line

    def close(self) -> None:
        if self._proc.poll() is None:
            _kill_group(self._proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.exit_status = signal_status(self._proc.wait(timeout=5))
        self._err_thread.join(timeout=1)
        self._selector.close()
        for pipe in (self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
