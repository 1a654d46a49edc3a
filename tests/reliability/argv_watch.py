"""Watch every process's command line for secret values: what ``ps`` shows to anyone.

``python -m tests.reliability.argv_watch OUT [--pct PCT --vmid N] [--mark NAME=TEXT ...]``,
with the secret values on stdin, one per line, so they are never on this process's own
command line. Until ``OUT.stop`` exists (at most 180 s) it

- reads every ``/proc/PID/cmdline`` in a loop (what ``ps`` reads; a process living a few
  milliseconds is still caught),
- runs ``ps -eww -o pid=,args=`` on the host every 0.2 s,
- with ``--pct``, runs ``PCT exec N -- ps -eww -o pid=,args=`` inside the container every 0.3 s,

then writes ``OUT``: JSON ``{"scans", "ps_host", "ps_container", "marks", "container_marks",
"hits"}``. ``marks[NAME]`` counts the scans that saw TEXT in some command line (proof the
window of interest was sampled), ``container_marks`` the same for the in-container ``ps``.
A hit names the process and where the value was, with every value replaced by ``***``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

LIMIT_S = 180.0


def _redact(text: bytes, secrets: list[bytes]) -> str:
    for s in secrets:
        text = text.replace(s, b"***")
    return text.replace(b"\0", b" ").decode("utf-8", "replace")[:300]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--pct")
    p.add_argument("--vmid")
    p.add_argument("--mark", action="append", default=[])
    args = p.parse_args()
    secrets = [line.encode() for line in sys.stdin.read().splitlines() if line]
    marks = dict(m.split("=", 1) for m in args.mark)
    out, stop = Path(args.out), Path(args.out + ".stop")
    report: dict = {
        "scans": 0,
        "ps_host": 0,
        "ps_container": 0,
        "hits": [],
        "marks": dict.fromkeys(marks, 0),
        "container_marks": dict.fromkeys(marks, 0),
    }
    lock = threading.Lock()
    me = str(os.getpid())
    done = threading.Event()

    def hit(where: str, text: bytes) -> None:
        with lock:
            report["hits"].append({"where": where, "text": _redact(text, secrets)})

    def in_container() -> None:
        while not done.is_set():
            ps = [args.pct, "exec", args.vmid, "--", "ps", "-eww", "-o", "pid=,args="]
            res = subprocess.run(ps, capture_output=True, timeout=30, check=False)
            with lock:
                report["ps_container"] += res.returncode == 0
                for name, text in marks.items():
                    report["container_marks"][name] += text.encode() in res.stdout
            for line in res.stdout.splitlines():
                if any(s in line for s in secrets):
                    hit("ps in the container", line)
            done.wait(0.3)

    worker = threading.Thread(target=in_container, daemon=True)
    if args.pct:
        worker.start()
    out.with_suffix(".ready").write_text("ready\n")
    deadline = time.monotonic() + LIMIT_S
    next_ps = 0.0
    while not stop.exists() and time.monotonic() < deadline:
        seen = dict.fromkeys(marks, False)
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmdline = fh.read()
            except OSError:
                continue
            if any(s in cmdline for s in secrets):
                hit(f"/proc/{pid}/cmdline", cmdline)
            for name, text in marks.items():
                seen[name] = seen[name] or text.encode() in cmdline
        with lock:
            report["scans"] += 1
            for name, was in seen.items():
                report["marks"][name] += was
        if time.monotonic() >= next_ps:
            next_ps = time.monotonic() + 0.2
            res = subprocess.run(
                ["ps", "-eww", "-o", "pid=,args="], capture_output=True, timeout=30, check=False
            )
            report["ps_host"] += res.returncode == 0
            for line in res.stdout.splitlines():
                if any(s in line for s in secrets):
                    hit("ps on the host", line)
    done.set()
    if args.pct:
        worker.join(timeout=35)
    with lock:
        out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
