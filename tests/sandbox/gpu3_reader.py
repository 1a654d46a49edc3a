"""A long-lived pynvml reader of GPU 3 (NVML stays initialised) for scenario-switch tests."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

CODE = (
    "import sys, pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(3)\n"
    "for line in sys.stdin:\n"
    "    try: print(n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetMemoryInfo(h).used >> 20, flush=True)\n"
    "    except n.NVMLError as e: print('error', e.value, flush=True)\n"
)


class Gpu3Reader:
    """Runs ``prefix + [python, -c, CODE]``; :meth:`ask` returns ``"UTIL MIB"`` or ``"error CODE"``."""

    def __init__(self, prefix: Sequence[str], python: str, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*prefix, python, "-c", CODE],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("x\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self, timeout_s: float = 10.0) -> int:
        """Close its stdin (it exits on EOF) and return its exit status; killed past ``timeout_s``."""
        assert self.proc.stdin
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)
