"""Training progress read from log lines: step, total, loss, throughput with its unit, ETA.

The one progress parser of orch: the agent's snapshot, the host observer, the detectors and
``orch diagnose`` all read lines through it. Per-framework tables live in
:mod:`orchestrator.wire.progress_readers`; this module holds the pure readers.

- :func:`read_line` reads one line with one reader (pure; never raises);
- :mod:`~orchestrator.wire.progress_bars` reads tqdm bars, and
  :mod:`~orchestrator.wire.progress_numbers` numbers, durations and raw lines;
- :func:`detect` names the framework a line comes from;
- :class:`ProgressParser` follows a log: it detects the framework, remembers the training
  bar's total and the epoch, and merges the newest value of each metric.

Bad input is parsed or ignored (progress_numbers); a rate must be finite and >= 0.

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from orchestrator.wire.progress_bars import Bar, is_training_bar, read_bar
from orchestrator.wire.progress_numbers import (
    MAX_STEP,
    SCALE,
    clean,
    duration_s,
    integer,
    last_match,
    number,
)
from orchestrator.wire.progress_readers import BY_NAME, GENERIC, READERS, Field, Reader
from orchestrator.wire.progress_tables import Cells, Tables

NUM = (
    r"[-+]?1\.#(?:QNAN|SNAN|IND|INF)\d*|"  # the MSVC runtime's NaN and infinity (CNTK on Windows)
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+|[-+]?(?:nan|inf)"
)
_DURATION = r"(?:\d+ days?, )?\d+(?::\d\d){1,2}|\d+(?:\.\d+)?(?:ms|s|m|h)\b"
_SEP = r"['\"]?\s*(?:[:=]\s*|\s+)['\"]?"


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
            # a rate may print its thousands ('TPS: 16.88K', 'tps: 5.8k'); other values not
            suffix = "ms|s|[kKM]" if f.metric == "rate" else "ms|s"
            body = rf"(?<![\w/.])(?:{f.key}){_SEP}({NUM})\s?({suffix})?(?![\w])"
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
_ANY_HINT = re.compile("|".join(re.escape(h) for r in READERS for h in r.hints))


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
    if _ANY_HINT.search(text) is None:
        return None
    for reader, rx in _DETECT:
        if any(h in text for h in reader.hints) and rx.search(text):
            return reader.name
    return None


# --- one line --------------------------------------------------------------------------------


_LOOKAROUND = re.compile(r"\(\?<?[!=][^()]*\)")


def field_hints(key: str) -> tuple[str, ...]:
    r"""Lower-case literal text one of which any match of ``key`` contains; ``()`` when the
    alternatives are not plain enough to tell (then the regex always runs).

    >>> field_hints(r"global_step|step|iter"), field_hints(r"(?:us|μs)/step")
    (('global_step', 'step', 'iter'), ())
    >>> field_hints(r"throughput per GPU \(TFLOP/s/GPU\)")
    ('throughput per gpu (tflop/s/gpu)',)
    >>> field_hints(r"(?<!avg )loss|train_time(?==)")  # lookarounds only narrow a match
    ('loss', 'train_time')
    """
    alts = _LOOKAROUND.sub("", key).split("|")
    if any(not a or re.search(r"[][()?*+{}^$.]", re.sub(r"\\.", "", a)) for a in alts):
        return ()
    return tuple(re.sub(r"\\(.)", r"\1", a).lower() for a in alts)


def _compiled(reader: Reader) -> list[tuple[Field, re.Pattern[str], tuple[str, ...]]]:
    """The reader's fields with their regex and hints, built once per reader."""
    got = _COMPILED.get(reader.name)
    if got is None:
        got = _COMPILED[reader.name] = [
            (f, _field_rx(f), (f.hint,) if f.hint else field_hints(f.key)) for f in reader.fields
        ]
    return got


