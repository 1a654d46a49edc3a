"""pct's failures: a Perl ``die`` (message on stderr, exit ``$!`` when set, else 255)."""

from __future__ import annotations

PCT_PM = "/usr/share/perl5/PVE/CLI/pct.pm"


class Die(Exception):
    """A Perl ``die``: message on stderr, exit ``status`` (255 unless ``$!`` was set)."""

    def __init__(self, message: str, status: int = 255) -> None:
        super().__init__(message)
        self.status = status


def die(msg: str, line: int | None = None) -> None:
    # Perl appends " at FILE line N." to a die message that lacks a trailing newline.
    raise Die(msg if line is None else f"{msg} at {PCT_PM} line {line}.")
