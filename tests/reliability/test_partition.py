"""A silent network partition: the sandbox host's sshd in its own network namespace, link down.

TCP to a partitioned host hangs (no reset), so only keepalive and timeouts can tell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.monitor import observe
from tests.reliability import netns

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CYCLES = 20


@dataclasses.dataclass
class NsHost:
    ns: netns.NetNs
    config: Path
    sshd: object


@pytest.fixture(scope="module")
def ns_host(fleet) -> Iterator[NsHost]:
    """The fleet's containers reached through an sshd living in a fresh network namespace."""
    why = netns.available()
    if why:
        pytest.skip(why)
    from orchestrator.sandbox import manager, sshd

    ns = netns.NetNs.create()
    server = None
    try:
        server = sshd.start_sshd(
            fleet.state_dir / "sshd-ns",
            path_prepend=[str(fleet.state_dir / "bin")],
            env=manager.host_env(fleet.state_dir),
            port=2222,
            address=ns.inner_ip,
            netns=ns.name,
        )
        doc = yaml.safe_load(fleet.config.read_text())
        doc["hosts"]["sandbox"].update(
            address=ns.inner_ip,
            port=server.port,
            identity_file=str(server.client_key_path),
            known_hosts=str(server.known_hosts_path),
        )
        path = fleet.state_dir / "netns.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield NsHost(ns, path, server)
    finally:
        if server is not None:
            sshd.stop_sshd(server)
        pids = netns._ip("netns", "pids", ns.name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ns.delete()


class Streamer:
    """``Target.stream`` consumed on a thread; every snapshot lands on ``q`` with its arrival time."""

    def __init__(self, target, interval_s: float, backoff_cap_s: float) -> None:
        self.q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._gen = observe.stream(target, interval_s, backoff_cap_s=backoff_cap_s)
        self.thread = threading.Thread(target=self._run, name="rel-streamer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for snap in self._gen:
                self.q.put((time.monotonic(), snap))
                if self._stop.is_set():
                    break
        finally:
            self._gen.close()

    def next_where(self, pred, timeout_s: float, after: float = 0.0):
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching snapshot within {timeout_s} s")
            try:
                t, snap = self.q.get(timeout=remaining)
            except queue.Empty:
                continue
            if t >= after and pred(snap):
                return t, snap

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the stream did not stop"


def _sockets() -> int:
    """Open sockets of this process (fds pointing at ``socket:[...]``)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def _settled(
    count: Callable[[], tuple[int, ...]], limit: tuple[int, ...], within_s: float
) -> tuple[int, ...]:
    """``count()`` once every figure is at most ``limit``'s, or its last value at the deadline."""
    deadline = time.monotonic() + within_s
    while True:
        now = count()
        if all(n <= m for n, m in zip(now, limit, strict=True)) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


@pytest.mark.fault(
    area="transport",
    fault="silent network partition (host in its own netns, link down: TCP hangs, no reset) "
    "during a stream",
    must="declared unreachable within 30 s (keepalive/timeouts), never dead; "
    "reachable again after the link returns",
)
def test_partition_declared_unreachable(ns_host, fleet, observe):
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.target import Target
    from orchestrator.transport.connect import close_all

    inv = load_inventory(ns_host.config)
    s = Streamer(Target(inv, "ct200"), 1.0, backoff_cap_s=4.0)
    try:
        s.next_where(lambda x: x.reachable, 60)
        cut = time.monotonic()
        ns_host.ns.partition()
        try:
            t, snap = s.next_where(lambda x: not x.reachable, 45, after=cut)
        finally:
            ns_host.ns.heal()
        took = t - cut
        assert took <= 30.0, took
        assert snap.run is None and snap.session is None
        healed = time.monotonic()
        t2, _ = s.next_where(lambda x: x.reachable, 60, after=healed)
        observe(
            f"unreachable after {took:.1f} s ({snap.errors[0][:90]!r}); reachable again "
            f"{t2 - healed:.1f} s after the link came back"
        )
    finally:
        s.stop()
        close_all()


@pytest.mark.fault(
    area="transport",
    fault=f"{CYCLES} partition/heal cycles under a live stream",
    must="each partition seen as unreachable and each heal recovered; no thread, "
    "channel or socket leak (counted before/after)",
)
def test_partition_cycles_leak_nothing(ns_host, observe):
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.target import Target
    from orchestrator.transport.pct import PctTransport
    from orchestrator.transport.ssh import SshTransport

    inv = load_inventory(ns_host.config)
    c = inv.container("ct200")
    host = dataclasses.replace(inv.hosts[c.host], keepalive_s=0.5, connect_timeout_s=2.0)
    ssh = SshTransport(host, dead_after_s=1.0, connect_attempts=1)
    target = Target(inv, "ct200", transport=PctTransport(ssh, c.vmid, name=c.name, env=c.env))

    def channels() -> int:
        conn = ssh._conn  # white-box: paramiko's open channel map is the thing that leaks
        return len(conn.transport._channels.values()) if conn is not None else 0

    s = Streamer(target, 0.5, backoff_cap_s=1.0)
    downs: list[float] = []
    ups: list[float] = []
    try:
        s.next_where(lambda x: x.reachable, 60)
        before = (threading.active_count(), channels(), _sockets())
        for _ in range(CYCLES):
            cut = time.monotonic()
            ns_host.ns.partition()
            try:
                t, _ = s.next_where(lambda x: not x.reachable, 30, after=cut)
            finally:
                ns_host.ns.heal()
            downs.append(t - cut)
            healed = time.monotonic()
            t, _ = s.next_where(lambda x: x.reachable, 30, after=healed)
            ups.append(t - healed)
        s.next_where(lambda x: x.reachable, 10)  # steady again
        # a poll in flight holds a channel for a moment: a leak is one that never closes
        after = _settled(lambda: (threading.active_count(), channels(), _sockets()), before, 5)
    finally:
        s.stop()
        ssh.close()
    observe(
        f"{CYCLES} cycles: unreachable after {min(downs):.1f}-{max(downs):.1f} s, "
        f"recovered after {min(ups):.1f}-{max(ups):.1f} s; threads/channels/sockets "
        f"before {before}, after {after}, after close {(threading.active_count(), _sockets())}"
    )
    assert after[0] <= before[0], (before, after)
    assert after[1] <= before[1], (before, after)
    assert after[2] <= before[2], (before, after)
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("orch-ssh-liveness")], names


def test_partition_really_hangs_tcp(ns_host):
    """Self-check of the fault: a connect during the partition times out, it is not refused."""
    ns_host.ns.partition()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            socket.create_connection((ns_host.ns.inner_ip, 2222), timeout=1.5).close()
        assert time.monotonic() - started >= 1.4
    finally:
        ns_host.ns.heal()
