"""Loading hosts.yaml: lookup order, the built-in local target, defaults, paths, the example file."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.config.inventory import LOCAL, find_config, load_inventory, parse_inventory
from orchestrator.config.limits import Limits
from orchestrator.config.restart import RestartPolicy
from orchestrator.errors import ConfigError, UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cwd and config home, no $ORCH_CONFIG: nothing on the lookup path yet.

    monkeypatch is the real mechanism here (cwd and environment are process state).
    """
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("ORCH_CONFIG", raising=False)
    return tmp_path


def _write(path: Path, address: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"hosts:\n  h:\n    address: {address}\n")
    path.chmod(0o600)
    return path


def test_lookup_order(clean_lookup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_config(None) is None
    user = _write(clean_lookup / "home/.config/orch/hosts.yaml", "user")
    assert find_config(None) == user
    cwd = _write(clean_lookup / "cwd/hosts.yaml", "cwd")
    assert find_config(None) == Path("hosts.yaml")
    assert find_config(None).resolve() == cwd.resolve()
    env = _write(clean_lookup / "env.yaml", "env")
    monkeypatch.setenv("ORCH_CONFIG", str(env))
    assert find_config(None) == env
    explicit = _write(clean_lookup / "explicit.yaml", "explicit")
    assert find_config(explicit) == explicit
    assert load_inventory(explicit).hosts["h"].address == "explicit"
    monkeypatch.delenv("ORCH_CONFIG")
    assert load_inventory().hosts["h"].address == "cwd"


def test_xdg_config_home_is_honoured(clean_lookup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = _write(clean_lookup / "xdg/orch/hosts.yaml", "xdg")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(clean_lookup / "xdg"))
    assert load_inventory().hosts["h"].address == "xdg"
    assert find_config(None) == xdg


def test_missing_orch_config_is_an_error(
    clean_lookup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(clean_lookup / "cwd/hosts.yaml", "cwd")
    monkeypatch.setenv("ORCH_CONFIG", str(clean_lookup / "typo.yaml"))
    with pytest.raises(ConfigError, match=r"typo.yaml: no such file \(named by \$ORCH_CONFIG\)"):
        load_inventory()


def test_no_file_gives_builtin_local(
    clean_lookup: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = load_inventory()
    assert inv.path is None
    assert inv.hosts == {}
    assert list(inv.containers) == [LOCAL]
    local = inv.container(LOCAL)
    assert local.is_local and local.vmid is None and inv.host_of(local) is None
    assert local.workdir == str(clean_lookup / "home/.local/state/orch/local/local")
    assert run(["hosts", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] is None
    assert [c["name"] for c in out["containers"]] == [LOCAL]


def test_local_exists_even_when_not_named() -> None:
    inv = parse_inventory("hosts: {pve1: {address: a}}\ncontainers: {c: {host: pve1, vmid: 300}}\n")
    assert list(inv.containers) == ["c", LOCAL]
    assert inv.container(LOCAL).host == LOCAL


def test_unknown_container_names_the_known_ones() -> None:
    inv = parse_inventory("containers: {lxc200: {host: local}}\n", "x.yaml")
    with pytest.raises(
        UsageError, match=r"no container 'lxc20' in the built-in .*did you mean 'lxc200'"
    ):
        inv.container("lxc20")


def test_defaults_apply_and_merge(tmp_path: Path) -> None:
    text = """
defaults:
  user: admin
  port: 2222
  poll_interval: 5
  workdir: /srv/train
  env: {NCCL_DEBUG: WARN, A: default}
  thresholds: {stall_timeout_s: 100, ghost_samples: 4}
hosts:
  pve1: {address: 10.1.2.6}
  pve2: {address: 10.1.2.7, user: root}
containers:
  c1:
    host: pve1
    vmid: 200
    env: {A: own}
    thresholds: {stall_timeout_s: 900, min_tokens_per_s: 2000, ignored_xids: [13]}
    gpus: {target: "0-4", drafter: [5, "6-7"]}
  c2: {host: local}
"""
    inv = parse_inventory(text, "h.yaml", tmp_path)
    assert inv.hosts["pve1"].user == "admin" and inv.hosts["pve1"].port == 2222
    assert inv.hosts["pve2"].user == "root"
    assert (
        "user" in inv.hosts["pve1"].explicit and "identity_file" not in inv.hosts["pve1"].explicit
    )
    c1 = inv.containers["c1"]
    assert c1.workdir == "/srv/train" and c1.poll_interval_s == 5.0
    assert c1.env == {"NCCL_DEBUG": "WARN", "A": "own"}
    assert c1.limits == Limits(
        stall_timeout_s=900.0, ghost_samples=4, min_tokens_per_s=2000.0, ignored_xids=(13,)
    )
    assert c1.gpus == {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
    assert c1.role_of(6) == "drafter" and c1.gpu_indices == tuple(range(8))
    # a defaults: workdir is for containers on hosts; a local target keeps its own default
    c2 = inv.containers["c2"]
    assert c2.workdir == os.path.expanduser("~/.local/state/orch/local/c2")
    assert c2.limits.stall_timeout_s == 100.0


def test_restart_policy_merges_with_defaults_and_turns_off(tmp_path: Path) -> None:
    text = """
defaults:
  restart: {max: 2, window: 30m, backoff: [5s, 1m]}
containers:
  a: {host: local}
  b: {host: local, restart: {backoff: 2, on: [crashed]}}
  c: {host: local, restart: false}
"""
    inv = parse_inventory(text, "h.yaml", tmp_path)
    a, b, c = (inv.containers[n].restart for n in "abc")
    assert a == RestartPolicy(max_restarts=2, window_s=1800.0, backoff_s=(5.0, 60.0))
    assert b == RestartPolicy(max_restarts=2, window_s=1800.0, backoff_s=(2.0,), on=("crashed",))
    assert c is None
    assert parse_inventory("containers: {d: {host: local}}").containers["d"].restart is None
    assert a is not None and a.to_dict()["window"] == "30m" and a.backoff_for(5) == 60.0


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    text = "hosts:\n  h:\n    address: a\n    identity_file: keys/id\n    known_hosts: ~/kh\n"
    inv = parse_inventory(text, "h.yaml", tmp_path / "conf")
    assert inv.hosts["h"].identity_file == str(tmp_path / "conf/keys/id")
    assert inv.hosts["h"].known_hosts == os.path.expanduser("~/kh")


def test_ssh_config_alias_stands_in_for_address() -> None:
    inv = parse_inventory("hosts:\n  h: {ssh_config: pve-alias}\n")
    assert inv.hosts["h"].address == "pve-alias"
    assert inv.hosts["h"].explicit == frozenset({"ssh_config"})  # address derived, not set


def test_command_list_is_quoted_once() -> None:
    inv = parse_inventory("containers:\n  c: {host: local, command: [python3, train.py, 'a b']}\n")
    assert inv.containers["c"].command == "python3 train.py 'a b'"


def test_writable_file_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts: {}\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="orchestrator.config.inventory"):
        load_inventory(path)
    assert caplog.records == []
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="orchestrator.config.inventory"):
        load_inventory(path)
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "chmod go-w" in record.getMessage()


def test_example_hosts_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    """The walkthrough at the repo root holds what the README promises."""
    path = REPO / "hosts.yaml"
    inv = load_inventory(path)
    pve1 = inv.hosts["pve1"]
    assert (pve1.address, pve1.user, pve1.port) == ("10.1.2.6", "root", 22)
    ct = inv.container("lxc200")
    assert (ct.host, ct.vmid, ct.workdir, ct.session) == ("pve1", 200, "/root/dflash", "train")
    assert ct.gpus == {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
    assert "torch" in ct.requires
    assert ct.limits != Limits()
    assert ct.restart == RestartPolicy(backoff_s=(120.0, 600.0))
    assert inv.container(LOCAL).is_local
    assert run(["-c", str(path), "hosts"]) == 0
    out = capsys.readouterr().out
    assert "lxc200" in out and "10.1.2.6:22" in out and "target:0-4" in out


def test_hosts_json_masks_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "containers:\n  c: {host: local, env: {HF_TOKEN: s3cr3t-planted, MODE: fast}}\n"
    )
    assert run(["-c", str(path), "hosts", "--json"]) == 0
    out = capsys.readouterr().out
    assert "s3cr3t-planted" not in out
    env = json.loads(out)["containers"][0]["env"]
    assert env == {"HF_TOKEN": "***", "MODE": "fast"}
