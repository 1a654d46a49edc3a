"""bench/delay_proxy.py really adds its delay in each direction, and carries bytes intact."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers import free_port

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
