"""Getting observations: one-shot snapshots of many targets at once, and one endless stream per
target with ONE reconnect policy.

- :func:`gather` runs one-shot jobs (a target's snapshot, a host's probe) concurrently under
  one deadline; :func:`snapshot_all` turns every failure into an unreachable marker.
- :func:`reconnecting` keeps a stream going: while a connection cannot be had it yields
  ``Snapshot.unreachable`` (or the container-down snapshot pct's answer gives) once per
  attempt and waits tenacity's exponential schedule, 0.5 s, 1 s, 2 s... up to
  :data:`BACKOFF_CAP_S`; a connection that brought data starts the schedule over.
  :func:`stream` is that over ``Target.stream_once``; :func:`pump` feeds a queue from it
  (``orch watch``: one daemon thread per target).

An unreachable target tells nothing about its run: the markers are data for the detectors
(``unreachable``), never a death.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import tenacity

from orchestrator.config.inventory import Inventory
from orchestrator.remote.target import StreamLost, Target
from orchestrator.wire.model import Snapshot

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
"""The first wait before a reconnect (seconds); each failure in a row doubles it."""
BACKOFF_CAP_S = 30.0
"""The longest wait between reconnects (seconds)."""
DEFAULT_JOBS = 32
"""Targets asked at once by a one-shot round."""

Connect = Callable[[], Iterable[Snapshot]]
"""Opens ONE connection and iterates its snapshots; raises (``StreamLost``...) when it is over."""
T = TypeVar("T")


def reconnect_wait(failures: int, cap_s: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row (tenacity's exponential wait).

    >>> [reconnect_wait(n, cap_s=4.0) for n in (1, 2, 3, 4, 5)]
    [0.5, 1.0, 2.0, 4.0, 4.0]
    """
    policy = tenacity.wait_exponential(multiplier=BACKOFF_START_S, max=cap_s)
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = max(1, failures)
    return float(policy(state))


def failure_reason(value: object) -> str:
    """One line saying why a job gave no snapshot (its exception's first line, at most 300
    characters).

    >>> failure_reason(TimeoutError("no answer within 30 s")), failure_reason(3)
    ('no answer within 30 s', 'unexpected answer int')
    """
    if isinstance(value, BaseException):
        text = str(value) or type(value).__name__
        return text.splitlines()[0][:300]
    return f"unexpected answer {type(value).__name__}"


def reconnecting(
    name: str,
    connect: Callable[[], Iterable[T]],
    *,
    backoff_cap_s: float = BACKOFF_CAP_S,
    sleep: Callable[[float], Any] = time.sleep,
    stop: threading.Event | None = None,
) -> Generator[T | Snapshot, None, None]:
    """Snapshots (or a host's documents) of ``connect()``'s connections, forever (until ``stop``
    is set).

    When a connection is over, the gap's marker is yielded (``StreamLost.marker``, or
    ``Snapshot.unreachable`` naming any other exception: lenient, a view must carry on),
    then the wait of :func:`reconnect_wait`; ``sleep`` may be ``stop.wait`` so that stopping
    wakes it at once. Closing the iterator closes the current connection.
    """
    failures = 0
    while stop is None or not stop.is_set():
        got = False
        try:
            for snap in connect():
                got = True
                yield snap
            marker = Snapshot.unreachable(name, time.time(), "stream ended")
        except StreamLost as exc:
            marker = exc.marker
        except Exception as exc:
            log.debug("%s: stream failed", name, exc_info=True)
            marker = Snapshot.unreachable(name, time.time(), failure_reason(exc))
        failures = 1 if got else failures + 1
        wait = reconnect_wait(failures, backoff_cap_s)
        log.info("%s: %s; retrying in %.1f s", name, "; ".join(marker.errors), wait)
        yield marker
        if stop is not None and stop.is_set():
            return
        sleep(wait)