_COMPILED: dict[str, list[tuple[Field, re.Pattern[str], tuple[str, ...]]]] = {}
_DIGIT = re.compile(r"\d")


def _field_value(f: Field, rx: re.Pattern[str], text: str) -> float | None:
    if f.sole:
        found = list(rx.finditer(text))
        m = found[0] if len(found) == 1 else None
    else:
        m = last_match(rx, text)
    if m is None:
        return None
    if f.metric == "eta_s":
        return duration_s(m.group(1))
    v = number(m.group(1))
    if v is None:
        return None
    suffix = m.group(2) or ""
    if f.value_first or suffix in ("k", "K", "M"):
        v *= SCALE.get(suffix, 1.0)
    elif suffix == "ms" and f.scale == 1.0:
        v *= 1e-3
    if f.invert:
        return 1.0 / v if v > 0 and math.isfinite(v) else None
    return v * f.scale


def _fields(reader: Reader, text: str, skipped: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    low = text.lower()
    for f, rx, hints in _compiled(reader):
        if f.metric in out or (skipped and f.metric in ("loss", "rate")):
            continue
        if hints:
            for h in hints:
                if h in low:
                    break
            else:
                continue
        v = _field_value(f, rx, text)
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
    if reader.counter is not None:
        m = _rx(reader.counter).search(text)
        if m is not None:
            _counted(m, out)
    for hint, pattern in reader.shapes:
        if hint in text:
            m = _rx(pattern).search(text)
            if m is not None:
                _counted(m, out)
                if "_i" in out:
                    out["_shape"] = True


def _counted(m: re.Match[str], out: dict[str, object]) -> None:
    """A counter's named groups into ``out`` (a value already there wins)."""
    if m.groupdict().get("epoch0") is not None:
        out.setdefault("_base", 0)  # a format known to count epochs from 0 (MXNet's)
    g = {k.rstrip("0123456789"): v for k, v in m.groupdict().items() if v is not None}
    if "loss" in g and (loss := number(g["loss"])) is not None:
        out.setdefault("loss", loss)  # an unnamed column (darknet's, YOLOv5's)
    if "sec" in g:
        sec = duration_s(g["sec"]) if ":" in g["sec"] else number(g["sec"])
        if sec is not None and math.isfinite(sec) and sec >= 0:
            out.setdefault("rate", sec)
            out.setdefault("unit", "s/step")
    if "step" in g or ("total" in g and "i" not in g):
        if "step" in g:
            out.setdefault("step", integer(g["step"]))
        if "total" in g:
            out.setdefault("total_steps", integer(g["total"]))
        return
    i = integer(g.get("i", ""))
    n = integer(g["n"]) if "n" in g else None
    epoch = integer(g["epoch"]) if "epoch" in g else None
    if i is None or "_i" in out or (n is None and epoch is None):
        return
    out["_i"] = i
    if n is not None:
        out["_n"] = n
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
    if not _DIGIT.search(text):
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
        if bar.n is not None and "_i" not in out:
            out.setdefault("step", bar.n)
        if bar.total is not None and "_i" not in out:
            out.setdefault("total_steps", bar.total)
        if bar.rate is not None:
            out["rate"], out["unit"] = bar.rate, bar.unit
        if bar.remaining_s is not None:
            out["eta_s"] = bar.remaining_s
        text = bar.postfix
        if "oss" in bar.desc:  # 'Loss'/'loss': a word check before the fields' regexes
            # tqdm's desc (format_meter: f'{desc}: ' before the bar) may carry the loss
            # (set_description(f'Loss: {loss}')); the postfix's, read below, wins
            desc_loss = _fields(reader, bar.desc, skipped).get("loss")
            if desc_loss is not None:
                out["_desc_loss"] = desc_loss
        if bar.tail.strip():
            # a step or loss printed after the bar (dllogger's 'Training Iteration: 701') is newer
            tail = _fields(reader, bar.tail, skipped)
            out.update({k: tail[k] for k in ("step", "loss") if k in tail})
    fields = _fields(reader, text, skipped)
    if bar is not None and out.get("unit") == "it/s" and fields.get("unit") not in _ITS:
        # a rate of the work in the postfix (ColossalAI's 'throughput=8.2 sample_per_sec')
        # over the bar's iterations: the model keeps the work's unit where both are printed
        out["rate"], out["unit"] = fields["rate"], fields["unit"]
    for k, v in fields.items():
        out.setdefault(k, v)
    if "_desc_loss" in out:
        out.setdefault("loss", out.pop("_desc_loss"))
    if "_i" in out and "step" not in out:
        out["step"], out["_from_i"] = out["_i"], True
    elif out.get("_shape") and out.get("step") == out.get("_i"):
        out["_from_i"] = True  # 'Epoch 3/10, Step 50/100': the step key printed the position
    return out if any(not k.startswith("_") for k in out) or "_i" in out else None


_ITS = (None, "it/s", "s/step")
"""Units that count the loop's iterations, not its work."""


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
        self.zero_epoch = False  # the log showed an epoch 0 (the generic reader's epoch base)
        self.reading = Reading()
        self.lines = 0
        self.readings = 0  # lines that said something (a repeated value counts: the log moved)
        self.tables = Tables()  # progress_tables: rows read under a header seen before
        self.cells: Cells | None = None

    @property
    def framework(self) -> str | None:
        """The reader's name once one is detected or forced, else ``None`` (generic)."""
        return self.reader.name if self.detected else None

    def skim(self, line: str) -> str | None:
        """Take only the framework and the epoch from ``line`` (an older line of a long read,
        where the newest lines carry the values); its clean text when there is more to read."""
        self.lines += 1
        text = clean(line)
        self.cells = self.tables.feed(text)
        if not text or self.cells is not None:
            return None  # a table's row is read by feed from self.cells, not as a line
        if not self.detected:  # a header without digits may name it (Ultralytics' columns)
            name = detect(text)
            if name is not None:
                self.reader, self.detected = BY_NAME[name], True
        if not _DIGIT.search(text):
            return None
        m = _EPOCH_LINE.match(text)
        if m is not None:
            self.epoch = integer(m.group(1))
            self.epochs = integer(m.group(2)) if m.group(2) else None
            self.zero_epoch = self.zero_epoch or self.epoch == 0
            return None
        return text

    def feed(self, line: str) -> None:
        """Read one line (oldest first) into :attr:`reading`; never raises."""
        text = self.skim(line)
        if text is None:
            c = self.cells
            if c is not None and c.said:
                self.readings += 1
                self.reading = self.reading.merged(
                    Reading(c.step, None, c.loss, c.rate, c.unit, c.eta_s)
                )
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
        if got.get("_no_step"):
            self.reading = replace(self.reading, step=None, total_steps=None)

    def _train_bar(self, bar: Bar, got: dict[str, object]) -> bool:
        """The first bar seen is the training bar; a bar of another total is not (HF's
        evaluation bar has no description)."""
        lightning = _LIGHTNING_DESC.match(bar.desc)
        if lightning is not None:
            got["_epoch"], got["_i"], got["_n"] = int(lightning.group(1)), bar.n, bar.total
            got["_base"] = 0  # Lightning's current_epoch counts from 0
            got.pop("step", None)
            got.pop("total_steps", None)
        if self.bar_total is None:
            self.bar_total = bar.total
        elif bar.total != self.bar_total:
            return False
        if (
            lightning is None
            and self.reader is GENERIC
            and self.epoch is not None
            and bar.n is not None
            and bar.total is not None
            and "_i" not in got
            and got.get("step") == bar.n
        ):
            # an epoch's bar after an epoch header (SpeechBrain's 'Going into epoch 2',
            # Ludwig's 'Epoch   4'): the bar's n is the position within that epoch
            got["_i"], got["_n"], got["_from_i"] = bar.n, bar.total, True
            got.pop("total_steps", None)
        return True

    def _epochs(self, got: dict[str, object]) -> None:
        i, n = got.get("_i"), got.get("_n")
        if not isinstance(i, int):
            return
        if "step" in got and not got.pop("_from_i", False):
            return  # the line prints the step itself (fairseq's num_updates beside [i / n])
        epoch = got.get("_epoch", self.epoch)
        epochs = got.get("_epochs", self.epochs)
        if epoch == 0:
            self.zero_epoch = True
        base = self._epoch_base(got)
        if isinstance(epoch, int) and epoch >= base:
            if not isinstance(n, int):  # the epoch's length is not printed
                if epoch == base:
                    got["step"] = i  # the first epoch: its position is the run's step
                else:
                    got.pop("step", None)
                    got["_no_step"] = True  # the step is no longer known
                return
            got["step"] = (epoch - base) * n + i
            if isinstance(epochs, int):
                got["total_steps"] = epochs * n if base else (epochs + 1) * n
        else:
            got["step"] = i
            if isinstance(n, int):
                got.setdefault("total_steps", n)

    def _epoch_base(self, got: dict[str, object]) -> int:
        """What the first epoch is numbered: the reader's framework says; the generic reader
        takes 1 until the log shows an epoch 0 (or the format is known to count from 0)."""
        base = got.get("_base")
        if isinstance(base, int):
            return base
        if self.reader.name in _EPOCHS_FROM_1:
            return 1
        if self.reader is GENERIC and not self.zero_epoch:
            return 1
        return 0

    def tee(self, lines: Iterable[str]) -> Iterator[str]:
        """Yield ``lines`` unchanged, feeding each one (``orch diagnose`` reads a log once
        for its signatures and its progress)."""
        for line in lines:
            self.feed(line)
            yield line

    def result(self) -> Reading:
        """The reading so far, with an ETA worked out (:func:`with_eta`)."""
        return with_eta(self.reading)

    def read(self, lines: Iterable[str]) -> Reading:
        """Feed ``lines`` (oldest first); the reading so far, an ETA worked out when a total
        and a rate are known and none is printed."""
        for line in lines:
            self.feed(line)
        return with_eta(self.reading)


_EPOCHS_FROM_1 = (
    "keras",
    "mmengine",
    "fairseq",
    "torch-xla",
    "yolox",
    "flair",
    "ultralytics",
    "opennmt-py",
)
"""Readers whose frameworks count epochs from 1 (``Epoch 1/10``, ``Epoch(train) [1]``,
fairseq's ``| epoch 001``, torch_xla's ``Epoch=1``, YOLOX's ``epoch: 1/300``, flair's
``epoch 1 - iter``, Ultralytics' ``1/1000``, OpenNMT-py 0.x's ``Epoch  1,``)."""
_EPOCH_LINE = re.compile(
    r"^\s*(?:\S.* - )?(?:Going into )?Epoch:? +(\d+)(?:/(\d+))?\s*$", re.IGNORECASE
)
"""An epoch header, alone or after a logger's prefix (AllenNLP's ``... trainer - Epoch 0/139``,
SpeechBrain's ``epoch_loop - Going into epoch 2``, Ludwig's ``Epoch   4``, MONAI's tutorials'
``epoch 15/300``, tacotron2's ``Epoch: 0``)."""
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


def read_log(lines: Iterable[str], framework: str | None = None) -> tuple[str | None, Reading]:
    """(framework detected or given, what a whole log says) — ``orch diagnose``'s reading.

    >>> read_log(["iter 10: loss 2.5000, time 95.00ms, mfu 40.00%"])
    ('nanogpt', Reading(step=10, total_steps=None, loss=2.5, rate=0.095, unit='s/step', eta_s=None))
    """
    p = ProgressParser(framework)
    r = p.read(lines)
    return p.framework, r
