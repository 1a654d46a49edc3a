"""orch's ssh_config resolution against OpenSSH's own: ``ssh -G -F CONFIG HOST`` (and the jump
chain ssh walks, one ``ssh -G`` per hop) on a table of tricky configs, field by field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.transport.openssh_config import resolve_options
from orchestrator.transport.ssh_config import alias_host, resolve, route
from tests.transport.openssh_oracle import DEFAULT_IDENTITIES, SSH, ssh_chain, ssh_g

pytestmark = pytest.mark.skipif(SSH is None, reason="needs OpenSSH's ssh (openssh-client)")

ROOT = Path(__file__).resolve().parents[2]
TEN = "".join(f"Host h{i}\n  HostName 10.0.0.{i}\n  Port {2200 + i}\n" for i in range(10))

# (id, files (path under HOME -> text; "config" is the one given to -F), host)
CASES: list[tuple[str, dict[str, str], str]] = [
    ("plain", {"config": "Host a\n  HostName 10.0.0.1\n  Port 2222\n  User bob\n"}, "a"),
    (
        "first-value-wins",
        {"config": "Host a\n  User first\nHost *\n  User second\n  Port 23\n"},
        "a",
    ),
    (
        "wildcard-before-exact",
        {"config": "Host *.lan\n  Port 2200\nHost web1.lan\n  Port 22\n  User w\n"},
        "web1.lan",
    ),
    ("negated", {"config": "Host * !bastion\n  User x\nHost *\n  User y\n"}, "bastion"),
    ("negated-after-positive", {"config": "Host b* !bastion\n  Port 1\n"}, "bastion"),
    ("question-mark", {"config": "Host ?b c*\n  Port 2300\n"}, "ab"),
    (
        "equals-and-quotes",
        {"config": 'Host=a\n  Port=2022\n  User = "x y"\n  HostName "10.0.0.5"\n'},
        "a",
    ),
    (
        "comments-tabs-blank",
        {"config": "# top\n\n\tHost a   # c\n\t\tUser\tt # trailing\n\n  Port 2\n"},
        "a",
    ),
    (
        "include-relative-glob",
        {
            "config": "Include conf.d/*.conf\nHost *\n  Port 9\n",
            ".ssh/conf.d/20-b.conf": "Host a\n  User b\n  Port 20\n",
            ".ssh/conf.d/10-a.conf": "Host a\n  User a\n",
            ".ssh/conf.d/skip.txt": "Host a\n  User txt\n",
        },
        "a",
    ),
    (
        "include-absolute",
        {"config": "Include {home}/extra\n", "extra": "Host a\n  HostName abs.example\n"},
        "a",
    ),
    (
        "include-nested",
        {
            "config": "Include one\n",
            ".ssh/one": "Include two\nHost a\n  Port 1\n",
            ".ssh/two": "Include three\n",
            ".ssh/three": "Host a\n  User deep\n  Port 3\n",
        },
        "a",
    ),
    (
        "include-in-matching-block",
        {"config": "Host a\n  Include inc\n  Port 4\n", ".ssh/inc": "User inc\n"},
        "a",
    ),
    (
        "include-in-other-block-parses-only",
        {
            "config": "Host zzz\n  Include inc\nHost a\n  Port 5\n",
            ".ssh/inc": "Host a\n  User never\n",
        },
        "a",
    ),
    ("include-missing", {"config": "Include nothere {home}/nope/*\nHost a\n  User m\n"}, "a"),
    (
        "match-host-after-hostname",
        {"config": "Host a\n  HostName real.example\nMatch host real.example\n  User m\n"},
        "a",
    ),
    ("match-originalhost", {"config": "Match originalhost A*\n  Port 2210\n"}, "Abc"),
    (
        "match-user",
        {"config": "Host a\n  User deploy\nMatch user deploy,!root\n  Port 2201\n"},
        "a",
    ),
    ("match-localuser", {"config": "Match localuser root,nobody\n  Port 2202\n"}, "a"),
    ("match-attribute-then-all", {"config": "Match host a all\n  User ha\n"}, "a"),
    ("match-all", {"config": "Host a\n  Port 2203\nMatch all\n  User all\n"}, "a"),
    ("match-negated-all", {"config": "Match !all\n  User no\nHost *\n  User yes\n"}, "a"),
    (
        "match-final",
        {
            "config": "Host a\n  HostName B.example\nMatch final host b.example\n  User fin\n"
            "Host b.example\n  Port 2300\n",
        },
        "a",
    ),
    (
        "match-canonical-not-final",
        {"config": "Match !canonical\n  Port 2301\nMatch canonical\n  User canon\n"},
        "a",
    ),
    (
        "match-exec",
        {
            "config": 'Match exec "test %h = a" host a\n  User ex\nMatch exec false\n  Port 1\n'
            "Match host a exec true\n  Port 2302\n",
        },
        "a",
    ),
    ("match-exec-skipped", {"config": "Match host zz exec false\n  User no\n"}, "a"),
    (
        "tokens",
        {
            "config": "Host a\n  HostName %h.example.com\n  IdentityFile ~/.ssh/%h_%r_%%\n"
            "  User tok\n  ProxyCommand nc %h %p # %r\n",
        },
        "a",
    ),
    (
        "identity-list",
        {
            "config": "Host a\n  IdentityFile ~/.ssh/one\n  IdentityFile /k/two\nHost *\n"
            "  IdentityFile ~/.ssh/one\n  IdentityFile %d/three\n",
        },
        "a",
    ),
    ("case", {"config": "Host A\n  Port 1\nHost a\n  HostName UPPER.Example\n"}, "a"),
    ("ignore-unknown", {"config": "IgnoreUnknown foo*\nHost a\n  FooBar yes\n  Port 7\n"}, "a"),
    (
        "canonicalize-off",
        {"config": "Host a\n  CanonicalizeHostname no\n  HostName b\nHost b\n  Port 2400\n"},
        "a",
    ),
    (
        "canonicalize-yes-reparses",
        {"config": "Host a\n  CanonicalizeHostname yes\n  HostName b\nHost b\n  Port 2401\n"},
        "a",
    ),
    (
        "jump-one",
        {
            "config": "Host t\n  ProxyJump j1\nHost j1\n  HostName 10.1.1.1\n  User ju\n  Port 2022\n"
        },
        "t",
    ),
    (
        "jump-two-forms",
        {
            "config": "Host t\n  HostName 10.0.0.9\n  User tu\n  ProxyJump alice@j1:2201,j2\n"
            "Host j1\n  HostName 10.1.1.1\n  User ignored\n  Port 1\nHost j2\n  HostName j2.lan\n",
        },
        "t",
    ),
    (
        "jump-ten",
        {"config": "Host t\n  ProxyJump " + ",".join(f"h{i}" for i in range(10)) + "\n" + TEN},
        "t",
    ),
    (
        "jump-uri-and-ip",
        {"config": "Host t\n  ProxyJump ssh://u@10.2.2.2:2022,[10.3.3.3]:23,v@10.4.4.4\n"},
        "t",
    ),
    (
        "jump-first-hop-own-jump",
        {
            "config": "Host t\n  ProxyJump j1\nHost j1\n  ProxyJump j0\n  User one\n"
            "Host j0\n  HostName 10.0.0.0\n",
        },
        "t",
    ),
    (
        "jump-last-hop-own-jump-ignored",
        {"config": "Host t\n  ProxyJump j1,j2\nHost j2\n  ProxyJump jx\n  User two\n"},
        "t",
    ),
    (
        "jump-hop-proxycommand",
        {"config": "Host t\n  ProxyJump j1\nHost j1\n  ProxyCommand nc -x proxy %h %p\n"},
        "t",
    ),
    ("jump-none-first", {"config": "Host t\n  ProxyJump none\nHost *\n  ProxyJump j1\n"}, "t"),
    (
        "proxycommand-before-jump",
        {"config": "Host t\n  ProxyCommand ssh -W %h:%p gw\n  ProxyJump j1\n"},
        "t",
    ),
    (
        "jump-before-proxycommand",
        {"config": "Host t\n  ProxyJump j1\n  ProxyCommand nc %h %p\n"},
        "t",
    ),
    (
        "proxycommand-none",
        {"config": "Host t\n  ProxyCommand none\nHost *\n  ProxyCommand nc\n"},
        "t",
    ),
    (
        "jump-user-from-config-star",
        {"config": "Host t\n  User target\n  ProxyJump j1\nHost *\n  User star\n"},
        "t",
    ),
]

# Configs ssh refuses: orch must refuse them too, with one ConfigError naming the file.
BAD: list[tuple[str, dict[str, str], str]] = [
    ("unknown-keyword", {"config": "Host a\n  Colour blue\n"}, "a"),
    ("bad-port", {"config": "Host zz\n  Port 99999\n"}, "a"),
    ("missing-argument", {"config": "Host a\n  User\n"}, "a"),
    ("include-itself", {"config": "Include {home}/config\n"}, "a"),
    (
        "include-loop-pair",
        {"config": "Include x\n", ".ssh/x": "Include y\n", ".ssh/y": "Include x\n"},
        "a",
    ),
    ("bad-match", {"config": "Match colour blue\n  User x\n"}, "a"),
    ("match-all-combined", {"config": "Match all host a\n  User x\n"}, "a"),
    ("match-no-criteria", {"config": "Match host\n  User x\n"}, "a"),
    ("unclosed-quote", {"config": 'Host a\n  User "x\n'}, "a"),
    ("bad-jump", {"config": "Host a\n  ProxyJump @j1\n"}, "a"),
    ("extra-arguments", {"config": "Host a\n  User x y\n"}, "a"),
    ("bad-hostname-token", {"config": "Host a\n  HostName %z.example\n"}, "a"),
    ("jumphost-loop", {"config": "Host a\n  ProxyJump a\n"}, "a"),
]


def write_case(home: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{home}", str(home)))
        path.chmod(0o644)
    return home / "config"


def _hop(hop: dict[str, object]) -> tuple[object, ...]:
    """A hop's fields; its ProxyCommand as set or not (orch shows it expanded, ssh -G raw)."""
    return hop["hostname"], hop["port"], hop["user"], "proxy_command" in hop


