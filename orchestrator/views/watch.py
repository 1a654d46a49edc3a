"""``orch watch``: a live dashboard of every target (rich Live), or one line per change.

Three layers, kept apart:

- **pumps** (I/O, one daemon thread per target): iterate ``Target.stream(interval_s)``
  and put each Snapshot on one queue. ``Target.stream`` reconnects by itself and
  yields ``Snapshot.unreachable`` markers while down; should it raise, the pump
  puts a marker too and starts a new stream after an exponential backoff (tenacity).
- **model** (:class:`WatchModel`, main thread only): per-target history, the
  detectors' findings, the state word, "unreachable since".
- **rendering** (pure: model + clock + size -> renderable or text line):
  :func:`render_dashboard`, :func:`render_detail`, :func:`plain_line`.

Keys (TTY only): ``q`` quits, up/down or ``j``/``k`` select, Enter opens the
detail of the selected target, Esc or ``b`` goes back. Ctrl-C quits cleanly too;
the terminal (alternate screen, cbreak mode) is restored on every exit path.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tenacity
from rich.console import Console, Group, RenderableType
from rich.text import Text

from orchestrator.model import Finding, GpuSample, Severity, Snapshot
from orchestrator.views.state import roles_by_gpu, target_state

log = logging.getLogger(__name__)

SPARK = "▁▂▃▄▅▆▇█"
BADGE_STYLE = {
    "connecting": "dim",
    "unreachable": "bold magenta",
    "stopped": "bold red",
    "idle": "dim",
    "starting": "cyan",
    "running": "bold green",
    "stalled": "bold yellow",
    "finished": "blue",
    "crashed": "bold red",
    "dead": "bold white on red",
}
ROLE_STYLE = {"target": "cyan", "drafter": "magenta"}
UNASSIGNED_STYLE = "grey50"
SEVERITY_STYLE = {
    Severity.INFO: "blue",
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
}
HIDDEN_KINDS = frozenset({"unreachable"})  # the badge already says it

Detect = Callable[[Sequence[Snapshot], Any, float], Sequence[Finding]]


# --- model -------------------------------------------------------------------------------


@dataclass
class TargetView:
    """Everything shown about one target. Mutated by :class:`WatchModel` only."""

    name: str
    roles: dict[int, str] = field(default_factory=dict)
    config: Any = None
    history: collections.deque[Snapshot] = field(
        default_factory=lambda: collections.deque(maxlen=150)
    )
    current: Snapshot | None = None
    last_good: Snapshot | None = None
    unreachable_since: float | None = None
    findings: tuple[Finding, ...] = ()
    state: str = "connecting"
    tokens_per_s: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=60)
    )
    log_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    run_id: str | None = None

    def signature(self) -> tuple[Any, ...]:
        """What counts as a change for ``--plain``: state, run, findings (not every step)."""
        return (
            self.state,
            self.run_id,
            self.unreachable_since,
            tuple(sorted((f.kind, int(f.severity), f.gpus) for f in self.findings)),
        )

    @property
    def shown(self) -> Snapshot | None:
        """The snapshot to draw readings from: the newest one that has data."""
        return self.last_good


class WatchModel:
    """The state of every watched target, fed one snapshot at a time (main thread)."""

    def __init__(self, views: Iterable[TargetView], detect: Detect | None = None) -> None:
        self.views: dict[str, TargetView] = {v.name: v for v in views}
        self.detect = detect
        self.messages: collections.deque[str] = collections.deque(maxlen=3)

    def apply(self, name: str, snap: Snapshot) -> bool:
        """Take in ``snap`` for target ``name``; ``True`` when its :meth:`~TargetView.signature` changed."""
        v = self.views[name]
        before = v.signature()
        v.current = snap
        v.history.append(snap)
        if snap.reachable:
            v.unreachable_since = None
            v.last_good = snap
            if snap.run is not None:
                if snap.run.run_id != v.run_id:
                    v.tokens_per_s.clear()
                    v.log_tail.clear()
                v.run_id = snap.run.run_id
                v.log_tail.extend(snap.run.new_log_lines)
            if snap.metrics is not None and snap.metrics.tokens_per_s is not None:
                v.tokens_per_s.append(snap.metrics.tokens_per_s)
        elif v.unreachable_since is None:
            v.unreachable_since = snap.taken_at
        findings: Sequence[Finding] = ()
        if self.detect is not None:
            try:
                findings = self.detect(list(v.history), v.config, snap.taken_at)
            except Exception as exc:  # noqa: BLE001 - lenient in views: show, carry on
                log.debug("detectors failed for %s", name, exc_info=True)
                self.messages.append(f"{name}: detectors failed: {exc}")
        v.findings = tuple(findings)
        grace = v.config.limits.startup_grace_s if v.config is not None else 120.0
        v.state = target_state(snap, v.findings, startup_grace_s=grace)
        return v.signature() != before


# --- pure rendering ------------------------------------------------------------------------


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their maximum.

    >>> sparkline([0, 5, 10], 3)
    '▁▅█'
    >>> sparkline([], 4)
    ''
    """
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    if top <= 0:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, round(v / top * (len(SPARK) - 1)))] for v in vals)


