"""The one small interface every remote operation goes through.

A :class:`Transport` runs an argv somewhere (this machine, a Proxmox host over
SSH, a container through ``pct exec``) and gives back a :class:`Result`. Code
above this layer takes a Transport and never knows which one it has, so tests
hand it a local one instead of mocks (the httpx way).

Failures of the transport itself (connection refused, host key, timeout) raise
:class:`~orchestrator.errors.TransportError`; a command that ran and failed is a
:class:`Result` with a non-zero ``exit_status``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Result:
    """What a finished command left behind.

    ``exit_status`` is ``None`` when the remote side closed without reporting
    one (paramiko's -1): unknown, which is not the same as failure.
    A signal shows as 128+N, as shells and ``lxc-attach`` report it.

    ``truncated`` is True when the command printed more than the ``max_output_bytes``
    it ran with: ``stdout`` then holds exactly the first ``max_output_bytes`` bytes,
    orch ended the command (or closed its channel) instead of reading the rest, and
    ``exit_status`` is ``None`` unless the command had already exited on its own.
    """

    exit_status: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    @property
    def out(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        """stderr decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")


class LineStream(abc.ABC):
    """A long-lived command whose stdout is read line by line (``agent stream``).

    Iterating yields decoded lines without the newline; iteration ends when the
    remote command exits or the connection drops (``exit_status`` then tells
    which: ``None`` for a drop). ``close()`` ends the remote command by closing
    its stdin/channel; it is idempotent.
    """

    exit_status: int | None = None
    stderr_tail: bytes = b""
    """The last bytes the command wrote to stderr (bounded; drained as it runs), for the
    message when the stream ends."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[str]: ...

    @abc.abstractmethod
    def readline(self, timeout: float) -> str | None:
        """Next line, or ``None`` at end of stream; raises ``CommandTimeout`` after ``timeout`` s.

        A line longer than the stream's ``max_line_bytes`` raises
        :class:`~orchestrator.errors.OutputTooLarge` once, in its place: the line is
        discarded as it arrives (never held whole) and the next call goes on with the
        line after it.
        """

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> LineStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport(abc.ABC):
    """Run argv somewhere. ``name`` is what error messages call the place."""

    name: str

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> Result:
        """Run ``argv`` (no shell) to completion.

        Args:
            argv: program and arguments; each arrives byte-for-byte unchanged.
            timeout: seconds until :class:`~orchestrator.errors.CommandTimeout`.
            stdin: bytes fed to the command's stdin, then EOF.
            env: variables set for this command only, on top of the remote default.
            max_output_bytes: read at most this many bytes of stdout: past it the
                command is ended and the Result is ``truncated`` (see :class:`Result`);
                stderr keeps its last ``max_output_bytes`` bytes. ``None``: no bound.
        """

    @abc.abstractmethod
    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        max_line_bytes: int | None = None,
    ) -> LineStream:
        """Start ``argv`` and return its stdout as a :class:`LineStream`.

        ``max_line_bytes``: a longer line raises ``OutputTooLarge`` from ``readline``
        (see :meth:`LineStream.readline`); ``None``: no bound.
        """

    @abc.abstractmethod
    def put(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (parent must exist), atomically where possible."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; safe to call twice."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