def compare(home: Path, config: Path, host: str) -> None:
    want = ssh_g(config, host, home=home)
    assert "error" not in want, want
    got = resolve_options(host, config)
    assert (got.hostname, got.port, got.user) == (want["hostname"], int(want["port"]), want["user"])
    assert list(got.identity_files or DEFAULT_IDENTITIES) == want["identityfile"]
    assert got.proxy_command == (
        None if want.get("proxycommand") in (None, "none") else want["proxycommand"]
    )
    chain = ssh_chain(config, host, home=home)
    ours = route(resolve(alias_host(host), config, local_user_default=True))
    assert [_hop(h) for h in ours["jump"]] == [_hop(h) for h in chain["jump"]]
    assert (ours["hostname"], ours["port"], ours["user"]) == (
        chain["hostname"],
        chain["port"],
        chain["user"],
    )


@pytest.mark.parametrize(("files", "host"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_resolution_equals_ssh_G(
    files: dict[str, str], host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    compare(tmp_path, write_case(tmp_path, files), host)


@pytest.mark.parametrize(("files", "host"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_configs_ssh_refuses_are_refused_with_file_and_line(
    files: dict[str, str], host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = write_case(tmp_path, files)
    assert "error" in ssh_g(config, host, home=tmp_path)  # the oracle refuses it
    with pytest.raises(ConfigError) as info:
        resolve(alias_host(host), config, local_user_default=True)
    assert str(tmp_path) in str(info.value)


def orch_route(home: Path, host: str) -> dict[str, object]:
    """``orch hosts HOST --ssh --json`` run as a user whose ~/.ssh/config is ``home``'s."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("ORCH_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "hosts", host, "--ssh", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got: dict[str, object] = json.loads(done.stdout)
    return got


@pytest.mark.parametrize("case", ["jump-two-forms", "match-final", "include-nested", "tokens"])
def test_orch_hosts_ssh_json_equals_ssh(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = dict(next(c[1] for c in CASES if c[0] == case))
    host = next(c[2] for c in CASES if c[0] == case)
    files[".ssh/config"] = files.pop("config")
    write_case(tmp_path, files)
    config = tmp_path / ".ssh" / "config"
    want = ssh_chain(config, host, home=tmp_path)
    got = orch_route(tmp_path, host)
    assert (got["hostname"], got["port"], got["user"]) == (
        want["hostname"],
        want["port"],
        want["user"],
    )
    assert [_hop(h) for h in got["jump"]] == [_hop(h) for h in want["jump"]]  # type: ignore[attr-defined]
    assert set(got) == {"hostname", "port", "user", "identity_files", "jump", "proxy_command"}


def test_orch_hosts_ssh_of_an_inventory_host_and_bad_usage(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host pve-alias\n  HostName 10.1.2.3\n  Port 2201\n")
    (tmp_path / "hosts.yaml").write_text("hosts:\n  pve1: {ssh_config: pve-alias, user: admin}\n")
    got = orch_route(tmp_path, "pve1")
    assert (got["hostname"], got["port"], got["user"], got["jump"]) == (
        "10.1.2.3",
        2201,
        "admin",
        [],
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "hosts", "--ssh"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 2 and "needs a HOST" in done.stderr
