"""``orch watch``: a live dashboard of every target (rich Live), or one line per change.

Three layers, kept apart:

- **observations** (the monitor's :func:`~orchestrator.monitor.observe.pump`, one daemon
  thread per target): each target's stream, reconnected with the one reconnect policy,
  ``Snapshot.unreachable`` markers while down, onto one queue.
- **model** (:class:`~orchestrator.views.watch_model.WatchModel`, main thread only): the
  monitor's judgement per snapshot plus what only the screen needs.
- **rendering** (:mod:`orchestrator.views.watch`, pure): model + clock + size -> renderable
  or text line.

A fourth daemon thread reads the restart journal (``orch supervise``'s decisions, in the
history database) every :data:`JOURNAL_POLL_S` and hands what is new to the model.

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
from typing import Any

from rich.console import Console, RenderableType

from orchestrator.config.inventory import Inventory
from orchestrator.monitor.history import read_journal
from orchestrator.monitor.hostpath import HOST_PREFIX, HostFeed, HostView, pump_host
from orchestrator.monitor.observe import Connect, pump, select_jobs, select_targets
from orchestrator.monitor.sweep import playbook_titles
from orchestrator.remote.target import Target
from orchestrator.views.watch import (
    job_plain_line,
    plain_host_line,
    plain_line,
    render_dashboard,
    render_detail,
)
from orchestrator.views.watch_model import Judge, TargetView, WatchModel
from orchestrator.wire.model import Snapshot

JOURNAL = "\x00journal"
"""The queue's name for a restart-journal update: the item is ``(target, entries)``."""
JOURNAL_POLL_S = 2.0


def _journal_pump(
    names: Sequence[str],
    db: Any,
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    inventory: Inventory | None = None,
) -> None:
    """Put ``(JOURNAL, (name, entries))`` whenever a target's restart journal changed."""
    seen: dict[str, int | None] = {}
    while not stop.is_set():
        for name, entries in read_journal(names, db, limit=5, inventory=inventory).items():
            last = entries[-1].id if entries else None
            if seen.get(name, -1) != last:
                seen[name] = last
                out.put((JOURNAL, (name, entries)))
        stop.wait(JOURNAL_POLL_S)


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


def watch(
    inventory: Inventory,
    names: Sequence[str],
    *,
    interval_s: float = 2.0,
    plain: bool = False,
    console: Console | None = None,
    stream_factory: Callable[[str], Connect] | None = None,
    judge: Judge | None = None,
    stop: threading.Event | None = None,
    db: Any = None,
) -> int:
    """Run the dashboard (or plain lines) until ``q``, Ctrl-C or ``stop``; returns 0.

    ``stream_factory(name)`` returns a zero-argument callable opening ONE connection's
    snapshot stream (default: ``Target(inventory, name).stream_once(interval_s)``, one Target
    per name so each connection resumes the log); the monitor's pump reconnects it. Without
    one, the containers of a host observed from the host share ONE stream per host
    (:func:`~orchestrator.monitor.hostpath.pump_host`), whose host-wide events show too.
    ``db``: the history database whose restart journal is shown (default: ``$ORCH_DB`` or
    the usual).
    """
    jobs = [inventory.job(j) for j in select_jobs(inventory, names)]
    # `orch watch lxc200`: the detail view; a job's name shows the job and its nodes
    detail = names[0] if len(names) == 1 and not jobs else None
    names = select_targets(inventory, names)
    first = [n for j in jobs for n in j.containers]  # a job's nodes together, in rank order
    names = [n for n in first if n in names] + [n for n in names if n not in first]
    if not names:
        from orchestrator.errors import UsageError

        raise UsageError("no targets to watch: add containers to hosts.yaml or name one")
    console = console or Console()
    stop = stop or threading.Event()
    targets: dict[str, Any] = {}

    def default_factory(name: str) -> Connect:
        t = targets[name] = Target(inventory, name)

        def connect() -> Iterable[Snapshot]:
            return t.stream_once(interval_s)

        return connect

    factory = stream_factory or default_factory
    views = []
    for n in names:
        cfg = inventory.container(n)
        views.append(TargetView(n, roles=cfg.roles_by_gpu, config=cfg))
    model = WatchModel(views, judge, jobs) if judge is not None else WatchModel(views, jobs=jobs)
    titles = playbook_titles()
    events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def inside(group: Sequence[str]) -> None:
        for n in group:
            threading.Thread(
                target=pump, args=(n, factory(n), events, stop), name=f"watch-{n}", daemon=True
            ).start()

    on_host = (start_host_streams(inventory, names, interval_s, events, stop, targets, inside)
               if stream_factory is None else set())  # fmt: skip
    inside([n for n in names if n not in on_host])
    threading.Thread(target=_journal_pump, args=(names, db, events, stop, inventory), name="watch-journal",
                     daemon=True).start()  # fmt: skip

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


def start_host_streams(
    inventory: Inventory,
    names: Sequence[str],
    interval_s: float,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    targets: dict[str, Any],
    inside: Callable[[Sequence[str]], None],
) -> set[str]:
    """One stream per host for its containers observed from the host; their names. A host
    that cannot run the observer hands its containers to ``inside`` (one stream each)."""
    from orchestrator.remote.hostlink import HostLink, host_groups

    on_host: set[str] = set()
    for host, group in host_groups(inventory, names).items():
        link = HostLink(inventory, host, group)

        def pane(name: str) -> Snapshot:
            t = targets.get(name) or targets.setdefault(name, Target(inventory, name))
            return t.snapshot()

        def connect(link: HostLink = link) -> Iterable[Any]:
            return link.stream_once(interval_s)

        feed = HostFeed(inventory, host, group, pane=pane, fallback=inside)
        threading.Thread(target=pump_host, args=(feed, connect, events, stop),
                         name=f"watch-host-{host}", daemon=True).start()  # fmt: skip
        on_host.update(group)
    return on_host


def _apply(model: WatchModel, name: str, item: Any) -> bool:
    """Take in one queued item (a target's snapshot, a host's view, a journal update)."""
    if name == JOURNAL:
        return model.apply_journal(*item)
    if name.startswith(HOST_PREFIX) and isinstance(item, HostView):
        return model.apply_host(item)
    return model.apply(name, item)


def _run_plain(
    model: WatchModel,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    titles: Mapping[str, str],
) -> None:
    shown: dict[str, tuple[Any, ...]] = {}
    while not stop.is_set():
        try:
            name, snap = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if not name or not _apply(model, name, snap):
            continue
        if isinstance(snap, HostView):
            print(plain_host_line(model.hosts[snap.host], now=time.time(), titles=titles),
                  flush=True)  # fmt: skip
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


def _close_all(targets: Iterable[Any]) -> None:
    """Close transports in the background: a dead peer must not hold up the exit."""

    def close() -> None:
        for t in list(targets):
            with contextlib.suppress(Exception):
                t.close()

    th = threading.Thread(target=close, name="watch-close", daemon=True)
    th.start()
    th.join(timeout=2.0)
