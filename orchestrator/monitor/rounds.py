"""One round of one-shot observations (``orch check``, each poll of ``orch export``): every
target not streamed, at once, under one deadline (:func:`~orchestrator.monitor.observe.gather`).

Containers observed from their host take one ``host-observe`` per host, the others one
in-container snapshot each, plus (when asked: ``probe_since``) one kernel-log probe of each
host of an in-container target. A host that cannot run the observer hands its containers to
the in-container path within the same round. A target in ``pair`` is sampled twice,
:data:`PAIR_GAP_S` apart; on the host path the second call
reads the kernel log from the same cursor as the first (the feed keeps each line once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.monitor.hostpath import HostView, run_host_pids
from orchestrator.monitor.observe import as_snapshot, failure_reason, gather
from orchestrator.remote.target import Host
from orchestrator.wire.model import HostDocument, HostProbe, Snapshot

if TYPE_CHECKING:
    from orchestrator.monitor.handles import Handles

log = logging.getLogger(__name__)

PAIR_GAP_S = 1.0
"""A target with no recent snapshot is sampled twice this many seconds apart, so detectors
that want consecutive samples (``ghost_samples``: 2) decide on the first check as on the
second (they count samples, not seconds)."""


@dataclass
class Round:
    """What one round saw (not judged yet: the caller judges with its own history)."""

    taken_at: float
    snaps: dict[str, Snapshot] = field(default_factory=dict)
    earlier: dict[str, Snapshot] = field(default_factory=dict)
    """The first of each pair (a sample the detectors see before ``snaps``)."""
    inside: set[str] = field(default_factory=set)
    """The targets observed from inside (their host's kernel events come from its probe)."""
    probes: dict[str, HostProbe] = field(default_factory=dict)
    hosts: dict[str, HostView] = field(default_factory=dict)
    """Each host's candidate events of this round (documents and probes)."""
    cursors: dict[str, tuple[str | None, float | None]] = field(default_factory=dict)
    """Per host observed: the kernel cursor and the time its document was taken."""


def take(
    obs: Handles,
    *,
    pair: Collection[str] = (),
    probe_since: Mapping[str, float] | None = None,
    probe_also: Collection[str] = (),
    past: Mapping[str, Sequence[Snapshot]] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> Round:
    """One round (see the module). ``probe_since``: host -> the Unix time its probe reads the
    kernel log from (``None``: no probes); ``probe_also``: hosts probed even when all their
    containers are observed from the host. ``past``: the targets' earlier snapshots (read once
    the answers are in: ``meanwhile``, run while they travel, may fill it), to place an OOM
    kill of a run process gone since. Never raises for a target."""
    names = [n for n in obs.names if n not in obs.streaming]
    groups = obs.groups(names)
    on_host = {n for ns in groups.values() for n in ns}
    inside = [n for n in names if n not in on_host]
    jobs: dict[str, Callable[[], Any]] = {
        f"H:{h}": _host_job(obs, h, ns, pair) for h, ns in groups.items()
    }
    jobs.update(_inside_jobs(obs, inside, pair))
    probed = _probe_hosts(obs, inside, probe_also) if probe_since is not None else set()
    jobs.update({f"h:{h}": _probe_job(obs, h, probe_since) for h in probed})
    got = settle(
        jobs, gather(jobs, workers=obs.workers, timeout_s=obs.timeout_s, meanwhile=meanwhile)
    )
    out = Round(time.time())
    pids = known_pids(past or {})
    fallback: list[str] = []
    for host, group in groups.items():
        fallback += _read_host(obs, out, host, group, got[f"H:{host}"], pair, pids)
    if fallback:  # a host that cannot run the observer: its containers from inside, now
        more = _inside_jobs(obs, fallback, pair)
        if probe_since is not None:
            more.update(
                {
                    f"h:{h}": _probe_job(obs, h, probe_since)
                    for h in _probe_hosts(obs, fallback, ()) - probed
                }
            )
        got.update(settle(more, gather(more, workers=obs.workers, timeout_s=obs.timeout_s)))
        inside += fallback
    for n in inside:
        value = got[f"t:{n}"]
        if isinstance(value, tuple):
            out.earlier[n], value = value
        out.snaps[n] = snap = as_snapshot(n, value, out.taken_at)
        if snap is not value:
            out.earlier.pop(n, None)
            obs.forget(n)  # reconnect next round
    out.inside = set(inside)
    for key, value in got.items():
        if key.startswith("h:") and isinstance(value, HostProbe):
            out.probes[key[2:]] = value
        elif key.startswith("h:"):
            log.info("%s: host probe failed: %s", key[2:], failure_reason(value))
    out.snaps = {n: obs.carry(s, out.earlier.get(n)) for n, s in out.snaps.items()}
    obs.remember(out.snaps.values())
    return out


def _inside_jobs(
    obs: Handles, names: list[str], pair: Collection[str]
) -> dict[str, Callable[[], Any]]:
    def one(name: str, resume: tuple[str, int] | None) -> Snapshot:
        if obs.fetch is not None:
            return obs.fetch(name, resume)
        t = obs.target(name)
        if resume is None:
            return t.snapshot(timeout=obs.timeout_s)
        return t.snapshot(resume[1], run_id=resume[0], timeout=obs.timeout_s)

    def job(name: str) -> Callable[[], Any]:
        resume = obs.resume.get(name)
        if name not in pair:
            return lambda: one(name, resume)

        def second(first: Snapshot) -> Snapshot:
            run = first.run if first.reachable else None
            return one(name, (run.run_id, run.log_offset) if run and run.run_id else resume)

        return Pair(lambda: one(name, resume), second)

    return {f"t:{n}": job(n) for n in names}


def _host_job(
    obs: Handles, host: str, names: list[str], pair: Collection[str]
) -> Callable[[], Any]:
    link = obs.link(host, names)

    def once() -> HostDocument:
        return link.observe(timeout=obs.timeout_s)  # type: ignore[no-any-return]

    if not any(n in pair for n in names):
        return once

    cursor, since = link.cursor, link.since

    def second(_first: HostDocument) -> HostDocument:
        after = link.cursor, link.since
        link.cursor, link.since = cursor, since  # the same kernel events again, and newer ones
        try:
            return once()
        except BaseException:
            link.cursor, link.since = after  # the first's are the newest read
            raise

    return Pair(once, second)


class Pair:
    """A job that samples twice, :data:`PAIR_GAP_S` apart: ``(first, second)``, or the first
    alone when the second fails; :attr:`first` stays readable when the round's deadline
    passes during the second (:func:`settle`)."""

    def __init__(self, first: Callable[[], Any], second: Callable[[Any], Any]) -> None:
        self._first, self._second = first, second
        self.first: Any = None

    def __call__(self) -> Any:
        self.first = self._first()
        time.sleep(PAIR_GAP_S)
        try:
            return self.first, self._second(self.first)
        except Exception as exc:  # noqa: BLE001 - one sample is still an answer
            log.info("second sample failed, keeping the first: %s", failure_reason(exc))
            return self.first


def settle(jobs: Mapping[str, Callable[[], Any]], got: dict[str, Any]) -> dict[str, Any]:
    """``got`` with the first sample of each pair the deadline cut short."""
    for key, job in jobs.items():
        if isinstance(job, Pair) and isinstance(got.get(key), BaseException) and job.first:
            got[key] = job.first
    return got


def _probe_hosts(obs: Handles, names: list[str], also: Collection[str]) -> set[str]:
    """The hosts of ``names`` observed from inside (not the local target's), and ``also``."""
    hosts = {c.host for c in map(obs.inventory.container, names) if not c.is_local}
    return hosts | set(also)


def _probe_job(
    obs: Handles, host: str, since: Mapping[str, float] | None
) -> Callable[[], HostProbe]:
    at = (since or {}).get(host)
    return lambda: Host(obs.inventory, host).probe(at)


def _read_host(
    obs: Handles,
    out: Round,
    host: str,
    names: list[str],
    value: Any,
    pair: Collection[str],
    known_pids: Mapping[int, str] | None,
) -> list[str]:
    """``value`` (a document, a pair of them, or the exception) into ``out``; the containers
    that fall back to the in-container path."""
    from orchestrator.remote.hostlink import observe_path

    docs = value if isinstance(value, tuple) else (value,)
    if all(isinstance(d, HostDocument) for d in docs):
        feed = obs.feed(host, names, known_pids=dict(known_pids or {}))
        seen: list[Any] = []
        for i, doc in enumerate(docs):
            snaps, view = feed.apply(doc)
            if i < len(docs) - 1:
                out.earlier.update({n: s for n, s in snaps.items() if n in pair})
            seen += view.events
        out.snaps.update(snaps)
        seen = list(dict.fromkeys(seen))  # a pair read the same kernel lines twice
        out.hosts[host] = HostView(host, seen, errors=view.errors, taken_at=view.taken_at)
        out.cursors[host] = (docs[-1].kernel_cursor, docs[-1].taken_at)
        link = obs.links[host]
        obs.cursors[host] = (link.cursor, link.since)
        obs.remember(out.snaps[n] for n in names)
        return []
    if observe_path(obs.inventory, obs.inventory.container(names[0])).mode == "container":
        return list(names)
    failed = next((d for d in docs if not isinstance(d, HostDocument)), value)
    reason = f"{host}: {failure_reason(failed)}"
    log.info("%s", reason)
    out.snaps.update({n: Snapshot.unreachable(n, out.taken_at, reason) for n in names})
    return []


def known_pids(history: Mapping[str, Sequence[Snapshot]]) -> dict[int, str]:
    """Host PID -> container of the runs in the newest two snapshots of each history."""
    return run_host_pids(s for snaps in history.values() for s in list(snaps)[-2:])
