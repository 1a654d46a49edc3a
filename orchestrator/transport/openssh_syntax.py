"""ssh_config's syntax as OpenSSH 9.2p1 has it (pure functions): the keyword table, tokens,
patterns, ``%`` expansion, ProxyJump hops.

The keywords ``ssh_config`` accepts: OpenSSH 9.2p1's ``readconf.c`` ``keywords[]`` table
(openssh-portable tag V_9_2_P1, every name of it, deprecated and unsupported ones included:
ssh reads those without failing), plus the ones Debian's 9.2p1 package adds
(debian/patches/gssapi.patch, keepalive-extensions.diff).

Any other keyword makes ssh stop with "Bad configuration option" (readconf.c parse_token),
unless ``IgnoreUnknown`` names it; :mod:`openssh_config` does the same.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from functools import lru_cache

READCONF_9_2 = frozenset(
    """
    addkeystoagent addressfamily afstokenpassing batchmode bindaddress bindinterface
    canonicaldomains canonicalizefallbacklocal canonicalizehostname canonicalizemaxdots
    canonicalizepermittedcnames casignaturealgorithms certificatefile
    challengeresponseauthentication checkhostip cipher ciphers clearallforwardings
    compression compressionlevel connectionattempts connecttimeout controlmaster controlpath
    controlpersist dsaauthentication dynamicforward enableescapecommandline enablesshkeysign
    escapechar exitonforwardfailure fallbacktorsh fingerprinthash forkafterauthentication
    forwardagent forwardx11 forwardx11timeout forwardx11trusted gatewayports
    globalknownhostsfile globalknownhostsfile2 gssapiauthentication gssapidelegatecredentials
    hashknownhosts host hostbasedacceptedalgorithms hostbasedauthentication hostbasedkeytypes
    hostkeyalgorithms hostkeyalias hostname identitiesonly identityagent identityfile
    identityfile2 ignoreunknown include ipqos kbdinteractiveauthentication
    kbdinteractivedevices keepalive kerberosauthentication kerberostgtpassing kexalgorithms
    knownhostscommand localcommand localforward loglevel logverbose macs match
    nohostauthenticationforlocalhost numberofpasswordprompts passwordauthentication
    permitlocalcommand permitremoteopen pkcs11provider port preferredauthentications protocol
    proxycommand proxyjump proxyusefdpass pubkeyacceptedalgorithms pubkeyacceptedkeytypes
    pubkeyauthentication rekeylimit remotecommand remoteforward requesttty requiredrsasize
    revokedhostkeys rhostsauthentication rhostsrsaauthentication rsaauthentication
    securitykeyprovider sendenv serveralivecountmax serveraliveinterval sessiontype setenv
    skeyauthentication smartcarddevice stdinnull streamlocalbindmask streamlocalbindunlink
    stricthostkeychecking syslogfacility tcpkeepalive tisauthentication tunnel tunneldevice
    updatehostkeys useprivilegedport user userknownhostsfile userknownhostsfile2 useroaming
    usersh verifyhostkeydns visualhostkey xauthlocation
    """.split()  # noqa: SIM905 (the table as readconf.c lists it)
)

DEBIAN_9_2 = frozenset(
    """
    gssapikeyexchange gssapiclientidentity gssapiserveridentity gssapirenewalforcesrekey
    gssapitrustdns gssapikexalgorithms protocolkeepalives setuptimeout
    """.split()  # noqa: SIM905 (the table as readconf.c lists it)
)

KEYWORDS = READCONF_9_2 | DEBIAN_9_2

# multistate_canonicalizehostname (readconf.c): value -> canonicalisation on
CANONICALIZE = {"true": True, "false": False, "yes": True, "no": False, "always": True}


@dataclass(frozen=True, slots=True)
class Hop:
    """One element of a ProxyJump list: ``[user@]host[:port]`` or ``ssh://...``."""

    user: str | None
    host: str
    port: int | None


@lru_cache(maxsize=512)
def _glob_re(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.S
    )


