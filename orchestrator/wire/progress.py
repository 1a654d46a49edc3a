"""Training progress read from log lines: step, total, loss, throughput with its unit, ETA.

The one progress parser of orch: the agent's snapshot, the host observer, the detectors and
``orch diagnose`` all read lines through it. Per-framework tables live in
:mod:`orchestrator.wire.progress_readers`; this module holds the pure readers.

- :func:`read_line` reads one line with one reader (pure; never raises);
- :func:`read_bar` reads a tqdm bar (tqdm v4.66 tqdm/std.py ``tqdm.format_meter``);
- :func:`detect` names the framework a line comes from;
- :class:`ProgressParser` follows a log: it detects the framework, remembers the training
  bar's total and the epoch, and merges the newest value of each metric.

Bad input is parsed or ignored: a line is cut to its last ``MAX_LINE_CHARS`` characters
after the last carriage return, a step is an int below 2**53 (else ignored), a loss may be
``nan``/``inf`` (the nan-loss detector's business), a rate must be finite and >= 0.

>>> r = read_line("{'loss': '2.345', 'grad_norm': '1.2', 'learning_rate': '5e-05', 'epoch': 0.5}",
...               BY_NAME["hf-trainer"])
>>> (r.loss, r.step)
(2.345, None)
>>> read_line("step: 10  loss:  8.1234  memory: 9.1GiB(10%)  tps: 5,862  tflops: 3.2",
...           BY_NAME["torchtitan"])
Reading(step=10, total_steps=None, loss=8.1234, rate=5862.0, unit='tokens/s/device', eta_s=None)
>>> read_line("no digits here", GENERIC) is None
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from orchestrator.wire.progress_readers import (
    BY_NAME,
    GENERIC,
    NOT_TRAINING_BARS,
    NOT_TRAINING_UNITS,
    READERS,
    Field,
    Reader,
)

MAX_LINE_CHARS = 4096
"""A longer line is read from its last this many characters (a tqdm stream without newlines
ends with the newest bar)."""
MAX_STEP = 2**53

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
NUM = (
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+|[-+]?(?:nan|inf)"
)
_DURATION = r"(?:\d+ days?, )?\d+(?::\d\d){1,2}|\d+(?:\.\d+)?(?:ms|s|m|h)\b"
_SEP = r"['\"]?\s*(?:[:=]\s*|\s+)['\"]?"
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


@dataclass(frozen=True, slots=True)
class Reading:
    """What one line (or a log so far) says; ``None`` where it does not say.

    ``rate`` is in ``unit`` (one of ``progress_readers.UNITS``); ``eta_s`` is seconds left.
    """

    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    rate: float | None = None
    unit: str | None = None
    eta_s: float | None = None

    def merged(self, newer: Reading) -> Reading:
        """``newer``'s values where it has them, else this one's (a rate keeps its unit).

        >>> Reading(step=1, loss=2.0).merged(Reading(step=2))
        Reading(step=2, total_steps=None, loss=2.0, rate=None, unit=None, eta_s=None)
        """
        rate, unit = (newer.rate, newer.unit) if newer.rate is not None else (self.rate, self.unit)
        return Reading(
            step=newer.step if newer.step is not None else self.step,
            total_steps=newer.total_steps if newer.total_steps is not None else self.total_steps,
            loss=newer.loss if newer.loss is not None else self.loss,
            rate=rate,
            unit=unit,
            eta_s=newer.eta_s if newer.eta_s is not None else self.eta_s,
        )


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
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line[-MAX_LINE_CHARS:]


def number(text: str) -> float | None:
    """A printed number: thousands separators dropped, ``nan``/``inf`` kept; else ``None``.

    >>> number("5,862"), number("2.345E+00"), number("-0"), number("1e309"), number("x")
    (5862.0, 2.345, -0.0, inf, None)
    """
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
    scale = _SCALE.get(text[-1:], 0.0) if text[-1:].isalpha() else 1.0
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


# --- the compiled tables -----------------------------------------------------------------------

_FIELD_RX: dict[Field, re.Pattern[str]] = {}


def _field_rx(f: Field) -> re.Pattern[str]:
    rx = _FIELD_RX.get(f)
    if rx is None:
        if f.value_first:
            body = rf"(?<![\w.])({NUM})\s?([kKM]?)(?:{f.key})(?![\w/])"
        elif f.metric == "eta_s":
            body = rf"(?<![\w/.])(?:{f.key}){_SEP}({_DURATION})"
        else:
            body = rf"(?<![\w/.])(?:{f.key}){_SEP}({NUM})(ms|s)?(?![\w])"
        flags = 0 if f.metric == "rate" and f.value_first else re.IGNORECASE
        rx = _FIELD_RX[f] = re.compile(body, flags)
    return rx


_RX: dict[str, re.Pattern[str]] = {}


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    rx = _RX.get(pattern)
    if rx is None:
        rx = _RX[pattern] = re.compile(pattern, flags)
    return rx


_DETECT = [(r, re.compile("|".join(f"(?:{p})" for p in r.detect))) for r in READERS]
_DETECT_BY_NAME = {r.name: rx for r, rx in _DETECT}
_ANY_DETECT = re.compile("|".join(f"(?:{p})" for r in READERS for p in r.detect))
_NOT_TRAINING = re.compile(rf"(?:{NOT_TRAINING_BARS})", re.IGNORECASE)


def detect(line: str) -> str | None:
    """The framework whose signature ``line`` shows, else ``None``.

    >>> detect(" iteration      100/    5000 | consumed samples:        12800 |")
    'megatron'
    >>> detect("{'loss': 1.9, 'grad_norm': 0.5, 'learning_rate': 2e-05, 'epoch': 0.1}")
    'hf-trainer'
    >>> detect("step=120 loss=2.3410 tok/s=21500") is None
    True
    """
    text = clean(line)
    if not _ANY_DETECT.search(text):
        return None
    for reader, rx in _DETECT:
        if rx.search(text):
            return reader.name
    return None


# --- tqdm ------------------------------------------------------------------------------------

_BAR = re.compile(
    r"(?:(?P<pct>\d{1,3})%)?(?:\|[^|]*\|)?\s*(?<![\w/.])(?P<n>[\d.]+[kMGTP]?)/(?P<total>[\d.]+[kMGTP]?)\s*"
    r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:]+|\?),\s*(?P<rate>[\d.]+[kMGTP]?|\?)\s*"
    r"(?P<unit>[^\s,\]]+)(?P<postfix>[^\]]*)\]"
)
_BAR_NOTOTAL = re.compile(
    r"(?<![\w/])(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?P<unitn>[A-Za-z]*) \[(?P<elapsed>[\d:]+),\s*"
    r"(?P<rate>[\d.]+[kMGTP]?|\?)\s*(?P<unit>[^\s,\]]+)(?P<postfix>[^\]]*)\]"
)
_BAR_UNITS = {"it": "it/s", "tok": "tokens/s", "tokens": "tokens/s", "samples": "samples/s",
              "step": "it/s", "steps": "it/s", "batch": "it/s", "batches": "it/s"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bar:
    """A tqdm bar: ``desc`` is the text before it, ``rate`` already in ``unit`` (``s/it``
    becomes it/s: tqdm inverts a rate below 1 for display only)."""

    desc: str
    n: int | None
    total: int | None
    rate: float | None
    unit: str | None
    counts: str
    remaining_s: float | None
    postfix: str


def read_bar(line: str) -> Bar | None:
    """A tqdm bar printed by ``format_meter`` (``{desc}: {pct}%|{bar}| {n}/{total}
    [{elapsed}<{remaining}, {rate}{unit}/s{postfix}]``), else ``None``.

    >>> read_bar(" 45%|####5     | 450/1000 [02:10<02:39,  3.45it/s]")
    Bar(desc='', n=450, total=1000, rate=3.45, unit='it/s', counts='it', remaining_s=159.0, postfix='')
    >>> read_bar("Map: 100%|██████████| 5000/5000 [00:01<00:00, 4000.00 examples/s]").counts
    'examples'
    >>> round(read_bar("Epoch 0: 3%|3| 3/100 [00:09<04:51,  3.00s/it, loss=2.1]").rate, 4)
    0.3333
    """
    m = _last(_BAR, line) or _last(_BAR_NOTOTAL, line)
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
    )


def _last(rx: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match: a line may hold several updates (bars written without ``\\r``)."""
    m = None
    for m in rx.finditer(text):  # noqa: B007 - the loop keeps the last one
        pass
    return m


