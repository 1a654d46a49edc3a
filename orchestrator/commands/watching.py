"""``orch watch``: the observer's streams, the restart journal and the keys onto one queue, and
the screen of :mod:`orchestrator.views.watch_loop` reading it (the only threads of watch are
started here and in the monitor, none in ``views/``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console

from orchestrator.config.inventory import Inventory
from orchestrator.monitor.observe import Connect, select_jobs, select_targets
from orchestrator.monitor.observer import Observer
from orchestrator.monitor.streams import follow_journal
from orchestrator.monitor.sweep import playbook_titles
from orchestrator.views.watch_loop import KEY, parse_keys, run_live, run_plain
from orchestrator.views.watch_model import TargetView, WatchModel
from orchestrator.wire.model import Snapshot


def watch(
    inventory: Inventory,
    names: Sequence[str],
    *,
    interval_s: float | None = None,
    plain: bool = False,
    console: Console | None = None,
    stream_factory: Callable[[str], Connect] | None = None,
    stop: threading.Event | None = None,
    db: Any = None,
) -> int:
    """Run the dashboard (or plain lines) until ``q``, Ctrl-C or ``stop``; returns 0.

    ``interval_s``: seconds between snapshots (``None``: each container's ``poll_interval:``
    of hosts.yaml). ``stream_factory(name)`` returns a zero-argument callable opening ONE
    connection's snapshot stream (every target then streams from inside through it); the
    monitor reconnects it. ``db``: the history database whose restart journal is shown
    (default: ``$ORCH_DB`` or the usual).
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
    views = [
        TargetView(n, roles=c.roles_by_gpu, config=c)
        for n in names
        if (c := inventory.container(n))
    ]
    model = WatchModel(views, jobs=jobs)
    titles = playbook_titles()
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    Observer(inventory, names, connect=stream_factory).start(events, stop, interval_s=interval_s)
    follow_journal(names, db, events, stop, inventory)
    try:
        if not plain and console.is_terminal:
            fd = read_keys(events, stop)
            run_live(model, events, stop, console, titles, detail=detail, fd=fd)
        else:
            run_plain(model, events, stop, titles)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
    return 0


def read_keys(out: queue.Queue[tuple[str, Any]], stop: threading.Event) -> int | None:
    """Put ``(KEY, ("key", key))`` for every key pressed on stdin (a daemon thread) until
    ``stop`` is set; stdin's descriptor, or ``None`` when it is not a terminal."""
    try:
        if not sys.stdin.isatty():
            return None
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return None

    def loop() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(fd, 32)
            if not data:
                return
            for key in parse_keys(data.decode("utf-8", "replace")):
                out.put((KEY, ("key", key)))

    threading.Thread(target=loop, name="watch-keys", daemon=True).start()
    return fd


def watch_for(
    inventory: Inventory,
    name: str,
    *,
    seconds: float,
    on_snapshot: Callable[[Snapshot], bool],
    console: Console,
    interval_s: float,
    show_after_s: float,
) -> None:
    """``orch watch NAME`` for ``seconds`` (plain lines when not a terminal), for the demo.

    Every snapshot goes to ``on_snapshot`` first; once it answers True the view stays
    ``show_after_s`` longer and ends.
    """
    from orchestrator.remote.target import Target

    stop = threading.Event()
    streams: list[Any] = []

    def factory(n: str) -> Callable[[], Iterator[Snapshot]]:
        target = Target(inventory, n)

        def open_stream() -> Iterator[Snapshot]:
            inner = target.stream_once(interval_s)
            streams.append(inner)
            for snap in inner:
                if on_snapshot(snap) and not stop.is_set():
                    threading.Timer(show_after_s, stop.set).start()
                yield snap

        return open_stream

    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    try:
        watch(
            inventory,
            [name],
            interval_s=interval_s,
            plain=not console.is_terminal,
            console=console,
            stream_factory=factory,
            stop=stop,
        )
    finally:
        stop.set()
        timer.cancel()
        for s in streams:  # closes the remote `agent stream` at once
            with contextlib.suppress(ValueError):  # still running in the pump thread
                s.close()
