"""``orch watch``'s screen: the rich Live dashboard (or one line per change), fed from one queue.

Three layers, kept apart:

- **observations** (:class:`~orchestrator.monitor.observer.Observer`, started by
  :mod:`orchestrator.commands.watching`): each target judged as its snapshots come, each
  host's own findings, the restart journal, the keys, onto one queue.
- **model** (:class:`~orchestrator.views.watch_model.WatchModel`, main thread only): what the
  screen needs of each judgement.
- **rendering** (:mod:`orchestrator.views.watch`, pure): model + clock + size -> renderable
  or text line.

Keys (TTY only): ``q`` quits, up/down or ``j``/``k`` select, Enter opens the
detail of the selected target, Esc or ``b`` goes back. Ctrl-C quits cleanly too;
the terminal (alternate screen, cbreak mode) is restored on every exit path.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from rich.console import Console, RenderableType

from orchestrator.monitor.hostpath import HostView
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.streams import JOURNAL
from orchestrator.views.watch import (
    job_plain_line,
    plain_gpu_lines,
    plain_host_line,
    plain_line,
    render_dashboard,
    render_detail,
)
from orchestrator.views.watch_model import WatchModel

KEY = ""
"""The queue's name for a key press: the item is ``("key", key)``."""


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


def _apply(model: WatchModel, name: str, item: Any) -> bool:
    """Take in one queued item (a target's judgement or snapshot, a host's view, a journal
    update)."""
    if name == JOURNAL:
        return model.apply_journal(*item)
    if isinstance(item, HostView):
        return model.apply_host(item)
    if isinstance(item, Judgement):
        return model.apply(name, item.snapshot, judged=item)
    return model.apply(name, item)


def run_plain(
    model: WatchModel,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    titles: Mapping[str, str],
) -> None:
    """One line per change until ``stop`` is set."""
    shown: dict[str, tuple[Any, ...]] = {}
    while not stop.is_set():
        try:
            name, snap = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if name == KEY:
            continue
        changed = _apply(model, name, snap)
        if name != JOURNAL and not isinstance(snap, HostView):
            for line in plain_gpu_lines(model.views[name], now=time.time()):
                print(line, flush=True)  # a GPU's numbers changed, whatever else did
        if not changed:
            continue
        if isinstance(snap, HostView):
            print(
                plain_host_line(model.hosts[snap.host], now=time.time(), titles=titles), flush=True
            )
            continue
        target = snap[0] if name == JOURNAL else name
        print(plain_line(model.views[target], now=time.time(), titles=titles), flush=True)
        for jj in model.job_rows():  # a job's line when its state or findings change
            if len(jj.nodes) < len(model.views) and any(
                model.views[n].current is None for n in _job_nodes(model, jj.name)
            ):
                continue
            sig = (jj.state, tuple(f.summary for f in jj.findings))
            if shown.get(jj.name) != sig:
                shown[jj.name] = sig
                print(job_plain_line(jj, now=time.time()), flush=True)


def _job_nodes(model: WatchModel, name: str) -> list[str]:
    return next((list(j.containers) for j in model.jobs if j.name == name), [])


def run_live(
    model: WatchModel,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    console: Console,
    titles: Mapping[str, str],
    detail: str | None,
    fd: int | None = None,
) -> None:
    """The full-screen view until ``q`` or ``stop``; ``fd``: the terminal whose keys arrive on
    ``events`` (cbreak mode while the view lasts)."""
    from rich.live import Live

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
                        if name != KEY:
                            _apply(model, name, item)
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
                            elif key in ("\x1b", "b"):
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
