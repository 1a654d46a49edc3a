"""The ``python3 -S -c`` scripts that start the agent from its bundle directory.

:data:`BOOT` (containers): the bundle's marker and python >= 3.10, then the agent's ``main``.
:data:`HOST_BOOT` (a Proxmox host): first the directories the bundle lives in (the SSH
user's own, writable by nobody else), then those checks, then, for ``host-observe``, the
resident observer's client (:mod:`orchestrator.agent.resident`): the argv goes to the
resident over its unix socket and its answer is printed as is; on any failure the one-shot
agent runs as before and a resident is started for the next check (once per failing check;
the resident's lock keeps it to one). The client imports ``_socket`` and ``zlib`` only.
"""

from __future__ import annotations

from orchestrator.agent.resident import ACK, ACK_S, REFUSED, REPLY_S, RESIDENT_BOOT, SKIP_ENV
from orchestrator.remote import deploy

BUNDLE_MISSING_EXIT = 97
"""The boot's exit status when the bundle has no verified marker or python is older than 3.10."""

# Python-2-safe up to the import, so an old python fails with a SyntaxError we can recognise.
_CHECKS = (
    "import os, sys; d = sys.argv.pop(1)\n"
    "if sys.version_info < (3, 10):\n"
    "    sys.stderr.write('orch agent: python %d.%d is too old\\n' % sys.version_info[:2]); sys.exit(97)\n"
    "if not os.path.isfile(os.path.join(d, '__MARKER__')):\n"
    "    sys.stderr.write('orch agent bundle missing: %s\\n' % d); sys.exit(97)\n"
).replace("__MARKER__", deploy.MARKER)
_RUN = "sys.path.insert(0, d); from orchestrator.agent.__main__ import main; sys.exit(main())"
BOOT = _CHECKS + _RUN

HOST_DIR_REFUSED = 96
"""The host boot's exit status when ``agent_dir`` is not the SSH user's own."""

# Before everything: the directories the bundle lives in must be the user's own and
# writable by nobody else (an agent planted there would run as root on the host).
_HOST_DIRS = (
    "import os, stat, sys\n"
    "d = sys.argv[1]; top = os.path.dirname(os.path.dirname(d))\n"
    "for p in (top, os.path.dirname(d), d):\n"
    "    try: st = os.lstat(p)\n"
    "    except OSError: continue\n"
    "    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:\n"
    "        sys.stderr.write('orch host agent: %s must be a directory of uid %d that nobody "
    "else may write (mode %o)\\n' % (p, os.geteuid(), st.st_mode & 0o7777)); sys.exit(96)\n"
)

# The resident's client: (socket name, refused, (rc, stdout, stderr) or None). Its socket name
# is orchestrator.agent.resident.socket_name's; tests/agent/test_resident.py holds them equal.
_CLIENT = r"""
def _orch_ask(d):
    import _socket, zlib
    cwd = os.getcwd()
    kept = sorted('%s=%s' % kv for kv in os.environ.items()
                  if kv[0] not in __SKIP__ and not kv[0].startswith('SSH_'))
    text = '\0'.join([sys.executable, cwd] + kept).encode('utf-8', 'surrogateescape')
    name = 'observer-%08x.sock' % zlib.crc32(text)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(__ACK_S__)
        os.chdir(d)
        try:
            s.connect(name)
        finally:
            os.chdir(cwd)
        req = '\0'.join(sys.argv[1:]).encode('utf-8', 'surrogateescape')
        s.sendall(('%d\n' % len(req)).encode() + req)
        first = s.recv(1)
        if first != __ACK__:
            return name, first == __REFUSED__, None
        s.settimeout(__REPLY_S__)
        parts = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            parts.append(chunk)
        head, _, body = b''.join(parts).partition(b'\n')
        f = head.split()
        if len(f) != 4 or f[0] != b'R' or len(body) != int(f[2]) + int(f[3]):
            return name, False, None
        return name, False, (int(f[1]), body[:int(f[2])], body[int(f[2]):])
    except Exception:
        return name, False, None
    finally:
        s.close()

def _orch_spawn(d, name):
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 4096)
            os.execv(sys.executable, [sys.executable, '-S', '-c', __RESIDENT__, d, name])
    finally:
        os._exit(0)

def _orch_write(fd, data):
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass

if sys.argv[1:2] == ['host-observe']:
    try:
        _name, _refused, _got = _orch_ask(d)
    except Exception:
        _name, _refused, _got = None, False, None
    if _got is not None:
        _orch_write(1, _got[1]); _orch_write(2, _got[2]); sys.exit(_got[0])
    if _name is not None and not _refused:
        try:
            _orch_spawn(d, _name)
        except Exception:
            pass
"""
for _key, _value in (
    ("__SKIP__", repr(SKIP_ENV)),
    ("__ACK_S__", repr(ACK_S)),
    ("__REPLY_S__", repr(REPLY_S)),
    ("__ACK__", repr(ACK)),
    ("__REFUSED__", repr(REFUSED)),
    ("__RESIDENT__", repr(RESIDENT_BOOT)),
):
    _CLIENT = _CLIENT.replace(_key, _value)

HOST_BOOT = _HOST_DIRS + _CHECKS + _CLIENT.lstrip("\n") + _RUN
"""The host agent's boot: directory checks, bundle checks, the resident's client, the agent."""
