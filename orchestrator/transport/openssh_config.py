"""``ssh_config`` read the way OpenSSH 9.2p1 reads it (pure logic, plus reading the files and
running ``Match exec`` commands; no network).

Written from openssh-portable V_9_2_P1: ``readconf.c`` (process_config_line_depth,
match_cfg_line, read_config_file_depth, parse_jump), ``ssh.c`` (main: the HostName
expansion, the second "final" pass, the ProxyJump-made ProxyCommand), ``misc.c``
(argv_split, strdelim, percent_expand, a2port, parse_user_host_port), ``match.c``
(match_pattern, match_pattern_list) and ``sshconnect.c`` (expand_proxy_command):

- Each option takes the FIRST value that applies (a later ``Host`` block never overrides);
  ``IdentityFile`` accumulates (duplicates dropped).
- ``Host`` patterns match the name as given (case-sensitive); ``Match host`` matches the
  HostName-expanded, lowercased one; ``Match final``/``canonical`` (or CanonicalizeHostname
  not ``no``) asks for a second pass with the final host name, filling only what is unset.
- ``Include`` globs (sorted), relative paths under ``~/.ssh`` (user files) or ``/etc/ssh``,
  nested at most :data:`MAX_DEPTH` deep, an Include in an inactive block parses only.
- ``Match exec`` runs ``$SHELL -c COMMAND`` as ssh does (stdin and stdout /dev/null), but
  bounded: past :data:`EXEC_TIMEOUT_S` it is killed and the config refused.
- Bad lines are refused like ssh refuses them (unknown keyword, missing argument, bad port,
  bad Match, unclosed quote): one :class:`ConfigError` naming the file and line.

Not done: DNS canonicalisation (CanonicalizeHostname keeps the name, as ssh does when no
CanonicalDomains entry resolves), and values of options orch does not use are not checked.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.transport.openssh_syntax import (
    CANONICALIZE,
    KEYWORDS,
    a2port,
    argv_split,
    is_addr,
    match_pattern,
    match_pattern_list,
    parse_jump,
    percent_expand,
)

MAX_DEPTH = 16  # readconf.c READCONF_MAX_DEPTH
MAX_FILE_BYTES = 1024 * 1024  # a config file larger than this is refused (not a config)
EXEC_TIMEOUT_S = 10.0
SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
WS = " \t\r\n"


@dataclass(frozen=True, slots=True)
class SshOptions:
    """What ``ssh -G`` prints for a host, for the fields orch uses.

    ``identity_files`` are as written (``~`` and ``%`` tokens unexpanded, like ``ssh -G``);
    ``proxy_jump`` is the raw list or None; ``proxy_command`` is None for none (and whenever
    a ProxyJump applies). ``user_given``: a User line or a preset set the user (else it is
    the local user). ``notes``: things ssh only logs at debug level (an Include matching
    nothing, a missing file).
    """

    host_arg: str
    hostname: str
    port: int
    user: str
    user_given: bool
    identity_files: tuple[str, ...]
    proxy_jump: str | None
    proxy_command: str | None
    notes: tuple[str, ...] = ()


def local_user() -> str:
    """The login name of this process's uid (ssh's ``pw->pw_name``)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", "root")


def _keyword(line: str) -> tuple[str, str]:
    """The keyword and the rest of a line, split like strdelim (whitespace or one ``=``)."""
    line = line.lstrip(WS)
    m = re.match(r'([^ \t\r\n="]*)(.*)', line, re.S)
    assert m is not None
    keyword, rest = m.group(1), m.group(2)
    if rest.startswith("="):
        return keyword, rest[1:].lstrip(WS)
    rest = rest.lstrip(WS)
    if rest.startswith("="):
        rest = rest[1:].lstrip(WS)
    return keyword, rest


