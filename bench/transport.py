"""Per-command latency: one reused paramiko connection vs a fresh `ssh` process per command.

Against a sandbox host when ``--config`` names one (its host ``sandbox``), else an sshd
started here for the run (orchestrator.sandbox.sshd). Each side runs ``true`` ``--runs``
times (default 50); the medians and their ratio are printed, and with ``--json`` ONE
JSON object last: ``{"reused_ms": ..., "fresh_ssh_ms": ..., "ratio": ...}``.

    python bench/transport.py --runs 50 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.config.inventory import HostConfig
from orchestrator.sandbox.sshd import start_sshd, stop_sshd
from orchestrator.transport.ssh import SshTransport
from orchestrator.transport.ssh_config import resolve


def median_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def bench(host: HostConfig, runs: int) -> dict[str, float | int | str]:
    ep = resolve(host)
    transport = SshTransport(host)
    try:
        transport.run(["true"])  # connect once, outside the timing

        def reused() -> None:
            assert transport.run(["true"]).ok

        reused_ms = median_ms(reused, runs)
    finally:
        transport.close()
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={ep.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-p",
        str(ep.port),
        *(a for f in ep.identity_files for a in ("-i", f)),
        f"{ep.user}@{ep.address}",
        "true",
    ]

    def fresh() -> None:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, timeout=30)

    fresh_ms = median_ms(fresh, runs)
    return {
        "reused_ms": round(reused_ms, 2),
        "fresh_ssh_ms": round(fresh_ms, 2),
        "ratio": round(fresh_ms / reused_ms, 1),
        "runs": runs,
        "host": f"{ep.address}:{ep.port}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=50, help="commands per side (>= 50 for the figure)"
    )
    parser.add_argument(
        "--config", type=Path, help="a sandbox hosts.yaml (uses its host 'sandbox')"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    if args.config:
        from orchestrator.config.inventory import load_inventory

        result = bench(load_inventory(args.config).hosts["sandbox"], args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
            server = start_sshd(Path(tmp) / "sshd")
            try:
                host = HostConfig(
                    name="bench",
                    address="127.0.0.1",
                    port=server.port,
                    user=server.user,
                    identity_file=str(server.client_key_path),
                    known_hosts=str(server.known_hosts_path),
                )
                result = bench(host, args.runs)
            finally:
                stop_sshd(server)
    print(
        f"reused paramiko connection: {result['reused_ms']:8.2f} ms/command (median of {args.runs})"
    )
    print(
        f"fresh ssh per command:      {result['fresh_ssh_ms']:8.2f} ms/command (median of {args.runs})"
    )
    print(f"ratio fresh/reused:         {result['ratio']:8.1f}x")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
