"""``orch doctor``'s word on where each container is observed from, and why.

A host whose containers are observed from the host runs its observer once here (one
document for every container of hosts.yaml on it); a host that cannot (no Python >= 3.10,
``observe: container``) keeps the in-container agent, one ``pct exec`` per container, and
the check says so. Each container then gets one line: ``host`` or ``container`` and the
reason (:func:`orchestrator.remote.hostlink.observe_path`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from orchestrator.config.inventory import ContainerConfig, HostConfig, Inventory
from orchestrator.errors import OrchError


def observe_checks(
    inv: Inventory, host: HostConfig | None, ct: ContainerConfig | None, check: Any
) -> Iterator[Any]:
    """The checks (``check(name, status, detail, fix)`` builds one): the host observer of
    ``host`` (or of ``ct``'s host) when it is used, then each container's path."""
    from orchestrator.remote.hostlink import HostLink, observe_path

    if ct is not None:
        containers = [ct]
        host = host or inv.hosts.get(ct.host)
    else:
        containers = [c for c in inv.containers.values() if host and c.host == host.name]
    on_host = [c.name for c in containers if observe_path(inv, c).mode == "host"]
    if host is not None and on_host:
        name = f"host observer on {host.name}"
        started = time.monotonic()
        try:
            doc = HostLink(inv, host.name, on_host).observe(timeout=60.0)
        except OrchError as exc:
            still = [c for c in on_host if observe_path(inv, inv.container(c)).mode == "host"]
            fix = (
                f"install python3 >= 3.10 on {host.name} (host_python: in hosts.yaml), or set "
                f"observe: container"
            )
            yield check(name, "fail" if still else "warn", str(exc)[:300], fix)
        else:
            ms = (time.monotonic() - started) * 1000
            states = ", ".join(f"{n} {s.container_status}" for n, s in doc.containers.items())
            kernel = doc.kernel_log_source or "no kernel log"
            yield check(
                name,
                "ok",
                f"one document in {ms:.0f} ms ({states}; {kernel}; agent in {host.agent_dir})",
                "",
            )
    for c in containers:
        path = observe_path(inv, c)
        yield check(f"{c.name} observed from", "ok", f"{path.mode}: {path.reason}", "")
    if host is not None:
        yield from journal_check(inv, host, check)


def journal_check(inv: Inventory, host: HostConfig, check: Any) -> Iterator[Any]:
    """Warn when ``host``'s journal is volatile: the kernel log of the boot before this one
    (where an Xid 79 before a hang-and-reset usually is) is then lost at every reboot.
    Equivalent: ``journalctl -k -b -1 -n 1 -q --no-pager`` (systemd 252 says so on stderr)."""
    from orchestrator.agent.kernel import VOLATILE_NOTE, is_volatile
    from orchestrator.transport.connect import host_transport

    argv = ["journalctl", "-k", "-b", "-1", "-n", "1", "-q", "--no-pager"]
    try:
        res = host_transport(inv, host.name).run(argv, timeout=30.0)
    except OrchError:
        return  # the ssh check above says why
    if res.ok and is_volatile(res.err or ""):
        fix = (
            "Storage=persistent in /etc/systemd/journald.conf (or mkdir -p /var/log/journal), "
            "then systemctl restart systemd-journald"
        )
        yield check(f"journal on {host.name}", "warn", VOLATILE_NOTE.split(";")[0], fix)