@dataclass
class _Reader:
    host: str
    original: str
    config: Path | None
    me: str
    hostname: str | None = None
    port: int | None = None
    user: str | None = None
    jump: str | None = None
    proxy_command: str | None = None
    canonicalize: bool | None = None
    ignore_unknown: str | None = None
    identity: list[str] = field(default_factory=list)
    final_pass: bool = False
    want_final: bool = False
    hostname_at: tuple[str, int] = ("command line", 0)
    notes: list[str] = field(default_factory=list)

    # -- files -----------------------------------------------------------------------------

    def read_all(self) -> None:
        if self.config is not None:
            if not self._read(self.config, 0, True, False, userconf=True, checkperm=False):
                self.notes.append(f"{self.config} does not exist")
            return
        user_config = Path("~/.ssh/config").expanduser()
        self._read(user_config, 0, True, False, userconf=True, checkperm=True)
        self._read(SYSTEM_CONFIG, 0, True, False, userconf=False, checkperm=False)

    def _read(
        self, path: Path, depth: int, active: bool, never: bool, *, userconf: bool, checkperm: bool
    ) -> bool:
        """Process ``path``; False when it does not exist. Raises ConfigError for bad lines."""
        try:
            with path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ConfigError(str(path), None, "", f"cannot read: {exc.strerror or exc}") from None
        if checkperm and ((st.st_uid not in (0, os.getuid())) or st.st_mode & 0o022):
            raise ConfigError(str(path), None, "", "bad owner or permissions (ssh refuses it too)")
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(str(path), None, "", f"larger than {MAX_FILE_BYTES} bytes")
        errors: list[tuple[int, str, str]] = []
        for lineno, raw in enumerate(data.decode(errors="replace").split("\n"), start=1):
            try:
                active = self._line(raw, path, lineno, depth, active, never, userconf)
            except _LineError as exc:
                errors.append((lineno, exc.keyword, exc.problem))
        if errors:
            lineno, keyword, problem = errors[0]
            more = (
                f" ({len(errors)} bad lines in this file; ssh refuses it)"
                if len(errors) > 1
                else ""
            )
            raise ConfigError(str(path), lineno, keyword, problem + more)
        return True

    # -- one line --------------------------------------------------------------------------

    def _line(
        self,
        raw: str,
        path: Path,
        lineno: int,
        depth: int,
        active: bool,
        never: bool,
        userconf: bool,
    ) -> bool:
        """Apply one line; returns the new active state (Host/Match change it)."""
        line = raw[:1] + raw[1:].rstrip(WS + "\f")  # ssh's loop never strips the first char
        keyword, rest = _keyword(line)
        if not keyword or keyword.startswith("#"):
            return active
        keyword = keyword.lower()
        if not rest:
            raise _LineError(keyword, "no argument after keyword")
        if keyword not in KEYWORDS:
            if self.ignore_unknown and match_pattern_list(keyword, self.ignore_unknown, True) == 1:
                return active
            raise _LineError(keyword, "Bad configuration option (not an ssh_config keyword)")
        args = argv_split(rest)
        if args is None:
            raise _LineError(keyword, "invalid quotes")
        if keyword == "host":
            return False if never else self._host(args, keyword)
        if keyword == "match":
            value = self._match(args, path, lineno)
            return False if never else value
        if keyword == "include":
            self._include(args, path, depth, active, never, userconf)
            return active
        self._option(keyword, args, rest, active, path, lineno)
        return active

    def _host(self, args: list[str], keyword: str) -> bool:
        active = False
        for arg in args:
            if not arg:
                raise _LineError(keyword, "empty argument")
            negated = arg.startswith("!")
            if match_pattern(self.host, arg[1:] if negated else arg):
                if negated:
                    return False
                active = True
        return active

    def _include(
        self, args: list[str], path: Path, depth: int, active: bool, never: bool, userconf: bool
    ) -> None:
        for arg in args:
            if not arg:
                raise _LineError("include", "empty argument")
            if arg.startswith("~") and not userconf:
                raise _LineError("include", f"bad include path {arg} (~ in a system file)")
            if not arg.startswith(("/", "~")):
                arg = ("~/.ssh/" if userconf else "/etc/ssh/") + arg
            pattern = os.path.expanduser(arg)
            found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
            found = [f for f in found if os.path.exists(f)]
            if not found:
                if not glob.has_magic(pattern):  # a named file missing (ssh: debug only)
                    self.notes.append(f"{path}: Include {arg}: no such file")
                continue
            if depth + 1 > MAX_DEPTH:
                raise _LineError(
                    "include",
                    f"Include nested more than {MAX_DEPTH} deep (does a file include itself?)",
                )
            for name in found:
                self._read(
                    Path(name),
                    depth + 1,
                    active,
                    never or not active,
                    userconf=userconf,
                    checkperm=True,
                )

    def _option(
        self, keyword: str, args: list[str], rest: str, active: bool, path: Path, lineno: int
    ) -> None:
        if keyword in ("proxycommand", "proxyjump"):
            value = rest.lstrip(WS + "=")
            if keyword == "proxyjump":
                spec = value.split("#")[0].rstrip(WS)
                if spec.lower() != "none" and parse_jump(spec) is None:
                    raise _LineError(keyword, f'Invalid ProxyJump "{value}"')
                self.set_jump(spec, active)
            elif active and self.proxy_command is None and self.jump is None:
                self.proxy_command = value
            return
        if keyword not in ("hostname", "user", "port", "identityfile", "identityfile2"):
            if keyword == "canonicalizehostname":
                if args and args[0].lower() not in CANONICALIZE:
                    raise _LineError(keyword, f'unsupported option "{args[0]}"')
                if active and self.canonicalize is None and args:
                    self.canonicalize = CANONICALIZE[args[0].lower()]
            elif keyword == "ignoreunknown" and active and self.ignore_unknown is None and args:
                self.ignore_unknown = args[0]
            return
        if not args or not args[0]:
            raise _LineError(keyword, "missing argument")
        if len(args) > 1:
            raise _LineError(keyword, "extra arguments at end of line")
        arg = args[0]
        if keyword == "port":
            port = a2port(arg)
            if port <= 0:
                raise _LineError(keyword, f"Bad port '{arg}'")
            if active and self.port is None:
                self.port = port
        elif not active:
            return
        elif keyword == "hostname" and self.hostname is None:
            self.hostname, self.hostname_at = arg, (str(path), lineno)
        elif keyword == "user" and self.user is None:
            self.user = arg
        elif keyword.startswith("identityfile") and arg not in self.identity:
            self.identity.append(arg)

    def set_jump(self, spec: str, active: bool) -> None:
        """readconf.c parse_jump: only when neither ProxyCommand nor ProxyJump is set yet."""
        if active and self.proxy_command is None and self.jump is None:
            self.jump = spec
            if spec.lower() != "none":
                self.proxy_command = "none"

    # -- Match -----------------------------------------------------------------------------

    def match_host(self) -> str:
        if self.final_pass:
            return self.hostname or self.host
        if self.hostname is not None:
            return self.expand_hostname()
        return self.host

    def expand_hostname(self) -> str:
        assert self.hostname is not None
        try:
            return percent_expand(self.hostname, {"h": self.host})
        except ValueError as exc:
            raise ConfigError(
                self.hostname_at[0], self.hostname_at[1] or None, "hostname", str(exc)
            ) from None

    def _match(self, args: list[str], path: Path, lineno: int) -> bool:
        host = self.match_host()
        ruser = self.user or self.me
        result, attributes, i = True, 0, 0
        while i < len(args):
            oattrib = args[i]
            i += 1
            negate = oattrib.startswith("!")
            attrib = (oattrib[1:] if negate else oattrib).lower()
            if attrib == "all":
                if attributes > 1 or i < len(args):
                    raise _LineError(
                        "match", f"'{oattrib}' cannot be combined with other Match attributes"
                    )
                return result and not negate
            attributes += 1
            if attrib in ("canonical", "final"):
                self.want_final = self.want_final or attrib == "final"
                if self.final_pass == negate:
                    result = False
                continue
            if i >= len(args):
                raise _LineError("match", f"Missing Match criteria for {attrib}")
            arg = args[i]
            i += 1
            if attrib == "host":
                hit = match_pattern_list(host.lower(), arg, True) == 1
            elif attrib == "originalhost":
                hit = match_pattern_list(self.original.lower(), arg, True) == 1
            elif attrib == "user":
                hit = match_pattern_list(ruser, arg, False) == 1
            elif attrib == "localuser":
                hit = match_pattern_list(self.me, arg, False) == 1
            elif attrib == "exec":
                if not result:
                    continue
                hit = self._exec(arg, host, ruser, path, lineno)
            else:
                raise _LineError("match", f"Unsupported Match attribute {attrib}")
            if hit == negate:
                result = False
        if attributes == 0:
            raise _LineError("match", "One or more attributes required for Match")
        return result

    def _exec(self, arg: str, host: str, ruser: str, path: Path, lineno: int) -> bool:
        """readconf.c execute_in_shell: ``$SHELL -c CMD``; True when it exits 0."""
        tokens = client_tokens(host, self.port or 22, ruser, self.original, self.me)
        tokens["k"] = host  # match_cfg_line's keyalias: HostKeyAlias, else the host
        try:
            cmd = percent_expand(arg, tokens)
        except ValueError as exc:
            raise _LineError("match", f"exec {arg!r}: {exc}") from None
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            done = subprocess.run(
                [shell, "-c", cmd],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=EXEC_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                str(path), lineno, "match", f"exec {cmd!r} still running after {EXEC_TIMEOUT_S:g} s"
            ) from None
        except OSError as exc:
            raise ConfigError(str(path), lineno, "match", f"exec {cmd!r}: {exc}") from None
        if done.returncode < 0:
            raise ConfigError(str(path), lineno, "match", f"exec {cmd!r} exited abnormally")
        return done.returncode == 0


