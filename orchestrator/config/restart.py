"""The ``restart:`` policy of hosts.yaml (per container, or in ``defaults``): when a dead run
may be relaunched by ``orch supervise`` / ``orch check --heal`` (docs/self-healing.md).

The YAML nodes are read by :meth:`orchestrator.config.reader.NodeReader.kind_restart` (every
mistake names ``file:line: key``) against :data:`RESTART_KEYS`; deciding is
:mod:`orchestrator.heal.decide`. The
policy says how often and how soon; whether a restart can help is each playbook's
``restart.retryable`` (the diagnosis), never the policy's.

A policy belongs to a unit: one container today, a multi-node job (a set of containers,
restarted together) when jobs exist. Nothing here is container-specific.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TRIGGERS = ("crashed", "silent-death", "stall")
"""The deaths a policy may act on (``on:``): an exit status != 0 (``crashed``), a run that
vanished without one (``silent-death``), a live run that stopped making progress (``stall``)."""

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``6h`` or ``1d`` (a bare number is seconds).

    >>> parse_duration("6h"), parse_duration("90s"), parse_duration("2.5"), parse_duration("1d")
    (21600.0, 90.0, 2.5, 86400.0)
    >>> parse_duration("6 hours")
    Traceback (most recent call last):
    ...
    ValueError: not a duration: '6 hours' (want seconds, or a number with s, m, h or d: 90s, 15m, 6h)
    """
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(
            f"not a duration: {text!r} (want seconds, or a number with s, m, h or d: 90s, 15m, 6h)"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds``.

    >>> format_duration(21600), format_duration(90), format_duration(0.5), format_duration(900)
    ('6h', '90s', '0.5s', '15m')
    """
    for unit in ("d", "h", "m"):
        n = seconds / _UNITS[unit]
        if seconds >= _UNITS[unit] and n == int(n):
            return f"{int(n)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often and how soon a unit's dead run may be relaunched (times in seconds).

    ``max_restarts`` restarts within any ``window_s``; the n-th restart of the window (0-based)
    waits ``backoff_s[n]`` after the death was first seen (the last value repeats). ``on``: the
    deaths acted on (:data:`TRIGGERS`); any other death is paged, never restarted.
    ``retry_unknown``: restart a death whose cause no playbook names (default: page).
    ``settle_timeout_s``: the longest wait for the dead run's processes to end and its GPUs to
    read free (memory back near zero, no compute process, no ghost reading) before paging.
    ``stop_grace_s``: how long a restart's stop step waits for a still-living (stalled) run to
    end (SIGINT; SIGTERM at half of it; SIGKILL at the end), as ``orch stop --grace``.
    """

    max_restarts: int = 3
    window_s: float = 6 * 3600.0
    backoff_s: tuple[float, ...] = (60.0, 300.0, 900.0)
    on: tuple[str, ...] = TRIGGERS
    retry_unknown: bool = False
    settle_timeout_s: float = 600.0
    stop_grace_s: float = 60.0

    def backoff_for(self, restarts_in_window: int) -> float:
        """Seconds to wait before the next restart, ``restarts_in_window`` having happened.

        >>> RestartPolicy(backoff_s=(5.0, 60.0)).backoff_for(0), RestartPolicy(backoff_s=(5.0, 60.0)).backoff_for(7)
        (5.0, 60.0)
        """
        return self.backoff_s[min(restarts_in_window, len(self.backoff_s) - 1)]

    def to_dict(self) -> dict[str, Any]:
        """hosts.yaml's spelling (``orch hosts --json``, the journal's evidence)."""
        return {
            "max": self.max_restarts,
            "window": format_duration(self.window_s),
            "backoff": [format_duration(b) for b in self.backoff_s],
            "on": list(self.on),
            "retry_unknown": self.retry_unknown,
            "settle_timeout": format_duration(self.settle_timeout_s),
            "stop_grace": format_duration(self.stop_grace_s),
        }


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One key of ``restart:``: its attribute, its type and default in words, its meaning."""

    key: str
    attr: str
    type_doc: str
    default_doc: str
    doc: str


RESTART_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "max",
        "max_restarts",
        "integer >= 0",
        "`3`",
        "Restarts allowed within `window`; the next death is paged instead (`0`: page at once).",
    ),
    KeySpec(
        "window",
        "window_s",
        "duration > 0",
        "`6h`",
        "The sliding window `max` counts in. Durations: seconds, or `90s`, `15m`, `6h`, `1d`.",
    ),
    KeySpec(
        "backoff",
        "backoff_s",
        "list of durations >= 0, or one",
        "`[60, 300, 900]`",
        "Wait before the 1st, 2nd, 3rd... restart of the window, counted from when the death "
        "was first seen (the last value repeats). Persisted: a supervisor restarted mid-wait "
        "keeps the same due time.",
    ),
    KeySpec(
        "on",
        "on",
        "list of: " + ", ".join(TRIGGERS),
        "all three",
        "The deaths acted on; any other death (and one not listed) is paged, never restarted.",
    ),
    KeySpec(
        "retry_unknown",
        "retry_unknown",
        "true or false",
        "`false`",
        "Restart a death whose cause no playbook names (an exit status nothing explains, a "
        "SIGKILL no OOM-killer line names). Default: page a human.",
    ),
    KeySpec(
        "settle_timeout",
        "settle_timeout_s",
        "duration > 0",
        "`10m`",
        "Longest wait for the dead run's processes to end and its GPUs to read free (memory "
        "back near zero, no compute process, no ghost reading) before paging instead.",
    ),
    KeySpec(
        "stop_grace",
        "stop_grace_s",
        "duration > 0",
        "`60s`",
        "How long a restart gives a run that still lives (a stall) to stop: SIGINT, SIGTERM at "
        "half of it, SIGKILL at the end (as `orch stop --grace`).",
    ),
)
"""Every key of ``restart:``, in documentation order (docs/hosts-yaml.md is generated from it)."""


def build_policy(
    defaults: Mapping[str, Any] | None, own: Mapping[str, Any] | None, *, own_given: bool
) -> RestartPolicy | None:
    """The container's policy: ``defaults.restart`` merged key by key with its own.

    ``own_given`` with ``own`` ``None`` is ``restart: false`` (off whatever the defaults say);
    neither given: no policy (``None``, never restarted).

    >>> build_policy({"max_restarts": 2}, {"backoff_s": (5.0,)}, own_given=True).backoff_s
    (5.0,)
    >>> build_policy({"max_restarts": 2}, None, own_given=True) is None
    True
    >>> build_policy(None, None, own_given=False) is None
    True
    """
    if own_given and own is None:
        return None
    if defaults is None and own is None:
        return None
    return RestartPolicy(**{**(defaults or {}), **(own or {})})
