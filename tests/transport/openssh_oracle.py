"""OpenSSH itself as the oracle: ``ssh -G`` for one host, and the whole jump chain the way
``ssh`` walks it (ssh.c main, OpenSSH 9.2p1: a ProxyJump ``j1,...,jn`` becomes
``ssh [-l U] [-p P] [-J j1,...,jn-1] -W '[%h]:%p' jn``, each hop one more ``ssh``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

SSH = shutil.which("ssh")
DEFAULT_IDENTITIES = [
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
]
# ssh -G's proxyjump line (readconf.c dump_client_config): [user@][[]host[]][:port]
HOP = re.compile(
    r"^(?:(?P<user>[^@]+)@)?(?:\[(?P<bhost>[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>\d+))?$"
)


def ssh_g(
    config: Path,
    host: str,
    *,
    user: str | None = None,
    port: int | None = None,
    jump: str | None = None,
    home: Path | None = None,
) -> dict[str, Any]:
    """``ssh -G -F config [-l user] [-p port] [-J jump] host`` parsed: one value per key, the
    identityfile lines as a list; ``error`` holds stderr when ssh exits non-zero."""
    assert SSH is not None
    argv = [SSH, "-G", "-F", str(config)]
    argv += ["-l", user] if user else []
    argv += ["-p", str(port)] if port else []
    argv += ["-J", jump] if jump else []
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home or config.parent)}
    done = subprocess.run(
        [*argv, host], capture_output=True, text=True, timeout=20, env=env, check=False
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()}
    out: dict[str, Any] = {"identityfile": []}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            out["identityfile"].append(value)
        else:
            out.setdefault(key, value)
    return out


def ssh_chain(config: Path, host: str, *, home: Path | None = None) -> dict[str, Any]:
    """The route ssh takes to ``host``: its own fields and ``jump`` (first hop first)."""
    top = ssh_g(config, host, home=home)
    if "error" in top:
        return top
    jumps = _hops(config, top.get("proxyjump"), home, 0)
    if isinstance(jumps, str):
        return {"error": jumps}
    return {
        "hostname": top["hostname"],
        "port": int(top["port"]),
        "user": top["user"],
        "identityfile": top["identityfile"],
        "proxycommand": top.get("proxycommand"),
        "jump": jumps,
    }


def _hops(config: Path, spec: str | None, home: Path | None, depth: int) -> list[Any] | str:
    if not spec:
        return []
    if depth > 20:
        return "ssh would fork ssh forever (a jump loop)"
    parts = spec.split(",")
    m = HOP.match(parts[-1])
    assert m is not None, parts[-1]
    rest = ",".join(parts[:-1]) or None
    port = int(m["port"]) if m["port"] else None
    hop = ssh_g(config, m["bhost"] or m["host"], user=m["user"], port=port, jump=rest, home=home)
    if "error" in hop:
        return hop["error"]
    before = _hops(config, hop.get("proxyjump"), home, depth + 1)
    if isinstance(before, str):
        return before
    command = hop.get("proxycommand") if hop.get("proxycommand") != "none" else None
    fields = {"hostname": hop["hostname"], "port": int(hop["port"]), "user": hop["user"]}
    return [*before, {**fields, **({"proxy_command": command} if command else {})}]
