"""The run's tmux session (two tmux commands per observation, each under a timeout).

Equivalent shell commands::

    tmux list-panes -s -t =SESSION -F '#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{pane_pid}|#{pane_id}|#{pid}'
    tmux capture-pane -p -J -t PANE -S -N

A dead pane can come without its exit status: tmux marks the pane dead on the
pty's EOF, but records the status only when it reaps the child, and tmux built
with libutempter loses a SIGCHLD that arrives while it removes the utmp record
at that EOF (the helper runs with SIGCHLD at its default), leaving the child a
zombie until some other child of the server exits. The status is then read from
the zombie itself (``/proc/<pid>/stat`` field 52, see
:func:`~orchestrator.agent.procs.zombie_exit`); if tmux reaped it meanwhile, the
panes are listed once more. A launched run's ``exit_status`` file stays the
authority; this is what the pane alone can tell.

The server socket follows tmux's own rules (``$TMUX_TMPDIR``, ``-L``/``-S``);
``socket_name``/``socket_path`` pick another. A missing server or session is
data (``server_running``/``exists`` false), never an exception; so is a tmux
that does not answer within ``timeout_s``.

tmux is run directly rather than through libtmux: the agent only needs two
commands, and importing libtmux cost ~250 ms of every one-shot agent call
(profiled in docs/snapshot.md), while it also runs tmux without a timeout.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.agent.procs import zombie_exit
from orchestrator.wire.model import SessionState

log = logging.getLogger(__name__)
T = TypeVar("T")

PANE_FORMAT = "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{pane_pid}|#{pane_id}|#{pid}"
_NO_SERVER = ("no server running", "error connecting to", "failed to connect to server")


def parse_pane_line(
    line: str,
) -> tuple[bool, int | None, int | None, int | None, str, int | None]:
    """Parse one ``PANE_FORMAT`` line into (dead, status, signal, pid, pane id, server pid).

    >>> parse_pane_line("1|2||4242|%0|17")
    (True, 2, None, 4242, '%0', 17)
    >>> parse_pane_line("1||9|4242|%3|17")
    (True, None, 9, 4242, '%3', 17)
    >>> parse_pane_line("0|||77|%1")
    (False, None, None, 77, '%1', None)
    """
    cells = (line.split("|") + [""] * 6)[:6]

    def num(text: str) -> int | None:
        return int(text) if text.strip().lstrip("-").isdigit() else None

    return cells[0] == "1", num(cells[1]), num(cells[2]), num(cells[3]), cells[4], num(cells[5])


def classify_tmux_error(stderr: list[str]) -> str:
    """``no-server``, ``no-session`` or ``other`` for a failed tmux command's stderr.

    >>> classify_tmux_error(["no server running on /tmp/tmux-0/default"])
    'no-server'
    >>> classify_tmux_error(["error connecting to /tmp/x (No such file or directory)"])
    'no-server'
    >>> classify_tmux_error(["can't find session: train"])
    'no-session'
    """
    text = " ".join(stderr).lower()
    if any(s in text for s in _NO_SERVER):
        return "no-server"
    if "can't find" in text or "session not found" in text:
        return "no-session"
    return "other"


@dataclass(frozen=True, slots=True)
class TmuxResult:
    """One tmux command's outcome: stdout lines (trailing blanks dropped), stderr lines."""

    returncode: int
    stdout: list[str]
    stderr: list[str]


def split_output(stdout: str, stderr: str) -> tuple[list[str], list[str]]:
    """stdout lines without the trailing empty ones; non-empty stderr lines.

    >>> split_output("a\\n\\nb\\n\\n", "\\nno server running\\n")
    (['a', '', 'b'], ['no server running'])
    """
    out = stdout.split("\n")
    while out and out[-1] == "":
        out.pop()
    return out, [line for line in stderr.split("\n") if line]


