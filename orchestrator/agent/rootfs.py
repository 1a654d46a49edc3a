"""Reading a container's files from the host, without ever reading a host file instead.

A running container's files are under ``/proc/<init-pid>/root/`` on the host, but a path
through it follows an absolute symlink relative to the HOST root: a container's root user
could plant ``runs/current/train.log -> /etc/shadow`` and have the host's file shipped to
the operator, into alerts and bundles. So every path is resolved INSIDE the container's
root: ``openat2(2)`` with ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`` (Linux >= 5.6, through
ctypes: Python has no binding), else a walker here that resolves one component at a
time with ``O_PATH | O_NOFOLLOW``, reads each symlink itself and resolves it against the
container's root, and clamps ``..`` at that root, as ``RESOLVE_IN_ROOT`` does.

Only regular files are read and directories listed: a FIFO, socket or device node the
container planted is refused before it is opened for reading (the final open goes through
the ``O_PATH`` descriptor already checked, ``/proc/self/fd/N``), so nothing blocks on it
and no device is opened. Every refusal is an :class:`OSError` (``ELOOP``, ``EXDEV``,
``EINVAL``...), the same data to the caller as a missing file.

Equivalent: ``nsenter -t PID -m -r cat PATH`` (but nothing runs inside the container's
namespaces and no container binary runs with the host's privileges).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from orchestrator.agent.cgroups import read_fd

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
SYS_OPENAT2 = 437
"""openat2's number: the same on every architecture (syscalls from 424 on share one table)."""
MAX_HOPS = 40
"""Symlinks one resolution may follow before ``ELOOP`` (Linux's own limit)."""


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


_syscall: Callable[..., int] | None = None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2); raises ``OSError`` (``ENOSYS`` where the kernel or a filter lacks it)."""
    global _syscall
    if _syscall is None:
        fn = ctypes.CDLL(None, use_errno=True).syscall
        fn.restype = ctypes.c_long
        fn.argtypes = (
            ctypes.c_long,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
        )
        _syscall = fn
    how = _OpenHow(flags, 0, resolve)
    fd = _syscall(SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.addressof(how), _HOW_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


_HOW_SIZE = ctypes.sizeof(_OpenHow)


def split_path(path: str) -> list[str]:
    """The components of ``path`` (leading ``/`` and ``.`` dropped; ``..`` kept).

    >>> split_path("/root//dflash/./runs/../x")
    ['root', 'dflash', 'runs', '..', 'x']
    """
    return [p for p in path.split("/") if p and p != "."]


class ContainerRoot:
    """A container's root directory, opened once from ``/proc/<pid>/root`` (or any directory
    for tests), with every path below resolved inside it.

    Args:
        root: ``/proc/<init-pid>/root`` or a directory.
        use_openat2: ``None`` tries openat2 and falls back to the walker on ``ENOSYS``/``EPERM``;
            ``False`` always walks (tests both ways).

    Raises:
        OSError: the root cannot be opened (the container stopped: ``ENOENT``).
    """

    def __init__(self, root: str, *, use_openat2: bool | None = None) -> None:
        self.root = root
        self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._openat2 = use_openat2

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ContainerRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- resolution -------------------------------------------------------------------------

    def resolve(self, path: str) -> int:
        """An ``O_PATH`` descriptor of ``path`` resolved inside the root (the caller closes it).

        Raises:
            OSError: missing (``ENOENT``), a symlink loop (``ELOOP``), a magic link (``ELOOP``
                or ``EXDEV``), or a component that is not a directory (``ENOTDIR``).
        """
        rel = "/".join(split_path(path)) or "."
        if self._openat2 is not False:
            try:
                fd = _openat2(
                    self.fd, rel, os.O_PATH | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
                )
                self._openat2 = True
                return fd
            except OSError as exc:
                if self._openat2 is True or exc.errno not in (errno.ENOSYS, errno.EPERM):
                    raise
                self._openat2 = False
        return self._walk(split_path(path))

    def _walk(self, parts: list[str]) -> int:
        """Resolve ``parts`` one component at a time; ``..`` never climbs above the root."""
        stack = [os.dup(self.fd)]  # directories from the root down to the current one
        todo = list(parts)
        hops = 0
        try:
            while todo:
                name = todo.pop(0)
                if name == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    target = os.readlink(name, dir_fd=stack[-1])
                    os.close(fd)
                    hops += 1
                    if hops > MAX_HOPS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                    todo[:0] = split_path(target)
                    continue
                if todo and not stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
                stack.append(fd)
            return stack.pop()
        finally:
            for fd in stack:
                os.close(fd)

    # --- reading ----------------------------------------------------------------------------

    def stat(self, path: str) -> os.stat_result:
        """``stat`` of ``path`` inside the root (symlinks followed inside it)."""
        fd = self.resolve(path)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def open(self, path: str) -> BinaryIO:
        """``path`` opened for reading; only a regular file (else ``OSError`` ``EINVAL``)."""
        return os.fdopen(self._open_fd(path), "rb")

    def _open_fd(self, path: str) -> int:
        """A read-only descriptor of regular file ``path`` (the caller closes it)."""
        fd = self.resolve(path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            rd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(fd)
        got = os.fstat(rd)
        if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):  # never: the same open file
            os.close(rd)
            raise OSError(errno.ESTALE, "file changed while opened", path)
        return rd

    def read(self, path: str, limit: int = 65536) -> tuple[bytes | None, float | None]:
        """(content up to ``limit`` bytes, mtime) of a small file; ``(None, None)`` when it is
        missing or refused. Read with ``os.read`` (no file object: a check reads ~50)."""
        try:
            rd = self._open_fd(path)
        except OSError:
            return None, None
        try:
            return read_fd(rd, limit), os.fstat(rd).st_mtime
        except OSError:
            return None, None
        finally:
            os.close(rd)

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path`` (``OSError`` when it is none)."""
        fd = self.resolve(path)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            os.close(fd)
        try:
            return os.listdir(dfd)
        finally:
            os.close(dfd)

    def statvfs(self, path: str) -> os.statvfs_result:
        """statvfs of the file system holding ``path`` inside the root."""
        fd = self.resolve(path)
        try:
            return os.fstatvfs(fd)
        finally:
            os.close(fd)

    def opener(self) -> Callable[[str], BinaryIO]:
        """:meth:`open` as a plain function (for readers that take an opener)."""
        return self.open