def integer_or_float(text: str) -> float | None:
    """A tqdm-scaled number (``4.00k``), else ``None``.

    >>> integer_or_float("4.00k"), integer_or_float("?")
    (4000.0, None)
    """
    scale = _SCALE.get(text[-1:], 1.0) if text[-1:].isalpha() else 1.0
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


# --- one line --------------------------------------------------------------------------------


def _field_value(f: Field, text: str) -> float | None:
    m = _last(_field_rx(f), text)
    if m is None:
        return None
    if f.metric == "eta_s":
        return duration_s(m.group(1))
    v = number(m.group(1))
    if v is None:
        return None
    suffix = m.group(2) or ""
    if f.value_first:
        v *= _SCALE.get(suffix, 1.0)
    elif suffix == "ms" and f.scale == 1.0:
        v *= 1e-3
    return v * f.scale


def _fields(reader: Reader, text: str, skipped: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in reader.fields:
        if f.metric in out or (skipped and f.metric in ("loss", "rate")):
            continue
        v = _field_value(f, text)
        if v is None:
            continue
        if f.metric in ("step", "total_steps"):
            if not math.isfinite(v) or v < 0 or v >= MAX_STEP or v != int(v):
                continue
            out[f.metric] = int(v)
        elif f.metric == "rate":
            if math.isfinite(v) and v >= 0:
                out["rate"], out["unit"] = v, f.unit
        elif f.metric == "eta_s":
            out["eta_s"] = v
        else:
            out[f.metric] = v
    return out


def _counter(reader: Reader, text: str, out: dict[str, object]) -> None:
    if reader.counter is None:
        return
    m = _rx(reader.counter).search(text)
    if m is None:
        return
    g = {k.rstrip("2"): v for k, v in m.groupdict().items() if v is not None}
    if "step" in g:
        out.setdefault("step", integer(g["step"]))
        if "total" in g:
            out.setdefault("total_steps", integer(g["total"]))
        return
    i, n = integer(g.get("i", "")), integer(g.get("n", ""))
    epoch = integer(g["epoch"]) if "epoch" in g else None
    if i is None or n is None:
        return
    out["_i"], out["_n"] = i, n
    if epoch is not None:
        out["_epoch"] = epoch
    if "epochs" in g:
        out["_epochs"] = integer(g["epochs"])


def read_line(line: str, reader: Reader = GENERIC) -> Reading | None:
    """What ``line`` says read with ``reader`` (no state: a bar's ``n`` is the step, a
    counter's ``i`` within its epoch); ``None`` when it says nothing.

    >>> read_line(" iteration      300/  500000 | elapsed time per iteration (ms): 812.5 |"
    ...           " lm loss: 7.123456E+00 | loss scale: 65536.0 |", BY_NAME["megatron"])
    Reading(step=300, total_steps=500000, loss=7.123456, rate=0.8125, unit='s/step', eta_s=None)
    >>> read_line("epoch 001:    200 / 1000 loss=9.1, wps=12,345.6, ups=2.1, num_updates=200",
    ...           BY_NAME["fairseq"])
    Reading(step=200, total_steps=None, loss=9.1, rate=12345.6, unit='words/s', eta_s=None)
    """
    text = clean(line)
    if not any(c.isdigit() for c in text):
        return None
    r = _read(reader, text)
    if r is None:
        return None
    return Reading(**{k: v for k, v in r.items() if not k.startswith("_")})  # type: ignore[arg-type]


def _read(reader: Reader, text: str) -> dict[str, object] | None:
    skipped = any(_rx(p, re.IGNORECASE).search(text) for p in reader.skip)
    out: dict[str, object] = {}
    _counter(reader, text, out)
    bar = read_bar(text) if reader.bars else None
    if bar is not None:
        if not is_training_bar(bar) or skipped:
            return None
        out["_bar"] = bar
        if bar.n is not None:
            out.setdefault("step", bar.n)
        if bar.total is not None:
            out.setdefault("total_steps", bar.total)
        if bar.rate is not None:
            out["rate"], out["unit"] = bar.rate, bar.unit
        if bar.remaining_s is not None:
            out["eta_s"] = bar.remaining_s
        text = bar.postfix
    for k, v in _fields(reader, text, skipped).items():
        out.setdefault(k, v)
    if "_i" in out and "step" not in out:
        out["step"] = out["_i"]
    return out if any(not k.startswith("_") for k in out) or "_i" in out else None


# --- a log -----------------------------------------------------------------------------------


class ProgressParser:
    """Follows one run's log: detects the framework (or takes ``framework``, hosts.yaml's
    ``log_format``), keeps the training bar's total and the epoch, merges readings.

    A step counted within an epoch (Lightning's bar, Keras, mmengine's ``[epoch][i/n]``)
    becomes a run-wide step: ``epoch x n + i`` (epochs from 0), so it only grows.

    Raises:
        ValueError: ``framework`` is not a known reader's name.

    >>> p = ProgressParser()
    >>> p.feed("Epoch 2/10")
    >>> p.feed("  50/100 [==============>...............] - ETA: 15s - loss: 0.7100")
    >>> p.framework, p.reading.step, p.reading.total_steps, p.reading.loss, p.reading.eta_s
    ('keras', 150, 1000, 0.71, 15.0)
    """

    def __init__(self, framework: str | None = None) -> None:
        if framework is not None and framework not in BY_NAME:
            raise ValueError(
                f"log_format: unknown framework {framework!r} (known: {', '.join(sorted(BY_NAME))})"
            )
        self.forced = framework
        self.reset()

    def reset(self) -> None:
        """Forget the log (a new run started)."""
        self.reader: Reader = BY_NAME[self.forced] if self.forced else GENERIC
        self.detected = self.forced is not None
        self.bar_total: int | None = None
        self.epoch: int | None = None
        self.epochs: int | None = None
        self.reading = Reading()
        self.lines = 0
        self.readings = 0  # lines that said something (a repeated value counts: the log moved)

    @property
    def framework(self) -> str | None:
        """The reader's name once one is detected or forced, else ``None`` (generic)."""
        return self.reader.name if self.detected else None

    def feed(self, line: str) -> None:
        """Read one line (oldest first) into :attr:`reading`; never raises."""
        self.lines += 1
        text = clean(line)
        if not text or not any(c.isdigit() for c in text):
            return
        if not self.detected:
            name = detect(text)
            if name is not None:
                self.reader, self.detected = BY_NAME[name], True
        m = _EPOCH_LINE.match(text)
        if m is not None:
            self.epoch, self.epochs = integer(m.group(1)), integer(m.group(2))
            return
        reader = self.reader
        for name in reader.also:
            if _DETECT_BY_NAME[name].search(text):
                reader = BY_NAME[name]
                break
        got = _read(reader, text)
        if got is None:
            return
        bar = got.pop("_bar", None)
        if isinstance(bar, Bar) and not self._train_bar(bar, got):
            return
        self._epochs(got)
        self.readings += 1
        rd = Reading(**{k: v for k, v in got.items() if not k.startswith("_")})  # type: ignore[arg-type]
        self.reading = self.reading.merged(rd)

    def _train_bar(self, bar: Bar, got: dict[str, object]) -> bool:
        """The first bar seen is the training bar; a bar of another total is not (HF's
        evaluation bar has no description)."""
        lightning = _LIGHTNING_DESC.match(bar.desc)
        if lightning is not None:
            got["_epoch"], got["_i"], got["_n"] = int(lightning.group(1)), bar.n, bar.total
            got.pop("step", None)
            got.pop("total_steps", None)
        if self.bar_total is None:
            self.bar_total = bar.total
            return True
        return bar.total == self.bar_total

    def _epochs(self, got: dict[str, object]) -> None:
        i, n = got.get("_i"), got.get("_n")
        if not isinstance(i, int) or not isinstance(n, int):
            return
        epoch = got.get("_epoch", self.epoch)
        epochs = got.get("_epochs", self.epochs)
        base = 1 if self.reader.name in _EPOCHS_FROM_1 else 0
        if isinstance(epoch, int) and epoch >= base:
            got["step"] = (epoch - base) * n + i
            if isinstance(epochs, int):
                got["total_steps"] = epochs * n if base else (epochs + 1) * n
        else:
            got["step"] = i
            got.setdefault("total_steps", n)

    def read(self, lines: Iterable[str]) -> Reading:
        """Feed ``lines`` (oldest first); the reading so far, an ETA worked out when a total
        and a rate are known and none is printed."""
        for line in lines:
            self.feed(line)
        return with_eta(self.reading)


_EPOCHS_FROM_1 = ("keras", "mmengine")
"""Readers whose frameworks count epochs from 1 (``Epoch 1/10``, ``Epoch(train) [1]``)."""
_EPOCH_LINE = re.compile(r"^\s*Epoch (\d+)/(\d+)\s*$")
_LIGHTNING_DESC = re.compile(r"^Epoch (\d+)$")


def with_eta(r: Reading) -> Reading:
    """``r`` with ``eta_s`` from steps left and the rate when it has none (it/s or s/step).

    >>> with_eta(Reading(step=100, total_steps=1100, rate=2.0, unit="it/s")).eta_s
    500.0
    >>> with_eta(Reading(step=100, total_steps=1100, rate=0.5, unit="s/step")).eta_s
    500.0
    """
    if r.eta_s is not None or r.step is None or r.total_steps is None or r.rate is None:
        return r
    left = max(r.total_steps - r.step, 0)
    if r.unit == "it/s" and r.rate > 0:
        return replace(r, eta_s=round(left / r.rate, 1))
    if r.unit == "s/step":
        return replace(r, eta_s=round(left * r.rate, 1))
    return r


def summary(framework: str | None, r: Reading) -> dict[str, object]:
    """The ``progress`` object of ``orch diagnose --json`` and the docs: ``None`` where the
    log does not say; ``throughput`` is ``{"value", "unit"}`` or ``None``.

    >>> summary("torchtitan", Reading(step=3, loss=2.5, rate=5862.0, unit="tokens/s/device"))
    {'framework': 'torchtitan', 'step': 3, 'total_steps': None, 'loss': 2.5, 'throughput': {'value': 5862.0, 'unit': 'tokens/s/device'}, 'eta_s': None}
    """
    rate = {"value": r.rate, "unit": r.unit} if r.rate is not None else None
    return {
        "framework": framework,
        "step": r.step,
        "total_steps": r.total_steps,
        "loss": r.loss,
        "throughput": rate,
        "eta_s": r.eta_s,
    }


def read_log(lines: Iterable[str], framework: str | None = None) -> tuple[str | None, Reading]:
    """(framework detected or given, what a whole log says) — ``orch diagnose``'s reading.

    >>> read_log(["iter 10: loss 2.5000, time 95.00ms, mfu 40.00%"])
    ('nanogpt', Reading(step=10, total_steps=None, loss=2.5, rate=0.095, unit='s/step', eta_s=None))
    """
    p = ProgressParser(framework)
    r = p.read(lines)
    return p.framework, r