class _LineError(Exception):
    def __init__(self, keyword: str, problem: str) -> None:
        super().__init__(problem)
        self.keyword, self.problem = keyword, problem


def resolve_options(
    host_arg: str,
    config: Path | None = None,
    *,
    user: str | None = None,
    port: int | None = None,
    jump: str | None = None,
    me: str | None = None,
) -> SshOptions:
    """``ssh -G [-F config] [-l user] [-p port] [-J jump] host_arg``, for the fields orch uses.

    ``config`` None reads ``~/.ssh/config`` then ``/etc/ssh/ssh_config`` (like ssh without
    ``-F``); a path reads only that file (like ``-F``). ``user``/``port``/``jump`` act like
    ``-l``/``-p``/``-J``: they win over the files. ``me`` is the local user (default: this
    process's).

    Raises:
        ConfigError: a bad line (file:line), an Include loop, a bad token in HostName, a
            ``Match exec`` that hangs, or a ProxyJump that points at the host itself.
    """
    r = _Reader(host=host_arg, original=host_arg, config=config, me=me or local_user())
    r.user, r.port = user, port
    if jump is not None:
        r.set_jump(jump, True)
    r.read_all()
    host = r.expand_hostname() if r.hostname is not None else host_arg
    if not is_addr(host):
        host = host.lower()
    if r.canonicalize:
        r.want_final = True
    if r.want_final:
        r.hostname, r.host, r.final_pass = host, host, True
        r.read_all()
    final_port, final_user = r.port or 22, r.user or r.me
    spec = r.jump if r.jump and r.jump.lower() != "none" else None
    if spec:
        hops = parse_jump(spec)
        assert hops is not None
        last = hops[-1]
        if (last.host, last.port or 22, last.user or final_user) == (host, final_port, final_user):
            where = str(config or "~/.ssh/config")
            raise ConfigError(where, None, "proxyjump", f"jumphost loop via {last.host}")
    command = r.proxy_command
    return SshOptions(
        host_arg=host_arg,
        hostname=host,
        port=final_port,
        user=final_user,
        user_given=r.user is not None,
        identity_files=tuple(r.identity),
        proxy_jump=spec,
        proxy_command=None if spec or command is None or command.lower() == "none" else command,
        notes=tuple(dict.fromkeys(r.notes)),
    )


