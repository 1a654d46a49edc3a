"""The ONE function that turns an argv into a shell command line.

Every remote command orch sends (ssh's ``exec_command`` takes a string that the
remote login shell parses; ``pct exec`` then runs an argv without a shell) is
built here, so there is exactly one place where quoting can go wrong, and one
property test (tests/test_quoting.py) proves it does not: arbitrary argv arrives
byte-for-byte unchanged through the real sshd, the pct stand-in and the shell.

>>> print(command_line(["echo", "it's", "$HOME", ""]))
echo 'it'"'"'s' '$HOME' ''
>>> command_line(["pct", "exec", "200", "--", "tmux", "ls"])
'pct exec 200 -- tmux ls'
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence


def command_line(argv: Sequence[str]) -> str:
    """Quote ``argv`` for a POSIX shell so each element arrives as one unchanged word.

    Raises:
        ValueError: an element holds a NUL byte, which no argv can carry.
    """
    if not argv:
        raise ValueError("empty argv")
    for arg in argv:
        if "\x00" in arg:
            raise ValueError(f"argument contains a NUL byte: {arg!r:.60}")
    return " ".join(shlex.quote(arg) for arg in argv)


def with_env(
    argv: Sequence[str], env: Mapping[str, str] | None, *, clear: bool = False
) -> list[str]:
    """Prefix ``argv`` with ``env K=V ...`` so variables travel as argv, not as shell text.

    With ``clear`` (``env -i``) the command gets exactly ``env`` and nothing it would inherit.

    >>> with_env(["python3", "-c", "pass"], {"A": "1 2"})
    ['env', 'A=1 2', 'python3', '-c', 'pass']
    >>> with_env(["true"], None)
    ['true']
    >>> with_env(["true"], {"HOME": "/root"}, clear=True)
    ['env', '-i', 'HOME=/root', 'true']
    """
    if not env and not clear:
        return list(argv)
    for key in env or {}:
        if not key or "=" in key or not (key[0].isalpha() or key[0] == "_"):
            raise ValueError(f"not a valid environment variable name: {key!r}")
    head = ["env", "-i"] if clear else ["env"]
    return [*head, *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