def level(fraction: float | None) -> str:
    """One block character for a 0..1 fraction (``?`` when unknown).

    >>> level(0.0), level(1.0), level(None)
    ('▁', '█', '?')
    """
    if fraction is None:
        return "?"
    f = min(1.0, max(0.0, fraction))
    return SPARK[round(f * (len(SPARK) - 1))]


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar ``width`` cells long.

    >>> bar(0.5, 10)
    '█████░░░░░'
    """
    if fraction is None:
        return "?" * width
    full = round(min(1.0, max(0.0, fraction)) * width)
    return "█" * full + "░" * (width - full)


def human(value: float | None) -> str:
    """Short number: ``21.5k``, ``950``, ``-`` when unknown.

    >>> human(21500.0), human(950.0), human(None)
    ('21.5k', '950', '-')
    """
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def duration(seconds: float | None) -> str:
    """``42s``, ``12m``, ``3h05m``, ``2d04h``.

    >>> duration(42), duration(720), duration(11100), duration(187200)
    ('42s', '12m', '3h05m', '2d04h')
    """
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(ts: float) -> str:
    """Local ``HH:MM:SS`` of Unix seconds."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def state_text(v: TargetView) -> str:
    """The badge's words: ``unreachable since HH:MM:SS`` for a lost connection."""
    if v.state == "unreachable" and v.unreachable_since is not None:
        return f"unreachable since {clock(v.unreachable_since)}"
    return v.state


def _role_style(v: TargetView, gpu: int) -> str:
    return ROLE_STYLE.get(v.roles.get(gpu, ""), UNASSIGNED_STYLE)


def _mem_fraction(g: GpuSample) -> float | None:
    if g.memory_used_mib is None or not g.memory_total_mib:
        return None
    return g.memory_used_mib / g.memory_total_mib


def _util_fraction(g: GpuSample) -> float | None:
    return None if g.utilization_pct is None else g.utilization_pct / 100.0


def _visible_findings(v: TargetView) -> list[Finding]:
    return sorted(
        (f for f in v.findings if f.kind not in HIDDEN_KINDS),
        key=lambda f: (-f.severity, f.kind),
    )


def _finding_line(f: Finding, titles: Mapping[str, str], indent: str) -> Text:
    t = Text(indent)
    t.append(f"{str(f.severity).upper():8}", style=SEVERITY_STYLE.get(f.severity, ""))
    t.append(f" {f.kind}")
    if f.gpus:
        t.append(f" GPU {','.join(map(str, f.gpus))}")
    title = titles.get(f.playbook or "", f.playbook or "")
    t.append(f" - {title or f.summary}", style="italic")
    return t


