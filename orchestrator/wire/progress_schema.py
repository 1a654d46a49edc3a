"""The progress readers' schema: :class:`Field`, :class:`Reader` and the units (data only).

A :class:`Reader` is one framework's table (``progress_readers``, ``progress_readers_vision``);
``fields`` map a printed key to a metric of :class:`orchestrator.wire.progress.Reading`:

- ``step``/``total_steps``: integers; ``loss``: the instantaneous value where both it and
  a running mean are printed (the first field row that matches wins, so order is priority);
- ``rate``: a throughput kept in the unit printed (``UNITS``), ``scale`` brings it to the
  unit's base (ms -> s); ``eta_s``: seconds left.

Stdlib only: this module ships to the agent inside ``wire/``.
"""

from __future__ import annotations

from dataclasses import dataclass

UNITS = (
    "tokens/s",
    "tokens/s/device",
    "samples/s",
    "samples/s/device",
    "words/s",
    "words/s/thread",
    "it/s",
    "s/step",
    "TFLOP/s/device",
)
"""The throughput units a reading may carry. ``s/step`` is a time (higher is slower); the
others are rates. ``it/s`` is tqdm's iteration: the training bar's iteration is a step.
``words/s/thread`` is fastText's per-thread rate, as printed (the thread count is not)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One printed key: ``key`` is a regex for the key text (matched case-insensitively,
    not preceded by a word character, ``/`` or ``.``); the value follows after ``=``, ``:``,
    quotes or a space. ``value_first`` reads ``21.5 Ktok/s`` (the number before the key)."""

    metric: str
    key: str
    unit: str = ""
    scale: float = 1.0
    value_first: bool = False
    invert: bool = False
    """The printed value is the rate's inverse (tqdm's ``s/it`` read back as ``it/s``)."""
    hint: str = ""
    """Lower-case literal text every match contains, where ``key`` is a pattern too rich to
    tell it (``progress.field_hints``); a line without it is not searched."""
    sole: bool = False
    """Read only where the key matches once in the line (a ``*_loss`` that is the only one;
    two are parts of a loss that is not printed)."""


@dataclass(frozen=True, slots=True)
class Reader:
    """A framework's progress lines; see the module docstring."""

    name: str
    source: str
    detect: tuple[str, ...]
    fields: tuple[Field, ...]
    skip: tuple[str, ...] = ()
    bars: bool = False
    also: tuple[str, ...] = ()
    """Readers whose lines share this log (HF Trainer under DeepSpeed): a line showing one of
    their signatures is read with that reader."""
    hints: tuple[str, ...] = ()
    """Literal text every ``detect`` match contains (one of them): a line without any is not
    searched (a substring test costs far less than a regex)."""
    counter: str | None = None
    """A regex with named groups ``step``/``total`` or ``epoch``/``i``/``n`` (mmengine's
    ``[epoch][i/n]``, Megatron's ``iteration N/M``) read before the fields; ``total`` alone
    (NeMo's ``iteration i/max_steps`` beside its printed ``global_step``) gives the total only;
    ``loss`` (an unnamed column: darknet's first number, YOLOv5's ``total``) and ``sec`` (seconds
    per step, read as ``s/step``; a ``H:MM:SS`` duration too) where the line names no key for them;
    a group name may end in digits (``step2``) where two alternatives name the same thing."""
    shapes: tuple[tuple[str, str], ...] = ()
    """More counters, each ``(literal, regex)``: the regex runs only on a line that contains
    the literal (the generic reader's families: MXNet's ``Epoch[e] Batch [i]``, Marian's
    ``Up. N``); read after ``counter``, the first value of a metric wins. A shape's ``i``
    (a position within an epoch) wins over a ``step`` key that printed the same number."""


def loss_fields(*keys: str) -> tuple[Field, ...]:
    """One ``loss`` field per key, in priority order."""
    return tuple(Field("loss", k) for k in keys)
