"""The resident host observer: ``host-observe`` without ~100 ms of imports per check.

The host boot (:data:`orchestrator.remote.boot.HOST_BOOT`) first hands a ``host-observe``
argv to the resident of its bundle over a unix socket, and prints what it answers; when
there is none (no socket, a stale one, refused, no answer within :data:`ACK_S`, a reply cut
short) it runs the one-shot agent as before and starts a resident for the next check
(:data:`RESIDENT_BOOT`: a double-forked, ``setsid`` child, stdio on ``/dev/null``, that
outlives the SSH channel). Output and exit status are the one-shot's either way: the
document says which answered (``served_by``: ``resident`` or ``oneshot``).

One resident per bundle directory and environment: the socket is
``<bundle_dir>/observer-<key>.sock`` (:func:`socket_name`: a CRC-32 of the python, the
working directory and the environment without the per-connection variables), so a new
bundle or another environment gets its own resident. ``observer-<key>.lock`` (``flock``,
the resident's pid inside) keeps it to one; the loser of a start race exits at once.

Security: the socket is created mode 0600 (umask) in the bundle directory whose owner and
mode the boot checked; each connection's ``SO_PEERCRED`` uid must be the resident's euid,
else it is answered :data:`REFUSED` and closed. It serves ``host-observe`` and nothing else.

Each request is served by a ``fork`` of the resident (every module already imported, the
pure parts of a check already run once on made-up input (:mod:`orchestrator.agent.prewarm`:
compiled regexes, the wire's tables, specialised bytecode), ``gc.freeze``-d): concurrent checks run side by side, one's crash or hang is its own, and
the observer state is the one-shot's (fresh per check; the kept init PIDs and journal cursor
live in files as before). The resident exits after :data:`IDLE_S` without a request
(``$ORCH_RESIDENT_IDLE_S``), when its bundle directory or its socket file is gone or
replaced, checked every :data:`CHECK_S`.

Wire (bytes): the client sends ``b"%d\\n" % len(payload)`` then the NUL-joined argv; the
server answers :data:`ACK` once it has read it, then ``b"R rc nout nerr\\n"``, stdout's and
stderr's bytes, and closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import io
import os
import select
import socket
import struct
import sys
import time
import zlib
from collections.abc import Mapping
from typing import Any

IDLE_S = 600.0
"""Seconds without a request after which the resident exits (``$ORCH_RESIDENT_IDLE_S``)."""
IDLE_ENV = "ORCH_RESIDENT_IDLE_S"
CHECK_S = 2.0
"""How often the resident looks whether its bundle directory and socket are still there (s)."""
ACK_S = 2.0
"""The client's limit for connecting and for the resident's :data:`ACK` (s); then one-shot."""
REPLY_S = 300.0
"""The client's limit for the whole answer after the ACK (s; the one-shot has none)."""
REQUEST_S = 5.0
"""A serving child's limit for reading the request (s)."""
MAX_CHILDREN = 16
"""Requests served at once; one more is closed unanswered (its client runs the one-shot)."""
ACK = b"+"
REFUSED = b"X"
SKIP_ENV = ("_", "SHLVL", "PWD", "OLDPWD", "XDG_SESSION_ID", "MOTD_SHOWN")
"""Environment variables (besides ``SSH_*``) that differ between SSH sessions of one user and
mean nothing to the observer: left out of the socket's key."""

RESIDENT_BOOT = (
    "import sys; d = sys.argv[1]; sys.path.insert(0, d)\n"
    "from orchestrator.agent.resident import main; sys.exit(main(sys.argv[1:]))"
)
"""What the boot ``exec``s (``python3 -S -c RESIDENT_BOOT <bundle_dir> <socket name>``)."""

PRELOAD = (
    "orchestrator.agent.__main__",
    "orchestrator.agent.host",
    "orchestrator.agent.kernel",
    "orchestrator.agent.gpu",
    "orchestrator.agent.gpu_smi",
    "orchestrator.wire.formats",
    "subprocess",
    "pynvml",
)
"""Imported once by the resident before it listens (what a check imports; ``pynvml`` when the
bundle has it). NVML itself is initialised by each serving child, as by the one-shot."""