def target_lines(
    v: TargetView,
    *,
    now: float,
    width: int,
    titles: Mapping[str, str],
    selected: bool = False,
    max_findings: int = 2,
) -> list[Text]:
    """The dashboard row of one target: a status line, a GPU line, its findings."""
    name_w = max(6, min(14, len(v.name)))
    head = Text("▶ " if selected else "  ", style="bold")
    head.append(f"{v.name[:name_w]:<{name_w}} ", style="bold")
    head.append(f" {state_text(v)} ", style=BADGE_STYLE.get(v.state, ""))
    snap = v.shown
    run = snap.run if snap is not None else None
    if run is not None:
        head.append(f" {run.run_id}")
        started = run.manifest.started_at if run.manifest is not None else None
        if started is not None and snap is not None:
            head.append(f" {duration(snap.taken_at - started)}", style="dim")
    m = snap.metrics if snap is not None else None
    if m is not None and m.step is not None:
        head.append(f"  step {m.step}")
    if v.tokens_per_s:
        head.append(f"  {human(v.tokens_per_s[-1])} tok/s ")
        head.append(sparkline(v.tokens_per_s, 12), style="green")
    if m is not None and m.tau is not None:  # acceptance length of real draft-and-verify
        head.append(f"  τ {m.tau:.2f}")
    head.no_wrap, head.overflow = True, "ellipsis"
    out = [head]

    if snap is not None and snap.gpus:
        gl = Text("    util ", style="dim")
        for g in snap.gpus:
            gl.append(level(_util_fraction(g)), style=_role_style(v, g.index))
        gl.append("  mem ", style="dim")
        for g in snap.gpus:
            gl.append(level(_mem_fraction(g)), style=_role_style(v, g.index))
        if width >= 100:
            used = sum(g.memory_used_mib or 0 for g in snap.gpus)
            gl.append(f"  {used / 1024:.0f} GiB used", style="dim")
        if v.state == "unreachable":
            gl.append("  (stale)", style="dim")
        gl.no_wrap, gl.overflow = True, "ellipsis"
        out.append(gl)
    elif snap is not None and snap.nvml is not None and not snap.nvml.ok:
        out.append(Text(f"    NVML: {snap.nvml.error_kind or snap.nvml.message}", style="yellow"))

    shown = _visible_findings(v)
    for f in shown[:max_findings]:
        line = _finding_line(f, titles, "    ")
        line.no_wrap, line.overflow = True, "ellipsis"
        out.append(line)
    if len(shown) > max_findings:
        out.append(Text(f"    +{len(shown) - max_findings} more (Enter for detail)", style="dim"))
    return out


def _header(title: str, now: float, hint: str) -> Text:
    t = Text(f"orch watch  {title}  {clock(now)}", style="bold reverse")
    t.append(f"  {hint}", style="reverse")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def render_dashboard(
    model: WatchModel,
    *,
    now: float,
    width: int = 80,
    height: int = 24,
    selected: int = 0,
    titles: Mapping[str, str] | None = None,
) -> RenderableType:
    """Every target, fitted into ``width`` x ``height`` (a ``+N more`` line when it does not fit)."""
    titles = titles or {}
    views = list(model.views.values())
    n = len(views)
    lines: list[Text] = [
        _header(f"{n} target{'s' if n != 1 else ''}", now, "q quit  ↑↓ select  ⏎ detail"),
        Text(""),
    ]
    budget = max(3, height - len(lines) - 1 - len(model.messages))
    used = 0
    for i, v in enumerate(views):
        block = target_lines(v, now=now, width=width, titles=titles, selected=i == selected)
        if used + len(block) > budget and i > 0:
            lines.append(Text(f"  +{n - i} more targets (make the terminal taller)", style="dim"))
            break
        lines.extend(block[: max(1, budget - used)])
        used += len(block)
    lines.extend(Text(m, style="dim yellow") for m in model.messages)
    return Group(*lines)


