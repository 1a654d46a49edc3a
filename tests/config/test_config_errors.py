"""Malformed hosts.yaml: each case is one line naming file:line and key path, exit 2, no traceback.

Every case goes through the real CLI entry point (``orchestrator.cli.run``) on a
real file, exactly as ``orch -c FILE hosts`` would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import run

H = "hosts:\n  pve1:\n    address: 10.1.2.6\n"
CT = "containers:\n  ct:\n    host: local\n"

# (case id, file text, expected message after "FILE:")
CASES = [
    ("unknown-key", H + "    prot: 22\n", "4: hosts.pve1.prot: unknown key; did you mean 'port'?"),
    (
        "unknown-key-no-match",
        "defaults:\n  vmid: 200\n",
        "2: defaults.vmid: unknown key; expected one of: port, user, identity_file, "
        "known_hosts, proxy_jump, connect_timeout_s, keepalive_s, observe, host_python, "
        "agent_dir, workdir, session, env, command, python, requires, trainer_config, "
        "thresholds, log_patterns, log_format, poll_interval, restart",
    ),
    (
        "wrong-type-int",
        H + "    port: abc\n",
        "4: hosts.pve1.port: must be an integer from 1 to 65535 (got str 'abc')",
    ),
    (
        "wrong-type-list",
        "hosts:\n  pve1:\n    address: [a, b]\n",
        "3: hosts.pve1.address: must be a host name or IP address (got a list)",
    ),
    (
        "port-range",
        H + "    port: 70000\n",
        "4: hosts.pve1.port: must be an integer from 1 to 65535 (got 70000)",
    ),
    (
        "vmid-too-small",
        H + "containers:\n  ct:\n    host: pve1\n    vmid: 99\n",
        "7: containers.ct.vmid: must be an integer >= 100 (got 99)",
    ),
    (
        "vmid-quoted",
        H + "containers:\n  ct:\n    host: pve1\n    vmid: '200'\n",
        "7: containers.ct.vmid: must be an integer >= 100 (got str '200')",
    ),
    (
        "vmid-bool",
        H + "containers:\n  ct:\n    host: pve1\n    vmid: true\n",
        "7: containers.ct.vmid: must be an integer >= 100 (got bool 'true')",
    ),
    (
        "vmid-missing",
        H + "containers:\n  ct:\n    host: pve1\n",
        "5: containers.ct.vmid: needs a vmid (the Proxmox container id, an integer >= 100)",
    ),
    (
        "undefined-host-suggest",
        H + "containers:\n  ct:\n    host: pve2\n    vmid: 200\n",
        "6: containers.ct.host: host 'pve2' is not defined under hosts; did you mean 'pve1'?",
    ),
    (
        "undefined-host",
        H + "containers:\n  ct:\n    host: zeta\n    vmid: 200\n",
        "6: containers.ct.host: host 'zeta' is not defined under hosts; defined: pve1, local",
    ),
    (
        "no-host",
        H + "containers:\n  ct:\n    vmid: 200\n",
        "5: containers.ct: needs a host (one of: pve1, local)",
    ),
    (
        "duplicate-container",
        H + "containers:\n  ct:\n    host: local\n  ct:\n    host: local\n",
        "7: containers.ct: duplicate name (first at line 5)",
    ),
    (
        "duplicate-host",
        H + "  pve1:\n    address: 10.1.2.7\n",
        "4: hosts.pve1: duplicate name (first at line 2)",
    ),
    (
        "duplicate-key",
        H + "    port: 22\n    port: 23\n",
        "5: hosts.pve1.port: duplicate key (first at line 4)",
    ),
    (
        "session-dot",
        CT + "    session: run.1\n",
        "4: containers.ct.session: tmux session names cannot contain '.' or ':' (got 'run.1')",
    ),
    (
        "session-colon",
        CT + "    session: 'a:b'\n",
        "4: containers.ct.session: tmux session names cannot contain '.' or ':' (got 'a:b')",
    ),
    ("session-empty", CT + "    session: ''\n", "4: containers.ct.session: must not be empty"),
    (
        "session-control",
        CT + '    session: "a\\tb"\n',
        "4: containers.ct.session: must not contain control characters (got 'a\\tb')",
    ),
    (
        "threshold-unknown",
        CT + "    thresholds:\n      stall_timeout: 5\n",
        "5: containers.ct.thresholds.stall_timeout: unknown threshold; "
        "did you mean 'stall_timeout_s'?",
    ),
    (
        "threshold-type",
        CT + "    thresholds:\n      stall_timeout_s: soon\n",
        "5: containers.ct.thresholds.stall_timeout_s: must be a number >= 0 (got str 'soon')",
    ),
    (
        "threshold-samples",
        CT + "    thresholds:\n      ghost_samples: 0\n",
        "5: containers.ct.thresholds.ghost_samples: must be an integer >= 1 (got 0)",
    ),
    (
        "threshold-ratio",
        "defaults:\n  thresholds:\n    throughput_drop_ratio: 2\n",
        "3: defaults.thresholds.throughput_drop_ratio: must be a number from 0 to 1 (got 2)",
    ),
    (
        "top-level-typo",
        "host:\n  pve1: {address: x}\n",
        "1: host: unknown top-level key; did you mean 'hosts'?",
    ),
    (
        "top-level-unknown",
        "zzz: 1\n",
        "1: zzz: unknown top-level key; the top level holds exactly: defaults, hosts, containers, jobs",
    ),
    (
        "not-a-mapping",
        "- a\n- b\n",
        "1: the top level must be a mapping with the keys defaults, hosts, containers, jobs (got a list)",
    ),
    (
        "section-not-a-mapping",
        "hosts: [pve1]\n",
        "1: hosts: must be a mapping (got a list)",
    ),
    (
        "yaml-syntax",
        "hosts:\n  pve1:\n    address: x\n   port: 2\n",
        "4: YAML syntax error: while parsing a block mapping, expected <block end>, "
        "but found '<block mapping start>'",
    ),
    (
        "yaml-tab",
        "hosts:\n\tpve1: {}\n",
        "2: YAML syntax error: while scanning for the next token, found character '\\t' "
        "that cannot start any token",
    ),
    (
        "yaml-two-documents",
        "hosts: {}\n---\nhosts: {}\n",
        "2: YAML syntax error: expected a single document in the stream, but found another document",
    ),
    (
        "control-character",
        "hosts:\n  pve1: {address: x}\n\x07\n",
        "3: YAML syntax error: character '\\x07' is not allowed",
    ),
    (
        "gpu-negative",
        CT + "    gpus: {target: [0, -1]}\n",
        "4: containers.ct.gpus.target[1]: must be a GPU index from 0 to 1023 (got -1)",
    ),
    (
        "gpu-two-roles",
        CT + "    gpus: {target: '0-4', drafter: [4, 5]}\n",
        "4: containers.ct.gpus.drafter: GPU 4 is already in role 'target'",
    ),
    (
        "gpu-huge-range",
        CT + "    gpus: {target: '0-99999999999'}\n",
        "4: containers.ct.gpus.target: GPU index 99999999999 is above 1023",
    ),
    (
        "env-name",
        CT + "    env: {'1BAD': x}\n",
        "4: containers.ct.env.1BAD: not a valid environment variable name "
        "(letters, digits, _; not starting with a digit)",
    ),
    (
        "env-null",
        CT + "    env: {GOOD: }\n",
        "4: containers.ct.env.GOOD: must be a string, '' for empty (got null)",
    ),
    (
        "env-nul-byte",
        CT + '    env: {A: "x\\0y"}\n',
        "4: containers.ct.env.A: contains a NUL byte, which no command or file can carry",
    ),
    (
        "requires-not-module",
        CT + "    requires: [torch, 'os; rm -rf /']\n",
        "4: containers.ct.requires[1]: not a Python module name: 'os; rm -rf /'",
    ),
    (
        "requires-not-list",
        CT + "    requires: torch\n",
        "4: containers.ct.requires: must be a list of module names (got str 'torch')",
    ),
    (
        "local-with-vmid",
        "containers:\n  local:\n    vmid: 200\n",
        "3: containers.local.vmid: a local target has no vmid (it is this machine)",
    ),
    (
        "local-on-host",
        H + "containers:\n  local:\n    host: pve1\n    vmid: 200\n",
        "6: containers.local.host: the container 'local' is this machine; its host must be "
        "local (give a remote container another name)",
    ),
    (
        "host-named-local",
        "hosts:\n  local: {address: x}\n",
        "2: hosts.local: 'local' is reserved for this machine; pick another host name",
    ),
    (
        "merge-key",
        "defaults: &d {user: root}\nhosts:\n  pve1:\n    <<: *d\n    address: x\n",
        "4: hosts.pve1: YAML merge keys (<<) are not supported; put shared settings under defaults:",
    ),
    (
        "workdir-relative",
        H + "containers:\n  ct:\n    host: pve1\n    vmid: 200\n    workdir: dflash\n",
        "8: containers.ct.workdir: must be an absolute path inside the container (got 'dflash')",
    ),
    (
        "address-option-injection",
        "hosts:\n  pve1: {address: -oProxyCommand=x}\n",
        "2: hosts.pve1.address: must not start with '-' (got '-oProxyCommand=x')",
    ),
    (
        "no-address",
        "hosts:\n  pve1: {port: 22}\n",
        "2: hosts.pve1: needs an address (or an ssh_config alias)",
    ),
    (
        "bad-regex",
        CT + "    log_patterns: {oom: '(unclosed'}\n",
        "4: containers.ct.log_patterns.oom: not a valid regular expression: "
        "missing ), unterminated subpattern at position 0",
    ),
    (
        "python-tag",
        "hosts:\n  pve1: {address: !!python/object:os.system x}\n",
        "2: hosts.pve1.address: unsupported YAML tag 'tag:yaml.org,2002:python/object:os.system'",
    ),
    (
        "bad-explicit-int",
        H + "    port: !!int abc\n",
        "4: hosts.pve1.port: must be an integer from 1 to 65535 (got int 'abc')",
    ),
    (
        "name-with-newline",
        'containers:\n  "a\\nb": {host: local}\n',
        "2: containers.a\\nb: names must be printable, not empty, without '/' and not "
        "starting with '-'",
    ),
    # restart: every key of the policy names its line
    (
        "restart-not-a-mapping",
        CT + "    restart: yes\n",
        "4: containers.ct.restart: must be a mapping {max, window, backoff, on, ...} or false",
    ),
    (
        "restart-unknown-key",
        CT + "    restart:\n      maxx: 3\n",
        "5: containers.ct.restart.maxx: unknown key; did you mean 'max'?",
    ),
    (
        "restart-max-negative",
        "defaults:\n  restart: {max: -1}\n",
        "2: defaults.restart.max: must be an integer from 0 to 1000 (got -1)",
    ),
    (
        "restart-window-zero",
        CT + "    restart:\n      window: 0s\n",
        "5: containers.ct.restart.window: must be a duration > 0 (seconds, or 90s, 15m, 6h) (got 0s)",
    ),
    (
        "restart-backoff-item",
        CT + "    restart:\n      backoff:\n        - 60\n        - 5 min\n",
        "7: containers.ct.restart.backoff[1]: not a duration: '5 min' (want seconds, or a number "
        "with s, m, h or d: 90s, 15m, 6h)",
    ),
    (
        "restart-backoff-empty",
        CT + "    restart: {backoff: []}\n",
        "4: containers.ct.restart.backoff: must not be an empty list",
    ),
    (
        "restart-on-unknown",
        CT + "    restart:\n      on: [crashed, crash-loop]\n",
        "5: containers.ct.restart.on[1]: unknown death 'crash-loop'; expected one of: crashed, silent-death, "
        "stall",
    ),
    (
        "restart-on-not-a-list",
        CT + "    restart:\n      on: stall\n",
        "5: containers.ct.restart.on: must be a list of: crashed, silent-death, stall",
    ),
    (
        "restart-retry-unknown",
        CT + "    restart:\n      retry_unknown: 1\n",
        "5: containers.ct.restart.retry_unknown: must be true or false (got int '1')",
    ),
    (
        "restart-settle-list",
        CT + "    restart:\n      settle_timeout: [1]\n",
        "5: containers.ct.restart.settle_timeout: must be a duration > 0 (seconds, or 90s, 15m, "
        "6h) (got a list)",
    ),
    (
        "restart-stop-grace-zero",
        CT + "    restart:\n      stop_grace: 0\n",
        "5: containers.ct.restart.stop_grace: must be a duration > 0 (seconds, or 90s, 15m, "
        "6h) (got 0)",
    ),
    (
        "poll-interval-zero",
        "defaults: {poll_interval: 0}\n",
        "1: defaults.poll_interval: must be a number of seconds > 0 (got 0.0)",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_hosts_yaml_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    rc = run(["-c", str(path), "hosts"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err == f"error: {path}:{expected}\n"
    assert "Traceback" not in err


def test_too_deep_nesting_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts: " + "[" * 5000 + "]" * 5000 + "\n")
    assert run(["-c", str(path), "hosts"]) == 2
    assert capsys.readouterr().err == f"error: {path}: YAML nested too deeply\n"


def test_not_utf8_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"hosts:\n  pve1: {address: \xff}\n")
    assert run(["-c", str(path), "hosts"]) == 2
    assert capsys.readouterr().err == f"error: {path}:2: not UTF-8 text\n"


def test_missing_explicit_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.yaml"
    assert run(["-c", str(path), "hosts"]) == 2
    assert capsys.readouterr().err == f"error: {path}: no such file\n"


def test_directory_instead_of_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-c", str(tmp_path), "hosts"]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: is a directory, not a hosts.yaml file\n"


def test_rich_markup_in_a_message_is_printed_literally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key like ``[/x]`` or ``:smile:`` must reach the terminal as typed, not as markup."""
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  pve1:\n    address: x\n    '[/x] [bold]:smile:': 1\n")
    assert run(["-c", str(path), "hosts"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:4: hosts.pve1.[/x] [bold]:smile:: unknown key; ")
    assert err.count("\n") == 1
