"""``orch export``'s loop: the observer's rounds (and its host streams) every interval, the
metrics of :mod:`orchestrator.views.export` served over HTTP or written as a textfile (the
threads of export are started here and in the monitor, none in ``views/``).
"""

from __future__ import annotations

import logging
import threading
import time

from orchestrator.monitor.poller import Poller
from orchestrator.views.export import parse_listen, registry_for

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 15.0
"""Seconds between polls with ``--listen`` and no ``--interval``."""


def serve(
    poller: Poller,
    *,
    listen: str | None,
    textfile: str | None,
    interval_s: float | None,
    stop: threading.Event | None = None,
) -> None:
    """Run the exporter until ``stop`` is set or Ctrl-C.

    ``listen``: serve ``/metrics`` on HOST:PORT (polling every ``interval_s``,
    default 15 s). ``textfile``: write the file after each poll; without
    ``interval_s`` (and without ``listen``) write it once and return, for cron.
    """
    from prometheus_client import start_http_server, write_to_textfile

    stop = stop or threading.Event()
    registry = registry_for(poller)
    server = None
    if listen:
        host, port = parse_listen(listen)
        server, _thread = start_http_server(port, addr=host, registry=registry)
        log.info("serving metrics on http://%s:%d/metrics", host, port)
    once = not listen and interval_s is None
    period = interval_s if interval_s is not None else DEFAULT_PERIOD_S
    if not once:  # one stream per host; the rounds ask the in-container targets
        poller.stream(min(period, DEFAULT_PERIOD_S))
    try:
        while not stop.is_set():
            started = time.monotonic()
            poller.poll_once()
            if textfile:
                write_to_textfile(textfile, registry)
            if once:
                return
            stop.wait(max(0.0, period - (time.monotonic() - started)))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        poller.close()
