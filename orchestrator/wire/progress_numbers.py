"""Numbers, durations and lines as training logs print them (pure, stdlib only).

Bad input is parsed or ignored, never raised: a line is cut to its last
``MAX_LINE_CHARS`` characters after its last carriage return, a step is an int below 2**53
(else ``None``), ``nan``/``inf`` are kept as floats (the nan-loss detector's business).
"""

from __future__ import annotations

import math
import re

MAX_LINE_CHARS = 4096
"""A longer line is read from its last this many characters (a tqdm stream without newlines
ends with the newest bar)."""
MAX_STEP = 2**53

_ANSI = re.compile(r"[\x1b\ufffd]\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
"""Colour codes, also as the agent's log reader leaves them (ESC replaced by U+FFFD)."""
_MSVC = re.compile(r"([-+]?)1\.#(QNAN|SNAN|IND|INF)\d*")
SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def clean(line: str) -> str:
    """The part of ``line`` a reader looks at: after the last ``\\r``, no ANSI colours, cut.

    >>> clean("\\x1b[31mstep: 1\\x1b[39m")
    'step: 1'
    >>> clean("10%|#| 1/10 [00:01<00:09]\\r20%|##| 2/10 [00:02<00:08]")
    '20%|##| 2/10 [00:02<00:08]'
    >>> len(clean("x" * 10_000_000))
    4096
    """
    if "\r" in line:
        parts = [p for p in line[-MAX_LINE_CHARS * 4 :].split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    line = line[-MAX_LINE_CHARS * 2 :]
    if "\x1b" in line or "\ufffd[" in line:
        line = _ANSI.sub("", line)
    return line[-MAX_LINE_CHARS:]


def number(text: str) -> float | None:
    """A printed number: thousands separators dropped, ``nan``/``inf`` kept; else ``None``.

    >>> number("5,862"), number("2.345E+00"), number("-0"), number("1e309"), number("x")
    (5862.0, 2.345, -0.0, inf, None)

    The MSVC runtime prints NaN and infinity as ``1.#QNAN0``, ``-1.#IND00``, ``1.#INF00``
    (CNTK on Windows):

    >>> number("1.#QNAN000"), number("-1.#IND00"), number("-1.#INF00")
    (nan, nan, -inf)
    """
    if "#" in text:
        m = _MSVC.fullmatch(text)
        if m is None:
            return None
        v = math.inf if m.group(2) == "INF" else math.nan
        return -v if m.group(1) == "-" else v
    try:
        return float(text.replace(",", ""))
    except (ValueError, OverflowError):
        return None


def integer(text: str) -> int | None:
    """A step or a total: a whole number below 2**53 (``1.23k`` as tqdm scales it), else ``None``.

    >>> integer("1,200"), integer("7" * 400), integer("1.5k"), integer("-3")
    (1200, None, 1500, None)
    """
    text = text.replace(",", "")
    scale = SCALE.get(text[-1:], 0.0) if text[-1:].isalpha() else 1.0
    if scale == 0.0 or len(text) > 20:
        return None
    v = number(text[:-1] if text[-1:].isalpha() else text)
    if v is None or not math.isfinite(v) or v < 0:
        return None
    n = int(v * scale)
    return n if n < MAX_STEP else None


def duration_s(text: str) -> float | None:
    """Seconds of a printed duration: ``1:02:03``, ``06:20``, ``1 day, 2:03:04``, ``30s``.

    >>> duration_s("06:20"), duration_s("1 day, 2:03:04"), duration_s("95ms"), duration_s("?")
    (380.0, 93784.0, 0.095, None)
    """
    text = text.strip()
    days = 0
    m = re.match(r"(\d+) days?, (.*)$", text)
    if m:
        days, text = int(m.group(1)), m.group(2)
    if re.fullmatch(r"\d+(?::\d\d){1,2}", text):
        secs = 0.0
        for part in text.split(":"):
            secs = secs * 60 + int(part)
        return days * 86400 + secs
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if m:
        return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return None


def last_match(rx: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match: a line may hold several updates (bars written without ``\\r``)."""
    m = None
    for m in rx.finditer(text):  # noqa: B007 - the loop keeps the last one
        pass
    return m