def proxy_command_line(opts: SshOptions) -> str:
    """sshconnect.c expand_proxy_command: ``exec CMD`` with %h %k %n %p %r (and %%) expanded.

    Raises:
        ValueError: an unknown ``%`` token.
    """
    assert opts.proxy_command is not None
    tokens = {
        "h": opts.hostname,
        "k": opts.host_arg,
        "n": opts.host_arg,
        "p": str(opts.port),
        "r": opts.user,
    }
    return percent_expand("exec " + opts.proxy_command, tokens)


def client_tokens(host: str, port: int, user: str, host_arg: str, me: str) -> dict[str, str]:
    """ssh.h DEFAULT_CLIENT_PERCENT_EXPAND_ARGS (9.2): %C %L %i %k %l %n %p %d %h %r %u
    (``%k``: host_arg, orch keeps no HostKeyAlias)."""
    thishost = socket.gethostname()
    return {
        "C": hashlib.sha1((thishost + host + str(port) + user).encode()).hexdigest(),
        "L": thishost.split(".")[0],
        "i": str(os.getuid()),
        "k": host_arg,
        "l": thishost,
        "n": host_arg,
        "p": str(port),
        "d": os.path.expanduser("~"),
        "h": host,
        "r": user,
        "u": me,
    }


def expand_identity(path: str, opts: SshOptions) -> str:
    """ssh.c load_public_identity_files: ``~`` then the default client tokens and ``${VAR}``.

    Raises:
        ValueError: an unknown token or an unset variable.
    """
    tokens = client_tokens(opts.hostname, opts.port, opts.user, opts.host_arg, local_user())
    expanded = percent_expand(os.path.expanduser(path), tokens)

    def env(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ValueError(f"${{{m.group(1)}}} is not set")
        return os.environ[m.group(1)]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, expanded)
