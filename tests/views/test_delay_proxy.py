"""bench/delay_proxy.py really adds its delay in each direction, and carries bytes intact."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_costs_twice_the_delay():
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen()

    def serve():
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "delay_proxy.py"),
            "--delay-ms",
            "40",
            f"127.0.0.1:{port}=127.0.0.1:{echo.getsockname()[1]}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout.readline().strip() == "ready"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            payload = os.urandom(200_000)
            started = time.monotonic()
            c.sendall(b"x")
            assert c.recv(1) == b"x"
            rtt = time.monotonic() - started
            assert 0.08 <= rtt < 0.5, rtt
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            assert got == payload
    finally:
        proxy.terminate()
        proxy.wait(timeout=5)
        echo.close()


def _start_proxy(upstream_port: int) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "delay_proxy.py"),
            "--delay-ms",
            "20",
            f"127.0.0.1:{port}=127.0.0.1:{upstream_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proxy.stdout is not None and proxy.stdout.readline().strip() == "ready"
    return proxy, port


def _handled(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` catches or blocks ``sig`` now (/proc/<pid>/status SigCgt, SigBlk masks)."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    bit = 1 << (sig - 1)
    return bool((int(fields["SigCgt"], 16) | int(fields["SigBlk"], 16)) & bit)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_exits_cleanly(sig: signal.Signals) -> None:
    """Exit 0 with nothing on stderr: (1) signalled while its ``ready`` is stuck in a full
    stdout pipe (before the fix the handlers came only after ``ready``: SIGTERM killed it,
    SIGINT ended in an asyncio KeyboardInterrupt traceback); (2) with a connection whose
    bytes sit in the delay queue."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen()
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(w, b"\n" * 4096)  # a full pipe: the proxy's print("ready") blocks
        os.set_blocking(w, True)
        proxy = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "delay_proxy.py"),
                f"127.0.0.1:{free_port()}=127.0.0.1:{sink.getsockname()[1]}",
            ],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(w)
        try:
            # SIGTERM, not ``sig``: Python catches SIGINT from its start-up on, so only
            # SIGTERM shows when the proxy's own signal handling has begun
            wait_for(
                lambda: _handled(proxy.pid, signal.SIGTERM),
                timeout_s=10,
                what="the proxy handling SIGTERM while its ready is unread",
            )
            proxy.send_signal(sig)
        except BaseException:
            proxy.kill()
            raise
        finally:
            with os.fdopen(r, "rb") as out:
                tail = out.read()  # drains the pipe; EOF when the proxy exits
        _out, err = proxy.communicate(timeout=10)
        assert (proxy.returncode, err, tail.split()[-1:]) == (0, "", [b"ready"])

        proxy, port = _start_proxy(sink.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            upstream, _ = sink.accept()
            with upstream:
                c.sendall(b"x" * 100_000)  # in flight: delayed 20 ms in the queue
                proxy.send_signal(sig)
                _out, err = proxy.communicate(timeout=10)
        assert (proxy.returncode, err) == (0, "")
    finally:
        sink.close()
