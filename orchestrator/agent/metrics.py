"""Training progress parsed from log lines: step, loss, tokens/s, acc_len, tau.

Each metric is one regex whose first group is the number; an optional second
group holding ``k``/``K``/``M`` scales it (``21.5 Ktok/s``). Defaults match the
bundled trainer (``step=120 loss=2.3410 tok/s=21500``) and the common forms
``step 120``, ``loss: 2.3``, ``tokens/s=...``, ``21.5 Ktok/s``, ``3.2it/s`` (tqdm),
``acc_len=3.1``, ``tau=2.31`` (the bundled trainer's acceptance length from real
draft-and-verify; its ``tau=-`` means "not measured at this step" and is not a value).
A container's ``log_patterns`` (hosts.yaml) replaces any of them.

>>> p = MetricParser()
>>> m = p.parse(["[it 7] step=120 loss=2.3410 tok/s=21500.5", "noise"], now=10.0)
>>> (m.step, m.loss, m.tokens_per_s, m.seen_at)
(120, 2.341, 21500.5, 10.0)
>>> p.parse(["Epoch 1: 50%|#####  | 60/120 [00:20<00:20, 3.20it/s]"], now=11.0).tokens_per_s
3.2
>>> p.parse(["step 9 | loss: nan | 21.5 Ktok/s | acc_len 3.25"], now=12.0)
Metrics(step=9, loss=nan, tokens_per_s=21500.0, acc_len=3.25, tau=None, seen_at=12.0)
>>> p.parse(["step=120 loss=2.3104 tau=2.31 tau_tf=2.45 tok/s=21500 lr=3.0e-04 gpu_mem=-"], now=1.0).tau
2.31
>>> p.parse(["step=5 loss=2.5 tok/s=1000"], now=1.0).tokens_per_s
1000.0
>>> p.parse(["nothing here"], now=13.0) is None
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from orchestrator.wire.model import Metrics

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"

DEFAULT_PATTERNS: dict[str, str] = {
    "step": r"\b(?:step|global_step|iter)\b\s*[=:]?\s*(\d+)",
    "loss": r"\bloss\b\s*[=:]?\s*" + _NUM,
    "tokens_per_s": (
        r"(?:\b(?:tok/s|tokens/s|tokens_per_s|tok_per_s|tps)\s*[=:]\s*([\d.]+)\s*([kKM]?)"
        r"|([\d.]+)\s*([kKM]?)\s*(?:tok/s|tokens/s|it/s)\b(?!\s*[=:]))"
    ),
    "acc_len": r"\bacc(?:ept(?:ance)?)?_len\b\s*[=:]?\s*([\d.]+)",
    "tau": r"\btau\b\s*[=:]\s*([\d.]+)",
}
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}


def _value(match: re.Match[str]) -> float | None:
    groups = [g for g in match.groups()]
    # first non-empty numeric group, and the unit group right after it
    for i, g in enumerate(groups):
        if g:
            unit = groups[i + 1] if i + 1 < len(groups) and groups[i + 1] in _SCALE else ""
            try:
                return float(g) * _SCALE.get(unit or "", 1.0)
            except ValueError:
                return None
    return None


class MetricParser:
    """Compiled metric regexes; ``patterns`` override the defaults by name.

    Raises:
        ValueError: a pattern does not compile or names an unknown metric
            (message names the key).
    """

    def __init__(self, patterns: Mapping[str, str] | None = None) -> None:
        merged = dict(DEFAULT_PATTERNS)
        for key, rx in (patterns or {}).items():
            if key not in DEFAULT_PATTERNS:
                raise ValueError(
                    f"log_patterns.{key}: unknown metric (known: {', '.join(DEFAULT_PATTERNS)})"
                )
            merged[key] = rx
        self._rx: dict[str, re.Pattern[str]] = {}
        for key, rx in merged.items():
            try:
                self._rx[key] = re.compile(rx, re.IGNORECASE if key != "tokens_per_s" else 0)
            except re.error as exc:
                raise ValueError(f"log_patterns.{key}: bad regex: {exc}") from None

    def parse(self, lines: Iterable[str], now: float) -> Metrics | None:
        """The newest value of each metric in ``lines`` (oldest first); ``None`` if none matched."""
        found: dict[str, float] = {}
        for line in reversed(list(lines)):
            for key, rx in self._rx.items():
                if key in found:
                    continue
                m = rx.search(line)
                if m:
                    v = _value(m)
                    if v is not None:
                        found[key] = v
            if len(found) == len(self._rx):
                break
        if not found:
            return None
        step = found.get("step")
        return Metrics(
            step=int(step) if step is not None else None,
            loss=found.get("loss"),
            tokens_per_s=found.get("tokens_per_s"),
            acc_len=found.get("acc_len"),
            tau=found.get("tau"),
            seen_at=now,
        )