def stream(
    target: Target,
    interval_s: float | None = None,
    *,
    backoff_cap_s: float = BACKOFF_CAP_S,
    stall_s: float | None = None,
    stop: threading.Event | None = None,
) -> Generator[Snapshot, None, None]:
    """``target``'s snapshots every ``interval_s`` (default its ``poll_interval_s``), forever,
    over :meth:`Target.stream_once` reconnected by :func:`reconnecting`; each connection
    resumes the log where the last one stopped."""

    def connect() -> Iterable[Snapshot]:
        return target.stream_once(interval_s, stall_s=stall_s)

    sleep: Callable[[float], Any] = stop.wait if stop is not None else time.sleep
    return reconnecting(target.name, connect, backoff_cap_s=backoff_cap_s, sleep=sleep, stop=stop)


def pump(
    name: str,
    connect: Connect,
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    *,
    backoff_cap_s: float = BACKOFF_CAP_S,
) -> None:
    """Put ``(name, Snapshot)`` on ``out`` until ``stop`` is set (a thread's body)."""
    snaps: Generator[Snapshot, None, None] = reconnecting(
        name, connect, backoff_cap_s=backoff_cap_s, sleep=stop.wait, stop=stop
    )
    try:
        for snap in snaps:
            if stop.is_set():
                return
            out.put((name, snap))
    finally:
        snaps.close()


def gather(
    jobs: Mapping[str, Callable[[], Any]],
    *,
    workers: int = DEFAULT_JOBS,
    timeout_s: float = 30.0,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Call every job concurrently; a job's value, or the exception it raised (or a TimeoutError).

    At most ``workers`` run at once (``workers=1`` is strictly sequential, the
    benchmark's baseline). A job still running after ``timeout_s`` seconds from
    the start gets a ``TimeoutError`` result; its thread is abandoned (each
    transport call has its own deadline, so it ends on its own) and jobs not yet
    started never start. The workers are daemon threads, not a
    ``ThreadPoolExecutor``'s: the executor's exit hook joins every worker, so an
    abandoned call held ``orch check``'s exit, and a Ctrl-C of ``orch watch``,
    until its own deadline. ``meanwhile`` runs in the calling thread once every
    job is handed out (work that needs no answer, done while the answers travel);
    what it raises propagates.
    """
    results: dict[str, Any] = {}
    if not jobs:
        if meanwhile is not None:
            meanwhile()
        return results
    deadline = time.monotonic() + timeout_s
    todo: queue.SimpleQueue[tuple[str, Callable[[], Any]]] = queue.SimpleQueue()
    for item in jobs.items():
        todo.put(item)
    answered = threading.Condition()
    expired = threading.Event()

    def work() -> None:
        while not expired.is_set():
            try:
                name, fn = todo.get_nowait()
            except queue.Empty:
                return
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001 - the job's failure is its result
                value = exc
            with answered:
                results[name] = value
                answered.notify()

    for i in range(max(1, min(workers, len(jobs)))):
        threading.Thread(target=work, name=f"orch-gather-{i}", daemon=True).start()
    try:
        if meanwhile is not None:
            meanwhile()
        with answered:
            while len(results) < len(jobs) and (left := deadline - time.monotonic()) > 0:
                answered.wait(left)
            got = dict(results)
    finally:
        expired.set()
    return {
        name: got[name] if name in got else TimeoutError(f"no answer within {timeout_s:g} s")
        for name in jobs
    }


def as_snapshot(name: str, value: object, at: float) -> Snapshot:
    """A job's answer as a snapshot: itself, or the unreachable marker naming the failure."""
    if isinstance(value, Snapshot):
        return value
    log.info("%s: snapshot failed: %s", name, value)
    return Snapshot.unreachable(name, at, failure_reason(value))


def select_targets(inventory: Inventory, names: Sequence[str]) -> list[str]:
    """The named containers (each validated; a job's name stands for its nodes), else every
    container but the built-in ``local``."""
    if names:
        out: list[str] = []
        for n in names:
            if n in inventory.jobs:
                out.extend(inventory.jobs[n].containers)
                continue
            inventory.container(n)  # raises UsageError naming the known ones
            out.append(n)
        return list(dict.fromkeys(out))
    return [n for n in inventory.containers if n != "local"]


def select_jobs(inventory: Inventory, names: Sequence[str]) -> list[str]:
    """The jobs shown as one row each: those named, else every job (with no names)."""
    if names:
        return [n for n in dict.fromkeys(names) if n in inventory.jobs]
    return list(inventory.jobs)