def render_detail(
    v: TargetView,
    *,
    now: float,
    width: int = 80,
    height: int = 24,
    titles: Mapping[str, str] | None = None,
    messages: Sequence[str] = (),
) -> RenderableType:
    """One target: its row, one line per GPU, findings with evidence, and the pane or log tail."""
    titles = titles or {}
    lines: list[Text] = [_header(v.name, now, "q quit  esc back"), Text("")]
    lines.extend(target_lines(v, now=now, width=width, titles=titles, max_findings=0)[:1])
    snap = v.shown
    bar_w = 10 if width < 100 else 20
    if snap is not None:
        for g in snap.gpus:
            role = v.roles.get(g.index, "-")
            t = Text(f"  GPU {g.index:<2} {role[:9]:<9} ")
            style = _role_style(v, g.index)
            t.append(bar(_util_fraction(g), bar_w), style=style)
            util = "?" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
            t.append(f" {util:>4}  ")
            t.append(bar(_mem_fraction(g), bar_w), style=style)
            used = "?" if g.memory_used_mib is None else f"{g.memory_used_mib / 1024:.1f}"
            total = "?" if g.memory_total_mib is None else f"{g.memory_total_mib / 1024:.0f}"
            t.append(f" {used}/{total}G")
            if width >= 90 and g.temperature_c is not None:
                t.append(f" {g.temperature_c:.0f}C")
            if width >= 90 and g.power_w is not None:
                t.append(f" {g.power_w:.0f}W")
            if g.error:
                t.append(f" {g.error}", style="bold red")
            t.no_wrap, t.overflow = True, "ellipsis"
            lines.append(t)
    for f in _visible_findings(v):
        lines.append(_finding_line(f, titles, "  "))
        summary = Text(f"      {f.summary}")
        summary.no_wrap, summary.overflow = True, "ellipsis"
        lines.append(summary)
        for ev in f.evidence[:4]:
            e = Text(f"      > {ev}", style="dim")
            e.no_wrap, e.overflow = True, "ellipsis"
            lines.append(e)
    tail = _tail(v)
    room = height - len(lines) - 2 - len(messages)
    if tail and room > 0:
        lines.append(Text("  --- pane / log tail ---", style="dim"))
        for raw in tail[-room:]:
            t = Text(f"  {raw}")
            t.no_wrap, t.overflow = True, "ellipsis"
            lines.append(t)
    lines.extend(Text(m, style="dim yellow") for m in messages)
    return Group(*lines[: max(1, height)])


def _tail(v: TargetView) -> list[str]:
    snap = v.shown
    if snap is not None and snap.session is not None and snap.session.pane_tail:
        return [line for line in snap.session.pane_tail if line.strip()] or list(v.log_tail)
    return list(v.log_tail)


def plain_line(v: TargetView, *, now: float, titles: Mapping[str, str] | None = None) -> str:
    """One line for ``--plain`` (and non-TTY output).

    >>> v = TargetView("ct200", state="crashed", run_id="r1")
    >>> plain_line(v, now=0.0)[9:]
    'ct200 crashed run=r1'
    """
    titles = titles or {}
    parts = [clock(now), v.name, state_text(v)]
    if v.run_id:
        parts.append(f"run={v.run_id}")
    snap = v.shown
    m = snap.metrics if snap is not None else None
    if m is not None and m.step is not None:
        parts.append(f"step={m.step}")
    if v.tokens_per_s:
        parts.append(f"tok/s={human(v.tokens_per_s[-1])}")
    if m is not None and m.tau is not None:
        parts.append(f"tau={m.tau:.2f}")
    for f in _visible_findings(v):
        gpus = f"[GPU {','.join(map(str, f.gpus))}]" if f.gpus else ""
        title = titles.get(f.playbook or "", "")
        parts.append(f"{f.severity.name}:{f.kind}{gpus}" + (f"({title})" if title else ""))
    return " ".join(parts)