def match_pattern(s: str, pattern: str) -> bool:
    """match.c match_pattern: ``*`` and ``?`` only, case-sensitive, whole string.

    >>> match_pattern("web1.lan", "web?.*"), match_pattern("Web1", "web*"), match_pattern("a[1]", "a[1]")
    (True, False, True)
    """
    return _glob_re(pattern).fullmatch(s) is not None


def match_pattern_list(s: str, patterns: str, dolower: bool) -> int:
    """match.c match_pattern_list: 1 on a positive match, -1 when a ``!pattern`` matches, else 0.

    >>> match_pattern_list("bob", "alice,b*", False), match_pattern_list("bob", "*,!bob", False)
    (1, -1)
    """
    got = 0
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        sub = sub[1:] if negated else sub
        if match_pattern(s, sub.lower() if dolower else sub):
            if negated:
                return -1
            got = 1
    return got


def percent_expand(s: str, tokens: dict[str, str]) -> str:
    """misc.c percent_expand: ``%%`` and the given one-letter tokens; anything else is an error.

    >>> percent_expand("%h.lan:%p %%", {"h": "web", "p": "22"})
    'web.lan:22 %'
    >>> percent_expand("%x", {"h": "web"})
    Traceback (most recent call last):
    ValueError: unknown key %x
    """
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "%":
            out.append(c)
        elif i + 1 >= len(s):
            raise ValueError("invalid format (a trailing %)")
        else:
            i += 1
            key = s[i]
            if key == "%":
                out.append("%")
            elif key in tokens:
                out.append(tokens[key])
            else:
                raise ValueError(f"unknown key %{key}")
        i += 1
    return "".join(out)


def argv_split(s: str) -> list[str] | None:
    """misc.c argv_split (comments end the line): quotes and backslash escapes; None when a
    quote is not closed.

    >>> argv_split('"a b" c\\\\ d e # f'), argv_split('"open')
    (['a b', 'c d', 'e'], None)
    """
    args: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s[i] in " \t":
            i += 1
            continue
        if s[i] == "#":
            break
        quote, arg = "", []
        while i < n:
            c = s[i]
            if c == "\\" and i + 1 < n and (s[i + 1] in "'\"\\" or (not quote and s[i + 1] == " ")):
                i += 1
                arg.append(s[i])
            elif not quote and c in " \t":
                break
            elif not quote and c in "\"'":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                arg.append(c)
            i += 1
        if quote:
            return None
        args.append("".join(arg))
    return args


def a2port(s: str) -> int:
    """misc.c a2port: 0-65535 or a tcp service name; -1 when neither."""
    if s.isdigit():
        return int(s) if int(s) <= 65535 else -1
    try:
        return socket.getservbyname(s, "tcp")
    except OSError:
        return -1


def parse_hop(spec: str) -> Hop | None:
    """misc.c parse_ssh_uri / parse_user_host_port for one ProxyJump element; None if bad.

    >>> parse_hop("admin@bastion:2222"), parse_hop("[::1]:22"), parse_hop("ssh://u@h:7")
    (Hop(user='admin', host='bastion', port=2222), Hop(user=None, host='::1', port=22), Hop(user='u', host='h', port=7))
    >>> parse_hop("@h"), parse_hop("h:0"), parse_hop("h:x")
    (None, None, None)
    """
    if spec.startswith("ssh://"):
        spec = spec[6:]
        if "/" in spec.rstrip("/"):
            return None
        spec = spec.rstrip("/")
    user, at, rest = spec.rpartition("@")
    if at and not user:
        return None
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            return None
        port_s = tail[1:]
    else:
        host, _, port_s = rest.partition(":")
    if not host:
        return None
    port = None
    if port_s:
        port = a2port(port_s)
        if port <= 0:
            return None
    return Hop(user or None, host, port)


def parse_jump(spec: str) -> list[Hop] | None:
    """Every hop of ``j1,j2,...`` in connection order (first hop first); None if one is bad."""
    hops = [parse_hop(part) for part in spec.split(",")]
    return None if any(h is None for h in hops) else [h for h in hops if h is not None]


def is_addr(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
