"""Progress as a person reads it: a rate with its unit, an ETA, ``orch diagnose``'s line."""

from __future__ import annotations

from orchestrator.wire.model import Metrics


def format_rate(value: float, unit: str) -> str:
    """A throughput with its unit, for a person (a time per step in ms when under a second).

    >>> format_rate(21500.0, "tokens/s"), format_rate(3.2, "it/s"), format_rate(0.812, "s/step")
    ('21.5k tokens/s', '3.20 it/s', '812 ms/step')
    """
    if unit == "s/step":
        return f"{value * 1e3:.0f} ms/step" if value < 1 else f"{value:.2f} s/step"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f}M {unit}"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k {unit}"
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:.2f} {unit}"


def format_eta(seconds: float) -> str:
    """``1h02m``, ``5m30s``, ``42s``.

    >>> format_eta(3720), format_eta(330), format_eta(42.4)
    ('1h02m', '5m30s', '42s')
    """
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def format_progress(p: dict[str, object]) -> str:
    """The one line ``orch diagnose`` prints under its matches, from :func:`summary`.

    >>> from orchestrator.wire.progress import Reading
    >>> from orchestrator.wire.progress_summary import summary
    >>> format_progress(summary("megatron", Reading(300, 500000, 7.12, 0.8125, "s/step")))
    'progress (megatron): step 300/500000, loss 7.12, 812 ms/step'
    >>> format_progress(summary(None, Reading()))
    'progress (generic): no step, loss or throughput in this log'
    """
    parts = []
    step, total, loss, rate, eta = (
        p.get(k) for k in ("step", "total_steps", "loss", "throughput", "eta_s")
    )
    if step is not None:
        parts.append(f"step {step}" + (f"/{total}" if total is not None else ""))
    if isinstance(loss, float):
        parts.append(f"loss {loss:.4g}")
    if isinstance(rate, dict):
        parts.append(format_rate(float(rate["value"]), str(rate["unit"])))
    if isinstance(eta, (int, float)):
        parts.append(f"ETA {format_eta(eta)}")
    head = f"progress ({p.get('framework') or 'generic'}): "
    return head + (", ".join(parts) if parts else "no step, loss or throughput in this log")


def step_text(m: Metrics) -> str:
    """``step 300/500000 ETA 1h02m`` (the total and the ETA when the log gives them).

    >>> step_text(Metrics(step=300, total_steps=500000, eta_s=3720.0))
    'step 300/500000 ETA 1h02m'
    >>> step_text(Metrics(step=7))
    'step 7'
    """
    out = f"step {m.step}" + (f"/{m.total_steps}" if m.total_steps is not None else "")
    return out + (f" ETA {format_eta(m.eta_s)}" if m.eta_s is not None else "")


def rate_text(value: float, unit: str) -> str:
    """A watch line's rate: tokens/s as before (``21.5k tok/s``), any other unit as printed.

    >>> rate_text(21500.0, "tokens/s"), rate_text(5862.0, "tokens/s/device")
    ('21.5k tok/s', '5,862 tokens/s/device')
    """
    if unit == "tokens/s":
        short = f"{value / 1e3:.1f}k" if abs(value) >= 1e3 else f"{value:.0f}"
        return f"{short} tok/s"
    return format_rate(value, unit)