_PARSER: Any = None
"""The agent's parser, built by :func:`serve` before it listens (the children share it)."""


def socket_name(env: Mapping[str, str], cwd: str, executable: str) -> str:
    """The socket's file name in the bundle directory: the one the boot connects to (its
    client computes the same CRC-32; ``tests/agent/test_resident.py`` holds them equal).

    >>> a = socket_name({"PATH": "/bin", "SSH_CLIENT": "1 2 3"}, "/root", "/usr/bin/python3")
    >>> a == socket_name({"PATH": "/bin", "SSH_CLIENT": "4 5 6"}, "/root", "/usr/bin/python3")
    True
    >>> a == socket_name({"PATH": "/usr/bin"}, "/root", "/usr/bin/python3"), a[:9], len(a)
    (False, 'observer-', 22)
    """
    kept = sorted(
        f"{k}={v}" for k, v in env.items() if k not in SKIP_ENV and not k.startswith("SSH_")
    )
    text = "\0".join([executable, cwd, *kept])
    return f"observer-{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}.sock"


def idle_s(env: Mapping[str, str] | None = None) -> float:
    """:data:`IDLE_S`, or ``$ORCH_RESIDENT_IDLE_S`` when that is a positive number.

    >>> idle_s({}), idle_s({IDLE_ENV: "0.5"}), idle_s({IDLE_ENV: "never"})
    (600.0, 0.5, 600.0)
    """
    try:
        value = float((os.environ if env is None else env).get(IDLE_ENV, ""))
    except ValueError:
        return IDLE_S
    return value if 0 < value < float("inf") else IDLE_S


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def main(argv: list[str]) -> int:
    """``RESIDENT_BOOT <bundle_dir> <socket name>``: serve until idle; 0 (also when another
    resident holds the lock), 2 for bad arguments."""
    if len(argv) != 2 or "/" in argv[1] or not argv[1].endswith(".sock"):
        return 2
    serve(argv[0], argv[1])
    return 0


