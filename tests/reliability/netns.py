"""A network namespace joined to this one by a veth pair: a host that can be partitioned silently.

Needs root and ``ip``. The pair sits on a private ``10.250.N.0/30`` (N random, unused
here), used only between the namespace and the root namespace. :meth:`NetNs.partition`
takes the namespace's end of the link down: packets to it vanish, so TCP hangs
instead of resetting (no RST, no ICMP), as with a pulled cable or a dead switch port.
Deleting the namespace deletes the pair; nothing global (routes, iptables) is touched.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from dataclasses import dataclass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def available() -> str | None:
    """None when namespaces can be made here, else why not (for a skip message)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "the ip command is missing (apt install iproute2)"
    return None


@dataclass
class NetNs:
    """One namespace ``name`` with address ``inner_ip``; this side of the link is ``outer_ip``."""

    name: str
    outer_dev: str
    inner_dev: str
    outer_ip: str
    inner_ip: str

    @classmethod
    def create(cls) -> NetNs:
        used = _ip("-4", "-o", "addr").stdout
        for _ in range(50):
            n = random.randrange(1, 255)
            if f"10.250.{n}." not in used:
                break
        tag = f"{os.getpid() % 10000}{n}"
        ns = cls(f"orchrel{tag}", f"orv{tag}a", f"orv{tag}b", f"10.250.{n}.1", f"10.250.{n}.2")
        try:
            _ip("netns", "add", ns.name)
            _ip("link", "add", ns.outer_dev, "type", "veth", "peer", "name", ns.inner_dev)
            _ip("link", "set", ns.inner_dev, "netns", ns.name)
            _ip("addr", "add", f"{ns.outer_ip}/30", "dev", ns.outer_dev)
            _ip("link", "set", ns.outer_dev, "up")
            ns.inside("ip", "addr", "add", f"{ns.inner_ip}/30", "dev", ns.inner_dev)
            ns.inside("ip", "link", "set", ns.inner_dev, "up")
            ns.inside("ip", "link", "set", "lo", "up")
        except BaseException:
            ns.delete()
            raise
        return ns

    def inside(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )

    def partition(self) -> None:
        """Take the namespace's end down: a silent partition (no RST, no ICMP)."""
        self.inside("ip", "link", "set", self.inner_dev, "down")

    def heal(self) -> None:
        self.inside("ip", "link", "set", self.inner_dev, "up")

    def delete(self) -> None:
        """Remove the pair and the namespace (idempotent; processes inside must be gone first)."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("link", "del", self.outer_dev, check=False)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("netns", "del", self.name, check=False)
