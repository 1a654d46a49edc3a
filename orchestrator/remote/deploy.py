"""Ship the agent into a container: build a bundle, send it once per content hash, verify it.

The bundle holds the operator's stdlib-only modules the agent shares (the whole
``orchestrator/wire`` package: :data:`SHARED`), the ``orchestrator/agent``
package and copies of the operator's installed pure-Python ``pynvml`` and ``libtmux`` (the
session's lifecycle; each observation runs ``tmux`` itself), so the container needs
neither network nor pip. It lands in ``<workdir>/.orch/agent-<hash>/``
(``PYTHONPATH`` for the agent). :func:`make_bundle` builds any other bundle the
same way (the launch's trainer bundle lands in ``.orch/trainer-<hash>/``).

Transfer: one deterministic ``tar.gz`` piped over stdin to ``python3 -c`` in the
container, which unpacks into a temp dir, recomputes the hash over the files,
and renames the dir into place only when it matches. A later :func:`ensure_agent`
costs one small command (check python + marker) and sends nothing if the hash
is already there; within one orch process the answer is cached.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import logging
import re
import tarfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import AgentError, OrchError, PythonTooOld
from orchestrator.transport.base import Transport

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 10)
"""The oldest Python the agent runs on: the bundled libtmux (0.6x) needs 3.10 at import time
(``X | Y`` unions at run time) and every shipped dataclass is ``slots=True`` (3.10)."""
MARKER = ".orch-bundle"
"""The file a verified bundle directory holds (its hash); every script below names it through
``__MARKER__``, replaced with this constant."""
SHARED = "wire"
"""The package of stdlib-only modules the agent imports too (``orchestrator/wire``), shipped
whole beside ``orchestrator/__init__.py``: no list of modules to drift."""
LIBTMUX_SKIP = ("test", "pytest_plugin.py")
"""libtmux's test helpers: the agent never imports them."""

# Runs under whatever python the container has, so it is Python-2-safe syntax.
_CHECK = r"""
import os, sys
v = sys.version_info
d = sys.argv[1]
try:
    ok = open(os.path.join(d, '__MARKER__')).read().strip() == sys.argv[2]
except Exception:
    ok = False
sys.stdout.write('%d.%d.%d %s\n' % (v[0], v[1], v[2], ok and 'present' or 'absent'))
""".replace("__MARKER__", MARKER)

_UNPACK = r"""
import hashlib, io, os, shutil, sys, tarfile
dest, want = sys.argv[1], sys.argv[2]
parent = os.path.dirname(dest)
os.makedirs(parent, exist_ok=True)
tmp = '%s.tmp-%d' % (dest, os.getpid())
data = sys.stdin.buffer.read()
try:
    with tarfile.open(fileobj=io.BytesIO(data), mode='r:gz') as tar:
        names = []
        for m in tar.getmembers():
            if not m.isfile() or m.name.startswith('/') or '..' in m.name.split('/'):
                sys.stderr.write('refusing bundle member %r\n' % m.name)
                sys.exit(3)
            names.append(m.name)
        tar.extractall(tmp, **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))
    h = hashlib.sha256()
    for name in sorted(names):
        with open(os.path.join(tmp, name), 'rb') as fh:
            body = fh.read()
        h.update(name.encode() + b'\0' + str(len(body)).encode() + b'\0' + body)
    got = h.hexdigest()[:16]
    if got != want:
        shutil.rmtree(tmp, ignore_errors=True)
        sys.stderr.write('bundle hash mismatch: got %s, want %s\n' % (got, want))
        sys.exit(4)
    with open(os.path.join(tmp, '__MARKER__'), 'w') as fh:
        fh.write(want + '\n')
    try:
        os.rename(tmp, dest)
    except OSError:
        if not os.path.isfile(os.path.join(dest, '__MARKER__')):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
except OSError as exc:  # a full disk, a read-only workdir: no tmp-PID directory is left
    shutil.rmtree(tmp, ignore_errors=True)
    sys.stderr.write('cannot unpack the bundle into %s: %s\n' % (parent, exc))
    sys.exit(5)
except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
sys.stdout.write('ok %s\n' % want)
""".replace("__MARKER__", MARKER)


@dataclass(frozen=True, slots=True)
class Bundle:
    """Files (relative path -> bytes), their hash and the tar.gz that carries them.

    ``kind`` names the directory it lands in: ``<workdir>/.orch/<kind>-<hash>/``.
    """

    files: dict[str, bytes]
    hash: str
    tarball: bytes
    kind: str = "agent"

    @property
    def dirname(self) -> str:
        return f"{self.kind}-{self.hash}"


