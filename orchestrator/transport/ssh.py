"""SSH transport over ONE pooled paramiko connection per host (channels, not new connections).

The only module that uses paramiko's connection (``ssh_config.py`` reads ``~/.ssh/config``
and ``known_hosts.py`` checks host keys with its parsers); every paramiko and socket
exception is translated here into :mod:`orchestrator.errors` types.

- Host keys are checked against the host's known_hosts (``HostConfig.known_hosts``
  or ``~/.ssh/known_hosts``): unknown -> :class:`HostKeyUnknown` (naming
  ``orch trust HOST``), changed -> :class:`HostKeyChanged`. Never AutoAddPolicy.
- paramiko's keepalive is sent, but it does not notice a dead peer (it never waits
  for a reply), so a monitor thread sends ``keepalive@openssh.com`` with want-reply
  every ``keepalive_s``; a probe unanswered for ``dead_after_s`` marks the
  connection dead, and it is closed and replaced on the next call.
- At most ``max_channels`` (sshd's MaxSessions, 10) channels are open at once.
- stdout and stderr are drained together, so large output never stalls on the window.
- ``max_output_bytes`` / ``max_line_bytes`` bound what is held: past the bound the
  channel is closed (the lifeline ends the command) instead of reading the rest.
- Connecting is retried with exponential backoff (tenacity) on connection errors
  only; a command is never re-sent once it may have started.
- A command killed by a signal reports 128+N: it runs under ``sh -c '"$@"; exit $?'``
  because sshd reports a signal death as ``exit-signal``, which paramiko ignores (-1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.config.inventory import HostConfig
from orchestrator.errors import (
    AuthFailed,
    CommandFailed,
    CommandTimeout,
    HostUnreachable,
)
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.transport.known_hosts import check_host_key, fingerprint, known_entries
from orchestrator.transport.local import READ_CHUNK, STDERR_TAIL_BYTES, LineBuffer, pop_line
from orchestrator.transport.proxy import proxy_socket, quiet_paramiko
from orchestrator.transport.ssh_config import Endpoint, hop_host, resolve
from orchestrator.transport.sshlib import paramiko
from orchestrator.wire.quoting import command_line, with_env

log = logging.getLogger(__name__)
quiet_paramiko()

MAX_CHANNELS = 10  # sshd's MaxSessions default
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
SIGNAL_SAFE = '"$@"; exit "$?"'  # not `exec`: the shell outlives the command and reports 128+N
# The channel's stdin is a lifeline: when orch closes the channel (timeout, stream closed),
# `cat` sees EOF and the command gets SIGTERM. Closing alone would leave it running and its
# sshd session (one of MaxSessions) taken; sshd refuses "signal" requests for root sessions.
# fd 3 carries the lifeline: an async list's stdin is /dev/null unless redirected (POSIX).
WATCHED = (
    'exec 3<&0 </dev/null; "$@" 3<&- & c=$!; { cat <&3; kill -TERM "$c"; } >/dev/null 2>&1 & '
    'w=$!; exec 3<&-; wait "$c"; s=$?; kill "$w" 2>/dev/null; exit "$s"'
)


def _translate(name: str, exc: BaseException, doing: str) -> HostUnreachable:
    if isinstance(exc, TimeoutError):
        return HostUnreachable(name, f"timed out {doing}")
    reason = str(exc) or type(exc).__name__
    return HostUnreachable(name, f"{doing}: {reason}")


NET_ERRORS = (OSError, EOFError, paramiko.SSHException)


def _refused(exc: BaseException, transport: paramiko.Transport) -> bool:
    """Whether a failed channel open was the server saying no on a live connection: paramiko
    keeps ONE ``saved_exception`` per transport, so of two opens refused at once one may see
    only ``SSHException("Unable to open channel.")``; dropping the connection kills its commands.
    """
    if isinstance(exc, paramiko.ChannelException):
        return True
    return transport.is_active() and str(exc) == "Unable to open channel."


def open_socket(ep: Endpoint, jump: SshTransport | None) -> Any:
    """A TCP socket to ``ep``, a ``direct-tcpip`` channel through ``jump``, or the stdin and
    stdout of ``ep.proxy_command`` (``$SHELL -c``, as ssh runs it; killed on close)."""
    if jump is not None:
        return jump.open_tunnel(ep.address, ep.port, ep.connect_timeout_s)
    if ep.proxy_command:
        return proxy_socket(ep)
    try:
        sock = socket.create_connection((ep.address, ep.port), timeout=ep.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small requests: no Nagle wait
        return sock
    except NET_ERRORS as exc:
        raise _translate(ep.name, exc, f"connecting to {ep.address}:{ep.port}") from None


def handshake(ep: Endpoint, sock: Any) -> paramiko.Transport:
    """Start the SSH protocol on ``sock`` (no auth, host key not yet checked), preferring
    key types known for the host so a known key is the one offered."""
    transport = paramiko.Transport(sock)
    transport.banner_timeout = transport.handshake_timeout = ep.connect_timeout_s
    transport.auth_timeout = ep.connect_timeout_s
    known = [t for _, t, _ in known_entries(ep.known_hosts, ep.known_name)]
    options = transport.get_security_options()
    preferred = [
        t for t in options.key_types if t in known or (t.startswith("rsa-") and "ssh-rsa" in known)
    ]
    if preferred:
        options.key_types = preferred
    try:
        transport.start_client(timeout=ep.connect_timeout_s)
        if not transport.is_active() or not transport.initial_kex_done:  # its timeout, a race
            raise transport.get_exception() or TimeoutError("no key exchange")
    except NET_ERRORS as exc:
        transport.close()
        raise _translate(ep.name, exc, "during the SSH handshake") from None
    return transport


def _load_keys(ep: Endpoint) -> list[tuple[str, Any]]:
    """(label, key) pairs to try: identity files (or the default ones), then ssh-agent keys."""
    paths = list(ep.identity_files) or [str(Path("~/.ssh").expanduser() / n) for n in DEFAULT_KEYS]
    keys: list[tuple[str, Any]] = []
    for path in paths:
        if not Path(path).is_file():
            continue
        try:
            keys.append((path, paramiko.PKey.from_path(path)))
        except paramiko.PasswordRequiredException:
            log.info("%s: %s needs a passphrase; trying ssh-agent", ep.name, path)
        except (paramiko.SSHException, OSError, ValueError) as exc:
            log.warning("%s: cannot read identity file %s: %s", ep.name, path, exc)
    if os.environ.get("SSH_AUTH_SOCK"):
        with contextlib.suppress(paramiko.SSHException, OSError):
            keys += [(f"agent key {fingerprint(k)}", k) for k in paramiko.Agent().get_keys()]
    return keys


def authenticate(ep: Endpoint, transport: paramiko.Transport) -> None:
    """Public-key auth with each candidate key. Raises AuthFailed (not retried) or HostUnreachable."""
    keys = _load_keys(ep)
    if not keys:
        raise AuthFailed(ep.name, ep.user, "no identity file and no ssh-agent key found")
    for label, key in keys:
        try:
            transport.auth_publickey(ep.user, key)
        except paramiko.AuthenticationException:
            continue
        except NET_ERRORS as exc:
            raise _translate(ep.name, exc, "during authentication") from None
        if transport.is_authenticated():
            log.debug("%s: authenticated as %s with %s", ep.name, ep.user, label)
            return
    tried = ", ".join(label for label, _ in keys)
    raise AuthFailed(ep.name, ep.user, f"server refused every key (tried {tried})")


class _Connection:
    """One authenticated paramiko Transport plus its liveness monitor thread."""

    def __init__(self, ep: Endpoint, transport: paramiko.Transport, dead_after_s: float) -> None:
        self.ep, self.transport, self.dead_after_s = ep, transport, dead_after_s
        self._stop = threading.Event()
        self._probe_since: float | None = None
        transport.set_keepalive(max(1, int(ep.keepalive_s)))
        self._monitor = threading.Thread(
            target=self._watch, name=f"orch-ssh-liveness-{ep.name}", daemon=True
        )
        self._monitor.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.ep.keepalive_s) and self.transport.is_active():
            self._probe_since = time.monotonic()
            # want-reply: sshd answers with REQUEST_FAILURE; returns early when the transport closes
            self.transport.global_request("keepalive@openssh.com", wait=True)
            self._probe_since = None

    def alive(self) -> bool:
        """Transport up and no liveness probe outstanding for ``dead_after_s`` or longer."""
        since = self._probe_since
        late = since is not None and time.monotonic() - since >= self.dead_after_s
        return self.transport.is_active() and not late

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self.transport.close()
        if self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2)


class SshTransport(Transport):
    """Run commands on one SSH host over a single pooled connection (thread-safe).

    Args:
        host: the hosts.yaml entry; ``ssh_config``/``proxy_jump`` are honoured.
        jump: the last jump host's transport (default: one per hop of ``ep.via``, nested).
        ssh_config_path: the ssh config read alone, like ``ssh -F`` (default ``~/.ssh/config``
            then ``/etc/ssh/ssh_config``).
        endpoint: the resolved settings to use as they are (a hop's; default resolves ``host``).
        connect_attempts: tries per connect (exponential backoff, connection errors only).
        dead_after_s: an unanswered liveness probe older than this kills the connection
            (default ``3 * keepalive_s``, at least 10 s: a busy sshd answers late).
        max_channels: concurrent channels on the connection (sshd MaxSessions).
    """

    def __init__(
        self,
        host: HostConfig,
        *,
        jump: SshTransport | None = None,
        ssh_config_path: Path | None = None,
        endpoint: Endpoint | None = None,
        connect_attempts: int = 3,
        dead_after_s: float | None = None,
        max_channels: int = MAX_CHANNELS,
    ) -> None:
        self.host = host
        self.name = host.name
        self.ep = endpoint or resolve(host, ssh_config_path)
        self._owned = None if jump else jump_transport(self.ep)  # closed with this one
        self._jump = jump or self._owned
        self._attempts = max(1, connect_attempts)
        self._dead_after_s = dead_after_s or max(10.0, 3 * self.ep.keepalive_s)
        self._slots = threading.BoundedSemaphore(max_channels)
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self.connects = 0  # connections made so far (tests and benchmarks read it)

    # -- connection ------------------------------------------------------------------------

    def _connect_once(self) -> _Connection:
        sock = open_socket(self.ep, self._jump)
        transport = handshake(self.ep, sock)
        try:
            check_host_key(self.ep, transport.get_remote_server_key())
            authenticate(self.ep, transport)
        except BaseException:
            transport.close()
            raise
        self.connects += 1
        log.debug("%s: connected to %s:%s", self.name, self.ep.address, self.ep.port)
        return _Connection(self.ep, transport, self._dead_after_s)

    def connection(self) -> paramiko.Transport:
        """The live pooled transport, connecting (with backoff) or replacing a dead one."""
        with self._lock:
            if self._conn is not None and not self._conn.alive():
                log.info("%s: pooled connection is dead; reconnecting", self.name)
                self._conn.close()
                self._conn = None
            if self._conn is None:
                retrying = Retrying(
                    stop=stop_after_attempt(self._attempts),
                    wait=wait_exponential(multiplier=0.25, max=4),
                    retry=retry_if_exception_type(HostUnreachable),
                    reraise=True,
                )
                self._conn = retrying(self._connect_once)
            return self._conn.transport

    def alive(self) -> bool:
        """Whether a pooled connection exists and passes the liveness check (no I/O)."""
        conn = self._conn
        return conn is not None and conn.alive()

    def _drop(self, transport: paramiko.Transport) -> None:
        with self._lock:
            if self._conn is not None and self._conn.transport is transport:
                self._conn.close()
                self._conn = None

    def _check(self, transport: paramiko.Transport, doing: str) -> None:
        conn = self._conn
        if conn is None or conn.transport is not transport or not conn.alive():
            self._drop(transport)
            raise HostUnreachable(self.name, f"connection lost {doing}")

    def open_tunnel(self, address: str, port: int, timeout_s: float) -> paramiko.Channel:
        """A ``direct-tcpip`` channel to ``address:port`` through this host (for ProxyJump)."""
        for attempt in (1, 2):
            transport = self.connection()
            try:
                return transport.open_channel(
                    "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout_s
                )
            except paramiko.ChannelException as exc:
                raise HostUnreachable(
                    self.name, f"jump to {address}:{port} refused: {exc}"
                ) from None
            except NET_ERRORS as exc:
                self._drop(transport)
                if attempt == 2:
                    raise _translate(
                        self.name, exc, f"opening a tunnel to {address}:{port}"
                    ) from None
        raise AssertionError("unreachable")

    def _open_session(self, deadline: float, command: str, timeout: float) -> paramiko.Channel:
        """A session channel holding one slot (released by :meth:`_release`)."""
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CommandTimeout(self.name, command, timeout)
        try:
            attempt, net_failures = 0, 0
            while True:
                attempt += 1
                transport = self.connection()
                open_timeout = max(0.1, min(deadline - time.monotonic(), self._dead_after_s))
                try:
                    return transport.open_session(timeout=open_timeout)
                except NET_ERRORS as exc:
                    if not _refused(exc, transport):
                        self._drop(transport)
                        net_failures += 1
                        if "Timeout opening channel" in str(exc) or net_failures > 1:
                            raise _translate(self.name, exc, "opening a channel") from None
                        continue
                    # sshd frees a closed session only once its process is reaped: wait, retry
                    # (nothing has run yet), until the command's own deadline
                    pause = min(0.05 * 2**attempt, 0.5)
                    if time.monotonic() + pause >= deadline:
                        raise HostUnreachable(self.name, f"channel refused: {exc}") from None
                    time.sleep(pause)
        except BaseException:
            self._slots.release()
            raise

    def _release(self, chan: paramiko.Channel) -> None:
        """Close ``chan`` (ending its command first if still running) and free its slot."""
        if not (chan.closed or chan.exit_status_ready()):
            with contextlib.suppress(Exception):
                chan.shutdown_write()  # EOF on the lifeline: WATCHED sends TERM to the command
        with contextlib.suppress(Exception):
            chan.close()
        self._slots.release()

    # -- Transport -------------------------------------------------------------------------

    @staticmethod
    def command(
        argv: Sequence[str], env: Mapping[str, str] | None, *, watched: bool = False
    ) -> str:
        """The exact line sent to the remote shell for ``argv`` with ``env``.

        ``watched``: the command's stdin is /dev/null and the channel's stdin is the
        lifeline (see ``WATCHED``); otherwise the channel's stdin is the command's.

        >>> SshTransport.command(["echo", "a b"], {"X": "1"})
        'sh -c \\'"$@"; exit "$?"\\' sh env X=1 echo \\'a b\\''
        """
        script = WATCHED if watched else SIGNAL_SAFE
        return command_line(["sh", "-c", script, "sh", *with_env(argv, env)])

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> Result:
        """Run ``argv`` on the host; see :meth:`Transport.run`.

        Past ``max_output_bytes`` of stdout the channel is closed (as on a timeout) and
        the Result is ``truncated``: held memory stays ~``max_output_bytes`` plus
        paramiko's window (2 MiB) whatever the command prints.

        Raises:
            CommandTimeout: not finished within ``timeout`` s. The channel is closed and,
                without ``stdin``, the command gets SIGTERM (with ``stdin``, SIGPIPE when it
                next writes); it may still run.
            HostUnreachable: connect failed, or the connection died (then the command may
                have run: it is never re-sent).
            HostKeyUnknown, HostKeyChanged, AuthFailed: see the module doc.
        """
        command = self.command(argv, env, watched=stdin is None)
        shown = command_line(list(argv))
        deadline = time.monotonic() + timeout
        chan = self._open_session(deadline, shown, timeout)
        transport = chan.get_transport()
        try:
            try:
                chan.exec_command(command)
            except NET_ERRORS as exc:
                self._drop(transport)
                raise _translate(self.name, exc, f"starting {shown!r}") from None
            out, err, status, truncated = self._drain(
                chan, transport, stdin, deadline, shown, timeout, max_output_bytes
            )
        finally:
            self._release(chan)
        return Result(status, out, err, truncated)

    def _drain(
        self,
        chan: paramiko.Channel,
        transport: paramiko.Transport,
        stdin: bytes | None,
        deadline: float,
        shown: str,
        timeout: float,
        limit: int | None = None,
    ) -> tuple[bytes, bytes, int | None, bool]:
        out, err = bytearray(), bytearray()
        pending = memoryview(stdin or b"")
        if stdin is not None and not pending:
            chan.shutdown_write()
        while True:
            busy = False
            while chan.recv_ready():
                chunk = chan.recv(READ_CHUNK)
                if limit is not None and len(out) + len(chunk) > limit:
                    out += chunk[: limit - len(out)]
                    status = chan.exit_status if chan.exit_status_ready() else -1
                    return bytes(out), bytes(err), (None if status == -1 else status), True
                out += chunk
                busy = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(READ_CHUNK)
                if limit is not None:
                    del err[: max(0, len(err) - limit)]
                busy = True
            if pending and chan.send_ready():
                try:
                    sent = chan.send(pending[:32768].tobytes())
                except (OSError, EOFError):  # remote closed its stdin: the rest is moot
                    sent = len(pending)
                pending = pending[sent:]
                if not pending:
                    with contextlib.suppress(OSError, EOFError):
                        chan.shutdown_write()
                busy = True
            finished = chan.closed or (chan.eof_received and chan.exit_status_ready())
            if finished and not (chan.recv_ready() or chan.recv_stderr_ready()):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(self.name, shown, timeout)
            self._check(transport, f"while running {shown!r}")
            if busy:
                continue
            if chan.eof_received:
                chan.status_event.wait(min(0.5, remaining))
            else:
                select.select([chan], [], [], min(0.01 if pending else 0.5, remaining))
        status = chan.exit_status if chan.exit_status_ready() else -1
        if status == -1 and chan.closed and not transport.is_active():
            self._drop(transport)
            raise HostUnreachable(self.name, f"connection lost while running {shown!r}")
        return bytes(out), bytes(err), (None if status == -1 else status), False

    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        max_line_bytes: int | None = None,
    ) -> LineStream:
        """Start ``argv``; stdout as lines. Holds one channel slot until closed.

        A line over ``max_line_bytes`` is discarded as it arrives and ``readline``
        raises ``OutputTooLarge`` in its place; the stream goes on.
        """
        shown = command_line(list(argv))
        chan = self._open_session(time.monotonic() + self.ep.connect_timeout_s, shown, 0.0)
        try:
            chan.exec_command(self.command(argv, env, watched=True))
        except NET_ERRORS as exc:
            self._release(chan)
            self._drop(chan.get_transport())
            raise _translate(self.name, exc, f"starting {shown!r}") from None
        except BaseException:
            self._release(chan)
            raise
        return SshLineStream(self, chan, shown, max_line_bytes)

    def put(self, data: bytes, path: str, *, mode: int = 0o644, timeout: float = 60.0) -> None:
        """Write ``data`` to ``path`` atomically: a temp file beside it, chmod, then ``mv``.

        Raises:
            CommandFailed: the remote side could not write (no parent directory, permissions).
        """
        tmp = f"{path}.orch-tmp-{uuid.uuid4().hex[:12]}"
        script = 'cat > "$1" && chmod "$2" "$1" && mv -f "$1" "$3" || { rm -f "$1"; exit 1; }'
        argv = ["sh", "-c", script, "sh", tmp, f"{mode:o}", path]
        res = self.run(argv, timeout=timeout, stdin=data)
        if not res.ok:
            raise CommandFailed(self.name, f"write {path}", res.exit_status, res.err)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if self._owned is not None:
            self._owned.close()

    def __repr__(self) -> str:
        return f"SshTransport({self.name!r}, {self.ep.user}@{self.ep.address}:{self.ep.port})"


class SshLineStream(LineStream):
    """stdout of a remote command as lines; stderr drained into ``stderr_tail``.

    A dropped connection ends the stream with ``exit_status`` ``None`` and ``dropped`` True.
    """

    def __init__(
        self,
        owner: SshTransport,
        chan: paramiko.Channel,
        shown: str,
        max_line_bytes: int | None = None,
    ) -> None:
        self._owner, self._chan, self._shown = owner, chan, shown
        self._transport = chan.get_transport()
        self._max_line_bytes = max_line_bytes
        self._buf = LineBuffer(max_line_bytes)
        self._eof = False
        self._closed = False
        self.dropped = False
        self.stderr_tail = b""

    def _pump(self) -> bool:
        busy = False
        while self._chan.recv_stderr_ready():
            self.stderr_tail = (self.stderr_tail + self._chan.recv_stderr(READ_CHUNK))[
                -STDERR_TAIL_BYTES:
            ]
            busy = True
        while self._chan.recv_ready() and not self._buf.ready:  # a line ready: hand it out
            self._buf.feed(self._chan.recv(READ_CHUNK))
            busy = True
        return busy

    def readline(self, timeout: float) -> str | None:
        """Next stdout line; ``None`` at the end; ``CommandTimeout`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            if self._closed:
                return None
            line = pop_line(
                self._buf, self._eof, self._owner.name, self._shown, self._max_line_bytes
            )
            if line is not None:
                return line
            if self._eof:
                self._finish()
                return None
            if self._pump():
                continue
            if self._chan.eof_received or self._chan.closed:
                self._pump()
                self._eof = not self._chan.recv_ready()
                continue
            try:
                self._owner._check(self._transport, f"while streaming {self._shown!r}")
            except HostUnreachable:
                self.dropped = True
                self._eof = True
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(self._owner.name, self._shown, timeout)
            select.select([self._chan], [], [], min(remaining, 0.5))

    def _finish(self) -> None:
        if not self.dropped:
            self._chan.status_event.wait(2.0)
        if self._chan.exit_status_ready() and self._chan.exit_status != -1:
            self.exit_status = self._chan.exit_status
        elif not self._transport.is_active():
            self.dropped = True
        self.close()

    def __iter__(self) -> Iterator[str]:
        while (line := self.readline(timeout=365 * 86400.0)) is not None:
            yield line

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner._release(self._chan)


def jump_transport(ep: Endpoint) -> SshTransport | None:
    """The transport to ``ep``'s last jump host (it builds its own hops in turn), or None."""
    return SshTransport(hop_host(ep.via), endpoint=ep.via) if ep.via is not None else None
