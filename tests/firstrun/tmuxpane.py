"""A real tmux pane on its own server (``-L``) for driving interactive commands in tests.

Type into it with :meth:`Pane.answer`, read it with :meth:`Pane.text`; every wait polls
with a deadline. :meth:`Pane.close` kills the server (tests call it in ``finally``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Mapping, Sequence

from tests.helpers import wait_for

EXIT_MARK = "[pane-exit "


class Pane:
    """``argv`` running in a detached 200x50 tmux session on a private server.

    The command runs as ``argv; echo "[pane-exit $?]"; sleep`` so its last screen and exit
    status stay readable after it ends.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
        self.socket = f"orch-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        wrapped = f'{shlex.join(argv)}; echo "{EXIT_MARK}$?]"; exec sleep 600'
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        self._tmux(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "200",
            "-y",
            "50",
            "-c",
            cwd,
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            "sh",
            "-c",
            wrapped,
        )

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return proc.stdout

    def text(self) -> str:
        """The pane's whole scrollback (wrapped lines joined)."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    def wait_text(self, needle: str, count: int = 1, timeout_s: float = 20.0) -> str:
        """Wait until ``needle`` appears ``count`` times; return the pane text."""
        seen = [""]

        def found() -> str | None:
            seen[0] = self.text()
            return seen[0] if seen[0].count(needle) >= count else None

        try:
            return wait_for(found, timeout_s, 0.05, f"{needle!r} x{count} in the pane")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- pane ---\n{seen[0].rstrip()}") from None

    def answer(self, prompt: str, reply: str, count: int = 1) -> None:
        """Wait for the ``count``-th ``prompt``, then type ``reply`` and Enter."""
        self.wait_text(prompt, count)
        if reply:
            self._tmux("send-keys", "-t", "t", "-l", reply)
        self._tmux("send-keys", "-t", "t", "Enter")

    def exit_status(self, timeout_s: float = 30.0) -> int:
        """Wait for the command to end; its exit status."""
        text = self.wait_text(EXIT_MARK, timeout_s=timeout_s)
        return int(text.split(EXIT_MARK, 1)[1].split("]", 1)[0])

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-L", self.socket, "kill-server"],
            env=self._env,
            capture_output=True,
            timeout=10,
            check=False,
        )