def bundle_hash(files: Mapping[str, bytes]) -> str:
    """16 hex chars of SHA-256 over sorted (path, size, content); the remote side recomputes it.

    >>> bundle_hash({"a.py": b"x"}) == bundle_hash({"a.py": b"x"}) != bundle_hash({"a.py": b"y"})
    True
    """
    h = hashlib.sha256()
    for name in sorted(files):
        body = files[name]
        h.update(name.encode() + b"\0" + str(len(body)).encode() + b"\0" + body)
    return h.hexdigest()[:16]


def make_bundle(
    files: Mapping[str, bytes] | Iterable[tuple[str, str | Path]], kind: str = "agent"
) -> Bundle:
    """Build a :class:`Bundle` from ``{arcname: bytes}`` or ``(arcname, path)`` pairs.

    The tarball is deterministic (sorted names, mtime 0, mode 0644), so the same
    files always give the same bytes and the same hash. Reads each path once;
    an unreadable path raises ``OSError``.

    >>> b = make_bundle({"t/a.py": b"x"}, kind="trainer")
    >>> b.dirname == f"trainer-{bundle_hash({'t/a.py': b'x'})}"
    True
    >>> make_bundle({"t/a.py": b"x"}).tarball == b.tarball
    True
    """
    if isinstance(files, Mapping):
        data = dict(files)
    else:
        data = {name: Path(path).read_bytes() for name, path in files}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data[name]), 0, 0o644
            tar.addfile(info, io.BytesIO(data[name]))
    # tarfile's "w:gz" stamps the current time into the gzip header; mtime=0 keeps bytes stable.
    tarball = gzip.compress(buf.getvalue(), compresslevel=6, mtime=0)
    return Bundle(files=data, hash=bundle_hash(data), tarball=tarball, kind=kind)


