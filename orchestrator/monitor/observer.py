"""THE observer of check, export and watch: which path each target takes, one-shot rounds and
endless streams, the fallback, the pane on demand, the intervals of hosts.yaml; what it saw
goes through one :class:`~orchestrator.monitor.ledger.Ledger` (judgements, host views).

- Path: a container is observed from its Proxmox host (one ``host-observe``/``host-stream``
  per host for all its containers) unless :func:`~orchestrator.remote.hostlink.observe_path`
  says from inside; a host that turns out unable to run the observer hands its containers to
  the in-container path (in a round at once, in a stream from then on).
- :meth:`Observer.round` (:mod:`orchestrator.monitor.rounds`): every target once, at once,
  under one deadline; a target without recent history is sampled twice :data:`PAIR_GAP_S`
  apart on either path (the second host call reads the kernel log from the same cursor as
  the first, so no event is lost or counted twice).
- :meth:`Observer.start` (:mod:`orchestrator.monitor.streams`): one daemon thread per host
  stream and per in-container stream, and one that judges what they bring: ``(name,
  Judgement)`` and ``(host:<name>, HostView)`` items on the caller's queue.
"""

from __future__ import annotations

from orchestrator.monitor.handles import DEFAULT_INTERVAL_S, Fetch, Handles
from orchestrator.monitor.rounds import PAIR_GAP_S, Round, take
from orchestrator.monitor.streams import start

__all__ = ["DEFAULT_INTERVAL_S", "PAIR_GAP_S", "Fetch", "Observer", "Round"]


class Observer(Handles):
    """Observes the containers ``names`` of ``inventory`` (see the module).

    ``fetch`` stands in for every one-shot snapshot and ``connect(name)`` for every stream
    (both put every target on the in-container path); ``timeout_s`` is a round's deadline.
    """

    round = take
    """One round of every target not streamed (:func:`orchestrator.monitor.rounds.take`):
    a :class:`~orchestrator.monitor.rounds.Round`."""
    start = start
    """Stream the targets from now on, judged items onto a queue
    (:func:`orchestrator.monitor.streams.start`)."""
