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

from orchestrator.errors import CommandTimeout
from orchestrator.paths import atomic_write
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.transport.quoting import command_line

STDERR_TAIL_BYTES = 64 * 1024


class LineBuffer:
    """Split a byte stream into decoded lines (newline removed, undecodable bytes replaced).

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
    """

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._data += chunk

    def pop(self, *, final: bool = False) -> str | None:
        """The next complete line; with ``final``, also an unterminated last line."""
        end = self._data.find(b"\n")
        if end < 0:
            if not (final and self._data):
                return None
            end = len(self._data)
        raw = bytes(self._data[:end])
        del self._data[: end + 1]
        return raw.rstrip(b"\r").decode("utf-8", "replace")


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
    ) -> Result:
        """Run ``argv`` to completion; ``CommandTimeout`` after ``timeout`` s (process group killed)."""
        try:
            proc = self._popen(argv, env, stdin is not None)
        except (FileNotFoundError, PermissionError) as exc:
            return Result(
                127 if isinstance(exc, FileNotFoundError) else 126, b"", f"{exc}\n".encode()
            )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise CommandTimeout(self.name, command_line(argv), timeout) from None
        return Result(signal_status(proc.returncode), out, err)

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LineStream:
        """Start ``argv``; its stdout as lines, its stderr kept as a tail (``stderr_tail``)."""
        try:
            return LocalLineStream(self._popen(argv, env, False), self.name, command_line(argv))
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

    def __init__(self, proc: subprocess.Popen[bytes], name: str, command: str) -> None:
        self._proc, self._name, self._command = proc, name, command
        self._buf = LineBuffer()
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
            line = self._buf.pop(final=self._eof)
            if line is not None or self._eof:
                if line is None:
                    self._finish()
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(self._name, self._command, timeout)
            if self._selector.select(min(remaining, 1.0)):
                assert self._proc.stdout is not None
                chunk = os.read(self._proc.stdout.fileno(), 65536)
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