def package_files(root: Path, prefix: str, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every ``*.py`` under ``root`` (no ``__pycache__``, nothing under ``skip``) as ``prefix/rel``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel or any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        out[f"{prefix}/{rel}"] = path.read_bytes()
    return out


def _installed(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise OrchError(
            f"{module} is not installed on this machine; pip install orch's dependencies"
        )
    return Path(spec.origin)


_cache_lock = threading.Lock()
_bundle: Bundle | None = None


def build_bundle(include_pynvml: bool = True) -> Bundle:
    """Collect the agent's files from this installation (cached per process when complete).

    ``include_pynvml=False`` leaves pynvml out: the agent then falls back to nvidia-smi.
    """
    global _bundle
    if include_pynvml and _bundle is not None:
        return _bundle
    here = Path(__file__).resolve().parents[1]
    files: dict[str, bytes] = {"orchestrator/__init__.py": (here / "__init__.py").read_bytes()}
    files.update(package_files(here / SHARED, f"orchestrator/{SHARED}"))
    files.update(package_files(here / "agent", "orchestrator/agent"))
    if include_pynvml:
        files["pynvml.py"] = _installed("pynvml").read_bytes()
    files.update(package_files(_installed("libtmux").parent, "libtmux", skip=LIBTMUX_SKIP))
    bundle = make_bundle(files)
    if include_pynvml:
        with _cache_lock:
            _bundle = bundle
    return bundle


def parse_python_version(text: str) -> tuple[int, ...] | None:
    """The version in ``python --version``'s answer (``None`` when there is none).

    >>> parse_python_version("Python 3.9.2\\n"), parse_python_version("Python 3.13.0rc1")
    ((3, 9, 2), (3, 13, 0))
    >>> parse_python_version("bash: python3: command not found") is None
    True
    """
    m = re.search(r"\bPython (\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def too_old(
    where: str, python: str, version: Sequence[int], *, host: bool = False
) -> tuple[str, str]:
    """(what is wrong, what to do) when ``python`` at ``where`` is older than :data:`MIN_PYTHON`:
    the agent's and doctor's one message. ``host``: a Proxmox host (the host probe), else a
    container (``python:`` in hosts.yaml picks another interpreter there).

    >>> print(*too_old("ct200", "python3", (3, 9, 2)), sep="\\n")
    ct200: python3 is Python 3.9.2; orch's agent needs Python >= 3.10 (Debian 11, Ubuntu 20.04 and Proxmox VE 7 ship 3.9)
    install Python >= 3.10 in ct200 and point python: of ct200 in hosts.yaml at it (e.g. python: /usr/local/bin/python3.11), or upgrade the container to Debian 12 or Ubuntu 22.04
    >>> print(too_old("pve1", "python3", (3, 9, 2), host=True)[1])
    upgrade pve1 to Proxmox VE 8 (Python 3.11), or point host_python: of pve1 in hosts.yaml at a Python >= 3.10 there; until then orch observes each container from inside (pct exec) and goes without the host probe (pct status, kernel events, GPU processes by container)
    """
    need = ".".join(map(str, MIN_PYTHON))
    got = ".".join(map(str, version))
    if host:
        problem = (
            f"{where}: {python} is Python {got}; orch's host observer and host probe need "
            f"Python >= {need} (Proxmox VE 7 ships 3.9)"
        )
        fix = (
            f"upgrade {where} to Proxmox VE 8 (Python 3.11), or point host_python: of {where} "
            f"in hosts.yaml at a Python >= {need} there; until then orch observes each "
            "container from inside (pct exec) and goes without the host probe (pct status, "
            "kernel events, GPU processes by container)"
        )
        return problem, fix
    problem = (
        f"{where}: {python} is Python {got}; orch's agent needs Python >= {need} "
        "(Debian 11, Ubuntu 20.04 and Proxmox VE 7 ship 3.9)"
    )
    fix = (
        f"install Python >= {need} in {where} and point python: of {where} in hosts.yaml at "
        "it (e.g. python: /usr/local/bin/python3.11), or upgrade the container to Debian 12 "
        "or Ubuntu 22.04"
    )
    return problem, fix


def parse_check(text: str) -> tuple[tuple[int, ...], bool]:
    """Parse the check script's answer ``"3.11.7 present"``.

    >>> parse_check("3.11.7 present\\n")
    ((3, 11, 7), True)
    >>> parse_check("2.7.18 absent")
    ((2, 7, 18), False)
    """
    version, _, state = text.strip().partition(" ")
    return tuple(int(x) for x in version.split(".")), state == "present"


_deployed: dict[tuple[str, str, str, str], str] = {}


def forget(transport: Transport, workdir: str) -> None:
    """Drop the cached "already deployed" answers for this place (after the bundle vanished)."""
    with _cache_lock:
        for key in [k for k in _deployed if k[0] == transport.name and k[1] == workdir]:
            del _deployed[key]


def bundle_path(workdir: str, bundle: Bundle) -> str:
    """Where ``bundle`` lives in the container: ``<workdir>/.orch/<kind>-<hash>``.

    >>> bundle_path("/w/", make_bundle({"a.py": b""}, kind="t")).startswith("/w/.orch/t-")
    True
    """
    return f"{workdir.rstrip('/')}/.orch/{bundle.dirname}"


def deployed(transport: Transport, workdir: str, python: str, bundle: Bundle) -> str | None:
    """The bundle's path if this process already knows it is in place, else ``None``."""
    with _cache_lock:
        return _deployed.get((transport.name, workdir, python, bundle.hash))


def remember(transport: Transport, workdir: str, python: str, bundle: Bundle) -> str:
    """Record that the bundle is in place (an agent ran from it); return its path."""
    dest = bundle_path(workdir, bundle)
    with _cache_lock:
        _deployed[(transport.name, workdir, python, bundle.hash)] = dest
    return dest


def ensure_agent(
    transport: Transport,
    workdir: str,
    python: str = "python3",
    *,
    bundle: Bundle | None = None,
    timeout_s: float = 60.0,
    host: bool = False,
) -> str:
    """Make sure the current bundle is in ``<workdir>/.orch/agent-<hash>/``; return that path.

    ``host``: the transport reaches a Proxmox host (the probe), not a container; only the
    advice of a too-old python differs (:func:`too_old`).

    Raises:
        AgentError: no ``python`` in the container, or one older than 3.10 (the
            message names what was found and what to do), or the transfer failed or did
            not verify.
        TransportError: the container could not be reached.
    """
    bundle = bundle or build_bundle()
    dest = bundle_path(workdir, bundle)
    known = deployed(transport, workdir, python, bundle)
    if known is not None:
        return known
    res = transport.run([python, "-c", _CHECK, dest, bundle.hash], timeout=timeout_s)
    where = transport.name
    if res.exit_status in (126, 127) or (not res.ok and "not found" in res.err.lower()):
        raise AgentError(
            f"{where}: {python!r} not found {'on the host' if host else 'in the container'} "
            f"(exit {res.exit_status}: {res.err.strip()[-200:] or 'no output'}); install "
            f"python3 >= 3.10 there or set {'host_python' if host else 'python'}: in hosts.yaml"
        )
    try:
        version, present = parse_check(res.out)
    except ValueError:
        raise AgentError(
            f"{where}: could not run {python!r} in the container (exit {res.exit_status}): "
            f"{(res.err or res.out).strip()[-300:] or 'no output'}"
        ) from None
    if version[:2] < MIN_PYTHON:
        raise PythonTooOld("; ".join(too_old(where, python, version, host=host)))
    if not present:
        log.info("%s: sending agent bundle %s (%d bytes)", where, bundle.hash, len(bundle.tarball))
        res = transport.run(
            [python, "-c", _UNPACK, dest, bundle.hash], stdin=bundle.tarball, timeout=timeout_s
        )
        if not res.ok or not res.out.startswith("ok "):
            raise AgentError(
                f"{where}: sending the agent to {dest} failed (exit {res.exit_status}): "
                f"{(res.err or res.out).strip()[-300:] or 'no output'}"
            )
    return remember(transport, workdir, python, bundle)