# --- I/O: stream pumps, keys, the loop -------------------------------------------------------


def pump(
    name: str,
    open_stream: Callable[[], Iterable[Snapshot]],
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    *,
    max_backoff_s: float = 15.0,
) -> None:
    """Feed ``out`` with ``(name, Snapshot)`` until ``stop`` is set; reconnect with backoff."""

    def attempt() -> None:
        for snap in open_stream():
            out.put((name, snap))
            if stop.is_set():
                return
        if not stop.is_set():
            raise ConnectionError("stream ended")

    def report(rs: tenacity.RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        reason = (str(exc) or type(exc).__name__) if exc else "stream ended"
        out.put((name, Snapshot.unreachable(name, time.time(), reason.splitlines()[0][:200])))

    def nap(seconds: float) -> None:
        stop.wait(seconds)  # wakes at once when told to stop

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(Exception),
        wait=tenacity.wait_exponential(multiplier=0.5, max=max_backoff_s),
        stop=lambda rs: stop.is_set(),
        sleep=nap,
        before_sleep=report,
        reraise=False,
    )
    with contextlib.suppress(tenacity.RetryError):
        retrying(attempt)


@contextlib.contextmanager
def _cbreak(fd: int | None) -> Iterator[None]:
    """Single-key input without echo; ISIG stays on so Ctrl-C still interrupts."""
    if fd is None:
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _keys(fd: int, out: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        data = os.read(fd, 32)
        if not data:
            return
        for key in parse_keys(data.decode("utf-8", "replace")):
            out.put(("", ("key", key)))


_ARROWS = {"\x1b[A": "up", "\x1b[B": "down", "\x1bOA": "up", "\x1bOB": "down"}


def parse_keys(text: str) -> list[str]:
    r"""Split one read from the terminal into keys (several may arrive together).

    >>> parse_keys("\x1b[Aj\r\x1b")
    ['up', 'j', '\r', '\x1b']
    """
    keys = []
    i = 0
    while i < len(text):
        seq = next((s for s in _ARROWS if text.startswith(s, i)), None)
        if seq is not None:
            keys.append(_ARROWS[seq])
            i += len(seq)
        elif text.startswith("\x1b[", i) and i + 2 < len(text):
            i += 3  # another CSI key (right, left...): ignored
        else:
            keys.append(text[i])
            i += 1
    return keys


class _RingHandler(logging.Handler):
    """Log records into the model's message line instead of over the full-screen view."""

    def __init__(self, sink: collections.deque[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.levelname.lower()}: {record.getMessage()}"[:200])


def default_detect(history: Sequence[Snapshot], cfg: Any, now: float) -> Sequence[Finding]:
    from orchestrator.detect.engine import run_detectors

    if cfg is None:
        return run_detectors(history, limits=_default_limits(), now=now)
    return run_detectors(history, limits=cfg.limits, roles=roles_by_gpu(cfg.gpus), now=now)


def _default_limits() -> Any:
    from orchestrator.detect.limits import Limits

    return Limits()


def watch(
    inventory: Any,
    names: Sequence[str],
    *,
    interval_s: float = 2.0,
    plain: bool = False,
    console: Console | None = None,
    stream_factory: Callable[[str], Callable[[], Iterable[Snapshot]]] | None = None,
    detect: Detect | None = default_detect,
    stop: threading.Event | None = None,
) -> int:
    """Run the dashboard (or plain lines) until ``q``, Ctrl-C or ``stop``; returns 0.

    ``stream_factory(name)`` returns a zero-argument callable opening a snapshot
    stream (default: ``Target(inventory, name).stream(interval_s)``).
    """
    from orchestrator.views.check import playbook_titles, select_targets

    detail = names[0] if len(names) == 1 else None  # `orch watch lxc200`: the detail view
    names = select_targets(inventory, names)
    if not names:
        from orchestrator.errors import UsageError

        raise UsageError("no targets to watch: add containers to hosts.yaml or name one")
    console = console or Console()
    stop = stop or threading.Event()
    targets: dict[str, Any] = {}

    def default_factory(name: str) -> Callable[[], Iterable[Snapshot]]:
        def open_stream() -> Iterable[Snapshot]:
            from orchestrator.target import Target

            t = targets[name] = Target(inventory, name)
            return t.stream(interval_s)

        return open_stream

    factory = stream_factory or default_factory
    views = []
    for n in names:
        cfg = inventory.container(n)
        views.append(TargetView(n, roles=roles_by_gpu(cfg.gpus), config=cfg))
    model = WatchModel(views, detect)
    titles = playbook_titles()
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    for n in names:
        threading.Thread(
            target=pump, args=(n, factory(n), events, stop), name=f"watch-{n}", daemon=True
        ).start()

    interactive = not plain and console.is_terminal
    try:
        if interactive:
            _run_live(model, events, stop, console, titles, detail=detail)
        else:
            _run_plain(model, events, stop, titles)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        _close_all(targets.values())
    return 0


def _run_plain(
    model: WatchModel,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    titles: Mapping[str, str],
) -> None:
    while not stop.is_set():
        try:
            name, snap = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if not name:
            continue
        if model.apply(name, snap):
            print(plain_line(model.views[name], now=time.time(), titles=titles), flush=True)


def _run_live(
    model: WatchModel,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    console: Console,
    titles: Mapping[str, str],
    detail: str | None,
) -> None:
    from rich.live import Live

    fd: int | None = None
    try:
        if sys.stdin.isatty():
            fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        fd = None
    if fd is not None:
        threading.Thread(
            target=_keys, args=(fd, events, stop), name="watch-keys", daemon=True
        ).start()

    root = logging.getLogger()
    handlers = [h for h in root.handlers if isinstance(h, logging.StreamHandler)]
    ring = _RingHandler(model.messages)
    for h in handlers:
        root.removeHandler(h)
    root.addHandler(ring)
    names = list(model.views)
    selected = 0

    def frame() -> RenderableType:
        w, h = console.size
        now = time.time()
        if detail is not None:
            return render_detail(
                model.views[detail],
                now=now,
                width=w,
                height=h,
                titles=titles,
                messages=list(model.messages),
            )
        return render_dashboard(model, now=now, width=w, height=h, selected=selected, titles=titles)

    try:
        with (
            _cbreak(fd),
            Live(
                frame(),
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            last_draw = 0.0
            while not stop.is_set():
                dirty = False
                try:
                    name, item = events.get(timeout=0.25)
                    while True:
                        if name:
                            model.apply(name, item)
                            dirty = True
                        else:
                            key = item[1]
                            if key in ("q", "Q"):
                                return
                            if key in ("down", "j"):
                                selected = min(len(names) - 1, selected + 1)
                            elif key in ("up", "k"):
                                selected = max(0, selected - 1)
                            elif key in ("\r", "\n") and detail is None:
                                detail = names[selected]
                            elif key in ("\x1b", "b") and len(names) > 1:
                                detail = None
                            dirty = True
                        name, item = events.get_nowait()
                except queue.Empty:
                    pass
                if dirty or time.monotonic() - last_draw >= 1.0:
                    live.update(frame(), refresh=True)
                    last_draw = time.monotonic()
    finally:
        root.removeHandler(ring)
        for h in handlers:
            root.addHandler(h)


def _close_all(targets: Iterable[Any]) -> None:
    """Close transports in the background: a dead peer must not hold up the exit."""

    def close() -> None:
        for t in list(targets):
            with contextlib.suppress(Exception):
                t.close()

    th = threading.Thread(target=close, name="watch-close", daemon=True)
    th.start()
    th.join(timeout=2.0)
