"""Training progress from log lines: the agent's side of the one progress parser.

Step, total, loss, throughput (value and unit) and ETA come from
:class:`orchestrator.wire.progress.ProgressParser`, which detects the framework from the log
(or takes hosts.yaml's ``log_format``, passed here as the ``log_format`` key of
``patterns``). Two bundled-trainer metrics stay here: ``acc_len`` and ``tau`` (its
acceptance length from real draft-and-verify; ``tau=-`` means "not measured at this step").
A container's ``log_patterns`` replace ``step``, ``loss``, ``tokens_per_s`` (tokens/s),
``acc_len`` or ``tau``: the regex's first group is the number, an optional second group
holding ``k``/``K``/``M`` scales it.

>>> p = MetricParser()
>>> m = p.parse(["[it 7] step=120 loss=2.3410 tok/s=21500.5", "noise"], now=10.0)
>>> (m.step, m.loss, m.tokens_per_s, m.throughput_unit, m.seen_at)
(120, 2.341, 21500.5, 'tokens/s', 10.0)
>>> m = p.parse(["Training: 50%|#####  | 60/120 [00:20<00:20, 3.20it/s]"], now=11.0)
>>> (m.step, m.total_steps, m.throughput, m.throughput_unit, m.tokens_per_s, m.eta_s)
(60, 120, 3.2, 'it/s', None, 20.0)
>>> m = MetricParser().parse(["step 9 | loss: nan | 21.5 Ktok/s | acc_len 3.25"], now=12.0)
>>> (m.step, m.loss, m.tokens_per_s, m.acc_len)
(9, nan, 21500.0, 3.25)
>>> p.parse(["step=120 loss=2.3104 tau=2.31 tau_tf=2.45 tok/s=21500 lr=3.0e-04 gpu_mem=-"], now=1.0).tau
2.31
>>> MetricParser().parse(["nothing here"], now=13.0) is None
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from orchestrator.wire.model import Metrics
from orchestrator.wire.progress import ProgressParser, Reading, clean, with_eta

FORMAT_KEY = "log_format"
"""The ``patterns`` key that names the framework (hosts.yaml ``log_format``)."""
EXTRA_PATTERNS: dict[str, str] = {
    "acc_len": r"\bacc(?:ept(?:ance)?)?_len\b\s*[=:]?\s*([\d.]+)",
    "tau": r"\btau\b\s*[=:]\s*([\d.]+)",
}
OVERRIDABLE = ("step", "loss", "tokens_per_s", *EXTRA_PATTERNS)
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}
READ_LINES = 16
"""A longer read (the first one takes the log's last 16 KiB) is read in full from its newest
this many lines; the ``SKIM_LINES`` before them give only the framework and the epoch, and
older ones nothing (cost: bench/poll.py's one-shot snapshot reads 16 KiB of tail)."""
SKIM_LINES = 64


def _value(match: re.Match[str]) -> float | None:
    groups = match.groups()
    for i, g in enumerate(groups):  # first non-empty group, and the unit group after it
        if g:
            unit = groups[i + 1] if i + 1 < len(groups) and groups[i + 1] in _SCALE else ""
            try:
                return float(g.replace(",", "")) * _SCALE.get(unit or "", 1.0)
            except ValueError:
                return None
    return None


class MetricParser:
    """The progress parser plus the bundled trainer's extras; ``patterns`` override by name.

    State (the framework detected, the training bar, the epoch) lives across calls: one
    parser follows one run's log; :meth:`reset` when the run changes.

    Raises:
        ValueError: a pattern does not compile, names an unknown metric, or ``log_format``
            names an unknown framework (the message names the key).
    """

    def __init__(self, patterns: Mapping[str, str] | None = None) -> None:
        patterns = dict(patterns or {})
        self.progress = ProgressParser(patterns.pop(FORMAT_KEY, None))
        self._rx: dict[str, re.Pattern[str]] = {}
        for key, rx in {**EXTRA_PATTERNS, **patterns}.items():
            if key not in OVERRIDABLE:
                raise ValueError(
                    f"log_patterns.{key}: unknown metric (known: {', '.join(OVERRIDABLE)})"
                )
            try:
                self._rx[key] = re.compile(rx, re.IGNORECASE if key != "tokens_per_s" else 0)
            except re.error as exc:
                raise ValueError(f"log_patterns.{key}: bad regex: {exc}") from None

    def reset(self) -> None:
        """Forget the log read so far (a new run)."""
        self.progress.reset()

    def _overrides(self, lines: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for line in reversed(lines):
            text = clean(line)
            for key, rx in self._rx.items():
                if key not in found and (m := rx.search(text)) is not None:
                    v = _value(m)
                    if v is not None:
                        found[key] = v
            if len(found) == len(self._rx):
                break
        return found

    def parse(self, lines: Iterable[str], now: float) -> Metrics | None:
        """What ``lines`` (new, oldest first) say, merged with what the log said before;
        ``None`` when nothing matched in these lines."""
        lines = list(lines)
        p = self.progress
        before = p.readings
        cut = max(0, len(lines) - READ_LINES)
        for line in lines[max(0, cut - SKIM_LINES) : cut]:
            p.skim(line)
        for line in lines[cut:]:
            p.feed(line)
        r = with_eta(p.reading) if p.readings != before else Reading()
        found = self._overrides(lines)
        if "step" in found:
            r = replace(r, step=int(found["step"]))
        if "loss" in found:
            r = replace(r, loss=found["loss"])
        if "tokens_per_s" in found:
            r = replace(r, rate=found["tokens_per_s"], unit="tokens/s")
        if r == Reading() and not found:
            return None
        return Metrics(
            step=r.step,
            loss=r.loss,
            tokens_per_s=r.rate if r.unit == "tokens/s" else None,
            acc_len=found.get("acc_len"),
            tau=found.get("tau"),
            seen_at=now,
            total_steps=r.total_steps,
            throughput=r.rate,
            throughput_unit=r.unit if r.rate is not None else None,
            eta_s=r.eta_s,
            framework=p.framework,
        )