class TmuxReader:
    """Reads one session's state by running ``tmux`` (no connection kept).

    Args:
        socket_name: tmux ``-L`` name; ``None`` for the default.
        socket_path: tmux ``-S`` path; wins over ``socket_name``.
        timeout_s: longest one tmux command may take before it counts as failed.
    """

    def __init__(
        self,
        socket_name: str | None = None,
        socket_path: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_name = socket_name
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.error: str | None = None

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        if self.socket_path:
            return ["tmux", "-S", self.socket_path, *args]
        if self.socket_name:
            return ["tmux", "-L", self.socket_name, *args]
        return ["tmux", *args]

    def cmd(self, *args: str) -> TmuxResult:
        """Run one tmux command (found on PATH).

        Raises:
            FileNotFoundError: no tmux; subprocess.TimeoutExpired: no answer in ``timeout_s``.
        """
        proc = subprocess.run(
            self._argv(args),
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="backslashreplace",
            timeout=self.timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        out, err = split_output(proc.stdout, proc.stderr)
        return TmuxResult(proc.returncode, out, err)

    def server_running(self) -> bool:
        """Whether a tmux server answers on this socket (``tmux list-sessions`` works, or fails
        for another reason than a missing server; a missing or wedged tmux counts as none)."""
        try:
            res = self.cmd("list-sessions", "-F", "#{session_name}")
        except (OSError, subprocess.SubprocessError):
            return False
        return res.returncode == 0 or classify_tmux_error(res.stderr) != "no-server"

    def capture(self, target: str, lines: int) -> tuple[list[str], str | None]:
        """``target``'s screen plus up to ``lines`` of scrollback, trailing blank lines dropped,
        and the error (``None`` when it worked)."""
        try:
            res = self.cmd("capture-pane", "-p", "-J", "-t", target, "-S", f"-{lines}")
        except (OSError, subprocess.SubprocessError) as exc:
            return [], f"tmux: {exc.__class__.__name__}: {exc}"[:300]
        if res.returncode != 0:
            return [], (" ".join(res.stderr) or f"tmux exit {res.returncode}")[:300]
        out = list(res.stdout)
        while out and not out[-1].strip():
            out.pop()
        return out, None

    def sessions(self) -> list[str]:
        """Names of the sessions on the server (empty when it is not running or tmux is missing)."""
        try:
            res = self.cmd("list-sessions", "-F", "#{session_name}")
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = f"tmux: {exc.__class__.__name__}: {exc}"
            return []
        return [] if res.returncode else list(res.stdout)

    def _unreaped(
        self, session: str, line: str, pid: int, server: int | None
    ) -> tuple[bool, int | None, int | None, int | None, str]:
        """A dead pane that tmux gave no status: read it from the unreaped child.

        When the child is gone instead, tmux reaped it since ``line`` was listed, so
        the panes are listed once more (one more tmux command, same timeout).
        """
        dead, status, signal, _pid, pane, _server = parse_pane_line(line)
        found = zombie_exit(pid, server)
        if found is not None:
            return dead, found[0], found[1], pid, pane
        if not os.path.exists(f"/proc/{pid}"):
            try:
                res = self.cmd("list-panes", "-s", "-t", f"={session}", "-F", PANE_FORMAT)
            except (OSError, subprocess.SubprocessError):
                res = None
            if res is not None and res.returncode == 0 and res.stdout:
                return parse_pane_line(res.stdout[0])[:5]
        return dead, status, signal, pid, pane

    def state(self, session: str, tail_lines: int = 8) -> SessionState:
        """State of ``session`` and the last ``tail_lines`` non-trailing-blank lines of its pane."""
        self.error = None
        try:
            res = self.cmd("list-panes", "-s", "-t", f"={session}", "-F", PANE_FORMAT)
        except (OSError, subprocess.SubprocessError) as exc:  # tmux missing or wedged is data
            self.error = f"tmux: {exc.__class__.__name__}: {exc}"
            return SessionState(name=session, exists=False, server_running=False)
        if res.returncode:
            kind = classify_tmux_error(res.stderr)
            if kind == "other":
                self.error = "tmux: " + " ".join(res.stderr)[:300]
            return SessionState(name=session, exists=False, server_running=kind != "no-server")
        if not res.stdout:
            return SessionState(name=session, exists=True)
        dead, status, signal, pid, pane, server = parse_pane_line(res.stdout[0])
        if dead and status is None and signal is None and pid:
            dead, status, signal, pid, pane = self._unreaped(session, res.stdout[0], pid, server)
        tail: tuple[str, ...] = ()
        if tail_lines > 0:
            try:
                cap: TmuxResult | None = self.cmd(
                    "capture-pane", "-p", "-J", "-t", pane, "-S", f"-{max(tail_lines * 4, 50)}"
                )
            except (OSError, subprocess.SubprocessError) as exc:
                self.error, cap = f"tmux: {exc.__class__.__name__}: {exc}", None
            if cap is not None and cap.returncode == 0:
                lines = list(cap.stdout)
                while lines and not lines[-1].strip():
                    lines.pop()
                tail = tuple(line[:1000] for line in lines[-tail_lines:])
        return SessionState(
            name=session,
            exists=True,
            server_running=True,
            pane_dead=dead,
            pane_dead_status=status,
            pane_dead_signal=signal,
            pane_pid=pid,
            pane_tail=tail,
        )


HISTORY_LIMIT = 200_000
"""Lines of scrollback kept in the run's pane (tmux's default is 2000)."""
RUN_WINDOW = "run"
"""The run's window in its session (a placeholder window holds the session while it is built)."""
LIFECYCLE_TIMEOUT_S = 10.0
"""Longest a session's creation, lookup or removal may take before tmux counts as wedged."""


class TmuxTimeout(RuntimeError):
    """tmux did not answer within the deadline (a wedged server); the call was abandoned."""


def _within(timeout_s: float, work: Callable[[], T]) -> T:
    """``work()`` on a daemon thread, waited for at most ``timeout_s``: libtmux runs tmux with no
    timeout of its own, so a wedged server must not block the agent. Raises what ``work`` raised,
    or :class:`TmuxTimeout` (the blocked tmux client is left behind; the agent exits soon)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    th = threading.Thread(target=run, name="tmux-lifecycle", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise TmuxTimeout(f"tmux did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _server() -> Any:
    """libtmux's handle on the default server (``$TMUX_TMPDIR``). Imported here only: the
    import costs ~250 ms, paid once per launch or stop, never per observation."""
    import libtmux

    return libtmux.Server()


@dataclass(frozen=True, slots=True)
class RunPane:
    """The run window's pane as read back after :func:`start_session`: its PID and the two
    options that must be in force before the run may start."""

    pane_pid: int | None
    remain_on_exit: str
    history_limit: str


def start_session(
    session: str,
    workdir: str,
    shell_command: str,
    env: dict[str, str] | None = None,
    *,
    timeout_s: float = LIFECYCLE_TIMEOUT_S,
) -> RunPane:
    """Create ``session``: a placeholder window, the session's ``history-limit``, the run window
    running ``shell_command``, ``remain-on-exit on``, the placeholder removed; then read the
    options back. Raises libtmux's errors or :class:`TmuxTimeout`; the caller removes the
    session on failure.

    The pane's environment is the tmux server's (whoever started it) plus ``env`` (``-e``,
    on tmux's command line: visible in ``ps``); a run clears it (``env -i``) and reads its
    own from a file instead.
    """

    def work() -> RunPane:
        s = _server().new_session(
            session_name=session,
            window_name="orch-boot",
            start_directory=workdir,
            window_command="sleep 30",
            x=250,
            y=50,
            attach=False,
        )
        s.set_option("history-limit", str(HISTORY_LIMIT))
        w = s.new_window(
            window_name=RUN_WINDOW,
            start_directory=workdir,
            window_shell=shell_command,
            environment=env,
            attach=False,
        )
        w.set_option("remain-on-exit", "on")
        s.windows.get(window_name="orch-boot").kill()
        remain = w.cmd("show-options", "-w", "-v", "remain-on-exit").stdout
        pane = w.active_pane
        hist = pane.cmd("display-message", "-p", "#{history_limit}").stdout
        pid = str(pane.pane_pid or "")
        return RunPane(
            int(pid) if pid.isdigit() else None, "".join(remain).strip(), "".join(hist).strip()
        )

    return _within(timeout_s, work)


def session_exists(session: str, *, timeout_s: float = LIFECYCLE_TIMEOUT_S) -> bool:
    """Whether a session named exactly ``session`` exists (``tmux has-session -t =NAME``)."""
    return bool(_within(timeout_s, lambda: _server().has_session(session, exact=True)))


def kill_session(session: str, *, timeout_s: float = LIFECYCLE_TIMEOUT_S) -> None:
    """Remove ``session`` if it exists (``tmux kill-session -t =NAME``)."""

    def work() -> None:
        server = _server()
        if server.has_session(session, exact=True):
            server.kill_session(f"={session}")

    _within(timeout_s, work)


def list_sessions(*, timeout_s: float = LIFECYCLE_TIMEOUT_S) -> list[str]:
    """The session names on the server (empty when no server runs)."""

    def work() -> list[str]:
        server = _server()
        return [s.session_name for s in server.sessions] if server.is_alive() else []

    return _within(timeout_s, work)


def capture_history(session: str, *, timeout_s: float = LIFECYCLE_TIMEOUT_S) -> list[str] | None:
    """The run pane's whole scrollback (``capture-pane -p -J -S - -E -``), ``None`` without one."""

    def work() -> list[str] | None:
        server = _server()
        if not server.has_session(session, exact=True):
            return None
        s = server.sessions.get(session_name=session)
        w = s.windows.get(window_name=RUN_WINDOW, default=None) or s.active_window
        return list(w.active_pane.cmd("capture-pane", "-p", "-J", "-S", "-", "-E", "-").stdout)

    return _within(timeout_s, work)


def parse_tmux_version(text: str) -> str | None:
    """``tmux 3.3a`` -> ``3.3a``.

    >>> parse_tmux_version("tmux 3.3a\\n"), parse_tmux_version("")
    ('3.3a', None)
    """
    parts = text.split()
    return parts[1] if len(parts) >= 2 and parts[0] == "tmux" else None


def tmux_version() -> str | None:
    """The installed tmux's version (``tmux -V``), ``None`` when there is none or it hangs."""
    try:
        out = subprocess.run(["tmux", "-V"], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_tmux_version(out.stdout.decode("utf-8", "replace"))
