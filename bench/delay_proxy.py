"""A TCP proxy that delays every byte by a fixed time in each direction (a WAN stand-in).

This kernel has no ``netem`` qdisc, so latency lives here: each chunk read from
one side is written to the other ``delay_ms`` later, in order, without slowing
the stream's throughput (chunks are queued with their due time, not
serialised behind a sleep). A round trip through the proxy costs 2 x delay.

Usage (one process can carry several listeners)::

    python3 bench/delay_proxy.py --delay-ms 25 127.0.0.1:2201=10.77.1.2:2201 ...

It prints ``ready`` on stdout once every listener is bound, and runs until
SIGTERM/SIGINT, on which it closes its listeners and connections and exits 0
without output (both signals are blocked until the event loop handles them, so
one sent right after ``ready``, or earlier, is no race). A listener that cannot be
bound: one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while True:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                data = b""
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                return

    await asyncio.gather(receive(), send())


async def _serve(
    listen: tuple[str, int], upstream: tuple[str, int], delay_s: float
) -> asyncio.Server:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_pipe(client_r, up_w, delay_s), _pipe(up_r, client_w, delay_s))
        except asyncio.CancelledError:
            pass  # shutting down with the connection open
        finally:
            for w in (client_w, up_w):
                with contextlib.suppress(OSError):
                    w.close()

    return await asyncio.start_server(handle, *listen, reuse_address=True)


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _main(routes: list[tuple[tuple[str, int], tuple[str, int]]], delay_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # one already pending: stop.set
    servers = [await _serve(src, dst, delay_s) for src, dst in routes]
    print("ready", flush=True)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=25.0, help="delay per direction (ms)")
    ap.add_argument("routes", nargs="+", metavar="LISTEN=UPSTREAM", help="host:port=host:port")
    args = ap.parse_args(argv)
    routes = []
    for r in args.routes:
        src, sep, dst = r.partition("=")
        if not sep:
            ap.error(f"route {r!r}: expected LISTEN=UPSTREAM")
        routes.append((_addr(src), _addr(dst)))
    # Blocked until _main's handlers are in: otherwise a signal in between kills the
    # process (SIGTERM) or ends asyncio.run with a KeyboardInterrupt traceback (SIGINT).
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        asyncio.run(_main(routes, args.delay_ms / 1000.0))
    except OSError as exc:
        print(f"delay_proxy: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
