"""tqdm bars read back: tqdm v4.66 tqdm/std.py ``tqdm.format_meter`` printed them.

``{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]``
where ``rate_fmt`` is ``{rate:5.2f}{unit}/s``, or ``{1/rate:5.2f}s/{unit}`` when the rate is
below one per second; without a total, ``{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]``.
A notebook strips the ``|{bar}|``; a post may cut the percentage, and a terminal narrower
than the bar cuts its tail (no closing ``]``). Stdlib only (ships in wire/).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from orchestrator.wire.progress_numbers import SCALE, duration_s, integer, last_match, number
from orchestrator.wire.progress_readers import NOT_TRAINING_BARS, NOT_TRAINING_UNITS

_NOT_TRAINING = re.compile(rf"(?:{NOT_TRAINING_BARS})", re.IGNORECASE)


_BAR = re.compile(
    r"(?:(?P<pct>\d{1,3})%)?(?:\|[^|]*\|)?\s*(?<![\w/.])(?P<n>[\d.]+[kMGTP]?)/(?P<total>[\d.]+[kMGTP]?)\s*"
    r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:]+|\?),\s*(?P<rate>[\d.]+[kMGTP]?|\?)\s*"
    r"(?P<unit>[^\s,\]]+)(?P<postfix>[^\]]*)(?:\]|$)"
)
_BAR_NOTOTAL = re.compile(
    r"(?<![\w/])(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?P<unitn>[A-Za-z]*) \[(?P<elapsed>[\d:]+),\s*"
    r"(?P<rate>[\d.]+[kMGTP]?|\?)\s*(?P<unit>[^\s,\]]+)(?P<postfix>[^\]]*)\]"
)
_BAR_ULTRALYTICS = re.compile(
    r"(?P<pct>\d{1,3})% [━─╸]{1,40} (?P<n>\d+)/(?P<total>\d+) "
    r"(?:(?P<rate>\d+(?:\.\d+)?)(?P<scale>[KMG]?)(?P<unit>[A-Za-z]+/s) )?"
    r"(?P<elapsed>\d+(?:\.\d+)?s|\d+(?::\d\d){1,2})(?:<(?P<remaining>\d+(?:\.\d+)?s|\d+(?::\d\d){1,2}))?"
)
"""Ultralytics' own bar (8.3, ultralytics/ultralytics 002363f1 ``ultralytics/utils/tqdm.py``
``TQDM._display``: ``f"{desc}: {percent:.0f}% {bar} {n_str}/{t_str} {rate_str}
{elapsed_str}{remaining_str}"``, the bar 12 of ``━``/``─``/``╸``, ``rate_str``
``f"{rate:.1f}{unit}/s"`` or with a ``K``/``M``/``G`` prefix (empty at rate 0), times
``56.0s``, ``M:SS`` or ``H:MM:SS``, ``remaining`` ``<...`` before the end): no brackets."""

_BAR_UNITS = {
    "it": "it/s",
    "tok": "tokens/s",
    "tokens": "tokens/s",
    "samples": "samples/s",
    "step": "it/s",
    "steps": "it/s",
    "batch": "it/s",
    "batches": "it/s",
}


@dataclass(frozen=True, slots=True)
class Bar:
    """A tqdm bar: ``desc`` is the text before it, ``tail`` the text after its closing ``]``
    (another writer's line on the same terminal line: DeepLearningExamples' dllogger after the
    bar), ``rate`` already in ``unit`` (``s/it`` becomes it/s: tqdm inverts a rate below 1 for
    display only)."""

    desc: str
    n: int | None
    total: int | None
    rate: float | None
    unit: str | None
    counts: str
    remaining_s: float | None
    postfix: str
    tail: str = ""


def read_bar(line: str) -> Bar | None:
    """A tqdm bar printed by ``format_meter`` (``{desc}: {pct}%|{bar}| {n}/{total}
    [{elapsed}<{remaining}, {rate}{unit}/s{postfix}]``), else ``None``.

    >>> read_bar(" 45%|####5     | 450/1000 [02:10<02:39,  3.45it/s]")
    Bar(desc='', n=450, total=1000, rate=3.45, unit='it/s', counts='it', remaining_s=159.0, postfix='', tail='')
    >>> read_bar("Map: 100%|██████████| 5000/5000 [00:01<00:00, 4000.00 examples/s]").counts
    'examples'
    >>> round(read_bar("Epoch 0: 3%|3| 3/100 [00:09<04:51,  3.00s/it, loss=2.1]").rate, 4)
    0.3333
    """
    if "% ━" in line or "% ─" in line:
        return _ultralytics_bar(line)
    if "[" not in line or ("/s" not in line and "s/" not in line and "?" not in line):
        return None  # every bar has "[elapsed..., rate]" and a rate "x/s", "s/x" or "?"
    m = last_match(_BAR, line) or last_match(_BAR_NOTOTAL, line)
    if m is None:
        return None
    g = m.groupdict()
    rate_text, unit_text = g["rate"], g["unit"]
    rate: float | None = None
    unit: str | None = None
    counts = ""
    if unit_text.startswith("s/"):
        counts = unit_text[2:]
        v = integer_or_float(rate_text)
        rate = 1.0 / v if v else None
    elif unit_text.endswith("/s"):
        counts = unit_text[:-2]
        rate = integer_or_float(rate_text)
    unit = _BAR_UNITS.get(counts)
    if unit is None:
        rate = None
    remaining = g.get("remaining")
    return Bar(
        desc=line[: m.start()].strip().rstrip(":").strip(),
        n=integer(g["n"]),
        total=integer(g["total"]) if g.get("total") else None,
        rate=rate if rate is None or (math.isfinite(rate) and rate >= 0) else None,
        unit=unit if rate is not None else None,
        counts=counts,
        remaining_s=duration_s(remaining) if remaining else None,
        postfix=g["postfix"].lstrip(", "),
        tail=line[m.end() :],
    )


def _ultralytics_bar(line: str) -> Bar | None:
    """Ultralytics 8.3's bar (:data:`_BAR_ULTRALYTICS`), else ``None``.

    >>> read_bar("  15/20  8.03G  1.605  1.123  1.6  11  512: 100% ━━━━━━━━━━━━ 86/86 1.5it/s 56.0s")
    Bar(desc='15/20  8.03G  1.605  1.123  1.6  11  512', n=86, total=86, rate=1.5, unit='it/s', counts='it', remaining_s=None, postfix='', tail='')
    >>> read_bar("Epoch 3: 40% ━━━━╸─────── 40/100 1.2Kit/s 1:05<0:49").rate
    1200.0
    """
    m = last_match(_BAR_ULTRALYTICS, line)
    if m is None:
        return None
    g = m.groupdict()
    counts, rate = "", None
    if g["rate"] is not None:
        counts = g["unit"][:-2]
        rate = float(g["rate"]) * {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}[g["scale"]]
    unit = _BAR_UNITS.get(counts)
    remaining = g.get("remaining")
    return Bar(
        desc=line[: m.start()].strip().rstrip(":").strip(),
        n=integer(g["n"]),
        total=integer(g["total"]),
        rate=rate if unit is not None else None,
        unit=unit if rate is not None else None,
        counts=counts,
        remaining_s=duration_s(remaining) if remaining else None,
        postfix="",
        tail=line[m.end() :],
    )


def integer_or_float(text: str) -> float | None:
    """A tqdm-scaled number (``4.00k``), else ``None``.

    >>> integer_or_float("4.00k"), integer_or_float("?")
    (4000.0, None)
    """
    scale = SCALE.get(text[-1:], 1.0) if text[-1:].isalpha() else 1.0
    v = number(text[:-1] if text[-1:].isalpha() else text)
    return v * scale if v is not None else None


def is_training_bar(bar: Bar) -> bool:
    """Whether a bar may be the training loop's (not a dataset map, a download, an eval).

    >>> is_training_bar(read_bar("Loading checkpoint shards: 100%|##| 4/4 [00:03<00:00,  1.2it/s]"))
    False
    >>> is_training_bar(read_bar("Epoch 2:  10%|#  | 10/100 [00:03<00:27,  3.3it/s, v_num=1]"))
    True
    """
    if bar.counts in NOT_TRAINING_UNITS:
        return False
    return not (bar.desc and _NOT_TRAINING.search(bar.desc))