def serve(bundle_dir: str, name: str) -> None:
    """Take the lock, preload, listen on ``bundle_dir/name``, serve until idle or gone."""
    path = os.path.join(bundle_dir, name)
    lock = os.open(path[: -len(".sock")] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another resident serves this socket
    os.ftruncate(lock, 0)
    os.write(lock, b"%d\n" % os.getpid())
    for module in PRELOAD:
        with contextlib.suppress(Exception):
            __import__(module)
    from orchestrator.agent.__main__ import build_parser

    global _PARSER
    _PARSER = build_parser(with_runs=False)  # built once: ~5 ms a request otherwise
    with contextlib.suppress(Exception):
        from orchestrator.agent.prewarm import prewarm

        prewarm(bundle_dir, _PARSER)  # what every fork would build again (~20 ms a request)
    sock, ident = _listen(bundle_dir, name)
    gc.collect()
    gc.freeze()  # the children's reads then copy fewer pages
    try:
        _loop(sock, path, ident, idle_s())
    finally:
        sock.close()
        if _ident(path) == ident:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(lock)


def _listen(bundle_dir: str, name: str) -> tuple[socket.socket, tuple[int, int] | None]:
    """The listening socket (mode 0600 from its creation); a stale file of that name removed.
    Bound relative to the bundle directory: a unix socket's path is limited to 107 bytes."""
    cwd = os.getcwd()
    os.chdir(bundle_dir)
    old = os.umask(0o177)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(name)
        os.chmod(name, 0o600)
        sock.listen(64)
    finally:
        os.umask(old)
        os.chdir(cwd)
    return sock, _ident(os.path.join(bundle_dir, name))


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _loop(sock: socket.socket, path: str, ident: tuple[int, int] | None, idle: float) -> None:
    kids: dict[int, float] = {}  # serving fork -> when it started (monotonic s)
    last = checked = time.monotonic()
    while True:
        _reap(kids)
        ready, _, _ = select.select([sock], [], [], 0.05 if kids else min(CHECK_S, idle))
        now = time.monotonic()
        if ready:
            last = now
            _accept(sock, kids)
        if now - checked >= CHECK_S or not ready:
            checked = now
            if _ident(path) != ident:
                return  # bundle directory or socket removed or replaced: a newer one serves
        if not kids and now - last >= idle:
            return


def _reap(kids: dict[int, float]) -> None:
    """Forget the serving forks that ended; kill one past :data:`REPLY_S` (its client gave up
    on it and ran the one-shot: a fork stuck in a driver call would keep the resident up)."""
    now = time.monotonic()
    for pid, started in list(kids.items()):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                if now - started > REPLY_S:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
                continue
        del kids[pid]


def _accept(sock: socket.socket, kids: dict[int, float]) -> None:
    try:
        conn, _ = sock.accept()
    except OSError:
        return
    try:
        uid = peer_uid(conn)
        if uid != os.geteuid():
            conn.settimeout(1.0)
            conn.sendall(REFUSED + b" peer uid %d is not the observer's %d\n" % (uid, os.geteuid()))
            return
        if len(kids) >= MAX_CHILDREN:
            return
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _child(conn)
            finally:
                os._exit(0)
        kids[pid] = time.monotonic()
    except OSError:
        return
    finally:
        conn.close()


def _child(conn: socket.socket) -> None:
    """Serve one request on ``conn`` (in a fork of the resident)."""
    conn.settimeout(REQUEST_S)
    try:
        argv = _read_request(conn)
    except (OSError, ValueError):
        return
    if argv[:1] != ["host-observe"]:
        conn.sendall(REFUSED + b" the resident serves host-observe only\n")
        return
    conn.sendall(ACK)
    rc, out, err = run_command(argv)
    conn.settimeout(REPLY_S)
    with contextlib.suppress(OSError):
        conn.sendall(b"R %d %d %d\n" % (rc, len(out), len(err)) + out + err)


def _read_request(conn: socket.socket) -> list[str]:
    """The NUL-joined argv after its length line; ``ValueError`` when it is not one."""
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) > 32:
            raise ValueError("no length line")
        data += chunk
    head, _, body = data.partition(b"\n")
    size = int(head)
    if not 0 < size <= 16 << 20:
        raise ValueError(f"request of {size} bytes")
    parts = [body]
    got = len(body)
    while got < size:
        chunk = conn.recv(min(1 << 20, size - got))
        if not chunk:
            raise ValueError("request cut short")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)[:size].decode("utf-8", "surrogateescape").split("\0")


def run_command(argv: list[str]) -> tuple[int, bytes, bytes]:
    """The agent's ``main(argv)`` as the one-shot runs it: (exit status, stdout, stderr), an
    uncaught exception's traceback on stderr with status 1, as the interpreter would."""
    from orchestrator.agent import __main__ as agent

    agent.SERVED_BY = "resident"
    out, err = io.BytesIO(), io.BytesIO()
    real = sys.stdout, sys.stderr
    sys.stdout = io.TextIOWrapper(out, encoding=real[0].encoding, errors=real[0].errors)
    sys.stderr = io.TextIOWrapper(err, encoding=real[1].encoding, errors="backslashreplace")
    try:
        rc = _exit_status(lambda a: agent.main(a, parser=_PARSER), argv)
        sys.stdout.flush()
        sys.stderr.flush()
        return rc, out.getvalue(), err.getvalue()
    finally:
        sys.stdout, sys.stderr = real


def _exit_status(func, argv: list[str]) -> int:  # type: ignore[no-untyped-def]
    try:
        return int(func(argv) or 0)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return int(code or 0)
        sys.stderr.write(f"{code}\n")
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one
        import traceback

        traceback.print_exc()
        return 1
