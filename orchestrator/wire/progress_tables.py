"""Tables and columns in training logs: a key and its value on different lines, or a header
naming the values printed in later rows (pure, stdlib only).

The line readers (:mod:`orchestrator.wire.progress`) read one line at a time; these read what
only a line before explains. Each family is written from the format string that prints it:

- one key per row, between dashed rules: stable-baselines 3's logger (DLR-RM/stable-baselines3
  00dc23b0 ``stable_baselines3/common/logger.py`` HumanOutputFormat.write:
  ``f"| {key}{key_space} | {value}{val_space} |"`` inside ``"-" * (key_width + val_width + 7)``,
  a ``tag/`` row with an empty value, then its keys indented by 3 spaces; floats
  ``f"{value:<8.3g}"``) and stable-baselines 2's (Stable-Baselines-Team/stable-baselines b06ab286
  ``stable_baselines/logger.py`` HumanOutputFormat.writekvs: ``'| %s%s | %s%s |'``, floats
  ``'%-8.3g'``, no tags). Read: ``iterations`` (SB3's rollouts, ``time/``) and ``nupdates``
  (SB2's updates) as the step, ``fps`` (environment steps per second) as samples/s, ``loss``
  (SB3's ``train/loss``, the total) as the loss; ``total_timesteps`` (environment steps) and
  the parts of a loss (``value_loss``, ``policy_loss``) are not;
- a header, then rows: see :func:`read_header` (fastai 0.7 / 1 / 2's epoch table,
  tf_cnn_benchmarks' ``Step\\tImg/sec\\ttotal_loss``, nerfstudio's ``Step (% Done)`` table,
  YOLOv5's ``Epoch gpu_mem box obj cls total labels img_size``);
- a row that names its own columns: CatBoost's iteration line (:func:`read_catboost`).

A row is read only under its header (or inside its rules): a header-less row of numbers,
YOLOv5's row or bar without its header among them, stays unguessed. A table ends at the first
line that is not one of its rows (a blank line and a tqdm bar redrawn between rows do not end
it), so its columns never name the numbers of a later, unrelated line. Bad input is ignored,
never raised: a number that does not parse is no value, a rate must be finite and >= 0, a step
an int below 2**53.

>>> t = Tables()
>>> [t.feed(x) for x in ("epoch      trn_loss   val_loss", "    0      3.925804   3.971093  ")]
[None, Cells(step=None, loss=3.925804, rate=None, unit=None, eta_s=None)]
>>> t.feed("Epoch 1: accuracy 0.91") is None  # the table ended: its columns do not apply
True
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from orchestrator.wire.progress_numbers import MAX_STEP, SCALE, number

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"


@dataclass(frozen=True, slots=True)
class Cells:
    """What one table row says; ``None`` where it does not say. ``rate`` is in ``unit``
    (``samples/s`` or ``s/step``); ``eta_s`` is seconds left."""

    step: int | None = None
    loss: float | None = None
    rate: float | None = None
    unit: str | None = None
    eta_s: float | None = None

    @property
    def said(self) -> bool:
        """Whether the row gave any value.

        >>> Cells().said, Cells(loss=1.0).said
        (False, True)
        """
        return any(v is not None for v in (self.step, self.loss, self.rate, self.eta_s))


@dataclass(frozen=True, slots=True)
class Header:
    """A table's header: ``kind`` names the family (``fastai``, ``tf-cnn``, ``nerfstudio``,
    ``yolov5``), ``columns`` the printed column names in order, ``prefix`` the text printed
    before the header (mpirun's ``[1,0]<stdout>:``), which each row repeats."""

    kind: str
    columns: tuple[str, ...]
    prefix: str = ""


# --- numbers ------------------------------------------------------------------------------


def _step(text: str) -> int | None:
    if not text.isdigit() or len(text) > 16:
        return None
    v = int(text)
    return v if v < MAX_STEP else None


def _rate(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def _num(text: str) -> float | None:
    return number(text) if len(text) < 64 else None


_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s?(ms|d|h|m|s)\b")
_SPAN_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def span_s(text: str) -> float | None:
    """Seconds in a duration printed as parts (``10 m, 56 s``, ``3 s, 656.933 ms``, CatBoost's
    ``1h 7m 22s``, ``70.1ms``); ``None`` when ``text`` is not only such parts.

    >>> span_s("10 m, 56 s"), span_s("3 s, 656.933 ms"), span_s("1h 7m 22s"), span_s("70.1ms")
    (656.0, 3.656933, 4042.0, 0.0701)
    >>> span_s("fast"), span_s("3 parsecs"), span_s("")
    (None, None, None)
    """
    if not text or len(text) > 64:
        return None
    parts = _SPAN.findall(text)
    if not parts or _SPAN.sub("", text).strip(" ,") != "":
        return None
    total = sum(float(v) * _SPAN_S[u] for v, u in parts)
    return round(total, 6) if math.isfinite(total) else None


# --- one key per row (stable-baselines) -------------------------------------------------------

_RULE = re.compile(r"^\s*-{10,}\s*$")
_KV = re.compile(r"^\s*\| (\s*)(\S[^|]*?)\s*\| ([^|]*?)\s*\|\s*$")


def read_kv(line: str) -> tuple[bool, str, str] | None:
    """``(indented, key, value)`` of a stable-baselines logger row ``| key | value |``
    (SB3 indents a tagged key by 3 spaces), else ``None``.

    >>> read_kv("|    fps                  | 1284        |")
    (True, 'fps', '1284')
    >>> read_kv("| time/                   |             |")
    (False, 'time/', '')
    >>> read_kv("| a | b | c |") is None, read_kv("plain text") is None
    (True, True)
    """
    if not line.lstrip().startswith("|") or len(line) > 512:
        return None
    m = _KV.match(line)
    if m is None:
        return None
    return len(m.group(1)) >= 2, m.group(2), m.group(3)


def kv_cells(tag: str, key: str, value: str) -> Cells:
    """The stable-baselines row ``key`` = ``value`` under ``tag`` (``""`` for SB2's untagged
    keys, ``"time/"``, ``"train/"`` for SB3's) as :class:`Cells`.

    >>> kv_cells("time/", "iterations", "7"), kv_cells("", "fps", "142").rate
    (Cells(step=7, loss=None, rate=None, unit=None, eta_s=None), 142.0)
    >>> kv_cells("train/", "loss", "20.1").loss, kv_cells("rollout/", "loss", "1").loss
    (20.1, None)
    >>> kv_cells("time/", "total_timesteps", "3584").said, kv_cells("", "fps", "1e309").said
    (False, False)
    """
    if key == "iterations" and tag in ("", "time/") or key == "nupdates" and tag == "":
        return Cells(step=_step(value))
    if key == "fps" and tag in ("", "time/"):
        rate = _rate(_num(value))
        return Cells(rate=rate, unit="samples/s" if rate is not None else None)
    if key == "loss" and tag in ("", "train/"):
        return Cells(loss=_num(value))
    return Cells()


# --- a header, then rows ------------------------------------------------------------------

_TF_CNN_HEADER = re.compile(r"^(.*?)Step\tImg/sec\t(\w+)((?:\t\w+)*)\s*$")
_NERF_HEADER = "Step (% Done)"
_YOLO_HEADER = re.compile(
    r"^\s*Epoch\s+gpu_mem\s+box\s+obj\s+cls\s+total\s+(?:labels|targets)\s+img_size\s*$"
)
_DIGIT = re.compile(r"\d")
_FASTAI_NAME = re.compile(r"^[A-Za-z_][\w@.:%-]*$")
_LOSSES = ("trn_loss", "train_loss")
"""fastai's training-loss columns: 0.7's ``trn_loss`` (``old/fastai/model.py`` fit), 1 and 2's
``train_loss`` (``basic_train.py`` Recorder, ``learner.py`` Recorder.metric_names)."""


def read_header(line: str) -> Header | None:
    """The table header ``line`` prints, else ``None``. The families:

    - fastai 0.7 (fastai/fastai 004f6761 ``old/fastai/model.py`` fit: ``names = ["epoch",
      "trn_loss", "val_loss"] + metrics``, ``layout = "{!s:10} " * len(names)``), fastai 1 and
      2 through fastprogress' console bar (fastai/fastprogress ``fastprogress/fastprogress.py``
      ConsoleMasterBar.write(table=True): names padded to 8, joined by two spaces:
      ``epoch  train_loss  valid_loss  accuracy  time``): the first name ``epoch``, a training
      loss column, no digits;
    - tf_cnn_benchmarks (tensorflow/benchmarks 0a61313a
      ``scripts/tf_cnn_benchmarks/benchmark_cnn.py``: ``'Step\\tImg/sec\\t' +
      loss_type_to_report`` (``total_loss`` or ``base_loss``; ``loss`` before it), then
      ``\\ttop_1_accuracy\\ttop_5_accuracy`` when printed), after any prefix (mpirun's tag);
    - nerfstudio (nerfstudio-project/nerfstudio 008df5e3 ``nerfstudio/utils/writer.py``
      LocalWriter._update_header: ``f"{'Step (% Done)':<20}"`` then ``f"{name:<20} "`` per
      tracked stat);
    - YOLOv5 (ultralytics/yolov5 ``train.py`` v3 to v6: ``('%10s' * 8) % ('Epoch', 'gpu_mem',
      'box', 'obj', 'cls', 'total', 'labels', 'img_size')``, v3's ``targets``).

    >>> read_header("epoch     train_loss  valid_loss  accuracy  time    ")
    Header(kind='fastai', columns=('epoch', 'train_loss', 'valid_loss', 'accuracy', 'time'), prefix='')
    >>> read_header("Step\\tImg/sec\\ttotal_loss").columns
    ('Step', 'Img/sec', 'total_loss')
    >>> read_header("Step (% Done)       Train Iter (time)    ETA (time)           Train Rays / Sec").columns
    ('Step (% Done)', 'Train Iter (time)', 'ETA (time)', 'Train Rays / Sec')
    >>> read_header("     Epoch   gpu_mem       box       obj       cls     total    labels  img_size").kind
    'yolov5'
    >>> read_header("epoch 1 train_loss 0.5") is None, read_header("") is None
    (True, True)
    """
    if len(line) > 1024:
        return None
    if "Img/sec" in line:
        m = _TF_CNN_HEADER.match(line)
        if m is not None:
            more = tuple(c for c in m.group(3).split("\t") if c)
            return Header("tf-cnn", ("Step", "Img/sec", m.group(2), *more), m.group(1))
        return None
    if _NERF_HEADER in line:
        head = line.strip()
        if not head.startswith(_NERF_HEADER):
            return None
        rest = head[len(_NERF_HEADER) :].strip()
        cols = tuple(c for c in re.split(r"\s{2,}", rest) if c) if rest else ()
        return Header("nerfstudio", (_NERF_HEADER, *cols))
    if "gpu_mem" in line:
        if _YOLO_HEADER.match(line):
            return Header("yolov5", tuple(line.split()))
        return None
    if "_loss" in line and "epoch" in line and _DIGIT.search(line) is None:
        names = tuple(line.split())
        if (
            len(names) >= 2
            and names[0] == "epoch"
            and any(n in _LOSSES for n in names)
            and all(_FASTAI_NAME.match(n) for n in names)
        ):
            return Header("fastai", names)
    return None


_TF_CNN_ROW = re.compile(
    rf"^(\d+)\timages/sec: ({_NUM})(?: \+/- (?:{_NUM}) \(jitter = (?:{_NUM})\))?\t({_NUM})"
    rf"(?:\t|\s*$)"
)
_NERF_STEP = re.compile(r"^(\d+) \((?:\d+(?:\.\d+)?)%\)$")
_NERF_RATE = re.compile(r"^(\d+(?:\.\d+)?) ?([KMBTP]?)$")
_NERF_SCALE = {**SCALE, "B": 1e9}  # nerfstudio's human_format: '', K, M, B, T, P
_YOLO_ROW = re.compile(
    rf"^\s*\d+/\d+\s+[\d.]+[GM]?\s+(?:{_NUM})\s+(?:{_NUM})\s+(?:{_NUM})\s+({_NUM})\s+\d+\s+\d+(?:\s|$)"
)


def read_row(header: Header, line: str) -> Cells | None:
    """What ``line`` says as a row of ``header``'s table, else ``None`` (not its row).

    - fastai: as many cells as columns, the first an epoch number; the training loss column
      is the loss (the epoch's smoothed mean, the only one printed; ``#na#`` is none); the
      epoch's length is not printed, so no step;
    - tf_cnn_benchmarks: ``'%i\\t%s\\t%.*f' % (step + 1, 'images/sec: %.1f +/- %.1f (jitter =
      %.1f)', digits, lossval)``: the step, the running mean images/sec as samples/s, the loss;
    - nerfstudio: ``f"{step} ({fraction_done*100:.02f}%)"`` padded to 20, then each stat
      padded to 20: ``Train Rays / Sec`` (human_format ``f"{n:.2f} {unit}"``, rays read as
      samples/s), ``ETA (time)`` (``_format_time``: ``8 m, 37 s``) as the time left; the iteration
      time is not read where the rays' rate is printed;
    - YOLOv5: ``('%10s' * 2 + '%10.4g' * 6) % (f'{epoch}/{epochs - 1}', mem, box, obj, cls,
      total, labels, img_size)``; ``total`` (the epoch's running mean) is the loss; a row with
      its tqdm bar (``%|``) is left to the ``yolov5`` line reader.

    >>> fa = read_header("epoch     train_loss  valid_loss  time    ")
    >>> read_row(fa, "1         0.123456    0.234567    00:12   ").loss
    0.123456
    >>> read_row(fa, "Epoch 2/10") is None, read_row(fa, "1  #na#  0.5  00:12").said
    (True, False)
    >>> tf = read_header("Step\\tImg/sec\\ttotal_loss")
    >>> read_row(tf, "100\\timages/sec: 204.8 +/- 0.0 (jitter = 0.2)\\t9.079")
    Cells(step=100, loss=9.079, rate=204.8, unit='samples/s', eta_s=None)
    >>> ns = read_header("Step (% Done)       Train Iter (time)    ETA (time)           Train Rays / Sec")
    >>> read_row(ns, "190 (0.63%)         17.369 ms            8 m, 37 s            38.20 M")
    Cells(step=190, loss=None, rate=38200000.0, unit='samples/s', eta_s=517.0)
    >>> yo = read_header("     Epoch   gpu_mem       box       obj       cls     total    labels  img_size")
    >>> read_row(yo, "      8/89     5.61G   0.03374   0.01268  0.001882    0.0483         4       640").loss
    0.0483
    """
    if len(line) > 4096:
        return None
    if header.prefix:
        if not line.startswith(header.prefix):
            return None
        line = line[len(header.prefix) :]
    if header.kind == "tf-cnn":
        m = _TF_CNN_ROW.match(line)
        if m is None:
            return None
        rate = _rate(_num(m.group(2)))
        loss = _num(m.group(3)) if "loss" in header.columns[2] else None
        return Cells(
            step=_step(m.group(1)), loss=loss, rate=rate, unit="samples/s" if rate else None
        )
    if header.kind == "nerfstudio":
        return _nerf_row(header, line)
    if header.kind == "yolov5":
        if "%|" in line:
            return None
        m = _YOLO_ROW.match(line)
        return Cells(loss=_num(m.group(1))) if m is not None else None
    cells = line.split()
    if len(cells) != len(header.columns) or not cells[0].isdigit():
        return None
    for name, cell in zip(header.columns, cells, strict=True):
        if name in _LOSSES:
            return Cells(loss=_num(cell))
    return Cells()


def _nerf_row(header: Header, line: str) -> Cells | None:
    cells = [c for c in re.split(r"\s{2,}", line.strip()) if c]
    if not cells:
        return None
    m = _NERF_STEP.match(cells[0])
    if m is None or len(cells) > len(header.columns):
        return None
    rate: float | None = None
    eta: float | None = None
    for name, cell in zip(header.columns[1:], cells[1:], strict=False):
        if name == "Train Rays / Sec":
            r = _NERF_RATE.match(cell)
            if r is not None:
                rate = _rate(float(r.group(1)) * _NERF_SCALE[r.group(2)])
        elif name == "ETA (time)":
            eta = span_s(cell)
    return Cells(
        step=_step(m.group(1)), rate=rate, unit="samples/s" if rate is not None else None, eta_s=eta
    )


# --- a row that names its own columns (CatBoost) -----------------------------------------------

_CATBOOST = re.compile(rf"^(\d+):\s+learn:? ?({_NUM})(?=passed:|\s|$)")
_CATBOOST_PASSED = re.compile(rf"passed: ({_NUM}) sec")
_CATBOOST_LEFT = re.compile(r"\tremaining: ([\w. ]{1,40}?)\s*$")


def read_catboost(line: str) -> Cells | None:
    """CatBoost's iteration line, else ``None`` (catboost/catboost 0ffde07c
    ``catboost/libs/loggers/logger.h`` TConsoleLoggingBackend: ``currentIteration << ":"``, then
    per set ``"\\t" << sourceName << ": " << value`` of the main metric (the test set's with
    ``"\\tbest: " << best << " (" << iteration << ")"``), then ``"\\ttotal: "`` elapsed and
    ``"\\tremaining: "`` left, as ``HumanReadable(TDuration)``); the 2018 form printed the
    learn value glued to the iteration's ``passed: X sec``, read as s/step.

    The iteration is printed from 0 and read as printed; ``learn`` is the main metric on the
    training set: the loss function unless an ``eval_metric`` is set (the line does not say).

    >>> read_catboost("600:\\tlearn: 0.1498213\\ttest: 0.1367448\\tbest: 0.1366783 (566)\\ttotal: 28.9s\\tremaining: 19.2s")
    Cells(step=600, loss=0.1498213, rate=None, unit=None, eta_s=19.2)
    >>> read_catboost("13:\\tlearn 0.2893642169passed: 17.7 sec\\ttotal: 6m 57s\\tremaining: 27m 49s")
    Cells(step=13, loss=0.2893642169, rate=17.7, unit='s/step', eta_s=1669.0)
    >>> read_catboost("12: loss 3") is None, read_catboost("learn: 1") is None
    (True, True)
    """
    if "learn" not in line or len(line) > 1024:
        return None
    m = _CATBOOST.match(line)
    if m is None:
        return None
    p = _CATBOOST_PASSED.search(line)
    rate = _rate(_num(p.group(1))) if p is not None else None
    left = _CATBOOST_LEFT.search(line)
    return Cells(
        step=_step(m.group(1)),
        loss=_num(m.group(2)),
        rate=rate,
        unit="s/step" if rate is not None else None,
        eta_s=span_s(left.group(1)) if left is not None else None,
    )


# --- following a log ----------------------------------------------------------------------


class Tables:
    """Follows a log's lines for its tables: remembers the header (or the rule) seen, reads
    the rows under it, forgets it at the first line that is not its row.

    :meth:`feed` takes each line (cleaned, oldest first) and returns the row's
    :class:`Cells` when the line is a table's row (the line readers should not read it),
    else ``None`` (a header, a rule or any other line: read it as a line).

    >>> t = Tables()
    >>> rows = ["-" * 41, "| time/                   |             |",
    ...         "|    iterations           | 7           |", "|    fps                  | 26          |"]
    >>> [t.feed(x) for x in rows][2:]
    [Cells(step=7, loss=None, rate=None, unit=None, eta_s=None), Cells(step=None, loss=None, rate=26.0, unit='samples/s', eta_s=None)]
    >>> t.feed("|    iterations           | 8           |") is not None
    True
    >>> t.feed("some other line") is None, t.feed("|    iterations           | 9           |") is None
    (True, True)
    """

    __slots__ = ("_armed", "_header", "_kv", "_tag")

    def __init__(self) -> None:
        self._header: Header | None = None
        self._kv = False  # inside a stable-baselines table
        self._armed = False  # the line before was a dashed rule
        self._tag = ""

    def feed(self, line: str) -> Cells | None:
        """``line``'s cells when it is a row of the table being read, else ``None``;
        never raises."""
        if not line or line.isspace():
            return None  # a blank line neither reads nor ends a table
        if self._kv or self._armed:
            got = self._kv_row(line)
            if got is not None:
                return got
        if "-" in line[:12] and _RULE.match(line):
            self._armed, self._kv, self._tag = True, False, ""
            if self._header is not None and self._header.kind == "nerfstudio":
                self._armed = True  # the rule under nerfstudio's header keeps its table
                return None
            self._header = None
            return None
        self._armed = False
        if self._header is not None:
            row = read_row(self._header, line)
            if row is not None:
                return row
            if "%|" in line:
                return None  # a tqdm bar redrawn between rows
            self._header = None
        if "_loss" in line or "Img/sec" in line or _NERF_HEADER in line or "Epoch" in line:
            header = read_header(line)  # (each header has one of these words)
            if header is not None:
                self._header = header
                return None
        return read_catboost(line) if line[:1].isdigit() and "learn" in line else None

    def _kv_row(self, line: str) -> Cells | None:
        kv = read_kv(line)
        if kv is None:
            self._kv = False
            return None
        self._kv, self._armed = True, False
        indented, key, value = kv
        if key.endswith("/") and not value:
            self._tag = key
            return Cells()
        return kv_cells(self._tag if indented else "", key, value)
